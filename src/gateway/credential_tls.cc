#include "gateway/credential_tls.h"

#include <openssl/x509_vfy.h>
#include <spdlog/spdlog.h>

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <cstring>

#include "gateway/credential_injection.h"
#include "net/redactor.h"
#include "net/request_end.h"
#include "net/sniff.h"

namespace space::gateway {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

// TLS records carry at most 16 KiB of plaintext: one read's worth.
constexpr size_t kRelayBuffer = 16 * 1024;
// How long a closing side gets to answer close_notify before its socket is just closed.
constexpr auto kShutdownGrace = std::chrono::seconds(2);

// The guest's socket with the bytes already read from it put back in front, so that TLS reads
// the ClientHello the decision needed first, then the socket. A stream in Asio's sense, for
// ssl::stream to sit on.
class ReplayStream {
 public:
  using executor_type = tcp::socket::executor_type;
  using lowest_layer_type = tcp::socket::lowest_layer_type;

  ReplayStream(tcp::socket socket, std::vector<uint8_t> replay)
      : socket_(std::move(socket)), replay_(std::move(replay)) {}

  executor_type get_executor() { return socket_.get_executor(); }
  lowest_layer_type& lowest_layer() { return socket_.lowest_layer(); }
  const lowest_layer_type& lowest_layer() const { return socket_.lowest_layer(); }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    return asio::async_initiate<Token, void(error_code, size_t)>(
        [this](auto handler, const MutableBuffers& into) {
          if (offset_ < replay_.size()) {
            size_t n = asio::buffer_copy(into, asio::buffer(replay_.data() + offset_, replay_.size() - offset_));
            offset_ += n;
            // Never completed inline: the caller may be inside the operation it started.
            asio::post(socket_.get_executor(),
                       [h = std::move(handler), n]() mutable { std::move(h)(error_code(), n); });
            return;
          }
          socket_.async_read_some(into, std::move(handler));
        },
        token, buffers);
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    return socket_.async_write_some(buffers, std::forward<Token>(token));
  }

 private:
  tcp::socket socket_;
  std::vector<uint8_t> replay_;
  size_t offset_ = 0;
};

int64_t millisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

bool endOfStream(const error_code& ec) {
  // A peer that closes without close_notify (common for HTTP servers that framed their answer)
  // reads as stream_truncated: the end of its data all the same.
  return ec == asio::error::eof || ec == ssl::error::stream_truncated;
}

class CredentialTlsSession : public std::enable_shared_from_this<CredentialTlsSession> {
 public:
  CredentialTlsSession(std::shared_ptr<GatewayCore> core, tcp::socket guest, std::vector<uint8_t> already_read,
                       CredentialTlsFacts facts)
      : core_(std::move(core)),
        guest_(ReplayStream(std::move(guest), std::move(already_read)), core_->guestTls()),
        upstream_(core_->io, core_->upstreamTls()),
        facts_(std::move(facts)),
        phase_timer_(core_->io),
        idle_timer_(core_->io),
        pipes_{Pipe(core_->io), Pipe(core_->io)} {
    ++core_->active_connections;
  }
  ~CredentialTlsSession() {
    if (!injection_.empty()) explicit_bzero(injection_.data(), injection_.size());
    --core_->active_connections;
  }

  void start() {
    net::LeafMinter* minter = core_->leafMinter();
    auto leaf = minter ? minter->leafFor(facts_.name, std::chrono::system_clock::now())
                       : Result<const net::LeafCertificate*>(makeError(ErrorCode::kUnavailable, "no credential CA"));
    SSL* ssl = guest_.native_handle();
    if (!leaf.ok() || SSL_use_certificate(ssl, leaf.value()->cert.get()) != 1 ||
        SSL_use_PrivateKey(ssl, leaf.value()->key) != 1) {
      return refuseBeforeTls("credential-tls-unavailable",
                             leaf.ok() ? "cannot use the leaf certificate" : leaf.error().message);
    }
    armPhase(core_->options.tls_handshake_timeout, "the guest's TLS handshake timed out");
    guest_.async_handshake(ssl::stream_base::server, [self = shared_from_this()](error_code ec) {
      if (self->over()) return;
      if (ec) {
        // Most often a guest that does not trust its sandbox's CA (an "unknown ca" alert).
        return self->refuseBeforeTls("credential-tls-handshake-failed", "guest TLS handshake: " + ec.message());
      }
      self->guest_tls_up_ = true;
      self->readRequest();
    });
  }

