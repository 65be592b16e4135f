#include "http/tls_relay.h"

#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

namespace space::http {

namespace ssl = boost::asio::ssl;
using boost::asio::ip::tcp;

namespace {
// Key exchange groups, both ends: elliptic curves, cheap to compute (see serverTlsContext).
constexpr const char* kTlsGroups = "X25519:P-256:P-384";
}  // namespace

Result<std::shared_ptr<ssl::context>> serverTlsContext(const TlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "TLS needs both a certificate chain and its private key");
  }
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  boost::system::error_code ec;
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                           ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use,
                       ec);
  if (ec || SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_2_VERSION) != 1) {
    return makeError(ErrorCode::kInternal, "cannot restrict TLS to version 1.2 and newer");
  }
  // TLS 1.2 with forward secrecy and AEAD only (1.3's suites are all of that kind); the server
  // picks, and no client may renegotiate (a handshake per request is a cheap way to burn CPU).
  SSL_CTX_set_options(context->native_handle(), SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_set_cipher_list(context->native_handle(), "ECDHE+AESGCM:ECDHE+CHACHA20") != 1) {
    return makeError(ErrorCode::kInternal, "cannot set the TLS 1.2 cipher suites");
  }
  // Elliptic-curve key exchange only. OpenSSL 3 also offers TLS 1.3's finite-field groups, and a
  // client that names ffdhe8192 alone costs the one event-loop thread ~0.1 s per ClientHello,
  // stalling every connection of the listener (measured by a review).
  if (SSL_CTX_set1_groups_list(context->native_handle(), kTlsGroups) != 1) {
    return makeError(ErrorCode::kInternal, "cannot set the TLS key exchange groups");
  }
  // An idle connection holds no read or write buffer (about 34 KB each otherwise).
  SSL_CTX_set_mode(context->native_handle(), SSL_MODE_RELEASE_BUFFERS);
  context->use_certificate_chain_file(files.cert_file, ec);
  if (ec) {
    return makeError(ErrorCode::kInvalidArgument,
                     "cannot load the TLS certificate chain " + files.cert_file + ": " + ec.message());
  }
  context->use_private_key_file(files.key_file, ssl::context::pem, ec);
  if (ec && ec.message().find("mismatch") != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "the TLS private key " + files.key_file +
                                                      " does not belong to the certificate " + files.cert_file);
  }
  if (ec) {
    return makeError(ErrorCode::kInvalidArgument,
                     "cannot load the TLS private key " + files.key_file + ": " + ec.message());
  }
  if (SSL_CTX_check_private_key(context->native_handle()) != 1) {
    return makeError(ErrorCode::kInvalidArgument, "the TLS private key " + files.key_file +
                                                      " does not belong to the certificate " + files.cert_file);
  }
  struct stat key {};
  if (::stat(files.key_file.c_str(), &key) == 0 && (key.st_mode & 077) != 0) {
    spdlog::warn("http: the TLS private key {} can be read by other users (mode {:o}); chmod 600 it", files.key_file,
                 key.st_mode & 0777);
  }
  return context;
}

struct TlsRelays::Relay {
  Relay(boost::asio::io_context& io, ssl::context& context, tcp::socket socket)
      : tls(std::move(socket), context), plain(io), timer(io) {}

  ssl::stream<tcp::socket> tls;
  boost::asio::local::stream_protocol::socket plain;  // the relay's end of the socketpair
  // One deadline at a time: the handshake's, then each write's to the client, then the
  // shutdown's (only the client-bound direction arms it after the handshake).
  boost::asio::steady_timer timer;
  uint64_t timer_generation = 0;  // a timer that fires for a deadline already disarmed is ignored
  // Allocated after the handshake: one still under way costs no relay buffers.
  struct Buffers {
    std::array<char, 16384> from_client;
    std::array<char, 16384> to_client;
  };
  std::unique_ptr<Buffers> buffers;
  std::string remote, client;
  std::list<RelayPtr>::iterator self;
  bool in_handshake = true;
  bool client_side = false;     // connect(): ours is the client end
  bool reading_client = false;  // a read from the client is pending
  bool writing_plain = false;   // what the client sent is being written to the server
  bool shutting_down = false;   // the server ended the connection: close_notify, then close
  bool shutdown_sent = false;
  bool closed = false;
};

TlsRelays::TlsRelays(boost::asio::io_context& io, std::shared_ptr<ssl::context> context, TlsRelayLimits limits)
    : io_(io), context_(std::move(context)), limits_(limits) {}

TlsRelays::~TlsRelays() = default;

void TlsRelays::armDeadline(const RelayPtr& relay, std::chrono::milliseconds timeout, std::function<void()> expired) {
  const uint64_t generation = ++relay->timer_generation;
  relay->timer.expires_after(timeout);
  relay->timer.async_wait([relay, generation, expired = std::move(expired)](boost::system::error_code ec) {
    if (ec || generation != relay->timer_generation || relay->closed) return;
    expired();
  });
}

