#include "gateway/audit_log.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace space::gateway {

namespace {

UniqueFd openAppend(const std::string& path) {
  return UniqueFd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640));
}

}  // namespace

Result<AuditLog> AuditLog::open(const std::string& path, uint64_t max_bytes) {
  UniqueFd fd = openAppend(path);
  if (!fd.valid()) {
    return makeError(ErrorCode::kInternal, "cannot open the audit log " + path + ": " + strerror(errno));
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return makeError(ErrorCode::kInternal, "cannot stat the audit log " + path + ": " + strerror(errno));
  }
  return AuditLog(path, max_bytes, std::move(fd), static_cast<uint64_t>(st.st_size));
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

void AuditLog::rotate() {
  const std::string old = path_ + ".1";
  if (::rename(path_.c_str(), old.c_str()) == 0) {
    UniqueFd fresh = openAppend(path_);
    if (fresh.valid()) {
      fd_ = std::move(fresh);
      size_ = 0;
      return;
    }
    spdlog::warn("audit: cannot reopen {} after rotation: {}; truncating instead", path_, strerror(errno));
  } else {
    spdlog::warn("audit: cannot rotate {}: {}; truncating instead", path_, strerror(errno));
  }
  // Still bounded when the directory is not ours to write: the history is lost, the disk is not.
  if (::ftruncate(fd_.get(), 0) != 0) spdlog::error("audit: cannot truncate {}: {}", path_, strerror(errno));
  size_ = 0;
}

}  // namespace space::gateway
