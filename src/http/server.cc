#include "http/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <utility>

#include "http/exchange.h"
#include "http/tcp.h"
#include "http/tls_relay.h"

namespace space::http {

namespace beast_http = boost::beast::http;

namespace {

// How long a closing connection may take to drain what the client still sends (see
// SocketStream::closeGracefully), and how much of it.
constexpr std::chrono::milliseconds kLingerTime{1000};
constexpr size_t kLingerBytes = 1 << 20;
// Threads beyond max_running_requests, for requests that stopped counting but whose thread is
// still handing the connection back.
constexpr size_t kThreadsFinishing = 32;

void signalEventFd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof one);
  (void)n;  // an eventfd counter cannot overflow from a few writes
}

// A complete error response that closes the connection, for the answers the server gives
// without a handler.
std::string errorResponseBytes(int status, ErrorCode code, std::string_view message) {
  std::string body =
      errorBody(errorCodeName(code), message).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string_view reason = beast_http::obsolete_reason(static_cast<beast_http::status>(status));
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
  out += "Content-Type: application/json\r\n";
  out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  out += "Connection: close\r\n\r\n";
  out += body;
  return out;
}

double millisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Who a connection counts against for max_connections_per_client: its address, except that
// addresses one party gets in bulk count as one. Any local user can bind any of 127.0.0.0/8, and
// a host is given a whole IPv6 /64.
std::string clientOf(const std::string& remote) {
  size_t colon = remote.rfind(':');
  std::string host = colon == std::string::npos ? remote : remote.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127 ? "127.0.0.0/8" : host;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return "127.0.0.0/8";
    std::memset(v6.s6_addr + 8, 0, 8);
    char text[INET6_ADDRSTRLEN];
    if (inet_ntop(AF_INET6, &v6, text, sizeof text)) return std::string(text) + "/64";
  }
  return host;
}

}  // namespace

// The event loop alone touches socket and timer, and only while the connection waits
// (`waiting`); a worker owns the descriptor while it serves a request. Fields marked so are
// guarded by Server::mutex_.
struct Server::Connection {
  explicit Connection(boost::asio::io_context& io) : socket(io), timer(io) {}

  boost::asio::ip::tcp::socket socket;
  boost::asio::steady_timer timer;
  uint64_t deadline_generation = 0;  // a timer that fires for an operation already over is ignored
  boost::asio::ip::tcp protocol = boost::asio::ip::tcp::v4();
  boost::beast::flat_buffer buffer;
  std::optional<detail::RequestParser> parser;
  std::string remote;
  std::string client;
  UniqueFd abort_fd{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // fails this connection's socket I/O
  Clock::time_point first_header_deadline;
  bool first_request = true;
  // Guarded by mutex_:
  bool waiting = false;   // the event loop holds the socket
  bool busy = false;      // a request header arrived: never evicted
  bool evicted = false;   // made room for a newer connection; closing
  bool finished = false;  // counted out of open_connections_
  Clock::time_point idle_since = Clock::now();
  StreamPtr stream;  // a detached response not yet closed (busy stays set while it is)
  RelayPtr relay;    // a relay on the loop, not yet closed (busy stays set while it is)
  // The loop's: a stream's keep-alive timer (here, not in the stream: the stream may outlive
  // the server, its connection and anything bound to the event loop do not).
  boost::asio::steady_timer stream_timer{socket.get_executor()};
  boost::asio::steady_timer hangup_timer{socket.get_executor()};  // a stream's client, once it sent bytes
};

// A detached response (Response::detach): producers queue from any thread, the event loop
// writes. Until it is closed the server outlives it (an open stream keeps its connection open,
// and stop() waits for connections); after that, nothing here touches the server.
struct Server::Stream final : detail::DetachedStream, std::enable_shared_from_this<Stream> {
  Stream(Server& s, ConnectionPtr c) : server(s), connection(std::move(c)) {}

  Server& server;
  ConnectionPtr connection;                                  // the loop's; reset when the stream closes
  std::string step_party = "address " + connection->client;  // guarded by m; see shareStepsWith
  // is_closed, readable without m: a step queued behind others is checked under the server's
  // steps lock, which is taken inside m (runBlocking), so it cannot take m.
  std::atomic<bool> closed_now{false};

  mutable std::mutex m;
  // Guarded by m:
  std::deque<std::pair<std::string, size_t>> queue;  // bytes framed for the socket, and the body bytes in them
  size_t pending_bytes = 0;                          // body bytes queued or being written
  bool ending = false;                               // end() was called
  bool abort_requested = false;
  bool is_closed = false;
  bool completed = false;
  bool started = false;      // on the event loop
  bool pump_posted = false;  // a pumpStream is queued on the loop
  Framing framing = Framing::kChunked;
  bool keep_alive = false;
  std::function<void(bool)> on_close;
  std::chrono::milliseconds keepalive_idle{0};
  std::string keepalive_chunk;

  // The event loop's:
  bool writing = false;
  bool end_queued = false;  // the last chunk is queued or written
  std::string in_flight;
  size_t in_flight_sent = 0;  // of in_flight, taken by the socket
  size_t in_flight_body = 0;
  Clock::time_point last_write = Clock::now();

  void setFraming(Framing f, bool keep) override {
    std::lock_guard lock(m);
    framing = f;
    keep_alive = keep;
  }

  bool write(std::string chunk) override {
    std::lock_guard lock(m);
    if (is_closed || ending || abort_requested) return false;
    if (chunk.empty() || framing == Framing::kNoBody) return true;  // an empty chunk would end the body
    size_t body = chunk.size();
    if (framing == Framing::kChunked) {
      char size_line[24];
      int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", body);
      chunk.insert(0, size_line, static_cast<size_t>(n));
      chunk += "\r\n";
    }
    pending_bytes += body;
    queue.emplace_back(std::move(chunk), body);
    postPumpLocked();
    return true;
  }

  void end() override {
    std::lock_guard lock(m);
    if (is_closed || ending) return;
    ending = true;
    postPumpLocked();
  }

  void abort() override {
    std::lock_guard lock(m);
    if (is_closed) return;
    abort_requested = true;
    postPumpLocked();
  }

  size_t pending() const override {
    std::lock_guard lock(m);
    return pending_bytes;
  }

  bool closed() const override { return closed_now.load(); }

  void onClose(std::function<void(bool)> fn) override {
    std::unique_lock lock(m);
    if (!is_closed) {
      on_close = std::move(fn);
      return;
    }
    bool done = completed;
    lock.unlock();
    if (fn) fn(done);
  }

  void keepAlive(std::chrono::milliseconds idle, std::string chunk) override {
    std::lock_guard lock(m);
    keepalive_idle = idle;
    keepalive_chunk = std::move(chunk);
  }

  void shareStepsWith(std::string party) override {
    std::lock_guard lock(m);
    step_party = "party " + party;  // never one of the addresses' names
  }

  bool runBlocking(std::function<void()> task) override {
    // Under m: while the stream is open the server (and its pool) is alive.
    std::lock_guard lock(m);
    if (is_closed || server.stopping_) return false;
    std::string why;
    if (server.runStep(shared_from_this(), std::move(task), why)) return true;
    spdlog::warn("http: a stream of {} cannot run a step: {}", connection ? connection->remote : "?", why);
    return false;
  }