void TlsRelays::disarm(Relay& relay) {
  ++relay.timer_generation;
  relay.timer.cancel();
}

TlsRelays::RelayPtr TlsRelays::track(tcp::socket socket, const std::string& remote, const std::string& client) {
  // At a limit, the oldest handshake under way makes room: this client's own when it is at its
  // limit, else the oldest of the client with the most under way (a flood from a few addresses
  // pays for itself, not the slow handshakes of others). Refusing the newest instead would let
  // a client that opens connections and never completes them lock everyone else out for a
  // handshake timeout at a time.
  auto atClientLimit = [&] {
    auto it = handshakes_by_client_.find(client);
    return it != handshakes_by_client_.end() && it->second >= limits_.max_handshakes_per_client;
  };
  while (handshakes_ >= limits_.max_handshakes || atClientLimit()) {
    const bool own = atClientLimit();
    size_t most = 0;
    for (const auto& entry : handshakes_by_client_) most = std::max(most, entry.second);
    // The oldest handshake among the clients with the most: by age, not by name, so that many
    // addresses with one handshake each cannot aim the eviction at one client by how they sort.
    RelayPtr oldest;
    for (auto it = relays_.rbegin(); it != relays_.rend(); ++it) {
      if ((*it)->in_handshake && (own ? (*it)->client == client : handshakesOf((*it)->client) == most)) {
        oldest = *it;
        break;
      }
    }
    if (!oldest) {  // cannot be: the counts above are of relays in the list
      boost::system::error_code ignored;
      socket.close(ignored);
      return nullptr;
    }
    spdlog::debug("http: {} TLS handshakes under way ({} of {}); dropping the oldest, with {}", handshakes_,
                  handshakesOf(client), client, oldest->remote);
    close(oldest);
  }
  ++handshakes_;
  ++handshakes_by_client_[client];
  auto relay = std::make_shared<Relay>(io_, *context_, std::move(socket));
  relay->remote = remote;
  relay->client = client;
  relays_.push_front(relay);
  relay->self = relays_.begin();
  armDeadline(relay, limits_.handshake_timeout, [this, relay] {
    spdlog::debug("http: the TLS handshake with {} did not complete in time; closing", relay->remote);
    close(relay);
  });
  return relay;
}

void TlsRelays::accept(tcp::socket socket, const std::string& remote, const std::string& client, Ready ready) {
  RelayPtr relay = track(std::move(socket), remote, client);
  if (!relay) return;
  relay->tls.async_handshake(ssl::stream_base::server,
                             [this, relay, ready = std::move(ready)](const boost::system::error_code& ec) mutable {
                               Failed none;
                               handshakeDone(relay, ec, ready, none);
                             });
}

void TlsRelays::connect(tcp::socket socket, const std::string& server_name, Ready ready, Failed failed) {
  RelayPtr relay = track(std::move(socket), server_name, server_name);
  if (!relay) return failed("too many TLS handshakes under way");
  relay->client_side = true;
  // SNI for a name only (RFC 6066 forbids literals); the certificate must name the server, as
  // a host name or an IP address.
  boost::system::error_code ec;
  (void)boost::asio::ip::make_address(server_name, ec);
  if (ec) {  // not an address literal
    SSL_set_tlsext_host_name(relay->tls.native_handle(), server_name.c_str());
  }
  relay->tls.set_verify_mode(ssl::verify_peer);
  relay->tls.set_verify_callback(ssl::host_name_verification(server_name));
  relay->tls.async_handshake(ssl::stream_base::client,
                             [this, relay, ready = std::move(ready),
                              failed = std::move(failed)](const boost::system::error_code& handshake_ec) mutable {
                               handshakeDone(relay, handshake_ec, ready, failed);
                             });
}

void TlsRelays::endHandshake(Relay& relay) {
  if (!relay.in_handshake) return;
  relay.in_handshake = false;
  --handshakes_;
  auto it = handshakes_by_client_.find(relay.client);
  if (it != handshakes_by_client_.end() && --it->second == 0) handshakes_by_client_.erase(it);
}