 private:
  static constexpr int kOut = 0;  // guest -> upstream
  static constexpr int kIn = 1;   // upstream -> guest
  struct Pipe {
    explicit Pipe(asio::io_context& io) : throttle(io) {}
    std::array<uint8_t, kRelayBuffer> buf{};
    std::vector<uint8_t> out;  // what is written instead of buf when it was changed (redacted)
    uint64_t bytes = 0;
    bool done = false;
    asio::steady_timer throttle;
  };

  bool over() const { return done_ || answered_; }

  void armPhase(std::chrono::milliseconds after, std::string what) {
    phase_timer_.expires_after(after);
    phase_timer_.async_wait([self = shared_from_this(), what = std::move(what)](error_code ec) {
      if (ec || self->over()) return;
      if (self->injected_) return self->finish(true, what);
      if (!self->guest_tls_up_) return self->refuseBeforeTls("credential-timeout", what);
      self->answer(504, "credential-timeout", what + "; nothing was sent");
    });
  }

  // The request head, decrypted, until net::sniff has all of it (at most kMaxSniffBytes).
  void readRequest() {
    const size_t old = request_.size();
    request_.resize(net::kMaxSniffBytes);
    guest_.async_read_some(asio::buffer(request_.data() + old, request_.size() - old),
                           [self = shared_from_this(), old](error_code ec, size_t n) {
                             if (self->over()) return;
                             self->request_.resize(old + (ec ? 0 : n));
                             if (ec) return self->refuseBeforeTls("credential-no-request", "guest: " + ec.message());
                             self->judgeRequest();
                           });
  }

  void judgeRequest() {
    net::SniffResult r = net::sniff(request_);
    if (r.status == net::SniffStatus::kNeedMore) {
      if (request_.size() >= net::kMaxSniffBytes) return answer(400, "malformed", "the request head is too large");
      return readRequest();
    }
    if (r.status != net::SniffStatus::kHttp) {
      return answer(400, "malformed",
                    "not an HTTP/1.x request (" + (r.detail.empty() ? std::string("unknown") : r.detail) +
                        "): a credential is added to HTTP/1.1 only; nothing was sent");
    }
    if (r.name != facts_.name) {
      // The TLS name chose the rule and the certificate; a Host naming another host would have
      // the secret travel to a server that answers for it on this address.
      return answer(421, "credential-host-mismatch",
                    "the request's Host " + r.name.substr(0, 253) + " is not the TLS server name " + facts_.name +
                        "; nothing was sent");
    }
    auto injected = injectCredential(*core_, facts_.rule, request_, facts_.name, facts_.ip);
    explicit_bzero(request_.data(), request_.size());
    request_.clear();
    if (auto* refusal = std::get_if<Refusal>(&injected))
      return answer(refusal->status, refusal->reason, refusal->message);
    auto& injection = std::get<Injection>(injected);
    injection_ = std::move(injection.bytes);
    method_ = std::move(injection.method);
    path_ = std::move(injection.path);
    secrets_ = std::move(injection.secrets);
    redactor_ = std::make_unique<net::Redactor>(std::move(injection.redact), method_ == "HEAD");
    connect();
  }

  void connect() {
    error_code ec;
    auto& socket = upstream_.next_layer();
    socket.open(tcp::v4(), ec);
    if (ec) return answer(502, "credential-upstream-failed", "upstream socket: " + ec.message() + "; nothing was sent");
    socket.set_option(tcp::no_delay(true), ec);
    armPhase(core_->options.connect_timeout, "the upstream connection timed out");
    socket.async_connect(tcp::endpoint(asio::ip::address_v4(facts_.ip), facts_.port), [self = shared_from_this()](
                                                                                          error_code connect_ec) {
      if (self->over()) return;
      if (connect_ec) {
        return self->answer(502, "credential-upstream-failed",
                            "cannot connect to " + net::ipv4ToString(self->facts_.ip) + ":" +
                                std::to_string(self->facts_.port) + ": " + connect_ec.message() + "; nothing was sent");
      }
      self->upstreamHandshake();
    });
  }

