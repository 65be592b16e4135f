// The gateway's audit log: one JSON object per line, one line per decision (a DNS question
// answered or refused, a TCP connection denied or closed, a policy reload that failed). The
// file is bounded: past max_bytes it becomes FILE.1 (replacing the previous one) and a new
// FILE starts, so a guest that provokes denials in a loop cannot fill the disk.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::gateway {

class AuditLog {
 public:
  // Opens (creates, appends to) `path`. Opened while still root: if the gateway's user may not
  // write in the file's directory later, rotation falls back to truncating the file in place.
  static Result<AuditLog> open(const std::string& path, uint64_t max_bytes);

  // Appends `entry` with "time_ms" (wall clock, ms since the epoch) added. Never fails: an
  // audit write error is logged on stderr, and the gateway goes on. A line cut short (a full
  // disk) is taken back, so the file holds whole lines only.
  void write(nlohmann::json entry);

  uint64_t size() const { return size_; }

 private:
  AuditLog(std::string path, uint64_t max_bytes, UniqueFd fd, uint64_t size)
      : path_(std::move(path)), max_bytes_(max_bytes), fd_(std::move(fd)), size_(size) {}
  void rotate();
  void dropPartialLine(size_t written);

  std::string path_;
  uint64_t max_bytes_;
  UniqueFd fd_;
  uint64_t size_;
};

}  // namespace space::gateway
