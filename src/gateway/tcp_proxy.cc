#include "gateway/tcp_proxy.h"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio/write.hpp>
#include <cctype>
#include <cstring>
#include <optional>
#include <vector>

#include "gateway/credential_injection.h"
#include "gateway/credential_tls.h"
#include "net/redactor.h"
#include "net/request_end.h"
#include "net/sniff.h"

#ifndef SO_ORIGINAL_DST
#define SO_ORIGINAL_DST 80  // linux/netfilter_ipv4.h, which does not mix with netinet/in.h
#endif

namespace space::gateway {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr size_t kRelayBuffer = 64 * 1024;
// An audit entry names at most this many of the destination's pinned names.
constexpr size_t kMaxAuditedPins = 8;

// Where the guest meant to connect, as the redirect recorded it.
bool originalDestination(tcp::socket& socket, uint32_t* ip, uint16_t* port) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getsockopt(socket.native_handle(), SOL_IP, SO_ORIGINAL_DST, &addr, &len) != 0 || addr.sin_family != AF_INET) {
    return false;
  }
  *ip = ntohl(addr.sin_addr.s_addr);
  *port = ntohs(addr.sin_port);
  return true;
}

// Loopback, "this network" and multicast/broadcast are never a destination, whatever the policy
// says: in the gateway's namespace they would reach the host itself or nothing sensible.
bool neverRoutable(uint32_t ip) {
  uint32_t first = ip >> 24;
  return first == 127 || first == 0 || first >= 224;
}

// Closes with RST: the guest learns "refused" at once instead of waiting on a timeout.
void reset(tcp::socket& socket) {
  error_code ignored;
  socket.set_option(asio::socket_base::linger(true, 0), ignored);
  socket.close(ignored);
}

int64_t millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

class TcpSession : public std::enable_shared_from_this<TcpSession> {
 public:
  TcpSession(std::shared_ptr<GatewayCore> core, tcp::socket guest, uint32_t ip, uint16_t port)
      : core_(std::move(core)),
        guest_(std::move(guest)),
        upstream_(core_->io),
        ip_(ip),
        port_(port),
        phase_timer_(core_->io),
        quiet_timer_(core_->io),
        idle_timer_(core_->io),
        pipes_{Pipe(core_->io), Pipe(core_->io)} {
    ++core_->active_connections;
  }
  ~TcpSession() { --core_->active_connections; }