  void upstreamHandshake() {
    SSL* ssl = upstream_.native_handle();
    // The rule's name, not the address: the certificate must be valid for the host the secret
    // belongs to, which is what makes a wrong pin or a rebinding harmless.
    if (SSL_set_tlsext_host_name(ssl, facts_.name.c_str()) != 1 || SSL_set1_host(ssl, facts_.name.c_str()) != 1) {
      return answer(502, "credential-upstream-failed", "cannot set the upstream's name; nothing was sent");
    }
    armPhase(core_->options.tls_handshake_timeout, "the upstream's TLS handshake timed out");
    upstream_.async_handshake(ssl::stream_base::client, [self = shared_from_this()](error_code ec) {
      if (self->over()) return;
      if (ec) {
        const long verify = SSL_get_verify_result(self->upstream_.native_handle());
        const std::string why = verify != X509_V_OK ? X509_verify_cert_error_string(verify) : ec.message();
        return self->answer(502, "credential-upstream-unverified",
                            "the server at " + net::ipv4ToString(self->facts_.ip) + " did not prove to be " +
                                self->facts_.name + " (" + why + "); nothing was sent");
      }
      self->sendRequest();
    });
  }

  void sendRequest() {
    phase_timer_.cancel();
    // One request goes with the credential, and nothing after it on this connection.
    const size_t keep = request_end_.take(injection_);
    if (request_end_.failed()) {
      explicit_bzero(injection_.data(), injection_.size());
      return answer(400, "malformed", "the request cannot be framed; nothing was sent");
    }
    injected_ = true;
    dropped_ += injection_.size() - keep;
    injection_.resize(keep);
    pipes_[kOut].bytes = injection_.size();
    last_activity_ = std::chrono::steady_clock::now();
    armIdle(core_->options.idle_timeout);
    asio::async_write(upstream_, asio::buffer(injection_), [self = shared_from_this()](error_code ec, size_t) {
      explicit_bzero(self->injection_.data(), self->injection_.size());
      self->injection_.clear();
      if (self->over()) return;
      if (ec) return self->finish(true, "upstream write: " + ec.message());
      self->read(kOut);
      self->read(kIn);
    });
  }

  template <class Fn>
  void withStream(int dir, Fn&& fn) {
    if (dir == kOut) {
      fn(guest_);
    } else {
      fn(upstream_);
    }
  }

  void read(int dir) {
    Pipe& pipe = pipes_[dir];
    auto on_read = [self = shared_from_this(), dir](error_code ec, size_t n) {
      if (self->over()) return;
      // The guest's read, cancelled so that close_notify can be sent (shutdownGuest).
      if (dir == kOut && self->shutting_down_) return self->startGuestShutdown();
      if (endOfStream(ec) && dir == kIn && self->redactor_ && self->redactor_->holding()) {
        // What the redactor held back goes before the end is passed on.
        Pipe& in = self->pipes_[kIn];
        in.out.clear();
        self->redactor_->finish(in.out);
        return self->write(kIn, in.out.size(), in.out.data(), /*then_end=*/true);
      }
      if (endOfStream(ec)) return self->sideEnded(dir);
      if (ec) return self->finish(true, (dir == kOut ? "guest: " : "upstream: ") + ec.message());
      self->last_activity_ = std::chrono::steady_clock::now();
      if (dir == kIn && !self->status_seen_) {
        self->status_seen_ = true;
        self->noteStatus(n);
      }
      if (dir == kIn && self->redactor_) {
        // The server's answer, with the values the gateway added masked (an echo of the headers).
        Pipe& in = self->pipes_[kIn];
        in.out.clear();
        self->redactor_->feed(std::span(in.buf.data(), n), in.out);
        if (!self->redactor_->refused().empty()) {
          // Nothing of the answer reached the guest yet: it gets the gateway's 502; else a reset.
          if (self->pipes_[kIn].bytes > 0) return self->finish(true, "answer refused: " + self->redactor_->refused());
          self->status_ = 502;
          return self->answerInstead(self->redactor_->refused() + "; the answer was not passed on");
        }
        if (in.out.empty()) return self->read(kIn);
        return self->write(kIn, in.out.size(), in.out.data());
      }
      if (dir == kOut) {
        const size_t keep = self->request_end_.take(std::span(self->pipes_[kOut].buf.data(), n));
        self->dropped_ += n - keep;
        if (self->request_end_.failed()) return self->finish(true, "the credentialed request's framing is broken");
        if (keep == 0) return self->read(kOut);  // after the request: read (to see the end), never sent
        n = keep;
      }
      self->write(dir, n);
    };
    withStream(dir, [&](auto& stream) { stream.async_read_some(asio::buffer(pipe.buf), std::move(on_read)); });
  }

