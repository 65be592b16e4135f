#include "http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <cerrno>
#include <cstring>
#include <limits>

#include "http/exchange.h"
#include "http/tcp.h"

namespace space::http {

namespace beast_http = boost::beast::http;

namespace {

// How long a closing connection may take to drain what the client still sends (see
// SocketStream::closeGracefully), and how much of it.
constexpr std::chrono::milliseconds kLingerTime{1000};
constexpr size_t kLingerBytes = 1 << 20;

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

// Fields other than thread and abort_fd are guarded by Server::mutex_.
struct Server::Connection {
  std::thread thread;
  std::string client;
  UniqueFd abort_fd{eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // fails this connection's socket I/O
  bool busy = false;                                          // running a request: never evicted
  bool evicted = false;                                       // made room for a newer connection; closing
  bool finished = false;
  Clock::time_point idle_since = Clock::now();
};

Result<std::unique_ptr<Server>> Server::start(const std::string& listen, Handler handler, ServerLimits limits) {
  auto listener = detail::listenTcp(listen, 128);
  if (!listener.ok()) return listener.error();
  std::unique_ptr<Server> server(new Server(std::move(listener.value()), std::move(handler), limits));
  if (!server->stop_fd_.valid()) {
    return makeError(ErrorCode::kResourceExhausted, "cannot create the server's eventfds (out of descriptors?)");
  }
  try {
    server->acceptor_ = std::thread([s = server.get()] { s->acceptLoop(); });
  } catch (const std::system_error& e) {
    return makeError(ErrorCode::kResourceExhausted, std::string("cannot start the acceptor thread: ") + e.what());
  }
  spdlog::info("http: listening on {}", server->address_);
  return server;
}

Server::Server(UniqueFd listener, Handler handler, ServerLimits limits)
    : listener_(std::move(listener)),
      handler_(std::move(handler)),
      limits_(limits),
      stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  address_ = detail::localAddress(listener_.get());
  auto parsed = detail::parseHostPort(address_, true);
  if (parsed.ok()) port_ = parsed->port;
}

Server::~Server() { stop(std::chrono::milliseconds(0)); }

void Server::stop(std::chrono::milliseconds grace) {
  std::call_once(stop_once_, [&] {
    stopping_ = true;
    signalEventFd(stop_fd_.get());
    if (acceptor_.joinable()) acceptor_.join();
    listener_.reset();
    std::list<Connection> all;
    {
      std::unique_lock lock(mutex_);
      if (!connection_ended_.wait_for(lock, grace, [&] { return open_connections_ == 0; })) {
        spdlog::warn("http: {} connection(s) still busy after {} ms; failing their I/O", open_connections_,
                     grace.count());
        for (Connection& connection : connections_) signalEventFd(connection.abort_fd.get());
      }
      all.splice(all.end(), connections_);
    }
    for (Connection& connection : all) connection.thread.join();
    spdlog::info("http: stopped listening on {}", address_);
  });
}

void Server::reapFinished() {
  std::list<Connection> finished;
  {
    std::lock_guard lock(mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->finished) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& connection : finished) connection.thread.join();
}

bool Server::admit(const std::string& client, std::string& why) {
  size_t from_client = 0;
  Connection* oldest_idle = nullptr;
  Connection* oldest_idle_of_client = nullptr;
  size_t closing = 0;
  for (Connection& c : connections_) {
    if (c.finished) continue;
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
  // that must not push the thread count past twice the limit.
  if (open_connections_ >= 2 * limits_.max_connections) {
    why = "the server is closing " + std::to_string(closing) + " connections to make room";
    return false;
  }
  if (victim) {
    victim->evicted = true;
    signalEventFd(victim->abort_fd.get());
    spdlog::debug("http: closing an idle connection of {} to admit one from {}", victim->client, client);
  }
  return true;
}

bool Server::setBusy(Connection& connection, bool busy) {
  std::lock_guard lock(mutex_);
  if (connection.evicted) return false;
  connection.busy = busy;
  if (!busy) connection.idle_since = Clock::now();
  return true;
}

void Server::rejectOverloaded(UniqueFd fd, const std::string& why) {
  spdlog::warn("http: rejecting {}: {}", detail::peerAddress(fd.get()), why);
  std::string response = errorResponseBytes(503, ErrorCode::kUnavailable, why + "; retry later");
  // Non-blocking and best effort: the acceptor must not wait for an unwanted client. A short
  // response fits the socket buffer; what the client already sent is drained so closing does
  // not reset the connection over the response.
  ssize_t sent = send(fd.get(), response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)sent;
  shutdown(fd.get(), SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && recv(fd.get(), scratch, sizeof scratch, MSG_DONTWAIT) > 0; ++i) {
  }
}

void Server::acceptLoop() {
  while (!stopping_) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) {
      spdlog::error("http: poll on the listening socket: {}", strerror(errno));
      return;
    }
    if (fds[1].revents & POLLIN) return;
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED) continue;
      // Out of descriptors or memory: back off instead of spinning on a listener that stays ready.
      spdlog::warn("http: accept: {}", strerror(err));
      pollfd stop{stop_fd_.get(), POLLIN, 0};
      poll(&stop, 1, 100);
      continue;
    }
    int one = 1;
    // Streamed output (one NDJSON line per chunk) must not wait for Nagle's algorithm.
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    reapFinished();

