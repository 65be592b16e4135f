// The guest's DNS resolver: nftables sends every guest query (UDP and TCP port 53, whatever
// the address) to these listeners. Names the policy refuses get NXDOMAIN; allowed A questions
// go to the upstream resolver, and the answers left after rebinding protection are pinned
// (DnsPins) before the guest sees them. Other types of allowed names get NODATA: the slot
// carries IPv4 only, and nothing but an A answer gives the guest an address to connect to.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "gateway/gateway_core.h"
#include "net/dns_message.h"

namespace space::gateway {

class DnsService {
 public:
  // Gets the answer's bytes, or nothing for a message to drop (malformed, over the rate).
  using Reply = std::function<void(std::vector<uint8_t>)>;

  DnsService(std::shared_ptr<GatewayCore> core, boost::asio::ip::udp::socket udp, boost::asio::ip::tcp::acceptor tcp);
  void start();

  // Answers one query from the guest; `reply` may be called later (after an upstream query).
  void handle(std::span<const uint8_t> message, Reply reply);

 private:
  void receiveUdp();
  void acceptTcp();
  void resolveUpstream(const net::DnsQuestion& question, const std::string& name,
                       std::shared_ptr<const net::Policy> policy, Reply reply);

  std::shared_ptr<GatewayCore> core_;
  boost::asio::ip::udp::socket udp_;
  boost::asio::ip::tcp::acceptor tcp_;
  boost::asio::steady_timer accept_retry_;
  std::array<uint8_t, net::kMaxDnsMessage> udp_buffer_{};
  boost::asio::ip::udp::endpoint udp_sender_;
  TokenBucket rate_;
};

}  // namespace space::gateway