  void postPumpLocked() {
    if (!started || pump_posted) return;  // startStreaming pumps what was queued before
    pump_posted = true;
    boost::asio::post(server.io_, [self = shared_from_this()] { self->server.pumpStream(self); });
  }
};

// A relayed connection (Response::relay): the loop's alone. The client's socket is the
// connection's; the peer's belongs to the plan's `keep` and is only borrowed here.
struct Server::Relay {
  Relay(ConnectionPtr c, RelayPlan p, std::string early)
      : connection(std::move(c)),
        peer(connection->socket.get_executor()),
        plan(std::move(p)),
        to_peer(std::move(early)) {}

  // One direction. Each reads a buffer's worth, writes it whole, then reads again: what waits
  // for a slow reader is one buffer, and the writer's TCP window holds back the rest.
  struct Way {
    std::vector<char> buffer;  // made when the way starts (a one-way relay has no up buffer)
    const char* data = nullptr;
    size_t left = 0;  // of data, not yet taken by the socket
    bool open = false;
    bool writing = false;
  };

  ConnectionPtr connection;
  // A socket of any family (TCP into a guest, a socketpair): its writes are sends without
  // SIGPIPE, where a descriptor's would be write(2)s that raise it.
  boost::asio::generic::stream_protocol::socket peer;
  RelayPlan plan;
  std::string to_peer;  // the client's bytes after its request: the peer's first (both ways)
  Way down;             // peer -> client
  Way up;               // client -> peer
  bool closed = false;
  bool peer_watched = false;  // watchRelayPeer's timer is armed
  Clock::time_point last_activity = Clock::now();
};

Result<std::unique_ptr<Server>> Server::start(const std::string& listen, Handler handler, ServerLimits limits,
                                              std::shared_ptr<boost::asio::ssl::context> tls) {
  auto listener = detail::listenTcp(listen, 512);
  if (!listener.ok()) return listener.error();
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  if (getsockname(listener->get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    return makeError(ErrorCode::kInternal, std::string("getsockname on the listening socket: ") + strerror(errno));
  }
  // Each connection holds two descriptors (its socket and an eventfd; over TLS two more, the
  // client's socket and the relay's end of the pair), and twice the limit may be open while
  // evicted ones close; a request may hold one upstream (a proxied port); over TLS a handshake
  // under way (one per connection at most) holds one more, and so does a relay closing. The
  // process needs others besides (files, VMs).
  const size_t per_connection = tls ? 11 : 5;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
    const double share = std::clamp(limits.descriptor_share, 0.01, 1.0);
    size_t fit = nofile.rlim_cur > 1024
                     ? static_cast<size_t>(static_cast<double>(nofile.rlim_cur - 512) * share) / per_connection
                     : 64;
    if (limits.max_connections > fit) {
      spdlog::warn("http: at most {} connections instead of {}: the descriptor limit is {}", fit,
                   limits.max_connections, nofile.rlim_cur);
      limits.max_connections = fit;
    }
  }
  std::unique_ptr<Server> server(new Server(std::move(handler), limits));
  if (tls) {
    TlsRelayLimits relay_limits;
    // Short: a handshake holds a place among max_handshakes, and a client's first request has
    // its own deadline after it.
    relay_limits.handshake_timeout =
        std::min({limits.read_timeout, limits.first_request_timeout, std::chrono::milliseconds(5000)});
    relay_limits.write_timeout = limits.write_timeout;
    relay_limits.max_handshakes = limits.max_connections;
    relay_limits.max_handshakes_per_client =
        std::min(limits.max_connections_per_client, limits.max_connections / 4 + 1);
    server->tls_ = std::make_unique<TlsRelays>(server->io_, std::move(tls), relay_limits);
  }
  server->address_ = detail::localAddress(listener->get());
  auto parsed = detail::parseHostPort(server->address_, true);
  if (parsed.ok()) server->port_ = parsed->port;
  boost::system::error_code ec;
  auto protocol = local.ss_family == AF_INET6 ? boost::asio::ip::tcp::v6() : boost::asio::ip::tcp::v4();
  server->acceptor_.assign(protocol, listener->get(), ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot watch the listening socket: " + ec.message());
  (void)listener->release();
  try {
    server->event_loop_ = std::thread([s = server.get()] {
      try {
        s->io_.run();
      } catch (const std::exception& e) {
        // Nothing on the loop throws by design; losing it would leave every connection hanging.
        spdlog::critical("http: the event loop failed: {}", e.what());
        std::abort();
      }
    });
  } catch (const std::system_error& e) {
    server->work_.reset();
    return makeError(ErrorCode::kResourceExhausted, std::string("cannot start the server's thread: ") + e.what());
  }
  boost::asio::post(server->io_, [s = server.get()] { s->acceptNext(); });
  spdlog::info("http: listening on {}{}", server->address_, server->tls_ ? " (TLS)" : "");
  return server;
}

std::string Server::url() const {
  // A wildcard address is where the server listens, not one to connect to (nor one a
  // certificate names): clients on this node reach it on the loopback address.
  std::string host_port = address_;
  if (host_port.rfind("0.0.0.0:", 0) == 0) {
    host_port = "127.0.0.1" + host_port.substr(7);
  } else if (host_port.rfind("[::]:", 0) == 0) {
    host_port = "[::1]" + host_port.substr(4);
  }
  return (tls_ ? "https://" : "http://") + host_port;
}

Server::Server(Handler handler, ServerLimits limits)
    : handler_(std::move(handler)),
      limits_(limits),
      io_(1),
      work_(io_.get_executor()),
      acceptor_(io_),
      accept_backoff_(io_),
      // Requests are counted (and refused over the limit) in dispatch(); a request's thread is
      // free for the next one only once it has handed its connection back, moments after the
      // request stopped counting, so the pool has some threads more than the limit.
      workers_(std::make_unique<detail::WorkerPool>(limits.max_running_requests + kThreadsFinishing,
                                                    std::chrono::seconds(60))),
      stream_steps_(std::make_unique<detail::WorkerPool>(std::max<size_t>(1, limits.max_stream_step_threads),
                                                         std::chrono::seconds(60),
                                                         std::max<size_t>(1, limits.max_streams))) {}

Server::~Server() { stop(std::chrono::milliseconds(0)); }

void Server::stop(std::chrono::milliseconds grace) {
  std::call_once(stop_once_, [&] {
    stopping_ = true;
    if (event_loop_.joinable()) {
      // The loop stops accepting and ends every wait; a connection whose request is running is
      // on a worker and finds stopping_ set when its handler returns.
      boost::asio::post(io_, [this] {
        boost::system::error_code ignored;
        acceptor_.close(ignored);
        accept_backoff_.cancel();
        std::vector<StreamPtr> streams;
        std::vector<RelayPtr> relays;
        {
          std::lock_guard lock(mutex_);
          for (const ConnectionPtr& connection : connections_) {
            if (connection->waiting) closeOnLoop(*connection);
            if (connection->stream) streams.push_back(connection->stream);
            if (connection->relay) relays.push_back(connection->relay);
          }
        }
        for (const RelayPtr& relay : relays) closeRelay(relay, false, "the server is stopping");
        // A detached stream has no handler to notice the stop: it ends now, as a handler's
        // stream ends at its next write. One not yet on the loop ends when it gets there.
        for (const StreamPtr& stream : streams) {
          bool started = false;
          {
            std::lock_guard lock(stream->m);
            started = stream->started;
          }
          if (started) closeStream(stream, false);
        }
      });
    }
    {
      std::unique_lock lock(mutex_);
      if (!connection_ended_.wait_for(lock, grace, [&] { return open_connections_ == 0; })) {
        spdlog::warn("http: {} connection(s) still busy after {} ms; failing their I/O", open_connections_,
                     grace.count());
        for (const ConnectionPtr& connection : connections_) signalEventFd(connection->abort_fd.get());
      }
      connection_ended_.wait(lock, [&] { return open_connections_ == 0; });
    }
    if (tls_ && event_loop_.joinable()) {
      // The relays pass on what the server wrote last, send their close_notify and close on
      // their own; what is left after a second is cut.
      auto relaysOpen = [this] {
        std::promise<size_t> open;
        auto answer = open.get_future();
        boost::asio::post(io_, [this, &open] { open.set_value(tls_->open()); });
        return answer.get();
      };
      for (auto until = Clock::now() + std::chrono::seconds(1); relaysOpen() > 0 && Clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      boost::asio::post(io_, [this] { tls_->closeAll(); });
    }
    workers_->stop();
    stream_steps_->stop();  // the streams are closed: what steps wait find them so and return
    work_.reset();
    if (event_loop_.joinable()) event_loop_.join();
    spdlog::info("http: stopped listening on {}", address_);
  });
}

bool Server::admit(const std::string& client, std::string& why) {
  size_t from_client = 0;
  Connection* oldest_idle = nullptr;
  Connection* oldest_idle_of_client = nullptr;
  size_t closing = 0;
  for (const ConnectionPtr& pointer : connections_) {
    Connection& c = *pointer;
    if (c.evicted) {
      ++closing;
      continue;
    }
    bool same = c.client == client;
    if (same) ++from_client;
    if (c.busy) continue;
    if (!oldest_idle || c.idle_since < oldest_idle->idle_since) oldest_idle = &c;
    if (same && (!oldest_idle_of_client || c.idle_since < oldest_idle_of_client->idle_since)) {
      oldest_idle_of_client = &c;
    }
  }
  size_t live = open_connections_ - closing;
  Connection* victim = nullptr;
  if (from_client >= limits_.max_connections_per_client) {
    victim = oldest_idle_of_client;
    if (!victim) {
      why = "this client has " + std::to_string(from_client) + " connections running requests (the limit is " +
            std::to_string(limits_.max_connections_per_client) + ")";
      return false;
    }
  } else if (live >= limits_.max_connections) {
    victim = oldest_idle;
    if (!victim) {
      why = "the server has " + std::to_string(live) + " connections running requests (the limit is " +
            std::to_string(limits_.max_connections) + ")";
      return false;
    }
  }
  // Evicted connections close within moments, but a client opening connections faster than
  // that must not push the descriptor count past twice the limit.
  if (open_connections_ >= 2 * limits_.max_connections) {
    why = "the server is closing " + std::to_string(closing) + " connections to make room";
    return false;
  }
  if (victim) {
    victim->evicted = true;
    // A waiting connection is on this loop: its read ends now. One between a worker and the
    // loop sees `evicted` at its next step.
    if (victim->waiting) closeOnLoop(*victim);
    signalEventFd(victim->abort_fd.get());
    spdlog::debug("http: closing an idle connection of {} to admit one from {}", victim->client, client);
  }
  return true;
}

bool Server::setBusyLocked(Connection& connection, bool busy) {
  if (connection.evicted) return false;
  if (connection.busy != busy) {
    if (busy) {
      ++running_;
      ++running_by_client_[connection.client];
    } else {
      --running_;
      auto it = running_by_client_.find(connection.client);
      if (--it->second == 0) running_by_client_.erase(it);
    }
  }
  connection.busy = busy;
  if (!busy) connection.idle_since = Clock::now();
  return true;
}

size_t Server::runningRequests() {
  std::lock_guard lock(mutex_);
  return running_;
}

size_t Server::openStreams() {
  std::lock_guard lock(mutex_);
  return streams_;
}

void Server::stopCountingRunningLocked(Connection& connection) {
  if (!connection.busy) return;
  --running_;
  auto it = running_by_client_.find(connection.client);
  if (--it->second == 0) running_by_client_.erase(it);
}

void Server::rejectOverloaded(UniqueFd fd, const std::string& remote, const std::string& why) {
  logRejection(remote, why);
  std::string response = errorResponseBytes(503, ErrorCode::kUnavailable, why + "; retry later");
  // Non-blocking and best effort: the event loop must not wait for an unwanted client. A short
  // response fits the socket buffer; what the client already sent is drained so closing does
  // not reset the connection over the response.
  ssize_t sent = send(fd.get(), response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)sent;
  shutdown(fd.get(), SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && recv(fd.get(), scratch, sizeof scratch, MSG_DONTWAIT) > 0; ++i) {
  }
}

void Server::acceptNext() {
  if (stopping_) return;
  acceptor_.async_accept([this](boost::system::error_code ec, boost::asio::ip::tcp::socket socket) {
    if (stopping_ || ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      if (ec == boost::asio::error::connection_aborted || ec == boost::asio::error::interrupted ||
          ec == boost::asio::error::would_block) {
        return acceptNext();
      }
      // Out of descriptors or memory: back off instead of spinning on a listener that stays ready.
      spdlog::warn("http: accept: {}", ec.message());
      accept_backoff_.expires_after(std::chrono::milliseconds(100));
      accept_backoff_.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec) acceptNext();
      });
      return;
    }
    if (tls_) {
      acceptTls(std::move(socket));
    } else {
      onAccepted(std::move(socket));
    }
    acceptNext();
  });
}

