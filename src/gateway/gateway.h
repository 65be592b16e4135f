// space-gateway: one process per sandbox, between its slot (the guest's network namespace)
// and the outside. It answers the guest's DNS and relays the guest's TCP connections that the
// sandbox's egress policy allows; everything else nftables drops in the slot. The guest is
// root and hostile: every byte from it is bounded in size and time.
//
// Gateway is the running service, on one thread: the listeners (created in the slot by
// main.cc), the DNS service and the TCP proxy, and SIGTERM/SIGINT handling.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <memory>

#include "common/result.h"
#include "common/unix_socket.h"
#include "gateway/gateway_core.h"

namespace space::gateway {

class DnsService;
class TcpProxy;

// Bound and listening sockets inside the slot, on kGatewayIp.
struct Listeners {
  UniqueFd tcp;      // kGatewayTcpPort: the transparent target of every guest TCP connection
  UniqueFd dns_udp;  // kGatewayDnsPort
  UniqueFd dns_tcp;  // kGatewayDnsPort, DNS over TCP
};

class Gateway {
 public:
  Gateway(GatewayOptions options, PolicyFile policy, AuditLog audit, CredentialsFile credentials);
  ~Gateway();

  // Adopts the listeners and starts serving (once run() runs).
  Status start(Listeners listeners);
  // Serves until SIGTERM or SIGINT.
  void run();

 private:
  // Declared first, destroyed last: sessions still pending when the io_context goes hold the
  // core (shared), so their destructors (audit, counters) find it alive.
  std::shared_ptr<GatewayCore> core_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  std::unique_ptr<DnsService> dns_;
  std::unique_ptr<TcpProxy> tcp_;
};

}  // namespace space::gateway