void TlsRelays::handshakeDone(const RelayPtr& relay, const boost::system::error_code& ec, Ready& ready,
                              Failed& failed) {
  if (relay->closed) {
    if (failed) failed("the TLS handshake with " + relay->remote + " did not complete in time");
    return;
  }
  endHandshake(*relay);
  disarm(*relay);
  if (ec) {
    spdlog::debug("http: TLS handshake with {} failed: {}", relay->remote, ec.message());
    if (failed) failed("TLS handshake with " + relay->remote + ": " + ec.message());
    return close(relay);
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
    spdlog::warn("http: cannot relay TLS with {}: socketpair: {}", relay->remote, strerror(errno));
    if (failed) failed(std::string("socketpair: ") + strerror(errno));
    return close(relay);
  }
  UniqueFd server_end(pair[0]);
  UniqueFd relay_end(pair[1]);
  boost::system::error_code assign_ec;
  relay->plain.assign(boost::asio::local::stream_protocol(), relay_end.get(), assign_ec);
  if (assign_ec) {
    spdlog::warn("http: cannot relay TLS with {}: {}", relay->remote, assign_ec.message());
    if (failed) failed(assign_ec.message());
    return close(relay);
  }
  (void)relay_end.release();
  // A small buffer on the HTTP side's end: what is queued there when the server closes its end
  // is what the relay still sends on its own, uncounted by the server's connection limits.
  // (Asked for 16 KB: Linux doubles it for its bookkeeping, so 32 KB in fact.)
  const int queue_bytes = 16 * 1024;
  setsockopt(server_end.get(), SOL_SOCKET, SO_SNDBUF, &queue_bytes, sizeof queue_bytes);
  relay->buffers = std::make_unique<Relay::Buffers>();
  pumpFromClient(relay);
  pumpToClient(relay);
  ready(std::move(server_end), relay->remote);
}

void TlsRelays::pumpFromClient(const RelayPtr& relay) {
  if (relay->closed) return;
  if (relay->shutting_down) return startShutdown(relay);
  relay->reading_client = true;
  relay->tls.async_read_some(
      boost::asio::buffer(relay->buffers->from_client), [this, relay](boost::system::error_code ec, size_t n) {
        relay->reading_client = false;
        if (relay->closed) return;
        if (relay->shutting_down) return startShutdown(relay);  // the read was cancelled for it
        if (ec && ec != boost::asio::error::eof && ec != ssl::error::stream_truncated) {
          // Not an end but a broken stream (a bad record, a reset): nothing more
          // can be trusted from it, and nothing is owed to it.
          spdlog::debug("http: TLS connection with {} failed: {}", relay->remote, ec.message());
          return close(relay);
        }
        if (ec || n == 0) {
          // The client ended its side (close_notify or a bare FIN) or failed: the server reads
          // the end of its request stream, and still answers what it has.
          boost::system::error_code ignored;
          relay->plain.shutdown(boost::asio::socket_base::shutdown_send, ignored);
          return;
        }
        relay->writing_plain = true;
        boost::asio::async_write(relay->plain, boost::asio::buffer(relay->buffers->from_client.data(), n),
                                 [this, relay](boost::system::error_code write_ec, size_t) {
                                   relay->writing_plain = false;
                                   if (relay->closed) return;
                                   if (write_ec) return close(relay);
                                   pumpFromClient(relay);
                                 });
      });
}

void TlsRelays::pumpToClient(const RelayPtr& relay) {
  if (relay->closed) return;
  relay->plain.async_read_some(
      boost::asio::buffer(relay->buffers->to_client), [this, relay](boost::system::error_code ec, size_t n) {
        if (relay->closed) return;
        if (ec || n == 0) return startShutdown(relay);  // the server is done with the connection
        armDeadline(relay, limits_.write_timeout, [this, relay] {
          spdlog::debug("http: {} stopped reading its TLS connection; closing", relay->remote);
          close(relay);
        });
        boost::asio::async_write(relay->tls, boost::asio::buffer(relay->buffers->to_client.data(), n),
                                 [this, relay](boost::system::error_code write_ec, size_t) {
                                   disarm(*relay);
                                   if (relay->closed) return;
                                   if (write_ec) return close(relay);
                                   pumpToClient(relay);
                                 });
      });
}

void TlsRelays::startShutdown(const RelayPtr& relay) {
  if (relay->closed || relay->shutdown_sent) return;
  if (relay->client_side) {
    // Ours is the client: it has nothing left to learn from the server, and a thread that waits
    // for the server's close_notify could outlive its process's exit.
    return close(relay);
  }
  if (!relay->shutting_down) {
    relay->shutting_down = true;
    // One deadline for all of the shutdown, armed now: the pending read's or write's end below
    // might never come.
    armDeadline(relay, std::chrono::milliseconds(1000), [this, relay] { close(relay); });
    if (relay->reading_client) {
      // A close_notify must not race the pending read: it ends first, and comes back here.
      boost::system::error_code ignored;
      relay->tls.next_layer().cancel(ignored);
      return;
    }
  }
  if (relay->reading_client || relay->writing_plain) return;  // their handlers come back here
  relay->shutdown_sent = true;
  relay->tls.async_shutdown([this, relay](boost::system::error_code) { close(relay); });
}