void Server::acceptTls(boost::asio::ip::tcp::socket socket) {
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);  // as in onAccepted
  socket.set_option(boost::asio::ip::tcp::no_delay(true), ec);
  const std::string remote = detail::peerAddress(socket.native_handle());
  tls_->accept(std::move(socket), remote, clientOf(remote), [this](UniqueFd plain, const std::string& client_address) {
    boost::asio::ip::tcp::socket relayed(io_);
    boost::system::error_code assign_ec;
    // The relay's socketpair end, read and written like a TCP socket by everything downstream.
    relayed.assign(boost::asio::ip::tcp::v4(), plain.get(), assign_ec);
    if (assign_ec) return;  // `plain` closes, and the relay with it
    (void)plain.release();
    onAccepted(std::move(relayed), client_address);
  });
}

void Server::onAccepted(boost::asio::ip::tcp::socket socket, std::string remote) {
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  // Asio accepts without SOCK_CLOEXEC: a tenant's connection must never leak into a child.
  fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
  // Streamed output (one NDJSON line per chunk) must not wait for Nagle's algorithm.
  socket.set_option(boost::asio::ip::tcp::no_delay(true), ec);
  if (remote.empty()) remote = detail::peerAddress(socket.native_handle());
  auto connection = std::make_shared<Connection>(io_);
  connection->protocol = socket.local_endpoint(ec).protocol();
  connection->remote = remote;
  connection->client = clientOf(remote);
  connection->buffer.max_size(limits_.max_header_bytes + limits_.max_buffered_bytes);
  {
    std::unique_lock lock(mutex_);
    std::string why;
    if (!admit(connection->client, why)) {
      lock.unlock();
      rejectOverloaded(UniqueFd(socket.release(ec)), remote, why);
      return;
    }
    if (!connection->abort_fd.valid()) {
      lock.unlock();
      rejectOverloaded(UniqueFd(socket.release(ec)), remote, "the server is out of file descriptors");
      return;
    }
    connection->socket = std::move(socket);
    connection->waiting = true;
    connections_.push_back(connection);
    ++open_connections_;
  }
  auto accepted = Clock::now();
  connection->first_header_deadline = accepted + std::min(limits_.read_timeout, limits_.first_request_timeout);
  waitForRequest(connection);
}

