#include "gateway/gateway_core.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "common/unix_socket.h"

namespace space::gateway {

namespace {

namespace ssl = boost::asio::ssl;

// Guests speak HTTP/1.1 to a terminating gateway: it reads and rewrites HTTP/1.1 heads only. A
// client offering ALPN gets http/1.1 if it offers it, and no ALPN otherwise (HTTP/1.1 by default).
int selectHttp11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
                 void*) {
  static constexpr unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kHttp11, sizeof kHttp11, in, inlen) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_NOACK;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

}  // namespace

GatewayCore::GatewayCore(boost::asio::io_context& io, GatewayOptions options, PolicyFile policy, AuditLog audit,
                         CredentialsFile credentials)
    : io(io),
      options(std::move(options)),
      audit(std::move(audit)),
      policy_(std::move(policy)),
      credentials_(std::move(credentials)),
      guest_tls_(ssl::context::tls_server),
      upstream_tls_(ssl::context::tls_client) {
  if (this->options.max_bytes_per_s > 0) {
    double rate = static_cast<double>(this->options.max_bytes_per_s);
    // A quarter second of burst: smooth enough, and a 64 KiB read always fits eventually.
    bandwidth.emplace(rate, std::max(rate / 4, 65536.0));
  }
  constexpr auto kNoOldProtocols = ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1;
  guest_tls_.set_options(kNoOldProtocols | SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_alpn_select_cb(guest_tls_.native_handle(), selectHttp11, nullptr);
  // No resumption toward the guest: TLS 1.3 would keep session state per ticket in the
  // context's cache, which a guest handshaking in a loop would fill.
  SSL_CTX_set_session_cache_mode(guest_tls_.native_handle(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_num_tickets(guest_tls_.native_handle(), 0);
  upstream_tls_.set_options(kNoOldProtocols | SSL_OP_NO_RENEGOTIATION);
  upstream_tls_.set_verify_mode(ssl::verify_peer);
  boost::system::error_code ec;
  if (this->options.upstream_ca_pem.empty()) {
    upstream_tls_.set_default_verify_paths(ec);
  } else {
    upstream_tls_.add_certificate_authority(boost::asio::buffer(this->options.upstream_ca_pem), ec);
  }
  // Without trust anchors every upstream fails verification: no secret is ever sent.
  if (ec) spdlog::error("credential TLS: cannot load the upstream trust store: {}", ec.message());
  static constexpr unsigned char kAlpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(upstream_tls_.native_handle(), kAlpn, sizeof kAlpn);
}

net::LeafMinter* GatewayCore::leafMinter() {
  (void)secret("");  // the file re-read if it changed
  if (credentials_.generation() != minter_generation_) {
    minter_generation_ = credentials_.generation();
    minter_.reset();
    if (!credentials_.caCertPem().empty()) {
      auto minter = net::LeafMinter::fromPem(credentials_.caCertPem(), credentials_.caKeyPem());
      if (minter.ok()) {
        minter_ = std::move(minter.value());
      } else {
        spdlog::warn("credential TLS: the credentials file's CA is unusable: {}", minter.error().message);
        audit.write({{"kind", "gateway"},
                     {"allowed", false},
                     {"reason", "credentials-ca-unusable"},
                     {"detail", minter.error().message}});
      }
    }
  }
  return minter_.get();
}

std::shared_ptr<const net::Policy> GatewayCore::policy() {
  auto refresh = policy_.refresh();
  if (refresh.reloaded) {
    spdlog::info("policy reloaded: mode {}", net::modeName(policy_.current()->mode));
  } else if (refresh.failure) {
    spdlog::warn("policy reload failed, the previous policy stays: {}", *refresh.failure);
    audit.write(
        {{"kind", "gateway"}, {"allowed", false}, {"reason", "policy-reload-failed"}, {"detail", *refresh.failure}});
  }
  auto current = policy_.current();
  if (current != seen_) {
    auto effective = std::make_shared<net::Policy>(*current);
    effective->openable = options.openable;
    effective_ = std::move(effective);
    seen_ = std::move(current);
  }
  return effective_;
}

const std::string* GatewayCore::secret(std::string_view name) {
  if (auto failure = credentials_.refresh()) {
    spdlog::warn("credentials reload failed, the previous values stay: {}", *failure);
    audit.write(
        {{"kind", "gateway"}, {"allowed", false}, {"reason", "credentials-reload-failed"}, {"detail", *failure}});
  }
  return credentials_.secret(name);
}

namespace {

// The IPv4 addresses of the calling thread's network namespace: every address of every
// interface (the kernel lists secondary ones too, under their labels), in host order. By the
// SIOCGIFCONF ioctl on an IPv4 socket rather than getifaddrs, which asks routing netlink
// through a socket it binds: a confined gateway may make no netlink socket and bind nothing
// (jail/seccomp_policy.h). nullopt with errno set if they cannot be listed.
std::optional<std::vector<uint32_t>> namespaceAddresses() {
  UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return std::nullopt;
  // A full buffer may have been cut short: asked again with twice the room, up to a bound no
  // host reaches (2.5 MiB).
  constexpr size_t kMostEntries = size_t{1} << 16;
  std::vector<ifreq> entries(32);
  size_t listed = 0;
  for (;;) {
    ifconf conf{};
    conf.ifc_len = static_cast<int>(entries.size() * sizeof(ifreq));
    conf.ifc_req = entries.data();
    if (::ioctl(fd.get(), SIOCGIFCONF, &conf) != 0) return std::nullopt;
    listed = static_cast<size_t>(conf.ifc_len) / sizeof(ifreq);
    if (listed < entries.size()) break;
    if (entries.size() >= kMostEntries) {
      errno = E2BIG;
      return std::nullopt;
    }
    entries.resize(entries.size() * 2);
  }
  std::vector<uint32_t> addresses;
  for (size_t i = 0; i < listed; ++i) {
    if (entries[i].ifr_addr.sa_family != AF_INET) continue;
    addresses.push_back(ntohl(reinterpret_cast<const sockaddr_in*>(&entries[i].ifr_addr)->sin_addr.s_addr));
  }
  return addresses;
}

}  // namespace

bool GatewayCore::isLocalAddress(uint32_t ipv4) {
  auto now = std::chrono::steady_clock::now();
  if (local_addresses_at_ == std::chrono::steady_clock::time_point{} ||
      now - local_addresses_at_ > std::chrono::seconds(1)) {
    // The calling thread is in the upstream namespace.
    if (auto addresses = namespaceAddresses()) {
      local_addresses_ = std::move(*addresses);
      local_addresses_at_ = now;
    } else {
      // The last list stays (the egress table refuses the namespace's addresses anyway), and
      // the next try waits its second.
      spdlog::warn("cannot list the upstream namespace's addresses: {}", strerror(errno));
      local_addresses_at_ = now;
    }
  }
  return std::find(local_addresses_.begin(), local_addresses_.end(), ipv4) != local_addresses_.end();
}

}  // namespace space::gateway
