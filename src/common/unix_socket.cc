#include "common/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace space {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset(o.fd_);
    o.fd_ = -1;
  }
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

int pollTimeoutMs(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return 1 << 30;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left < 0) return 0;
  return left > (1 << 30) ? (1 << 30) : static_cast<int>(left);
}

Result<UniqueFd> connectUnix(const std::string& path, Clock::time_point deadline, int peer_pidfd) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return makeError(ErrorCode::kInvalidArgument, "socket path too long (" + std::to_string(path.size()) +
                                                      " bytes, limit " + std::to_string(sizeof(addr.sun_path) - 1) +
                                                      "): " + path);
  }
  while (true) {
    // The socket itself, never a link: these sockets live in run directories that a jailed
    // QEMU can write, and a link there could point us at another VM's monitor or agent. So
    // the path is opened without following (O_PATH), checked to be a socket, and connected
    // through that descriptor's /proc name, which names exactly that inode.
    UniqueFd node(::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    int err = errno;
    if (node.valid()) {
      struct stat st {};
      if (::fstat(node.get(), &st) != 0 || !S_ISSOCK(st.st_mode)) {  // O_PATH|O_NOFOLLOW opens a link itself
        return makeError(ErrorCode::kUnavailable,
                         "connect " + path + (S_ISLNK(st.st_mode) ? ": a symbolic link, refused" : ": not a socket"));
      }
      const std::string via = "/proc/self/fd/" + std::to_string(node.get());
      addr = sockaddr_un{};
      addr.sun_family = AF_UNIX;
      memcpy(addr.sun_path, via.c_str(), via.size());
      UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!fd.valid()) return makeError(ErrorCode::kInternal, std::string("socket: ") + strerror(errno));
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
      err = errno;
    }
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN) {
      return makeError(ErrorCode::kUnavailable, "connect " + path + ": " + strerror(err));
    }
    // A refusal or no socket, and the peer is gone: nothing will ever listen there.
    if (peer_pidfd >= 0) {
      pollfd exited{peer_pidfd, POLLIN, 0};
      if (::poll(&exited, 1, 0) > 0 && (exited.revents & (POLLIN | POLLHUP)) != 0) {
        return makeError(ErrorCode::kUnavailable,
                         "connect " + path + ": " + strerror(err) + ", and the process that would listen has exited");
      }
    }
    if (Clock::now() >= deadline) {
      return makeError(ErrorCode::kDeadlineExceeded, "connect " + path + ": " + strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Result<UniqueFd> listenUnix(const std::string& path, int backlog) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return makeError(ErrorCode::kInvalidArgument, "socket path too long (" + std::to_string(path.size()) +
                                                      " bytes, limit " + std::to_string(sizeof(addr.sun_path) - 1) +
                                                      "): " + path);
  }
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size());
  // unlink removes a link itself, not what it names; bind makes a new name and fails on any
  // that is there again.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return makeError(ErrorCode::kUnavailable, "cannot remove " + path + " to listen there: " + strerror(errno));
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return makeError(ErrorCode::kInternal, std::string("socket: ") + strerror(errno));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd.get(), backlog) != 0) {
    return makeError(ErrorCode::kUnavailable, "listen at " + path + ": " + strerror(errno));
  }
  return fd;
}

Result<bool> LineReader::takeBuffered(std::string* line) {
  size_t nl = buf_.find('\n');
  if (nl == std::string::npos) {
    if (buf_.size() > max_line_) {
      return makeError(ErrorCode::kUnavailable, "peer sent a line longer than " + std::to_string(max_line_) + " bytes");
    }
    return false;
  }
  if (nl > max_line_) {
    return makeError(ErrorCode::kUnavailable, "peer sent a line longer than " + std::to_string(max_line_) + " bytes");
  }
  line->assign(buf_, 0, nl);
  buf_.erase(0, nl + 1);
  return true;
}

Result<LineReader::FillResult> LineReader::fill() {
  char chunk[65536];
  bool got = false;
  while (true) {
    ssize_t n = read(fd_, chunk, sizeof chunk);
    if (n > 0) {
      got = true;
      buf_.append(chunk, static_cast<size_t>(n));
      // Stop reading once a line is complete or the bound is passed; the rest stays in the kernel.
      if (buf_.find('\n') != std::string::npos || buf_.size() > max_line_) return FillResult::kData;
      continue;
    }
    if (n == 0) return got ? FillResult::kData : FillResult::kEof;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return got ? FillResult::kData : FillResult::kWouldBlock;
    return makeError(ErrorCode::kUnavailable, std::string("read: ") + strerror(errno));
  }
}

Result<std::string> LineReader::readLine(Clock::time_point deadline) {
  std::string line;
  while (true) {
    auto got = takeBuffered(&line);
    if (!got.ok()) return got.error();
    if (got.value()) return line;
    pollfd p{fd_, POLLIN, 0};
    int rc = poll(&p, 1, pollTimeoutMs(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return makeError(ErrorCode::kInternal, std::string("poll: ") + strerror(errno));
    if (rc == 0) return makeError(ErrorCode::kDeadlineExceeded, "timed out waiting for the peer");
    auto filled = fill();
    if (!filled.ok()) return filled.error();
    if (filled.value() == FillResult::kEof) return makeError(ErrorCode::kUnavailable, "peer closed the connection");
  }
}

Status writeAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      int rc = poll(&p, 1, pollTimeoutMs(deadline));
      if (rc == 0) return makeError(ErrorCode::kDeadlineExceeded, "timed out writing to the peer");
      continue;
    }
    return makeError(ErrorCode::kUnavailable, std::string("write: ") + strerror(errno));
  }
  return okStatus();
}

}  // namespace space
