// The gateway's audit log: one JSON object per line, one line per decision (a DNS question
// answered or refused, a TCP connection denied or closed, a policy reload that failed). The
// file is bounded: past max_bytes its lines move to FILE.1 (replacing the previous ones) and
// FILE starts empty, so a guest that provokes denials in a loop cannot fill the disk.
//
// Both files are opened once, while the gateway is still root, and rotation works on those
// descriptors alone (copy, then truncate): the gateway then needs no right to make, rename or
// remove a file anywhere, and has none (its directory is root's and Landlock leaves it
// read-only), so a compromised one cannot fill the disk with files of its own either.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::gateway {

class AuditLog {
 public:
  // Opens (creates, appends to) `path`, and opens (creates) `path`.1 for the rotated lines.
  // Each must be a regular file with no other name: anything else there (a symbolic link, a
  // FIFO, a directory, a hard link to another file) is replaced, never written through. Where
  // `path`.1 cannot be made (a directory closed to us), rotation truncates `path` in place:
  // the history is lost, not the bound; where `path` cannot, an error.
  static Result<AuditLog> open(const std::string& path, uint64_t max_bytes);

  // Appends `entry` with "time_ms" (wall clock, ms since the epoch) added. Never fails: an
  // audit write error is logged on stderr, and the gateway goes on. A line cut short (a full
  // disk) is taken back, so the file holds whole lines only.
  void write(nlohmann::json entry);

  uint64_t size() const { return size_; }

 private:
  AuditLog(std::string path, uint64_t max_bytes, UniqueFd fd, UniqueFd rotated, uint64_t size)
      : path_(std::move(path)), max_bytes_(max_bytes), fd_(std::move(fd)), rotated_(std::move(rotated)), size_(size) {}
  void rotate();
  bool copyToRotated();
  void dropPartialLine(size_t written);

  std::string path_;
  uint64_t max_bytes_;
  UniqueFd fd_;       // FILE, read-write, appending
  UniqueFd rotated_;  // FILE.1; invalid: none could be opened
  uint64_t size_;
};

}  // namespace space::gateway