void TlsRelays::close(const RelayPtr& relay) {
  if (relay->closed) return;
  relay->closed = true;
  endHandshake(*relay);
  disarm(*relay);
  boost::system::error_code ignored;
  relay->tls.next_layer().close(ignored);
  relay->plain.close(ignored);
  relays_.erase(relay->self);
}

void TlsRelays::closeAll() {
  std::list<RelayPtr> all = relays_;
  for (const auto& relay : all) close(relay);
}

Result<std::shared_ptr<ssl::context>> clientTlsContext(const std::string& ca_file) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_client);
  boost::system::error_code ec;
  if (SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_2_VERSION) != 1) {
    return makeError(ErrorCode::kInternal, "cannot restrict TLS to version 1.2 and newer");
  }
  if (SSL_CTX_set1_groups_list(context->native_handle(), kTlsGroups) != 1) {
    return makeError(ErrorCode::kInternal, "cannot set the TLS key exchange groups");
  }
  if (ca_file.empty()) {
    context->set_default_verify_paths(ec);
  } else {
    context->load_verify_file(ca_file, ec);
    // What the user named is trusted as it is, also a certificate that is not a root (a node's
    // own leaf or an intermediate): it is the anchor they chose.
    X509_STORE_set_flags(SSL_CTX_get_cert_store(context->native_handle()), X509_V_FLAG_PARTIAL_CHAIN);
  }
  if (ec) {
    return makeError(ErrorCode::kInvalidArgument, "cannot load the CA certificates " +
                                                      (ca_file.empty() ? std::string("of the system") : ca_file) +
                                                      ": " + ec.message());
  }
  return context;
}

namespace {

// A client connection's relay: one io_context and thread per connection, since the client is
// synchronous and the relay lives as long as the connection, however the caller uses its end
// (a request, a terminal). The thread ends once the relay has closed.
struct ClientLoop {
  boost::asio::io_context io{1};
  std::unique_ptr<TlsRelays> relays;
  std::atomic<bool> done{false};
};

// The client relays' threads, joined before the process exits: a thread still inside OpenSSL
// when its exit handler frees OpenSSL's state would crash the exit. Constructed on the first
// connection, after a client context (and so OpenSSL) exists, so destroyed before that handler runs.
class ClientLoops {
 public:
  static ClientLoops& instance() {
    static ClientLoops loops;
    return loops;
  }

  // Throws std::system_error when no thread can be started.
  void start(std::shared_ptr<ClientLoop> loop) {
    std::lock_guard lock(mutex_);
    for (auto it = running_.begin(); it != running_.end();) {  // reap the finished
      if (it->first->done) {
        it->second.join();
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    std::thread thread([loop] {
      loop->io.run();
      loop->relays.reset();  // before the io_context its sockets belong to
      loop->done = true;
    });
    running_.emplace_back(std::move(loop), std::move(thread));
  }

  ~ClientLoops() {
    std::lock_guard lock(mutex_);
    for (auto& [loop, thread] : running_) {
      // Closing the relay ends its pending operations, and with them the loop's run().
      if (!loop->done) boost::asio::post(loop->io, [loop = loop] { loop->relays->closeAll(); });
      thread.join();
    }
  }

 private:
  std::mutex mutex_;
  std::list<std::pair<std::shared_ptr<ClientLoop>, std::thread>> running_;
};

}  // namespace

Result<UniqueFd> connectTls(UniqueFd tcp, const std::string& server_name, std::shared_ptr<ssl::context> context,
                            Clock::time_point deadline) {
  auto loop = std::make_shared<ClientLoop>();
  TlsRelayLimits limits;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  limits.handshake_timeout = std::max(std::chrono::milliseconds(1), std::min(left, std::chrono::milliseconds(3600000)));
  limits.write_timeout = std::chrono::milliseconds(3600000);  // the caller's own deadlines apply to its end
  loop->relays = std::make_unique<TlsRelays>(loop->io, std::move(context), limits);
  boost::asio::ip::tcp::socket socket(loop->io);
  boost::system::error_code ec;
  socket.assign(boost::asio::ip::tcp::v4(), tcp.get(), ec);
  if (ec) return makeError(ErrorCode::kInternal, "TLS: " + ec.message());
  (void)tcp.release();
  auto outcome = std::make_shared<std::promise<Result<UniqueFd>>>();
  auto answered = outcome->get_future();
  loop->relays->connect(
      std::move(socket), server_name,
      [outcome](UniqueFd plain, const std::string&) { outcome->set_value(std::move(plain)); },
      [outcome](const std::string& why) { outcome->set_value(makeError(ErrorCode::kUnavailable, why)); });
  try {
    ClientLoops::instance().start(loop);
  } catch (const std::system_error& e) {
    return makeError(ErrorCode::kResourceExhausted, std::string("cannot start a TLS thread: ") + e.what());
  }
  return answered.get();
}

}  // namespace space::http
