// Blocking Unix-domain stream sockets with deadlines, for talking to local peers we do not trust
// to answer (QEMU's QMP, the guest's serial port): every read is bounded in size and time.
#pragma once

#include <chrono>
#include <string>

#include "common/result.h"

namespace space {

using Clock = std::chrono::steady_clock;

// An owned file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1);
  // Gives up ownership: the caller closes the returned descriptor.
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Connects to the socket at `path` (non-blocking fd). Retries while the socket does not exist
// yet or refuses, until `deadline` (a peer we just started may not be listening yet), or until
// the process behind `peer_pidfd` (when given) has exited: nothing will listen then, and a
// caller learns it at once instead of at its deadline (kUnavailable). A path that is a symbolic
// link or not a socket is refused (kUnavailable), not followed.
Result<UniqueFd> connectUnix(const std::string& path, Clock::time_point deadline, int peer_pidfd = -1);

// A listening socket bound at `path` (close-on-exec), for a process we start to accept on
// (handed over as a descriptor), so that it need not make the socket file itself. What was at
// `path` is removed first, never followed: a socket an earlier run left there, or anything its
// run directory's earlier QEMU made. An error if `path` cannot be freed (a directory) or bound.
Result<UniqueFd> listenUnix(const std::string& path, int backlog);

// Reads newline-terminated lines from a non-blocking fd. Lines longer than the limit are an
// error (the peer is broken or hostile), never an unbounded allocation.
class LineReader {
 public:
  LineReader(int fd, size_t max_line) : fd_(fd), max_line_(max_line) {}

  // Returns a complete line (without '\n') if one is buffered; does not block.
  Result<bool> takeBuffered(std::string* line);
  enum class FillResult { kData, kWouldBlock, kEof };
  // Reads what is available now without blocking; stops early once a line is complete.
  Result<FillResult> fill();
  // Blocks until a full line or the deadline.
  Result<std::string> readLine(Clock::time_point deadline);

 private:
  int fd_;
  size_t max_line_;
  std::string buf_;
};

// Writes all of `data`, waiting for the socket to drain until `deadline`.
Status writeAll(int fd, const std::string& data, Clock::time_point deadline);

// Milliseconds left until `deadline` for poll(), never negative.
int pollTimeoutMs(Clock::time_point deadline);

}  // namespace space