void Server::closeOnLoop(Connection& connection) {
  // Closed, not cancelled: a cancel ends only the read pending now, and Beast's header read or a
  // completion already queued would start another one that nothing ends. After a close, every
  // further operation fails at once and the connection finishes.
  boost::system::error_code ignored;
  connection.socket.close(ignored);
}

void Server::logRejection(const std::string& remote, const std::string& why) {
  size_t suppressed = 0;
  {
    std::lock_guard lock(mutex_);
    auto now = Clock::now();
    if (now - last_rejection_log_ < std::chrono::seconds(1)) {
      ++rejections_unlogged_;
      return;
    }
    last_rejection_log_ = now;
    suppressed = std::exchange(rejections_unlogged_, 0);
  }
  if (suppressed > 0) {
    spdlog::warn("http: rejecting {}: {} (and {} more rejected in the last second)", remote, why, suppressed);
  } else {
    spdlog::warn("http: rejecting {}: {}", remote, why);
  }
}

void Server::armDeadline(const ConnectionPtr& connection, Clock::time_point deadline) {
  uint64_t generation = ++connection->deadline_generation;
  connection->timer.expires_at(deadline);
  connection->timer.async_wait([this, connection, generation](boost::system::error_code ec) {
    if (ec || generation != connection->deadline_generation) return;
    closeOnLoop(*connection);
  });
}

void Server::waitForRequest(const ConnectionPtr& connection) {
  if (stopping_) return finish(connection);
  if (connection->buffer.size() > 0) return readHeader(connection);  // pipelined
  // The next request's first bytes: within the idle timeout, or for a new connection within
  // its first-request deadline. Reading (rather than waiting for readability) also picks up
  // bytes that arrived while a worker had the socket.
  auto deadline = connection->first_request ? connection->first_header_deadline : Clock::now() + limits_.idle_timeout;
  armDeadline(connection, deadline);
  auto space = connection->buffer.prepare(std::min<size_t>(4096, connection->buffer.max_size()));
  connection->socket.async_read_some(space, [this, connection](boost::system::error_code ec, size_t n) {
    ++connection->deadline_generation;
    connection->timer.cancel();
    if (ec || n == 0) {
      if (ec == boost::asio::error::operation_aborted && connection->first_request && !stopping_) {
        spdlog::debug("http: {} sent nothing in time; closing", connection->remote);
      }
      return finish(connection);
    }
    connection->buffer.commit(n);
    readHeader(connection);
  });
}

