#include "http/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace space::http::detail {

namespace {

boost::system::error_code errnoCode(int err) { return {err, boost::system::system_category()}; }

std::string sockaddrToString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return formatHostPort(host, ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return formatHostPort(host, ntohs(in6->sin6_port));
  }
  return "?";
}

// The earlier of now + timeout (zero: no timeout) and the deadline, as a poll() timeout.
int pollTimeout(std::chrono::milliseconds timeout, Clock::time_point deadline) {
  if (timeout.count() > 0) deadline = std::min(deadline, Clock::now() + timeout);
  return pollTimeoutMs(deadline);
}

}  // namespace

Result<HostPort> parseHostPort(std::string_view text, bool require_port, uint16_t default_port) {
  auto invalid = [&](const std::string& why) {
    return makeError(ErrorCode::kInvalidArgument, "invalid address \"" + std::string(text) + "\": " + why +
                                                      " (expected host:port, e.g. 127.0.0.1:8080 or [::1]:8080)");
  };
  HostPort out;
  std::string_view rest;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return invalid("unterminated '['");
    out.host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
  } else {
    size_t colon = text.rfind(':');
    out.host = std::string(text.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon);
    if (out.host.find(':') != std::string::npos) return invalid("an IPv6 address needs brackets");
  }
  if (out.host.empty()) return invalid("no host");
  if (rest.empty()) {
    if (require_port) return invalid("no port");
    out.port = default_port;
    return out;
  }
  if (rest[0] != ':' || rest.size() == 1) return invalid("no port");
  unsigned long port = 0;
  for (char c : rest.substr(1)) {
    if (c < '0' || c > '9') return invalid("the port is not a number");
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535) return invalid("the port is over 65535");
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

std::string formatHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<UniqueFd> listenTcp(const std::string& listen, int backlog) {
  auto where = parseHostPort(listen, true);
  if (!where.ok()) return where.error();
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  auto* in = reinterpret_cast<sockaddr_in*>(&addr);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, where->host.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(where->port);
    addr_len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, where->host.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(where->port);
    addr_len = sizeof(sockaddr_in6);
  } else {
    return makeError(ErrorCode::kInvalidArgument, "invalid listen address \"" + listen +
                                                      "\": the host must be an IPv4 or a bracketed IPv6 literal, "
                                                      "e.g. 127.0.0.1:8080 or [::1]:8080");
  }
  UniqueFd fd(socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return makeError(ErrorCode::kInternal, std::string("socket: ") + strerror(errno));
  int one = 1;
  // Lets a restarted daemon bind while connections of its previous run are in TIME_WAIT; on
  // Linux it still refuses a port another socket listens on.
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.ss_family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    int err = errno;
    return makeError(err == EADDRINUSE || err == EACCES ? ErrorCode::kUnavailable : ErrorCode::kInvalidArgument,
                     "cannot listen on " + listen + ": " + strerror(err));
  }
  if (::listen(fd.get(), backlog) != 0) {
    return makeError(ErrorCode::kUnavailable, "cannot listen on " + listen + ": " + strerror(errno));
  }
  return fd;
}

Result<UniqueFd> connectTcp(const HostPort& where, Clock::time_point deadline) {
  std::string name = formatHostPort(where.host, where.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(where.host.c_str(), std::to_string(where.port).c_str(), &hints, &found);
  if (rc != 0) return makeError(ErrorCode::kUnavailable, "cannot resolve " + where.host + ": " + gai_strerror(rc));
  std::string last_error = "no address";
  ErrorCode last_code = ErrorCode::kUnavailable;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last_error = std::string("socket: ") + strerror(errno);
      continue;
    }
    int err = 0;
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd.get(), POLLOUT, 0};
        int ready = poll(&p, 1, pollTimeoutMs(deadline));
        if (ready == 0) {
          last_error = "timed out";
          last_code = ErrorCode::kDeadlineExceeded;
          continue;
        }
        socklen_t len = sizeof err;
        if (ready < 0) {
          err = errno;
        } else if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err != 0) {
      last_error = strerror(err);
      last_code = ErrorCode::kUnavailable;
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    freeaddrinfo(found);
    return fd;
  }
  freeaddrinfo(found);
  return makeError(last_code, "cannot connect to " + name + ": " + last_error);
}

std::string localAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return sockaddrToString(addr);
}

std::string peerAddress(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return sockaddrToString(addr);
}

SocketStream::SocketStream(UniqueFd fd, int abort_fd) : fd_(std::move(fd)), abort_fd_(abort_fd) {}

bool SocketStream::waitFor(short events, Duration timeout, Clock::time_point deadline, boost::system::error_code& ec) {
  while (true) {
    pollfd fds[2] = {{fd_.get(), events, 0}, {abort_fd_, POLLIN, 0}};
    int rc = poll(fds, abort_fd_ >= 0 ? 2 : 1, pollTimeout(timeout, deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      ec = errnoCode(errno);
      return false;
    }
    if (rc == 0) {
      ec = boost::asio::error::timed_out;
      return false;
    }
    if (abort_fd_ >= 0 && (fds[1].revents & POLLIN)) {
      ec = boost::asio::error::operation_aborted;
      return false;
    }
    return true;  // ready, or an error the next syscall reports
  }
}

size_t SocketStream::readInto(void* data, size_t size, boost::system::error_code& ec) {
  while (true) {
    ssize_t n = recv(fd_.get(), data, size, 0);
    if (n > 0) {
      ec = {};
      return static_cast<size_t>(n);
    }
    if (n == 0) {
      ec = boost::asio::error::eof;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec = errnoCode(errno);
      return 0;
    }
    if (!waitFor(POLLIN, read_timeout_, read_deadline_, ec)) return 0;
  }
}

size_t SocketStream::writeFrom(const iovec* iov, int count, boost::system::error_code& ec) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  while (true) {
    // MSG_NOSIGNAL: a peer that went away is an error for the caller, not SIGPIPE for the process.
    ssize_t n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n >= 0) {
      ec = {};
      return static_cast<size_t>(n);
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ec = errnoCode(errno);
      return 0;
    }
    if (!waitFor(POLLOUT, write_timeout_, write_deadline_, ec)) return 0;
  }
}

SocketStream::Wait SocketStream::waitReadable(Clock::time_point deadline, int wake_fd) {
  while (true) {
    pollfd fds[3] = {{fd_.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}, {abort_fd_, POLLIN, 0}};
    int rc = poll(fds, 3, pollTimeoutMs(deadline));  // poll() ignores negative fds
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return Wait::kTimedOut;
    if (rc < 0 || (fds[1].revents & POLLIN) || (fds[2].revents & POLLIN)) return Wait::kWoken;
    return Wait::kReadable;
  }
}

void SocketStream::closeGracefully(Clock::time_point deadline, size_t max_bytes) {
  if (!fd_.valid()) return;
  shutdown(fd_.get(), SHUT_WR);
  char scratch[16384];
  size_t discarded = 0;
  while (discarded < max_bytes) {
    boost::system::error_code ec;
    if (!waitFor(POLLIN, Duration(0), deadline, ec)) break;
    ssize_t n = recv(fd_.get(), scratch, sizeof scratch, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
    if (n > 0) discarded += static_cast<size_t>(n);
  }
  fd_.reset();
}

}  // namespace space::http::detail