  // Writes `n` bytes of `data` (the pipe's read buffer unless given) to the other side, then
  // reads again (or, `then_end`, passes the side's end on).
  void write(int dir, size_t n, const uint8_t* data = nullptr, bool then_end = false) {
    Pipe& pipe = pipes_[dir];
    pipe.bytes += n;
    auto wait = core_->bandwidth ? core_->bandwidth->take(static_cast<double>(n)) : std::chrono::nanoseconds(0);
    auto on_written = [self = shared_from_this(), dir, wait, then_end](error_code ec, size_t) {
      if (self->over()) return;
      if (ec) return self->finish(true, (dir == kOut ? "upstream: " : "guest: ") + ec.message());
      self->last_activity_ = std::chrono::steady_clock::now();
      if (then_end) return self->sideEnded(dir);
      if (wait <= std::chrono::nanoseconds(0)) return self->read(dir);
      Pipe& throttled = self->pipes_[dir];
      throttled.throttle.expires_after(wait);
      throttled.throttle.async_wait([self, dir](error_code wait_ec) {
        if (!wait_ec && !self->over()) self->read(dir);
      });
    };
    // The other side of `dir` is where its bytes go.
    withStream(1 - dir, [&](auto& stream) {
      asio::async_write(stream, asio::buffer(data != nullptr ? data : pipe.buf.data(), n), std::move(on_written));
    });
  }

  // One side finished: the server's end (its answer is complete, as Connection: close asked)
  // ends the connection, after the guest is told with close_notify; the guest's end waits for
  // the server's answer.
  void sideEnded(int dir) {
    pipes_[dir].done = true;
    if (dir == kOut && !pipes_[kIn].done) return;
    shutdownGuest("closed");
  }