void Server::readHeader(const ConnectionPtr& connection) {
  auto deadline = connection->first_request ? connection->first_header_deadline : Clock::now() + limits_.read_timeout;
  connection->first_request = false;
  connection->parser.emplace();
  auto& parser = *connection->parser;
  parser.header_limit(
      static_cast<uint32_t>(std::min<size_t>(limits_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
  parser.body_limit(boost::none);  // handlers choose their limits with readBody(max_bytes)
  armDeadline(connection, deadline);
  beast_http::async_read_header(
      connection->socket, connection->buffer, parser, [this, connection](boost::system::error_code ec, size_t) {
        ++connection->deadline_generation;
        connection->timer.cancel();
        if (ec == beast_http::error::header_limit || ec == beast_http::error::buffer_overflow) {
          return dispatch(connection,
                          std::pair(431, makeError(ErrorCode::kResourceExhausted,
                                                   "the request header exceeds the limit of " +
                                                       std::to_string(limits_.max_header_bytes) + " bytes")));
        }
        if (detail::isHttpParseError(ec) && ec != beast_http::error::partial_message) {
          return dispatch(connection, std::pair(400, makeError(ErrorCode::kInvalidArgument,
                                                               "malformed HTTP request: " + ec.message())));
        }
        if (ec) {
          if (ec != beast_http::error::end_of_stream && ec != beast_http::error::partial_message) {
            spdlog::debug("http: {} dropped while sending a request header: {}", connection->remote, ec.message());
          }
          return finish(connection);
        }
        dispatch(connection, std::nullopt);
      });
}

void Server::dispatch(const ConnectionPtr& connection, std::optional<std::pair<int, Error>> early) {
  bool evicted = false;
  std::string over_limit;
  {
    std::lock_guard lock(mutex_);
    connection->waiting = false;
    size_t running = running_;
    auto of_client = running_by_client_.find(connection->client);
    size_t running_of_client = of_client == running_by_client_.end() ? 0 : of_client->second;
    if (running >= limits_.max_running_requests) {
      over_limit = "the server is running " + std::to_string(running) + " requests (the limit is " +
                   std::to_string(limits_.max_running_requests) + ")";
    } else if (running_of_client >= limits_.max_running_requests_per_client) {
      over_limit = "this client is running " + std::to_string(running_of_client) + " requests (the limit is " +
                   std::to_string(limits_.max_running_requests_per_client) + ")";
    } else {
      // An early answer closes the connection anyway; a request is not evicted from here on.
      evicted = !early && !setBusyLocked(*connection, true);
    }
  }
  if (evicted || stopping_) return finish(connection);
  boost::system::error_code ec;
  UniqueFd fd(connection->socket.release(ec));
  if (ec || !fd.valid()) return finish(connection);  // closed meanwhile (a deadline, an eviction)
  if (!over_limit.empty()) {
    rejectOverloaded(std::move(fd), connection->remote, over_limit);
    return finish(connection);
  }
  // The task owns the descriptor until the worker's stream takes it; a task never run (the
  // pool refused it) closes it with the lambda.
  auto shared_fd = std::make_shared<UniqueFd>(std::move(fd));
  std::string why;
  bool taken = workers_->run(
      [this, connection, shared_fd, early] { serveRequest(connection, std::move(*shared_fd), early); }, why);
  if (!taken) {
    rejectOverloaded(std::move(*shared_fd), connection->remote, why);
    finish(connection);
  }
}

void Server::finish(const ConnectionPtr& connection) {
  {
    std::lock_guard lock(mutex_);
    if (connection->finished) return;
    connection->finished = true;
    connection->waiting = false;
    connections_.remove(connection);
    --open_connections_;
    connection_ended_.notify_all();
  }
  // The socket and timer belong to the event loop: closed there, after anything still queued
  // for them. A worker reaches here holding no socket (its stream closed the descriptor).
  boost::asio::post(io_, [connection] {
    boost::system::error_code ignored;
    connection->timer.cancel();
    connection->socket.close(ignored);
  });
}

void Server::serveRequest(const ConnectionPtr& connection, UniqueFd fd, std::optional<std::pair<int, Error>> early) {
  const std::string& remote = connection->remote;
  detail::SocketStream stream(std::move(fd), connection->abort_fd.get());
  stream.setTimeouts(limits_.read_timeout, limits_.write_timeout);
  bool keep = false;
  bool drain_before_close = false;
  std::shared_ptr<detail::DetachedStream> detached;
  bool detached_head_sent = false;
  std::optional<RelayPlan> relay_plan;  // counted (reserveRelay): started below or counted out
  std::string relay_early;
  try {
    if (early) {
      std::string bytes = errorResponseBytes(early->first, early->second.code, early->second.message);
      boost::system::error_code ignored;
      boost::asio::write(stream, boost::asio::buffer(bytes), ignored);
      spdlog::debug("http: {} -> {} ({})", remote, early->first, early->second.message);
      drain_before_close = true;
    } else {
      auto started = Clock::now();
      detail::Exchange exchange(stream, connection->buffer, *connection->parser, stopping_);
      exchange.setStreamReserver([this, connection] { return reserveStream(connection); });
      exchange.setRelayReserver([this, connection] { return reserveRelay(connection); });
      Request& request = exchange.request();
      Response& response = exchange.response();
      auto parsed = exchange.parseRequest(remote);
      if (!parsed.ok()) {
        exchange.closeAfterResponse();
        exchange.sendServerError(400, parsed.error());
      } else {
        try {
          handler_(request, response);
        } catch (const std::exception& e) {
          spdlog::error("http: handler for {} {} threw: {}", request.method(), request.rawPath(), e.what());
        } catch (...) {
          spdlog::error("http: handler for {} {} threw a non-standard exception", request.method(), request.rawPath());
        }
      }
      // Taken at once: a stream counted for this connection must be started (or closed) below.
      detached = exchange.detached();
      detached_head_sent = detached && !exchange.ioFailed();
      if (exchange.relayPlan()) {
        relay_plan = std::move(exchange.relayPlan());  // moves only: cannot throw
        relay_early = std::move(exchange.relayEarlyBytes());
      }
      if (!response.started()) {
        if (const auto& failure = exchange.bodyFailure()) {
          exchange.sendServerError(failure->first, failure->second);
        } else {
          exchange.sendServerError(500, makeError(ErrorCode::kInternal, "the request handler failed to respond"));
        }
      }
      spdlog::debug("http: {} {} {} -> {} ({:.1f} ms{})", remote, request.method(), request.rawPath(),
                    response.status(), millisecondsSince(started), exchange.detached() ? ", streaming on" : "");
      keep = exchange.keepAlive() && !stopping_;
      // A taken-over connection ends with a FIN too: its last bytes must reach the client.
      if (!exchange.keepAlive()) {
        drain_before_close = !exchange.ioFailed() && (!exchange.bodyComplete() || exchange.takenOver());
      }
    }
  } catch (const std::exception& e) {
    // Out of memory, most likely: lose this connection, not the process.
    spdlog::error("http: connection from {} failed: {}", remote, e.what());
    keep = false;
    drain_before_close = false;
  }
  connection->parser.reset();
  if (relay_plan) {
    // The relay goes on without this thread, on the event loop with both sockets. The
    // connection stays busy (never evicted) but no longer counts as a running request.
    {
      std::lock_guard lock(mutex_);
      stopCountingRunningLocked(*connection);
    }
    try {
      auto relay = std::make_shared<Relay>(connection, std::move(*relay_plan), std::move(relay_early));
      auto back = std::make_shared<UniqueFd>(stream.releaseFd());
      boost::asio::post(io_, [this, relay, back] { startRelay(relay, std::move(*back)); });
    } catch (const std::exception& e) {
      // Out of memory: the relay never starts; its count goes, and the connection with it.
      spdlog::error("http: relay for {} failed to start: {}", remote, e.what());
      {
        std::lock_guard lock(mutex_);
        uncountRelayLocked(*connection);
      }
      finish(connection);
    }
    return;
  }
  if (detached) {
    // The stream goes on without this thread: to the event loop with the socket. It stays busy
    // (never evicted) but no longer counts as a running request.
    {
      std::lock_guard lock(mutex_);
      stopCountingRunningLocked(*connection);
    }
    auto stream_ptr = std::static_pointer_cast<Stream>(detached);
    try {
      auto back = std::make_shared<UniqueFd>(detached_head_sent ? stream.releaseFd() : UniqueFd());
      boost::asio::post(io_, [this, stream_ptr, back] { startStreaming(stream_ptr, std::move(*back)); });
    } catch (const std::exception& e) {
      // Out of memory: the stream ends here (its socket with this thread's stream object), and
      // must still be counted out, on the loop like every close.
      spdlog::error("http: stream to {} failed: {}", remote, e.what());
      boost::asio::post(io_, [this, stream_ptr] { closeStream(stream_ptr, false); });
    }
    return;
  }
  {
    // Not running a request any more: evictable, and not counted against the client's running
    // requests, while it lingers or waits for the next request.
    std::lock_guard lock(mutex_);
    keep = setBusyLocked(*connection, false) && keep;
  }
  try {
    if (!keep && !drain_before_close) return finish(connection);
    // Back to the event loop: to wait for the next request, or to linger, without a thread.
    if (!keep) shutdown(stream.fd(), SHUT_WR);
    if (connection->buffer.size() == 0) connection->buffer.shrink_to_fit();  // an idle connection keeps no body
    auto back = std::make_shared<UniqueFd>(stream.releaseFd());
    if (!keep) {
      boost::asio::post(io_, [this, connection, back] { linger(connection, std::move(*back)); });
      return;
    }
    postWaitForNext(connection, back);
  } catch (const std::exception& e) {
    // Out of memory: this connection is lost, but it must still be counted out.
    spdlog::error("http: connection from {} failed: {}", remote, e.what());
    finish(connection);
  }
}

void Server::postWaitForNext(const ConnectionPtr& connection, const std::shared_ptr<UniqueFd>& back) {
  boost::asio::post(io_, [this, connection, back] {
    bool evicted = false;
    {
      std::lock_guard lock(mutex_);
      evicted = connection->evicted;
      if (!evicted && !stopping_) connection->waiting = true;
    }
    if (evicted || stopping_) return finish(connection);
    boost::system::error_code ec;
    connection->socket.assign(connection->protocol, back->get(), ec);
    if (ec) {
      spdlog::warn("http: cannot wait for {}'s next request: {}", connection->remote, ec.message());
      return finish(connection);
    }
    (void)back->release();
    waitForRequest(connection);
  });
}

void Server::linger(const ConnectionPtr& connection, UniqueFd fd) {
  if (stopping_) return finish(connection);
  boost::system::error_code ec;
  connection->socket.assign(connection->protocol, fd.get(), ec);
  if (ec) return finish(connection);
  (void)fd.release();
  lingerOnLoop(connection);
}

void Server::lingerOnLoop(const ConnectionPtr& connection) {
  if (stopping_) {
    closeOnLoop(*connection);
    return finish(connection);
  }
  {
    std::lock_guard lock(mutex_);
    if (connection->evicted) {
      closeOnLoop(*connection);
      return finish(connection);
    }
    connection->waiting = true;
  }
  armDeadline(connection, Clock::now() + kLingerTime);
  auto discard = std::make_shared<size_t>(0);
  auto step = std::make_shared<std::function<void()>>();
  *step = [this, connection, discard, step] {
    connection->buffer.clear();
    auto space = connection->buffer.prepare(std::min<size_t>(16384, connection->buffer.max_size()));
    connection->socket.async_read_some(space,
                                       [this, connection, discard, step](boost::system::error_code read_ec, size_t n) {
                                         *discard += n;
                                         if (read_ec || n == 0 || *discard >= kLingerBytes || stopping_) {
                                           ++connection->deadline_generation;
                                           connection->timer.cancel();
                                           *step = nullptr;  // breaks the cycle step -> lambda -> step
                                           return finish(connection);
                                         }
                                         (*step)();
                                       });
  };
  (*step)();
}

// ---- Detached streams

Result<std::shared_ptr<detail::DetachedStream>> Server::reserveStream(const ConnectionPtr& connection) {
  std::lock_guard lock(mutex_);
  if (connection->stream) return makeError(ErrorCode::kFailedPrecondition, "the response is already detached");
  if (streams_ >= limits_.max_streams) {
    return makeError(ErrorCode::kUnavailable, "the server has " + std::to_string(streams_) +
                                                  " streams open (the limit is " + std::to_string(limits_.max_streams) +
                                                  "); retry later");
  }
  auto of_client = streams_by_client_.find(connection->client);
  if (of_client != streams_by_client_.end() && of_client->second >= limits_.max_streams_per_client) {
    return makeError(ErrorCode::kUnavailable, "this client has " + std::to_string(of_client->second) +
                                                  " streams open (the limit is " +
                                                  std::to_string(limits_.max_streams_per_client) + ")");
  }
  auto stream = std::make_shared<Stream>(*this, connection);
  connection->stream = stream;
  ++streams_;
  ++streams_by_client_[connection->client];
  return std::shared_ptr<detail::DetachedStream>(stream);
}

bool Server::runStep(const StreamPtr& stream, std::function<void()> task, std::string& why) {
  const std::string party = stream->step_party;  // under the stream's lock (runBlocking)
  // The pool takes the step, or refuses it, under this lock: no step of the party can queue
  // behind one that is then refused, so a refusal leaves nobody waiting for a step that never
  // runs. (The pool never runs a task on the calling thread, nor takes this lock. A task it
  // refuses goes under this lock, the pool's and the stream's: what a step captures must take
  // none of them when it goes, as a waiting step's below.)
  std::lock_guard lock(steps_mutex_);
  try {
    PartySteps& steps = steps_by_party_[party];
    if (steps.running >= std::max<size_t>(1, limits_.max_stream_steps_per_client)) {
      if (steps.waiting.size() >= limits_.max_streams_per_client) {
        // Steps of streams that closed while they waited hold no place. (What they captured
        // goes here, under this lock: a tenant's ticket, a pump's reference; none of it
        // takes a stream's lock or this one.)
        std::erase_if(steps.waiting, [](const auto& waiting) { return waiting.first->closed(); });
      }
      if (steps.waiting.size() >= limits_.max_streams_per_client) {
        why = "its party has " + std::to_string(steps.running) + " steps running and " +
              std::to_string(steps.waiting.size()) + " waiting (the limit is " +
              std::to_string(limits_.max_streams_per_client) + ")";
        return false;
      }
      steps.waiting.emplace_back(stream, std::move(task));  // all or nothing
      return true;
    }
    std::function<void()> first = [this, party, stream, task = std::move(task)]() mutable {
      runStepsOfParty(party, std::move(stream), std::move(task));
    };
    if (stream_steps_->run(std::move(first), why)) {
      ++steps.running;
      return true;
    }
  } catch (const std::exception& e) {  // no memory for the step
    why = std::string("cannot queue the step: ") + e.what();
  }
  // Not run: an entry made for it goes (there are no empty entries).
  if (auto it = steps_by_party_.find(party);
      it != steps_by_party_.end() && it->second.running == 0 && it->second.waiting.empty()) {
    steps_by_party_.erase(it);
  }
  return false;
}

void Server::runStepsOfParty(const std::string& party, StreamPtr stream, std::function<void()> task) {
  while (true) {
    // A step taken after its stream closed (it waited its turn, or the server stops) is skipped:
    // a client that is gone costs no blocking call.
    if (!stream->closed()) {
      try {
        task();
      } catch (const std::exception& e) {
        // Its producer cannot go on (a pump left marked running): the stream ends, not hangs.
        spdlog::error("http: a stream step threw: {}; the stream is cut", e.what());
        stream->abort();
      }
    }
    task = nullptr;  // what the step captured goes before the next one runs
    stream.reset();
    std::lock_guard lock(steps_mutex_);
    auto it = steps_by_party_.find(party);
    if (it->second.waiting.empty()) {
      if (--it->second.running == 0) steps_by_party_.erase(it);
      return;
    }
    std::tie(stream, task) = std::move(it->second.waiting.front());
    it->second.waiting.pop_front();
  }
}

void Server::startStreaming(const StreamPtr& stream, UniqueFd fd) {
  const ConnectionPtr& connection = stream->connection;
  if (!fd.valid() || stopping_) return closeStream(stream, false);
  boost::system::error_code ec;
  connection->socket.assign(connection->protocol, fd.get(), ec);
  if (ec) {
    spdlog::warn("http: cannot stream to {}: {}", connection->remote, ec.message());
    return closeStream(stream, false);
  }
  (void)fd.release();
  {
    std::lock_guard lock(stream->m);
    stream->started = true;
  }
  stream->last_write = Clock::now();
  watchStreamClient(stream);
  armStreamKeepAlive(stream);
  pumpStream(stream);
}

void Server::pumpStream(const StreamPtr& stream) {
  std::unique_lock lock(stream->m);
  stream->pump_posted = false;
  if (stream->is_closed || stream->writing) return;  // a write's completion pumps again
  if (stream->abort_requested) {
    lock.unlock();
    return closeStream(stream, false);
  }
  const bool chunked = stream->framing == detail::DetachedStream::Framing::kChunked;
  // Up to ~1 MiB per write: queued chunks go out together, and one slow client's backlog is
  // taken by the socket in steps.
  constexpr size_t kWriteBatch = 1 << 20;
  stream->in_flight.clear();
  stream->in_flight_body = 0;
  while (!stream->queue.empty() && stream->in_flight.size() < kWriteBatch) {
    auto& [bytes, body] = stream->queue.front();
    stream->in_flight += bytes;
    stream->in_flight_body += body;
    stream->queue.pop_front();
  }
  if (stream->queue.empty() && stream->ending && !stream->end_queued) {
    stream->end_queued = true;
    if (chunked) stream->in_flight += "0\r\n\r\n";
  }
  if (stream->in_flight.empty()) {
    bool done = stream->ending && stream->end_queued;
    lock.unlock();
    if (done) closeStream(stream, true);
    return;
  }
  stream->writing = true;
  lock.unlock();
  stream->in_flight_sent = 0;
  writeStreamSome(stream);
}

void Server::writeStreamSome(const StreamPtr& stream) {
  // A piece at a time, the deadline re-armed on each: the write timeout bounds a stall, not the
  // time a steadily slow reader takes for the whole batch.
  const ConnectionPtr& connection = stream->connection;
  armDeadline(connection, Clock::now() + limits_.write_timeout);
  connection->socket.async_write_some(
      boost::asio::buffer(stream->in_flight.data() + stream->in_flight_sent,
                          stream->in_flight.size() - stream->in_flight_sent),
      [this, stream](boost::system::error_code ec, size_t n) {
        const ConnectionPtr& c = stream->connection;
        if (!c) return;  // closed meanwhile
        ++c->deadline_generation;
        c->timer.cancel();
        if (ec) {
          spdlog::debug("http: stream to {} ended: {}", c->remote,
                        ec == boost::asio::error::operation_aborted ? "the write timed out" : ec.message());
          return closeStream(stream, false);
        }
        stream->in_flight_sent += n;
        if (stream->in_flight_sent < stream->in_flight.size()) return writeStreamSome(stream);
        stream->last_write = Clock::now();
        bool done = false;
        {
          std::lock_guard inner(stream->m);
          stream->writing = false;
          stream->pending_bytes -= stream->in_flight_body;
          done = stream->end_queued && stream->queue.empty();
        }
        stream->in_flight.clear();
        if (done) return closeStream(stream, true);
        pumpStream(stream);
      });
}

void Server::watchStreamClient(const StreamPtr& stream) {
  // The client sends nothing while it reads a stream: readability means it hung up (or
  // half-closed, which counts as gone, as Response::clientGone says), or sent its next request
  // early, which stays in the socket for after the stream.
  stream->connection->socket.async_wait(
      boost::asio::ip::tcp::socket::wait_read, [this, stream](boost::system::error_code ec) {
        if (ec || !stream->connection) return;
        char byte;
        ssize_t n = ::recv(stream->connection->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return pollStreamClient(stream);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return watchStreamClient(stream);
        spdlog::debug("http: {} left during a stream", stream->connection->remote);
        closeStream(stream, false);
      });
}

void Server::pollStreamClient(const StreamPtr& stream) {
  // Bytes wait in the socket (a pipelined request, a stray CRLF), so it stays readable: look for
  // the hang-up behind them each second instead (POLLRDHUP sees a FIN past unread data).
  auto& timer = stream->connection->hangup_timer;
  timer.expires_after(std::chrono::seconds(1));
  timer.async_wait([this, stream](boost::system::error_code ec) {
    if (ec || !stream->connection) return;
    pollfd p{stream->connection->socket.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      spdlog::debug("http: {} left during a stream", stream->connection->remote);
      return closeStream(stream, false);
    }
    pollStreamClient(stream);
  });
}

void Server::armStreamKeepAlive(const StreamPtr& stream) {
  std::chrono::milliseconds idle{0};
  {
    std::lock_guard lock(stream->m);
    idle = stream->keepalive_idle;
  }
  if (idle <= std::chrono::milliseconds(0) || !stream->connection) return;
  auto now = Clock::now();
  auto at = stream->last_write + idle;
  if (at <= now) at = now + idle;  // a write is in flight or just went: wait a whole period
  auto& timer = stream->connection->stream_timer;
  timer.expires_at(at);
  timer.async_wait([this, stream, idle](boost::system::error_code ec) {
    if (ec || !stream->connection) return;
    bool idle_long = false;
    std::string chunk;
    {
      std::lock_guard lock(stream->m);
      idle_long = !stream->writing && stream->queue.empty() && Clock::now() >= stream->last_write + idle;
      if (idle_long) chunk = stream->keepalive_chunk;
    }
    if (idle_long) (void)stream->write(std::move(chunk));
    armStreamKeepAlive(stream);
  });
}

void Server::closeStream(const StreamPtr& stream, bool completed) {
  std::function<void(bool)> on_close;
  bool keep_alive = false;
  {
    std::lock_guard lock(stream->m);
    if (stream->is_closed) return;
    stream->is_closed = true;
    stream->closed_now = true;
    stream->completed = completed;
    on_close = std::move(stream->on_close);
    stream->on_close = nullptr;
    keep_alive = stream->keep_alive;
    stream->queue.clear();
    stream->pending_bytes = 0;
  }
  ConnectionPtr connection = std::move(stream->connection);
  connection->stream_timer.cancel();
  connection->hangup_timer.cancel();
  bool keep = false;
  {
    std::lock_guard lock(mutex_);
    connection->stream.reset();
    --streams_;
    auto it = streams_by_client_.find(connection->client);
    if (--it->second == 0) streams_by_client_.erase(it);
    // An idle connection again (the handler's count ended when it returned).
    connection->busy = false;
    connection->idle_since = Clock::now();
    keep = completed && keep_alive && !stopping_ && !connection->evicted;
    if (keep) connection->waiting = true;
  }
  if (keep) {
    boost::system::error_code ignored;
    connection->socket.cancel(ignored);  // the wait for a hang-up
    waitForRequest(connection);
  } else if (completed) {
    shutdown(connection->socket.native_handle(), SHUT_WR);
    boost::system::error_code ignored;
    connection->socket.cancel(ignored);
    lingerOnLoop(connection);
  } else {
    closeOnLoop(*connection);
    finish(connection);
  }
  if (!on_close) return;
  try {
    on_close(completed);
  } catch (const std::exception& e) {
    // Nothing may throw on the loop; a callback that did loses only its own clean-up.
    spdlog::error("http: a stream's close callback threw: {}", e.what());
  }
}

// ---- Relays

Status Server::reserveRelay(const ConnectionPtr&) {
  std::lock_guard lock(mutex_);
  if (relays_ >= limits_.max_relays) {
    return makeError(ErrorCode::kUnavailable, "the server has " + std::to_string(relays_) +
                                                  " connections relayed (the limit is " +
                                                  std::to_string(limits_.max_relays) + "); retry later");
  }
  ++relays_;
  return okStatus();
}

size_t Server::openRelays() {
  std::lock_guard lock(mutex_);
  return relays_;
}

void Server::uncountRelayLocked(Connection& connection) {
  --relays_;
  // An idle connection again (the handler's count ended when it returned).
  connection.relay.reset();
  connection.busy = false;
  connection.idle_since = Clock::now();
}

void Server::startRelay(const RelayPtr& relay, UniqueFd fd) {
  const ConnectionPtr& connection = relay->connection;
  {
    std::lock_guard lock(mutex_);
    connection->relay = relay;  // for stop(), which closes it on this loop
  }
  if (!fd.valid() || stopping_) return closeRelay(relay, false, "the server is stopping");
  boost::system::error_code ec;
  connection->socket.assign(connection->protocol, fd.get(), ec);
  if (ec) return closeRelay(relay, false, "the client's socket cannot join the loop");
  (void)fd.release();
  int family = 0;
  socklen_t length = sizeof family;
  if (::getsockopt(relay->plan.peer, SOL_SOCKET, SO_DOMAIN, &family, &length) != 0) {
    return closeRelay(relay, false, "the peer is not a socket");
  }
  relay->peer.assign(boost::asio::generic::stream_protocol(family, 0), relay->plan.peer, ec);
  if (ec) return closeRelay(relay, false, "the peer's socket cannot join the loop");
  try {
    relay->down.buffer.resize(64 * 1024);
    if (relay->plan.both_ways) relay->up.buffer.resize(64 * 1024);
  } catch (const std::exception&) {
    return closeRelay(relay, false, "no memory for its buffers");
  }
  relay->down.open = true;
  relay->up.open = relay->plan.both_ways;
  armRelayIdle(relay);
  relay->down.data = relay->plan.to_client.data();
  relay->down.left = relay->plan.to_client.size();
  writeRelay(relay, connection->socket, true, [this, relay] {
    std::string().swap(relay->plan.to_client);
    pumpRelay(relay, relay->peer, relay->connection->socket, true);
    if (!relay->plan.both_ways) return watchRelayClient(relay);
    relay->up.data = relay->to_peer.data();
    relay->up.left = relay->to_peer.size();
    writeRelay(relay, relay->peer, false, [this, relay] {
      std::string().swap(relay->to_peer);
      pumpRelay(relay, relay->connection->socket, relay->peer, false);
    });
  });
}

template <class To>
void Server::writeRelay(const RelayPtr& relay, To& to, bool down, std::function<void()> done) {
  Relay::Way& way = down ? relay->down : relay->up;
  if (way.left == 0) {
    way.writing = false;
    return done();
  }
  way.writing = true;
  if (down) watchRelayPeer(relay);
  to.async_write_some(boost::asio::buffer(way.data, way.left),
                      [this, relay, &to, down, done = std::move(done)](boost::system::error_code ec, size_t n) mutable {
                        if (relay->closed) return;
                        if (ec) return closeRelay(relay, false, down ? "the client failed" : "the peer failed");
                        Relay::Way& w = down ? relay->down : relay->up;
                        w.data += n;
                        w.left -= n;
                        relay->last_activity = Clock::now();  // each piece: a slow reader is not idle
                        writeRelay(relay, to, down, std::move(done));
                      });
}

template <class From, class To>
void Server::pumpRelay(const RelayPtr& relay, From& from, To& to, bool down) {
  Relay::Way& way = down ? relay->down : relay->up;
  from.async_read_some(
      boost::asio::buffer(way.buffer), [this, relay, &from, &to, down](boost::system::error_code ec, size_t n) {
        if (relay->closed) return;
        Relay::Way& w = down ? relay->down : relay->up;
        if (ec == boost::asio::error::eof) {
          // The end passes on as a half-close; the other direction goes on.
          ::shutdown(to.native_handle(), SHUT_WR);
          w.open = false;
          if (down) {
            if (!relay->plan.both_ways) return closeRelay(relay, true, "the answer ended");
            // The peer's socket shut down both ways (its owner ended it: the sandbox stopped):
            // nothing can go to it any more either.
            pollfd p{relay->peer.native_handle(), 0, 0};
            if (::poll(&p, 1, 0) > 0 && (p.revents & POLLHUP) != 0) return closeRelay(relay, true, "the peer ended");
            // A peer that sent its end first and closes later (a WebSocket server's close
            // handshake) must not leave the relay to the client's whims or the idle timeout.
            if (relay->up.open) watchRelayPeer(relay);
          }
          if (!relay->down.open && !relay->up.open) closeRelay(relay, true, "both sides ended");
          return;
        }
        if (ec) return closeRelay(relay, false, down ? "the peer failed" : "the client failed");
        relay->last_activity = Clock::now();
        w.data = w.buffer.data();
        w.left = n;
        writeRelay(relay, to, down, [this, relay, &from, &to, down] { pumpRelay(relay, from, to, down); });
      });
}

void Server::watchRelayPeer(const RelayPtr& relay) {
  // The end of a peer shut down both ways shows as a read's end of stream; but a read waits
  // while the client is slow to take what was read before. Meanwhile the peer is looked at
  // each second, so an ended peer (a sandbox gone) does not hold its relay until the idle timeout.
  // Both ways, a peer whose end of stream came first is looked at the same way while the
  // client may still send: once it closed altogether, nothing can go either way.
  if (relay->peer_watched) return;
  relay->peer_watched = true;
  auto& timer = relay->connection->timer;
  timer.expires_after(std::chrono::seconds(1));
  timer.async_wait([this, relay](boost::system::error_code ec) {
    relay->peer_watched = false;
    const bool after_peer_end = relay->plan.both_ways && !relay->down.open && relay->up.open;
    if (ec || relay->closed || (!relay->down.writing && !after_peer_end)) return;
    if (after_peer_end) {
      pollfd p{relay->peer.native_handle(), 0, 0};
      if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0) {
        return closeRelay(relay, true, "the peer ended");
      }
      return watchRelayPeer(relay);
    }
    // Once the client's end was passed on (our shutdown of the peer's sending side), the peer's
    // own FIN completes a hang-up that ends nothing: its last bytes still wait to be read.
    if (relay->plan.both_ways && !relay->up.open) return;
    pollfd p{relay->peer.native_handle(), 0, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR)) != 0) {
      return closeRelay(relay, false, "the peer ended while the client was slow");
    }
    watchRelayPeer(relay);
  });
}

void Server::watchRelayClient(const RelayPtr& relay) {
  // One way, the client has nothing more to send: readability means it hung up or half-closed
  // (gone, as for streams: a browser that leaves a silent answer must not hold it until the idle
  // timeout), or sent bytes that stay unread (a pipelined request; then its end is looked for
  // each second, POLLRDHUP seeing a FIN past unread data).
  relay->connection->socket.async_wait(
      boost::asio::ip::tcp::socket::wait_read, [this, relay](boost::system::error_code ec) {
        if (ec || relay->closed) return;
        char byte;
        ssize_t n = ::recv(relay->connection->socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return pollRelayClient(relay);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
          return watchRelayClient(relay);
        }
        closeRelay(relay, false, "the client left");
      });
}

void Server::pollRelayClient(const RelayPtr& relay) {
  auto& timer = relay->connection->hangup_timer;
  timer.expires_after(std::chrono::seconds(1));
  timer.async_wait([this, relay](boost::system::error_code ec) {
    if (ec || relay->closed) return;
    pollfd p{relay->connection->socket.native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      return closeRelay(relay, false, "the client left");
    }
    pollRelayClient(relay);
  });
}

void Server::armRelayIdle(const RelayPtr& relay) {
  auto& timer = relay->connection->stream_timer;
  timer.expires_at(relay->last_activity + relay->plan.idle_timeout);
  timer.async_wait([this, relay](boost::system::error_code ec) {
    if (ec || relay->closed) return;
    if (Clock::now() >= relay->last_activity + relay->plan.idle_timeout) {
      return closeRelay(relay, false, "nothing moved for the idle timeout");
    }
    armRelayIdle(relay);
  });
}

void Server::closeRelay(const RelayPtr& relay, bool completed, const char* why) {
  if (relay->closed) return;
  relay->closed = true;
  const ConnectionPtr connection = relay->connection;
  spdlog::debug("http: relay for {} ended: {}", connection->remote, why);
  connection->stream_timer.cancel();
  connection->hangup_timer.cancel();
  connection->timer.cancel();
  // Borrowed: released, never closed here (its owner closes it with `keep`); pending operations end.
  boost::system::error_code ignored;
  if (relay->peer.is_open()) (void)relay->peer.release(ignored);
  try {
    relay->plan.keep.reset();  // before the connection counts out: a stop waits for both
  } catch (const std::exception& e) {
    spdlog::error("http: a relay's clean-up threw: {}", e.what());
  }
  {
    std::lock_guard lock(mutex_);
    uncountRelayLocked(*connection);
  }
  if (completed && !stopping_) {
    // Its last bytes must reach the client: a FIN (sent when the answer ended), then a linger,
    // not a close over unread bytes, which would reset the connection.
    ::shutdown(connection->socket.native_handle(), SHUT_WR);
    connection->socket.cancel(ignored);
    lingerOnLoop(connection);
  } else {
    closeOnLoop(*connection);
    finish(connection);
  }
}

}  // namespace space::http
