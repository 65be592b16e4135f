#include "http/server.h"

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

}  // namespace

struct Server::Connection {
  std::thread thread;
  bool finished = false;  // guarded by Server::mutex_
};

Result<std::unique_ptr<Server>> Server::start(const std::string& listen, Handler handler, ServerLimits limits) {
  auto listener = detail::listenTcp(listen, 128);
  if (!listener.ok()) return listener.error();
  std::unique_ptr<Server> server(new Server(std::move(listener.value()), std::move(handler), limits));
  if (!server->stop_fd_.valid() || !server->abort_fd_.valid()) {
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
      stop_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      abort_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
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
        signalEventFd(abort_fd_.get());
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

void Server::rejectOverloaded(UniqueFd fd) {
  spdlog::warn("http: rejecting {}: {} connections open", detail::peerAddress(fd.get()), limits_.max_connections);
  std::string response = errorResponseBytes(
      503, ErrorCode::kUnavailable,
      "the server has too many open connections (" + std::to_string(limits_.max_connections) + "); retry later");
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

    std::unique_lock lock(mutex_);
    if (open_connections_ >= limits_.max_connections) {
      lock.unlock();
      rejectOverloaded(std::move(fd));
      continue;
    }
    connections_.emplace_back();
    Connection& connection = connections_.back();
    try {
      connection.thread = std::thread([this, &connection, fd = std::move(fd)]() mutable {
        std::string remote = detail::peerAddress(fd.get());
        try {
          detail::SocketStream stream(std::move(fd), abort_fd_.get());
          serveConnection(stream, remote);
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

void Server::serveConnection(detail::SocketStream& stream, const std::string& remote) {
  stream.setTimeouts(limits_.read_timeout, limits_.write_timeout);
  boost::beast::flat_buffer buffer;
  bool first_request = true;
  bool drain_before_close = false;
  auto answerAndClose = [&](int status, ErrorCode code, const std::string& message) {
    std::string bytes = errorResponseBytes(status, code, message);
    boost::system::error_code ignored;
    boost::asio::write(stream, boost::asio::buffer(bytes), ignored);
    spdlog::debug("http: {} -> {} ({})", remote, status, message);
    drain_before_close = true;
  };

  while (true) {
    if (buffer.size() == 0) {
      auto wait = first_request ? limits_.read_timeout : limits_.idle_timeout;
      auto ready = stream.waitReadable(Clock::now() + wait, stop_fd_.get());
      if (ready == detail::SocketStream::Wait::kTimedOut && first_request) {
        spdlog::debug("http: {} sent nothing for {} ms; closing", remote, wait.count());
      }
      if (ready != detail::SocketStream::Wait::kReadable) break;
    } else if (stopping_) {
      break;
    }
    first_request = false;
    auto started = Clock::now();

    detail::RequestParser parser;
    parser.header_limit(
        static_cast<uint32_t>(std::min<size_t>(limits_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser.body_limit(boost::none);  // handlers choose their limits with readBody(max_bytes)
    boost::system::error_code ec;
    stream.setReadDeadline(started + limits_.read_timeout);
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

    detail::Exchange exchange(stream, buffer, parser, limits_.read_timeout, stopping_);
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
      drain_before_close = !exchange.ioFailed() && !exchange.bodyComplete();
      break;
    }
  }
  if (drain_before_close) stream.closeGracefully(Clock::now() + kLingerTime, kLingerBytes);
}

}  // namespace space::http
