// What the gateway's DNS service and TCP proxy share: the options, the policy in force, the
// DNS pins, the audit log and the limits that span connections. Single-threaded: everything runs
// on the one io_context thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "gateway/audit_log.h"
#include "gateway/credentials_file.h"
#include "gateway/dns_pins.h"
#include "gateway/policy_file.h"
#include "gateway/token_bucket.h"
#include "net/policy.h"
#include "net/tls_ca.h"

namespace space::gateway {

struct GatewayOptions {
  boost::asio::ip::udp::endpoint upstream_dns;
  size_t max_connections = 256;
  std::chrono::milliseconds handshake_timeout{10000};
  std::chrono::milliseconds idle_timeout{600000};
  std::chrono::milliseconds connect_timeout{10000};
  // A connection silent this long after it opens is decided by its address alone: the client
  // waits for the server to speak first (SSH, SMTP, many databases).
  std::chrono::milliseconds quiet_decision{300};
  uint64_t max_bytes_per_s = 0;  // 0: unlimited; all connections together, both directions
  // DNS: questions a second (and burst) over UDP and TCP together, questions waiting on the
  // upstream resolver at once, its answer timeout, DNS-over-TCP connections at once.
  double dns_rate = 200;
  double dns_burst = 400;
  size_t max_upstream_queries = 64;
  std::chrono::milliseconds dns_timeout{2000};
  size_t max_dns_tcp_connections = 16;
  // The TTL given to the guest (and the life of a pin) is the upstream's clamped to this.
  std::chrono::seconds min_ttl{30};
  std::chrono::seconds max_ttl{3600};
  // The private ranges the node lets tenant allow CIDRs open (net::Policy::openable); the
  // policy file, which a tenant's request wrote, never says.
  std::vector<net::Rule> openable;
  // Credential TLS: the authorities an upstream's certificate must chain to (PEM; empty: the
  // host's trust store), and the time allowed for each side's TLS handshake.
  std::string upstream_ca_pem;
  std::chrono::milliseconds tls_handshake_timeout{10000};
};

class GatewayCore {
 public:
  GatewayCore(boost::asio::io_context& io, GatewayOptions options, PolicyFile policy, AuditLog audit,
              CredentialsFile credentials);

  // The policy to decide with now: the file is re-read if it changed, and a reload that fails
  // is audited (once per version of the file) while the previous policy stays in force.
  std::shared_ptr<const net::Policy> policy();
  // The current value of a credential secret (the file re-read if it changed), or null. Valid
  // until the next call.
  const std::string* secret(std::string_view name);
  // The signer of leaf certificates under the sandbox's credential CA (from the credentials
  // file, re-read if it changed), or null when the file has no CA or a bad one (audited once).
  net::LeafMinter* leafMinter();
  // The sandbox's placeholders (what the guest sees -> the secret's name), as of the last read
  // of the credentials file (secret() or leafMinter() re-read it).
  const std::map<std::string, std::string, std::less<>>& placeholders() const { return credentials_.placeholders(); }
  // TLS toward the guest (a leaf is set per connection) and toward credential rules' hosts
  // (peer verified against options.upstream_ca_pem or the host's store; the name per connection).
  boost::asio::ssl::context& guestTls() { return guest_tls_; }
  boost::asio::ssl::context& upstreamTls() { return upstream_tls_; }
  // Whether `ipv4` is an address of the upstream namespace itself (the host, by default): a
  // connection there would reach the host's own services over its loopback path, whatever
  // address they listen on. Refreshed at most once a second.
  bool isLocalAddress(uint32_t ipv4);

  boost::asio::io_context& io;
  const GatewayOptions options;
  AuditLog audit;
  DnsPins pins;
  std::optional<TokenBucket> bandwidth;
  size_t active_connections = 0;      // TCP connections, from accept to close
  size_t dns_upstream_in_flight = 0;  // questions waiting on the upstream resolver
  size_t dns_tcp_connections = 0;     // DNS-over-TCP connections open

 private:
  PolicyFile policy_;
  CredentialsFile credentials_;
  std::unique_ptr<net::LeafMinter> minter_;
  uint64_t minter_generation_ = 0;
  boost::asio::ssl::context guest_tls_;
  boost::asio::ssl::context upstream_tls_;
  std::shared_ptr<const net::Policy> seen_;       // the file's policy last made effective
  std::shared_ptr<const net::Policy> effective_;  // it, with the node's openable ranges
  std::vector<uint32_t> local_addresses_;
  std::chrono::steady_clock::time_point local_addresses_at_{};
};

}  // namespace space::gateway
