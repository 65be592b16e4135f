// Internal to the HTTP module: TCP sockets for Beast's synchronous API, with the deadlines the
// server and the client need. Asio's own sync operations cannot be used for this: on a socket
// with SO_RCVTIMEO they retry EAGAIN with an unbounded poll(), so a silent peer would still
// hold the thread forever. SocketStream polls with a timeout before every read and write.
#pragma once

#include <sys/uio.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::http::detail {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 literal
  uint16_t port = 0;
};

// "host:port" or "[v6]:port". With require_port false a missing port is default_port.
Result<HostPort> parseHostPort(std::string_view text, bool require_port, uint16_t default_port = 0);

// "1.2.3.4:80" or "[::1]:80".
std::string formatHostPort(const std::string& host, uint16_t port);

// A listening socket on an IPv4 or IPv6 literal (no name resolution: the daemon must bind
// exactly what its configuration says).
Result<UniqueFd> listenTcp(const std::string& listen, int backlog);

// Connects to host (a literal or a name) within the deadline; returns a non-blocking socket.
Result<UniqueFd> connectTcp(const HostPort& where, Clock::time_point deadline);

std::string localAddress(int fd);
std::string peerAddress(int fd);

// A connected non-blocking socket as a Beast SyncReadStream/SyncWriteStream. Each operation
// waits at most its per-operation timeout, never past its deadline, and fails at once with
// operation_aborted when `abort_fd` (an eventfd, or -1) becomes readable.
class SocketStream {
 public:
  using Duration = std::chrono::milliseconds;

  explicit SocketStream(UniqueFd fd, int abort_fd = -1);

  int fd() const { return fd_.get(); }
  // Hands the socket back (to the server's event loop, between requests).
  UniqueFd releaseFd() { return std::move(fd_); }
  int abortFd() const { return abort_fd_; }
  void setTimeouts(Duration read, Duration write) {
    read_timeout_ = read;
    write_timeout_ = write;
  }
  void setReadDeadline(Clock::time_point deadline) { read_deadline_ = deadline; }
  void setWriteDeadline(Clock::time_point deadline) { write_deadline_ = deadline; }

  enum class Wait { kReadable, kTimedOut, kWoken };
  // Waits for data without consuming it (the wait between keep-alive requests).
  Wait waitReadable(Clock::time_point deadline, int wake_fd);

  // Sends FIN, then reads and discards until the peer closes, the deadline or max_bytes:
  // closing with unread data would send a reset that can destroy the response we just sent
  // before the peer reads it.
  void closeGracefully(Clock::time_point deadline, size_t max_bytes);

  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, boost::system::error_code& ec) {
    for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers); ++it) {
      boost::asio::mutable_buffer b(*it);
      if (b.size() > 0) return readInto(b.data(), b.size(), ec);
    }
    ec = {};
    return 0;
  }
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    boost::system::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers, boost::system::error_code& ec) {
    iovec iov[kMaxIov];
    int count = 0;
    for (auto it = boost::asio::buffer_sequence_begin(buffers);
         it != boost::asio::buffer_sequence_end(buffers) && count < kMaxIov; ++it) {
      boost::asio::const_buffer b(*it);
      if (b.size() == 0) continue;
      iov[count].iov_base = const_cast<void*>(b.data());
      iov[count].iov_len = b.size();
      ++count;
    }
    if (count == 0) {
      ec = {};
      return 0;
    }
    return writeFrom(iov, count, ec);
  }
  template <class ConstBufferSequence>
  size_t write_some(const ConstBufferSequence& buffers) {
    boost::system::error_code ec;
    size_t n = write_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  static constexpr int kMaxIov = 16;

  // Polls for `events` until the earlier of timeout and deadline; sets ec on timeout/abort.
  bool waitFor(short events, Duration timeout, Clock::time_point deadline, boost::system::error_code& ec);
  size_t readInto(void* data, size_t size, boost::system::error_code& ec);
  size_t writeFrom(const iovec* iov, int count, boost::system::error_code& ec);

  UniqueFd fd_;
  int abort_fd_;
  Duration read_timeout_{30000};
  Duration write_timeout_{30000};
  Clock::time_point read_deadline_ = Clock::time_point::max();
  Clock::time_point write_deadline_ = Clock::time_point::max();
};

}  // namespace space::http::detail
