// The guest's TCP egress: nftables redirects every guest connection here. Each one is decided
// from its original destination, the name its first bytes claim (TLS SNI, HTTP Host; sniff.h)
// and the DNS pins of that address; a denied one is reset at once, an allowed one is relayed
// to the original destination (never re-resolved) with bounded buffers and timeouts.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "gateway/gateway_core.h"

namespace space::gateway {

class TcpProxy {
 public:
  TcpProxy(std::shared_ptr<GatewayCore> core, boost::asio::ip::tcp::acceptor acceptor);
  void start();

 private:
  void accept();

  std::shared_ptr<GatewayCore> core_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
};

}  // namespace space::gateway
