#include "gateway/audit_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace space::gateway {

namespace {

// O_NONBLOCK: a FIFO put at the path must not block the open (a regular file ignores it).
constexpr int kOpenFlags = O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;

// `path` as a regular file with no other name, made where missing. Whatever else stands there
// (a symbolic link, a FIFO, a device, a directory, a second name of another file: left by an
// earlier gateway that could write the directory) is removed first, never opened or followed;
// where that fails, the result is invalid with errno set.
UniqueFd openOwnFile(const std::string& path, int flags) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !(S_ISREG(st.st_mode) && st.st_nlink == 1)) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);  // a symbolic link inside is removed, not followed
    if (ec) {
      errno = ec.value();
      return UniqueFd();
    }
  }
  UniqueFd fd(::open(path.c_str(), flags | O_CREAT | kOpenFlags, 0640));
  if (fd.valid() && (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)) {
    errno = EEXIST;  // replaced again since the check: not ours to write
    fd.reset();
  }
  return fd;
}

}  // namespace

Result<AuditLog> AuditLog::open(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd = openOwnFile(path, O_RDWR | O_APPEND);
  if (!fd.valid()) {
    return makeError(ErrorCode::kInternal, "cannot open the audit log " + path + ": " + strerror(errno));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return makeError(ErrorCode::kInternal, "cannot stat the audit log " + path + ": " + strerror(errno));
  }
  UniqueFd rotated = openOwnFile(path + ".1", O_RDWR);
  if (!rotated.valid()) {
    spdlog::warn("audit: {}.1 cannot be a regular file; past {} bytes, {} is truncated instead", path, max_bytes, path);
  }
  return AuditLog(path, max_bytes, std::move(fd), std::move(rotated), static_cast<uint64_t>(st.st_size));
}

void AuditLog::write(nlohmann::json entry) {
  entry["time_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  // Names and details come from the guest: `replace` keeps a stray invalid byte from making
  // the whole entry unwritable.
  std::string line = entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (size_ > 0 && size_ + line.size() > max_bytes_) rotate();
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n = ::write(fd_.get(), line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      spdlog::error("audit: cannot write {}: {}", path_, strerror(errno));
      if (written > 0) dropPartialLine(written);
      return;
    }
    written += static_cast<size_t>(n);
    size_ += static_cast<uint64_t>(n);
  }
}

void AuditLog::dropPartialLine(size_t written) {
  // A line cut short (a full disk) would glue itself to the next entry, and the reader drops
  // lines that are not JSON: both would be lost. Our bytes are the file's last (O_APPEND).
  struct stat st {};
  if (fstat(fd_.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < written ||
      ::ftruncate(fd_.get(), st.st_size - static_cast<off_t>(written)) != 0) {
    spdlog::error("audit: cannot remove a partial line from {}: {}", path_, strerror(errno));
    return;
  }
  size_ -= std::min<uint64_t>(size_, written);
}

bool AuditLog::copyToRotated() {
  if (!rotated_.valid()) return false;
  if (::ftruncate(rotated_.get(), 0) != 0) return false;
  // By hand rather than copy_file_range: the file is at most max_bytes, and this works on
  // every filesystem and kernel alike.
  char buffer[64 << 10];
  off_t at = 0;
  for (;;) {
    ssize_t n = ::pread(fd_.get(), buffer, sizeof buffer, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::pwrite(rotated_.get(), buffer + done, static_cast<size_t>(n - done), at + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += w;
    }
    at += n;
  }
}

void AuditLog::rotate() {
  if (!copyToRotated()) {
    spdlog::warn("audit: cannot keep {}'s lines in {}.1: {}; truncating it", path_, path_,
                 rotated_.valid() ? strerror(errno) : "no such file");
    // A copy cut short would end in the middle of a line: none is better than a broken one.
    if (rotated_.valid() && ::ftruncate(rotated_.get(), 0) != 0) spdlog::error("audit: cannot empty {}.1", path_);
  }
  // Bounded whatever happened above: the history may be lost, the disk is not. The next
  // appends start at 0 again (O_APPEND).
  if (::ftruncate(fd_.get(), 0) != 0) spdlog::error("audit: cannot truncate {}: {}", path_, strerror(errno));
  size_ = 0;
}

}  // namespace space::gateway