  void start() {
    error_code ignored;
    guest_.set_option(tcp::no_delay(true), ignored);
    // Sniffing reads only what is already there (non-blocking), after a readiness wait that can
    // be cancelled without losing bytes: what arrives after the decision is relayed as is.
    guest_.non_blocking(true, ignored);
    phase_timer_.expires_after(core_->options.handshake_timeout);
    phase_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->state_ != State::kSniffing) return;
      self->deny("handshake-timeout", std::to_string(self->hello_.size()) + " bytes received");
    });
    quiet_timer_.expires_after(core_->options.quiet_decision);
    quiet_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->state_ != State::kSniffing || !self->hello_.empty()) return;
      error_code ignored;
      self->guest_.cancel(ignored);
      self->late_claim_check_ = true;
      self->decide("", "", "client silent: decided by address");
    });
    waitHello();
  }

 private:
  enum class State { kSniffing, kConnecting, kRelaying, kClosed };

  // One direction of the relay: read into buf, write it all to the other side, read again; the
  // buffer is the whole backlog, so a side that does not read stops the other from being read.
  struct Pipe {
    explicit Pipe(asio::io_context& io) : throttle(io) {}
    std::vector<uint8_t> buf;
    std::vector<uint8_t> out;  // what is written instead of buf when it was changed (redacted)
    uint64_t bytes = 0;
    bool done = false;
    asio::steady_timer throttle;
  };
  static constexpr int kOut = 0;  // guest -> upstream
  static constexpr int kIn = 1;   // upstream -> guest

  tcp::socket& source(int dir) { return dir == kOut ? guest_ : upstream_; }
  tcp::socket& sink(int dir) { return dir == kOut ? upstream_ : guest_; }

  void waitHello() {
    guest_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (self->state_ != State::kSniffing) return;
      if (ec) return self->close(true, "guest error: " + ec.message());
      self->readHello();
    });
  }

  void readHello() {
    size_t old = hello_.size();
    size_t room = net::kMaxSniffBytes - old;
    hello_.resize(old + room);
    error_code ec;
    size_t n = guest_.read_some(asio::buffer(hello_.data() + old, room), ec);
    hello_.resize(old + (ec ? 0 : n));
    if (ec == asio::error::would_block || ec == asio::error::try_again) return waitHello();
    if (ec) return close(false, "guest closed before a decision");
    net::SniffResult r = net::sniff(hello_);
    switch (r.status) {
      case net::SniffStatus::kNeedMore:
        if (hello_.size() >= net::kMaxSniffBytes) return deny("malformed", "handshake too large");
        return waitHello();
      case net::SniffStatus::kTls: return decide(r.name, "sni", r.name.empty() ? "TLS without SNI" : r.detail);
      case net::SniffStatus::kHttp: return decide(r.name, "host", r.detail);
      case net::SniffStatus::kOther: return decide("", "", r.detail.empty() ? "not TLS or HTTP" : r.detail);
      case net::SniffStatus::kMalformed: return deny("malformed", r.detail);
    }
  }

  void decide(const std::string& name, const std::string& claim, const std::string& detail) {
    name_ = name;
    claim_ = claim;
    detail_ = detail;
    if (neverRoutable(ip_)) return deny("never-routable", detail);
    if (core_->isLocalAddress(ip_)) return deny("local-address", detail);
    net::Decision decision = judge(name);
    reason_ = decision.reason;
    if (!decision.allowed) return deny(decision.reason, detail);
    if (!applyCredentials()) return;
    if (!injected_ && claim_ == "host") notePlaceholders();
    connect();
  }

  // A request to a credential rule's host gets the rule's headers (injectCredential) in place of
  // its head in hello_, over plain HTTP where the rule allows it; a TLS connection to such a host
  // is handed to the credential TLS session, which terminates it. False when this session's part
  // in the connection is over.
  bool applyCredentials() {
    if (claim_.empty() || name_.empty()) return true;
    const net::CredentialRule* rule = net::credentialFor(*decided_by_, name_, port_);
    if (rule == nullptr) return true;
    if (claim_ == "sni") {
      if (pipes_[kIn].bytes > 0) {
        // Decided by address, and the server spoke before the ClientHello came: its bytes are
        // in the guest's stream already, so the connection cannot become a terminated one.
        answerless("credential-late-tls", "a TLS claim for a credential rule's host came after the server spoke");
        return false;
      }
      if (core_->leafMinter() == nullptr) {
        detail_ = "a credential rule matches, but this gateway has no credential CA: TLS passes through without it";
        return true;
      }
      cancelTimers();
      state_ = State::kClosed;  // the TLS session audits the connection from here on
      error_code ignored;
      guest_.non_blocking(false, ignored);
      startCredentialTls(core_, std::move(guest_), std::move(hello_),
                         CredentialTlsFacts{ip_, port_, name_, reason_, pinned_, *rule, start_});
      return false;
    }
    if (!rule->plain_http) {
      detail_ = "a credential rule matches; not sent over plain HTTP (the rule's plain_http is false)";
      return true;
    }
    auto injected = injectCredential(*core_, *rule, hello_, name_, ip_);
    if (auto* refusal = std::get_if<Refusal>(&injected)) {
      answerGuest(refusal->status, refusal->reason, refusal->message);
      return false;
    }
    auto& injection = std::get<Injection>(injected);
    explicit_bzero(hello_.data(), hello_.size());
    hello_ = std::move(injection.bytes);
    // One request goes with the credential, and nothing after it on this connection.
    request_end_.emplace();
    const size_t keep = request_end_->take(hello_);
    if (request_end_->failed()) {
      explicit_bzero(hello_.data(), hello_.size());
      answerGuest(400, "malformed", "the request cannot be framed; nothing was sent");
      return false;
    }
    dropped_ += hello_.size() - keep;
    hello_.resize(keep);
    injected_ = true;
    // Audited when the connection ends, with the server's status and the bytes both ways.
    injected_method_ = std::move(injection.method);
    injected_path_ = std::move(injection.path);
    injected_secrets_ = std::move(injection.secrets);
    redactor_ = std::make_unique<net::Redactor>(std::move(injection.redact), injected_method_ == "HEAD");
    return true;
  }

  // A plain request to a host that is not a credential rule's that carries a placeholder goes
  // out unchanged (the placeholder is worth nothing there), and is audited: a guest sending its
  // stand-in for a secret to the wrong host is worth knowing about.
  void notePlaceholders() {
    (void)core_->secret("");  // the file re-read if it changed
    if (core_->placeholders().empty()) return;
    const std::string_view head(reinterpret_cast<const char*>(hello_.data()), hello_.size());
    nlohmann::json names = nlohmann::json::array();
    for (const auto& [seen, secret_name] : core_->placeholders()) {
      if (head.find(seen) != std::string_view::npos) names.push_back(secret_name);
    }
    if (names.empty()) return;
    auto e = entry(true, "placeholder-elsewhere");
    e["kind"] = "placeholder";
    e["secrets"] = std::move(names);
    e["detail"] = "sent unchanged: a placeholder becomes its secret only for credential rules' hosts";
    core_->audit.write(std::move(e));
  }

  // Ends the connection with a reset both ways, audited as a denial.
  void answerless(const std::string& reason, const std::string& detail) {
    detail_ = detail;
    auto e = entry(false, reason);
    e["duration_ms"] = millisecondsSince(start_);
    core_->audit.write(std::move(e));
    state_ = State::kClosed;
    cancelTimers();
    reset(guest_);
    reset(upstream_);
  }

  // An HTTP answer of the gateway's own to the guest, then the end of the connection.
  void answerGuest(int status, const std::string& reason, const std::string& message) {
    detail_ = message;
    auto e = entry(false, reason);
    e["duration_ms"] = millisecondsSince(start_);
    core_->audit.write(std::move(e));
    state_ = State::kClosed;
    cancelTimers();
    auto text = std::make_shared<std::string>(gatewayAnswer(status, message));
    asio::async_write(guest_, asio::buffer(*text), [self = shared_from_this(), text](error_code, size_t) {
      error_code ignored;
      self->guest_.shutdown(tcp::socket::shutdown_both, ignored);
      self->guest_.close(ignored);
    });
  }

  // The policy's word on this connection claiming `name` ("" for none).
  net::Decision judge(const std::string& name) {
    auto policy = core_->policy();
    net::ConnectionFacts facts;
    facts.destination = ip_;
    facts.port = port_;
    facts.name = name;
    facts.pinned_names = core_->pins.namesFor(ip_, DnsPins::Clock::now());
    pinned_ = facts.pinned_names;
    if (pinned_.size() > kMaxAuditedPins) pinned_.resize(kMaxAuditedPins);
    decided_by_ = policy;
    return net::decideConnection(*policy, facts);
  }

  // A client silent at first was decided by its address, and the server may have spoken since;
  // its first bytes may still claim a name (a TLS client slower than the quiet window, as guests
  // under emulation are, or one that waits on purpose). The claim is judged as if it had come in
  // time, so waiting out the window gains nothing: a denied or unpinned name resets both sides.
  void lateClaim(size_t n) {
    const uint8_t* data = pipes_[kOut].buf.data();
    hello_.insert(hello_.end(), data, data + n);
    net::SniffResult r = net::sniff(hello_);
    if (r.status == net::SniffStatus::kNeedMore && hello_.size() < net::kMaxSniffBytes) return read(kOut);
    late_claim_check_ = false;
    std::string name, claim;
    if (r.status == net::SniffStatus::kTls) {
      name = r.name;
      claim = "sni";
    } else if (r.status == net::SniffStatus::kHttp) {
      name = r.name;
      claim = "host";
    }
    if (r.status == net::SniffStatus::kMalformed || !name.empty()) {
      net::Decision decision =
          r.status == net::SniffStatus::kMalformed ? net::Decision{false, "malformed"} : judge(name);
      if (!decision.allowed) {
        name_ = name;
        claim_ = claim;
        auto e = entry(false, decision.reason);
        e["detail"] = "claimed after the quiet window" + (r.detail.empty() ? std::string() : ": " + r.detail);
        e["bytes_out"] = pipes_[kOut].bytes;
        e["bytes_in"] = pipes_[kIn].bytes;
        e["duration_ms"] = millisecondsSince(start_);
        core_->audit.write(std::move(e));
        spdlog::debug("tcp: denied {}:{} on a late claim ({})", net::ipv4ToString(ip_), port_, decision.reason);
        state_ = State::kClosed;
        cancelTimers();
        reset(guest_);
        reset(upstream_);
        return;
      }
      name_ = name;
      claim_ = claim;
      reason_ = decision.reason;
      if (!applyCredentials()) {
        reset(upstream_);
        return;
      }
    }
    pipes_[kOut].bytes += hello_.size();
    // Counted against the bandwidth limit like relayed bytes (the debt slows the next reads).
    if (core_->bandwidth) (void)core_->bandwidth->take(static_cast<double>(hello_.size()));
    asio::async_write(upstream_, asio::buffer(hello_), [self = shared_from_this()](error_code ec, size_t) {
      if (self->state_ != State::kRelaying) return;
      if (ec) return self->close(true, "upstream write: " + ec.message());
      if (self->injected_) explicit_bzero(self->hello_.data(), self->hello_.size());
      self->hello_.clear();
      self->hello_.shrink_to_fit();
      self->read(kOut);
    });
  }

  nlohmann::json entry(bool allowed, const std::string& reason) const {
    nlohmann::json e{{"kind", "tcp"},
                     {"allowed", allowed},
                     {"reason", reason},
                     {"destination", net::ipv4ToString(ip_)},
                     {"port", port_}};
    if (!claim_.empty()) e[claim_] = name_;
    if (!detail_.empty()) e["detail"] = detail_;
    if (!pinned_.empty()) e["pinned"] = pinned_;
    return e;
  }

  void deny(const std::string& reason, const std::string& detail) {
    detail_ = detail;
    auto e = entry(false, reason);
    e["bytes_out"] = hello_.size();
    e["duration_ms"] = millisecondsSince(start_);
    core_->audit.write(std::move(e));
    spdlog::debug("tcp: denied {}:{} ({})", net::ipv4ToString(ip_), port_, reason);
    state_ = State::kClosed;
    cancelTimers();
    reset(guest_);
  }

  void connect() {
    state_ = State::kConnecting;
    error_code ec;
    upstream_.open(tcp::v4(), ec);
    if (ec) return close(true, "upstream socket: " + ec.message());
    upstream_.set_option(tcp::no_delay(true), ec);
    phase_timer_.expires_after(core_->options.connect_timeout);
    phase_timer_.async_wait([self = shared_from_this()](error_code wait_ec) {
      if (!wait_ec && self->state_ == State::kConnecting) self->close(true, "connect timeout");
    });
    tcp::endpoint to(asio::ip::address_v4(ip_), port_);
    upstream_.async_connect(to, [self = shared_from_this()](error_code connect_ec) {
      if (self->state_ != State::kConnecting) return;
      if (connect_ec) return self->close(true, "connect: " + connect_ec.message());
      self->relay();
    });
  }

  void relay() {
    state_ = State::kRelaying;
    error_code ignored;
    phase_timer_.cancel();
    guest_.non_blocking(false, ignored);
    last_activity_ = std::chrono::steady_clock::now();
    armIdle(core_->options.idle_timeout);
    pipes_[kOut].buf.resize(kRelayBuffer);
    pipes_[kIn].buf.resize(kRelayBuffer);
    read(kIn);
    if (hello_.empty()) return read(kOut);
    // What the guest sent before the decision goes first, then the relay proper.
    pipes_[kOut].bytes = hello_.size();
    asio::async_write(upstream_, asio::buffer(hello_), [self = shared_from_this()](error_code ec, size_t) {
      if (self->state_ != State::kRelaying) return;
      if (ec) return self->close(true, "upstream write: " + ec.message());
      if (self->injected_) explicit_bzero(self->hello_.data(), self->hello_.size());
      self->hello_.clear();
      self->hello_.shrink_to_fit();
      self->read(kOut);
    });
  }

  void read(int dir) {
    Pipe& pipe = pipes_[dir];
    source(dir).async_read_some(asio::buffer(pipe.buf), [self = shared_from_this(), dir](error_code ec, size_t n) {
      if (self->state_ != State::kRelaying) return;
      if (ec == asio::error::eof && dir == kOut && self->late_claim_check_ && !self->hello_.empty()) {
        return self->close(true, "guest ended inside its first message");
      }
      if (ec == asio::error::eof && dir == kIn && self->redactor_ && self->redactor_->holding()) {
        // What the redactor held back goes before the end is passed on.
        Pipe& in = self->pipes_[kIn];
        in.out.clear();
        self->redactor_->finish(in.out);
        return self->write(kIn, in.out.size(), in.out.data(), /*then_half_close=*/true);
      }
      if (ec == asio::error::eof) return self->halfClose(dir);
      if (ec) return self->close(true, (dir == kOut ? "guest: " : "upstream: ") + ec.message());
      self->last_activity_ = std::chrono::steady_clock::now();
      if (dir == kOut && self->late_claim_check_) return self->lateClaim(n);
      if (dir == kOut && self->request_end_) {
        const size_t keep = self->request_end_->take(std::span(self->pipes_[kOut].buf.data(), n));
        self->dropped_ += n - keep;
        if (self->request_end_->failed()) return self->close(true, "the credentialed request's framing is broken");
        if (keep == 0) return self->read(kOut);  // after the request: read (to see the end), never sent
        n = keep;
      }
      if (dir == kIn && self->injected_ && !self->status_seen_) {
        self->status_seen_ = true;
        self->noteStatus(n);
      }
      if (dir == kIn && self->redactor_) {
        // The server's answer, with the values the gateway added masked (an echo of the headers).
        Pipe& in = self->pipes_[kIn];
        in.out.clear();
        self->redactor_->feed(std::span(in.buf.data(), n), in.out);
        if (!self->redactor_->refused().empty()) return self->refuseAnswer();
        if (in.out.empty()) return self->read(kIn);
        return self->write(kIn, in.out.size(), in.out.data());
      }
      self->write(dir, n);
    });
  }

  // Writes `n` bytes of `data` (the pipe's read buffer unless given) to the other side, then
  // reads again (or passes the end on).
  void write(int dir, size_t n, const uint8_t* data = nullptr, bool then_half_close = false) {
    Pipe& pipe = pipes_[dir];
    pipe.bytes += n;
    auto wait = core_->bandwidth ? core_->bandwidth->take(static_cast<double>(n)) : std::chrono::nanoseconds(0);
    asio::async_write(sink(dir), asio::buffer(data != nullptr ? data : pipe.buf.data(), n),
                      [self = shared_from_this(), dir, wait, then_half_close](error_code ec, size_t) {
                        if (self->state_ != State::kRelaying) return;
                        if (ec) return self->close(true, (dir == kOut ? "upstream: " : "guest: ") + ec.message());
                        self->last_activity_ = std::chrono::steady_clock::now();
                        if (then_half_close) return self->halfClose(dir);
                        if (wait <= std::chrono::nanoseconds(0)) return self->read(dir);
                        Pipe& pipe = self->pipes_[dir];
                        pipe.throttle.expires_after(wait);
                        pipe.throttle.async_wait([self, dir](error_code wait_ec) {
                          if (!wait_ec && self->state_ == State::kRelaying) self->read(dir);
                        });
                      });
  }

  // The server's answer to a credentialed request cannot be masked (net::Redactor said why): the
  // guest gets the gateway's 502 if nothing of the answer reached it yet, else a reset.
  void refuseAnswer() {
    const std::string why = redactor_->refused();
    if (pipes_[kIn].bytes > 0) return close(true, "answer refused: " + why);
    auto text = std::make_shared<std::string>(gatewayAnswer(502, why + "; the answer was not passed on"));
    pipes_[kIn].bytes = text->size();
    injected_status_ = 502;
    asio::async_write(guest_, asio::buffer(*text), [self = shared_from_this(), text, why](error_code, size_t) {
      self->close(false, "answer refused: " + why);
    });
  }

  // The status of the server's answer to an injected request, from its first bytes ("HTTP/1.1 200").
  void noteStatus(size_t n) { injected_status_ = answerStatus(std::span(pipes_[kIn].buf.data(), n)); }

  // One side finished sending: pass the FIN on and keep relaying the other way.
  void halfClose(int dir) {
    pipes_[dir].done = true;
    error_code ignored;
    sink(dir).shutdown(tcp::socket::shutdown_send, ignored);
    if (pipes_[kOut].done && pipes_[kIn].done) close(false, "closed");
  }

  void armIdle(std::chrono::steady_clock::duration after) {
    idle_timer_.expires_after(after);
    idle_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->state_ != State::kRelaying) return;
      auto idle = std::chrono::steady_clock::now() - self->last_activity_;
      auto limit = self->core_->options.idle_timeout;
      if (idle >= limit) return self->close(true, "idle timeout");
      self->armIdle(limit - idle);
    });
  }

  void cancelTimers() {
    phase_timer_.cancel();
    quiet_timer_.cancel();
    idle_timer_.cancel();
    pipes_[kOut].throttle.cancel();
    pipes_[kIn].throttle.cancel();
  }

  // Ends the connection (with RST both ways when `abort`), auditing an allowed one.
  void close(bool abort, const std::string& end) {
    if (state_ == State::kClosed) return;
    bool was_allowed = state_ == State::kConnecting || state_ == State::kRelaying;
    state_ = State::kClosed;
    cancelTimers();
    error_code ignored;
    if (abort) {
      reset(guest_);
      reset(upstream_);
    } else {
      guest_.close(ignored);
      upstream_.close(ignored);
    }
    if (!was_allowed) {
      spdlog::debug("tcp: {}:{}: {}", net::ipv4ToString(ip_), port_, end);
      return;
    }
    auto e = entry(true, reason_);
    if (injected_) {
      e["kind"] = "credential";
      e["method"] = injected_method_;
      e["path"] = injected_path_;
      e["secrets"] = injected_secrets_;
      if (dropped_ > 0) e["dropped_bytes"] = dropped_;
      if (redactor_ && redactor_->masked() > 0) e["masked_in_answer"] = redactor_->masked();
      if (injected_status_ != 0) e["status"] = injected_status_;
    }
    e["end"] = end;
    e["bytes_out"] = pipes_[kOut].bytes;
    e["bytes_in"] = pipes_[kIn].bytes;
    e["duration_ms"] = millisecondsSince(start_);
    core_->audit.write(std::move(e));
  }

  std::shared_ptr<GatewayCore> core_;
  tcp::socket guest_;
  tcp::socket upstream_;
  uint32_t ip_;
  uint16_t port_;
  State state_ = State::kSniffing;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_activity_;
  asio::steady_timer phase_timer_;  // the handshake, then the upstream connect
  asio::steady_timer quiet_timer_;  // a silent client is decided by address
  asio::steady_timer idle_timer_;
  std::vector<uint8_t> hello_;
  bool late_claim_check_ = false;  // decided by address: the first bytes, when they come, are judged
  std::string name_, claim_, detail_, reason_;
  std::vector<std::string> pinned_;                // the names whose answers included the destination
  std::shared_ptr<const net::Policy> decided_by_;  // the policy of the last decision
  bool injected_ = false;                          // a credential rule's headers were added
  std::string injected_method_, injected_path_;
  std::vector<std::string> injected_secrets_;   // their names, never values
  int injected_status_ = 0;                     // the server's answer, once seen
  bool status_seen_ = false;                    // its first bytes were looked at
  std::optional<net::RequestEnd> request_end_;  // where the credentialed request ends
  std::unique_ptr<net::Redactor> redactor_;     // masks the added values in the answer
  uint64_t dropped_ = 0;                        // guest bytes after it, never sent
  std::array<Pipe, 2> pipes_;
};

}  // namespace

TcpProxy::TcpProxy(std::shared_ptr<GatewayCore> core, tcp::acceptor acceptor)
    : core_(std::move(core)), acceptor_(std::move(acceptor)), retry_(core_->io) {}

void TcpProxy::start() { accept(); }

void TcpProxy::accept() {
  acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, most likely: wait rather than spin on a listener that stays ready.
      spdlog::warn("tcp: accept failed: {}", ec.message());
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](error_code wait_ec) {
        if (!wait_ec) accept();
      });
      return;
    }
    uint32_t ip = 0;
    uint16_t port = 0;
    if (!originalDestination(socket, &ip, &port)) {
      // Not a redirected connection: nothing to relay it to.
      reset(socket);
    } else if (core_->active_connections >= core_->options.max_connections) {
      core_->audit.write({{"kind", "tcp"},
                          {"allowed", false},
                          {"reason", "max-connections"},
                          {"destination", net::ipv4ToString(ip)},
                          {"port", port}});
      reset(socket);
    } else {
      std::make_shared<TcpSession>(core_, std::move(socket), ip, port)->start();
    }
    accept();
  });
}

}  // namespace space::gateway