  // An ssl::stream runs no shutdown beside a read: the guest's pending read is cancelled first
  // (its handler then starts the shutdown), unless the guest had ended already.
  void shutdownGuest(const std::string& end) {
    if (shutting_down_) return;
    shutting_down_ = true;
    end_ = end;
    phase_timer_.expires_after(kShutdownGrace);
    phase_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec && !self->over()) self->finish(false, self->end_);
    });
    if (pipes_[kOut].done) return startGuestShutdown();
    error_code ignored;
    guest_.lowest_layer().cancel(ignored);
  }

  void startGuestShutdown() {
    guest_.async_shutdown([self = shared_from_this()](error_code) {
      if (!self->over()) self->finish(false, self->end_);
    });
  }

  void noteStatus(size_t n) { status_ = answerStatus(std::span(pipes_[kIn].buf.data(), n)); }

  void armIdle(std::chrono::steady_clock::duration after) {
    idle_timer_.expires_after(after);
    idle_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->over()) return;
      auto idle = std::chrono::steady_clock::now() - self->last_activity_;
      auto limit = self->core_->options.idle_timeout;
      if (idle >= limit) return self->finish(true, "idle timeout");
      self->armIdle(limit - idle);
    });
  }

  nlohmann::json entry(bool allowed, const std::string& reason) const {
    nlohmann::json e{{"kind", injected_ ? "credential" : "tcp"},
                     {"allowed", allowed},
                     {"reason", reason},
                     {"destination", net::ipv4ToString(facts_.ip)},
                     {"port", facts_.port},
                     {"sni", facts_.name},
                     {"tls", "terminated"}};
    if (!facts_.pinned.empty()) e["pinned"] = facts_.pinned;
    return e;
  }

  // Refused before the guest's TLS is up: nothing to answer on, so a reset.
  void refuseBeforeTls(const std::string& reason, const std::string& detail) {
    auto e = entry(false, reason);
    e["detail"] = detail;
    e["duration_ms"] = millisecondsSince(facts_.start);
    core_->audit.write(std::move(e));
    spdlog::debug("credential tls: {} {}: {}", facts_.name, reason, detail);
    done_ = true;
    cancelTimers();
    error_code ignored;
    auto& socket = guest_.lowest_layer();
    socket.set_option(asio::socket_base::linger(true, 0), ignored);
    socket.close(ignored);
  }

  // The gateway's own answer over the guest's TLS, then the end; nothing went upstream.
  void answer(int status, const std::string& reason, const std::string& message) {
    answered_ = true;
    auto e = entry(false, reason);
    e["detail"] = message;
    e["status"] = status;
    e["duration_ms"] = millisecondsSince(facts_.start);
    core_->audit.write(std::move(e));
    cancelTimers();
    error_code ignored;
    upstream_.next_layer().close(ignored);
    answer_ = gatewayAnswer(status, message);
    phase_timer_.expires_after(kShutdownGrace);
    phase_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->closeQuietly();
    });
    asio::async_write(guest_, asio::buffer(answer_), [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->closeQuietly();
      self->guest_.async_shutdown([self](error_code) { self->closeQuietly(); });
    });
  }

  // After the request went upstream: the gateway's 502 instead of the server's answer, then the
  // end (audited as the credentialed request it was).
  void answerInstead(const std::string& message) {
    answer_ = gatewayAnswer(502, message);
    end_ = "answer refused: " + message;
    error_code ignored;
    upstream_.next_layer().close(ignored);
    pipes_[kIn].bytes += answer_.size();
    asio::async_write(guest_, asio::buffer(answer_),
                      [self = shared_from_this()](error_code, size_t) { self->finish(true, self->end_); });
  }

  void closeQuietly() {
    done_ = true;
    cancelTimers();
    error_code ignored;
    guest_.lowest_layer().close(ignored);
    upstream_.next_layer().close(ignored);
  }

  void cancelTimers() {
    phase_timer_.cancel();
    idle_timer_.cancel();
    pipes_[kOut].throttle.cancel();
    pipes_[kIn].throttle.cancel();
  }

  // The end of a connection that reached the upstream, audited with what it carried.
  void finish(bool abort, const std::string& end) {
    if (over()) return;
    done_ = true;
    cancelTimers();
    error_code ignored;
    if (abort) guest_.lowest_layer().set_option(asio::socket_base::linger(true, 0), ignored);
    guest_.lowest_layer().close(ignored);
    upstream_.next_layer().close(ignored);
    auto e = entry(true, facts_.reason);
    if (injected_) {
      e["method"] = method_;
      e["path"] = path_;
      e["secrets"] = secrets_;
      if (dropped_ > 0) e["dropped_bytes"] = dropped_;
      if (redactor_ && redactor_->masked() > 0) e["masked_in_answer"] = redactor_->masked();
      if (status_ != 0) e["status"] = status_;
    }
    e["end"] = end;
    e["bytes_out"] = pipes_[kOut].bytes;
    e["bytes_in"] = pipes_[kIn].bytes;
    e["duration_ms"] = millisecondsSince(facts_.start);
    core_->audit.write(std::move(e));
  }

  std::shared_ptr<GatewayCore> core_;
  ssl::stream<ReplayStream> guest_;
  ssl::stream<tcp::socket> upstream_;
  CredentialTlsFacts facts_;
  asio::steady_timer phase_timer_;  // a handshake, the connect, a closing side's grace
  asio::steady_timer idle_timer_;
  std::chrono::steady_clock::time_point last_activity_;
  std::vector<uint8_t> request_;    // the decrypted request head, until judged
  std::vector<uint8_t> injection_;  // the request with its credential, until written
  std::string answer_;              // the gateway's own answer, while it is written
  std::string method_, path_;
  std::vector<std::string> secrets_;
  int status_ = 0;
  bool status_seen_ = false;                 // the answer's first bytes were looked at
  net::RequestEnd request_end_;              // where the credentialed request ends
  std::unique_ptr<net::Redactor> redactor_;  // masks the added values in the answer
  uint64_t dropped_ = 0;                     // guest bytes after it, never sent
  bool injected_ = false;                    // the request went upstream with its credential
  bool answered_ = false;                    // the gateway answered instead (audited then)
  bool guest_tls_up_ = false;
  bool shutting_down_ = false;
  std::string end_;  // why the connection ends, once it is ending
  bool done_ = false;
  std::array<Pipe, 2> pipes_;
};

}  // namespace

void startCredentialTls(std::shared_ptr<GatewayCore> core, tcp::socket guest, std::vector<uint8_t> already_read,
                        CredentialTlsFacts facts) {
  std::make_shared<CredentialTlsSession>(std::move(core), std::move(guest), std::move(already_read), std::move(facts))
      ->start();
}

}  // namespace space::gateway