    std::string remote = detail::peerAddress(fd.get());
    std::string client = clientOf(remote);
    std::unique_lock lock(mutex_);
    std::string why;
    if (!admit(client, why)) {
      lock.unlock();
      rejectOverloaded(std::move(fd), why);
      continue;
    }
    connections_.emplace_back();
    Connection& connection = connections_.back();
    connection.client = client;
    if (!connection.abort_fd.valid()) {
      connections_.pop_back();
      lock.unlock();
      rejectOverloaded(std::move(fd), "the server is out of file descriptors");
      continue;
    }
    try {
      connection.thread = std::thread([this, &connection, remote, fd = std::move(fd)]() mutable {
        try {
          detail::SocketStream stream(std::move(fd), connection.abort_fd.get());
          serveConnection(connection, stream, remote);
        } catch (const std::exception& e) {
          // Out of memory, most likely: lose this connection, not the process.
          spdlog::error("http: connection from {} failed: {}", remote, e.what());
        }
        std::lock_guard done_lock(mutex_);
        connection.finished = true;
        --open_connections_;
        connection_ended_.notify_all();
      });
      ++open_connections_;
    } catch (const std::system_error& e) {
      connections_.pop_back();
      lock.unlock();
      spdlog::error("http: cannot start a connection thread: {}", e.what());
    }
  }
}

void Server::serveConnection(Connection& connection, detail::SocketStream& stream, const std::string& remote) {
  stream.setTimeouts(limits_.read_timeout, limits_.write_timeout);
  boost::beast::flat_buffer buffer(limits_.max_header_bytes + limits_.max_buffered_bytes);
  bool first_request = true;
  bool drain_before_close = false;
  auto answerAndClose = [&](int status, ErrorCode code, const std::string& message) {
    std::string bytes = errorResponseBytes(status, code, message);
    boost::system::error_code ignored;
    boost::asio::write(stream, boost::asio::buffer(bytes), ignored);
    spdlog::debug("http: {} -> {} ({})", remote, status, message);
    drain_before_close = true;
  };

  auto accepted = Clock::now();
  auto first_header_deadline = accepted + std::min(limits_.read_timeout, limits_.first_request_timeout);
  while (true) {
    if (buffer.size() == 0) {
      auto ready = stream.waitReadable(first_request ? first_header_deadline : Clock::now() + limits_.idle_timeout,
                                       stop_fd_.get());
      auto wait = first_request ? first_header_deadline - accepted : std::chrono::milliseconds(limits_.idle_timeout);
      if (ready == detail::SocketStream::Wait::kTimedOut && first_request) {
        spdlog::debug("http: {} sent nothing for {} ms; closing", remote,
                      std::chrono::duration_cast<std::chrono::milliseconds>(wait).count());
      }
      if (ready != detail::SocketStream::Wait::kReadable) break;
    } else if (stopping_) {
      break;
    }
    auto started = Clock::now();
    auto header_deadline = first_request ? first_header_deadline : started + limits_.read_timeout;
    first_request = false;

    detail::RequestParser parser;
    parser.header_limit(
        static_cast<uint32_t>(std::min<size_t>(limits_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser.body_limit(boost::none);  // handlers choose their limits with readBody(max_bytes)
    boost::system::error_code ec;
    stream.setReadDeadline(header_deadline);
    beast_http::read_header(stream, buffer, parser, ec);
    stream.setReadDeadline(Clock::time_point::max());
    if (ec == beast_http::error::header_limit || ec == beast_http::error::buffer_overflow) {
      answerAndClose(431, ErrorCode::kResourceExhausted,
                     "the request header exceeds the limit of " + std::to_string(limits_.max_header_bytes) + " bytes");
      break;
    }
    if (ec == beast_http::error::end_of_stream || ec == beast_http::error::partial_message) break;
    if (detail::isHttpParseError(ec)) {
      answerAndClose(400, ErrorCode::kInvalidArgument, "malformed HTTP request: " + ec.message());
      break;
    }
    if (ec) {
      spdlog::debug("http: {} dropped while sending a request header: {}", remote, ec.message());
      break;
    }

    if (!setBusy(connection, true)) break;  // evicted while its header arrived
    detail::Exchange exchange(stream, buffer, parser, stopping_);
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
    if (!response.started()) {
      if (const auto& failure = exchange.bodyFailure()) {
        exchange.sendServerError(failure->first, failure->second);
      } else {
        exchange.sendServerError(500, makeError(ErrorCode::kInternal, "the request handler failed to respond"));
      }
    }
    spdlog::debug("http: {} {} {} -> {} ({:.1f} ms)", remote, request.method(), request.rawPath(), response.status(),
                  millisecondsSince(started));
    if (!exchange.keepAlive()) {
      // A taken-over connection ends with a FIN too: its last bytes must reach the client.
      drain_before_close = !exchange.ioFailed() && (!exchange.bodyComplete() || exchange.takenOver());
      break;
    }
    if (!setBusy(connection, false)) break;
  }
  if (drain_before_close) stream.closeGracefully(Clock::now() + kLingerTime, kLingerBytes);
}

}  // namespace space::http
