#include "common/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

namespace space {

Status fsyncPath(const std::string& path) {
  // O_RDONLY opens directories too; O_NONBLOCK: a lease on the file fails the open instead of
  // holding it (a layer is a hard link of a disk its QEMU may lease).
  // O_NOFOLLOW: some of these names are in run directories, which a jailed QEMU can write.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return makeError(ErrorCode::kInternal, "open " + path + ": " + strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) {
    return makeError(err == ENOSPC || err == EDQUOT ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                     "fsync " + path + ": " + strerror(err));
  }
  return okStatus();
}

namespace {

Error sysError(const std::string& what, const std::string& path) {
  return makeError(ErrorCode::kInternal, what + " " + path + ": " + strerror(errno));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

namespace {
Status writeReplacing(const std::string& path, const std::string& data, int mode, bool durable) {
  std::filesystem::path target(path);
  std::string tmp = path + ".tmp-XXXXXX";
  std::vector<char> tmpl(tmp.begin(), tmp.end());
  tmpl.push_back('\0');
  Fd f{mkostemp(tmpl.data(), O_CLOEXEC)};  // never inherited by a VM or helper started meanwhile
  if (f.fd < 0) return sysError("create temp file for", path);
  std::string tmp_path(tmpl.data());
  auto fail = [&](const char* what) {
    Error e = sysError(what, tmp_path);
    unlink(tmp_path.c_str());
    return e;
  };
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(f.fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    off += static_cast<size_t>(n);
  }
  if (fchmod(f.fd, static_cast<mode_t>(mode)) != 0) return fail("chmod");
  if (durable && fsync(f.fd) != 0) return fail("fsync");
  if (rename(tmp_path.c_str(), path.c_str()) != 0) return fail("rename");
  if (!durable) return okStatus();
  std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  Fd d{open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0) fsync(d.fd);
  return okStatus();
}
}  // namespace

Status writeFileAtomic(const std::string& path, const std::string& data, int mode) {
  return writeReplacing(path, data, mode, true);
}

Status replaceFile(const std::string& path, const std::string& data, int mode) {
  return writeReplacing(path, data, mode, false);
}

Result<std::string> readFileTail(const std::string& path, size_t max_bytes) {
  // Never through a link, never blocked on a FIFO: callers read files in directories a jailed
  // QEMU can write (its run directory), and must not be pointed at the host's files.
  Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)};
  if (f.fd < 0) return sysError("open", path);
  struct stat st {};
  if (fstat(f.fd, &st) != 0) return sysError("stat", path);
  if (!S_ISREG(st.st_mode)) return makeError(ErrorCode::kInvalidArgument, path + " is not a regular file");
  off_t start = st.st_size > static_cast<off_t>(max_bytes) ? st.st_size - static_cast<off_t>(max_bytes) : 0;
  std::string out(static_cast<size_t>(st.st_size - start), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = pread(f.fd, out.data() + got, out.size() - got, start + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sysError("read", path);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

Result<uint64_t> chargeableBytesUnder(const std::string& path,
                                      const std::set<std::pair<dev_t, ino_t>>& counted_elsewhere) {
  std::set<std::pair<dev_t, ino_t>> seen;
  uint64_t bytes = 0;
  auto charge = [&](const std::string& p) -> Status {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      if (errno == ENOENT) return okStatus();  // removed meanwhile
      return sysError("stat", p);
    }
    const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
    if (counted_elsewhere.count(id) || !seen.insert(id).second) return okStatus();
    bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    return okStatus();
  };
  SPACE_TRY(charge(path));
  std::error_code ec;
  const auto status = std::filesystem::symlink_status(path, ec);
  if (ec || !std::filesystem::is_directory(status)) return bytes;
  std::filesystem::recursive_directory_iterator it(path, ec), end;
  for (; !ec && it != end; it.increment(ec)) SPACE_TRY(charge(it->path().string()));
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return makeError(ErrorCode::kInternal, "cannot list " + path + ": " + ec.message());
  }
  return bytes;
}

uint64_t allocatedBytesUnder(const std::string& path) {
  auto bytes = chargeableBytesUnder(path, {});
  return bytes.ok() ? bytes.value() : 0;
}

Result<std::string> readSmallFile(const std::string& path, size_t max_bytes) {
  Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) {
    if (errno == ENOENT) return makeError(ErrorCode::kNotFound, "no such file: " + path);
    return sysError("open", path);
  }
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sysError("read", path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {
      return makeError(ErrorCode::kResourceExhausted, path + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  return out;
}

Result<TempDir> TempDir::create(const std::string& parent, const std::string& prefix) {
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return makeError(ErrorCode::kInternal, "create " + parent + ": " + ec.message());
  std::string tmpl = parent + "/" + prefix + "XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) return sysError("mkdtemp in", parent);
  return TempDir(std::string(buf.data()));
}

Result<TempDir> TempDir::createAt(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0) {
    if (errno == EEXIST) return makeError(ErrorCode::kAlreadyExists, path + " already exists");
    return sysError("mkdir", path);
  }
  return TempDir(path);
}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

void TempDir::remove() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  path_.clear();
}

UniqueFd holdImageCacheEntry(const std::string& file) {
  const std::string manifest = (std::filesystem::path(file).parent_path() / "manifest.json").string();
  UniqueFd fd(::open(manifest.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return fd;
  // A prune holds it exclusively for a moment at most: wait for it.
  while (::flock(fd.get(), LOCK_SH) != 0) {
    if (errno != EINTR) return UniqueFd();
  }
  // The prune that held it may have moved the entry away meanwhile (it does so under its lock):
  // then this manifest is no longer at its path, and the entry is gone.
  struct stat held {
  }, at{};
  if (::fstat(fd.get(), &held) != 0 || ::stat(manifest.c_str(), &at) != 0 || held.st_dev != at.st_dev ||
      held.st_ino != at.st_ino) {
    return UniqueFd();
  }
  return fd;
}

}  // namespace space
