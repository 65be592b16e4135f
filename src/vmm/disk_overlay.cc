#include "vmm/disk_overlay.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "common/fs.h"
#include "common/process.h"
#include "common/unix_socket.h"

namespace space::vmm {

namespace {

uint64_t bigEndian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

// A name may come from a header a hostile QEMU wrote: it is looked at (O_PATH, no link
// followed) before it is opened, so no device is opened and no FIFO blocks the reader.
// kInvalidArgument: not a regular file (a link included).
Result<UniqueFd> openRegularFile(const std::string& path) {
  UniqueFd node(::open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!node.valid()) {
    return makeError(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal,
                     "open " + path + ": " + strerror(errno));
  }
  struct stat st {};
  if (::fstat(node.get(), &st) != 0) return makeError(ErrorCode::kInternal, "stat " + path + ": " + strerror(errno));
  if (!S_ISREG(st.st_mode)) return makeError(ErrorCode::kInvalidArgument, path + " is not a regular file");
  // O_NONBLOCK: a lease on the file (its QEMU may take one) fails the open instead of holding
  // it for the lease-break time; a special regular file (/proc/kmsg) does not block a read.
  UniqueFd fd(
      ::open(("/proc/self/fd/" + std::to_string(node.get())).c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return makeError(ErrorCode::kUnavailable, "open " + path + ": " + strerror(errno));
  return fd;
}

constexpr uint64_t kMaxVirtualSize = uint64_t{16} << 40;

}  // namespace

// Read here, not by qemu-img, so that qemu-img never opens a base (-u): a layer's header is its
// sandbox's to rewrite, and qemu-img, unconfined, would follow any backing it names.
Result<uint64_t> diskVirtualSize(const std::string& base, const std::string& format) {
  if (format == "raw") {
    struct stat st {};
    if (::stat(base.c_str(), &st) != 0) return makeError(ErrorCode::kNotFound, "stat " + base + ": " + strerror(errno));
    return static_cast<uint64_t>(st.st_size);
  }
  auto fd = openRegularFile(base);
  if (!fd.ok()) return fd.error();
  unsigned char header[32];
  if (::pread(fd->get(), header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
      memcmp(header, "QFI\xfb", 4) != 0) {
    return makeError(ErrorCode::kInvalidArgument, base + " is not a qcow2 image");
  }
  const uint64_t size = bigEndian(header + 24, 8);
  if (size == 0 || size > kMaxVirtualSize) return makeError(ErrorCode::kInvalidArgument, base + ": implausible size");
  return size;
}

namespace {

// A new overlay is the same bytes for every VM over one base: its header names the base and its
// format, and its empty tables are sized by the base's virtual size. qemu-img, a process that
// links QEMU's block layer and fdatasyncs the file five times, took ~20-25 ms of each restore's
// start (bench/RESULTS.md), so what it wrote for a base is kept and written directly for the next
// VMs over that base. The key holds the base's identity: a replaced or rewritten base (new inode,
// size or mtime) gets a new overlay from qemu-img. Not fsynced, as qemu-img's would be: QEMU
// fdatasyncs the file on every guest flush and when a save stops the guest, which covers these
// bytes before anything of value is in it.
struct Key {
  std::string base;
  std::string format;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  auto operator<=>(const Key&) const = default;
};

// Each entry is ~200 KB for a 2 GiB base; bases are images, templates and snapshots.
constexpr size_t kMaxKept = 32;
constexpr size_t kMaxKeptBytes = 1 << 20;

std::mutex g_mu;
std::map<Key, std::shared_ptr<const std::string>> g_kept;
std::atomic<size_t> g_from_memory{0};

std::optional<Key> keyOf(const std::string& abs_base, const std::string& format) {
  struct stat st {};
  if (::stat(abs_base.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return Key{abs_base,  format,     st.st_dev,
             st.st_ino, st.st_size, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

Status writeOverlay(const std::string& overlay, const std::string& bytes) {
  UniqueFd fd(::open(overlay.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  int err = 0;
  // 0644 whatever the umask: once frozen into a layer, VMs of other uids read it.
  if (!fd.valid() || ::fchmod(fd.get(), 0644) != 0) {
    err = errno;
  } else {
    for (size_t done = 0; done < bytes.size() && err == 0;) {
      ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) err = n < 0 ? errno : EIO;
      if (n > 0) done += static_cast<size_t>(n);
    }
  }
  if (err == 0) return okStatus();
  ::unlink(overlay.c_str());
  return makeError(err == ENOSPC || err == EDQUOT ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                   "write " + overlay + ": " + strerror(err));
}

}  // namespace

Status createDiskOverlay(const std::string& base, const std::string& format, const std::string& overlay,
                         const std::string& log) {
  const std::string abs_base = std::filesystem::absolute(base).string();
  const auto key = keyOf(abs_base, format);
  if (key) {
    std::shared_ptr<const std::string> kept;
    {
      std::lock_guard guard(g_mu);
      if (auto it = g_kept.find(*key); it != g_kept.end()) kept = it->second;
    }
    if (kept) {
      ++g_from_memory;
      return writeOverlay(overlay, *kept);
    }
  }
  auto size = diskVirtualSize(abs_base, format);
  if (!size.ok()) return size.error();
  auto img = ChildProcess::spawn(
      {"qemu-img", "create", "-q", "-f", "qcow2", "-F", format, "-b", abs_base, "-u", overlay, std::to_string(*size)},
      SpawnOptions{log, "", true});
  if (!img.ok()) return img.error();
  auto status = img->waitFor(std::chrono::seconds(30));
  if (!status) {
    img->kill();
    return makeError(ErrorCode::kDeadlineExceeded, "qemu-img create did not finish in 30 s");
  }
  if (status->signaled || status->exit_code != 0) {
    auto tail = readFileTail(log, 2048);
    return makeError(ErrorCode::kInternal,
                     "qemu-img create " + status->describe() + ": " + (tail.ok() ? tail.value() : std::string()));
  }
  // 0644 whatever the umask: once frozen into a layer, VMs of other uids read it.
  if (UniqueFd made(::open(overlay.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      !made.valid() || ::fchmod(made.get(), 0644) != 0) {
    return makeError(ErrorCode::kInternal, "chmod " + overlay + ": " + strerror(errno));
  }
  // Kept only if the base is still the file qemu-img read.
  if (key && keyOf(abs_base, format) == key) {
    if (auto bytes = readSmallFile(overlay, kMaxKeptBytes); bytes.ok()) {
      std::lock_guard guard(g_mu);
      if (g_kept.size() >= kMaxKept) g_kept.clear();
      g_kept.emplace(*key, std::make_shared<const std::string>(std::move(bytes.value())));
    }
  }
  return okStatus();
}

size_t diskOverlaysWrittenFromMemory() { return g_from_memory.load(); }

// The backing file name in a qcow2 header (qcow2BackingFile), and whether the header names an
// external data file (`external_data_file`, when given): one open and read for both.
static Result<std::string> readQcow2Header(const std::string& path, bool* external_data_file) {
  // qcow2 header: magic "QFI\xfb" at 0, version at 4, backing_file_offset (u64) at 8,
  // backing_file_size (u32) at 16, and from version 3 incompatible_features (u64) at 72, all
  // big-endian (QEMU's docs/interop/qcow2.txt). Incompatible bit 2: the clusters live in an
  // external data file that a header extension names, which QEMU opens when no data-file
  // option overrides it; a layer's header (its sandbox's QEMU may rewrite it) could then make
  // the next QEMU over it open any file its view holds.
  auto opened = openRegularFile(path);
  if (!opened.ok()) return opened.error();
  const UniqueFd& fd = opened.value();
  unsigned char header[80];
  ssize_t got = ::pread(fd.get(), header, sizeof header, 0);
  if (got < 0) return makeError(ErrorCode::kInternal, "read " + path + ": " + strerror(errno));
  if (got < 20 || memcmp(header, "QFI\xfb", 4) != 0) {
    return makeError(ErrorCode::kInvalidArgument, path + " is not a qcow2 image");
  }
  if (external_data_file != nullptr) {
    // A version 3 header too short to hold the field is not trusted either.
    *external_data_file =
        bigEndian(header + 4, 4) >= 3 && (got < 80 || (bigEndian(header + 72, 8) & (uint64_t{1} << 2)) != 0);
  }
  const uint64_t offset = bigEndian(header + 8, 8);
  const uint64_t size = bigEndian(header + 16, 4);
  if (offset == 0 || size == 0) return std::string();
  if (size > 1023 || offset > (uint64_t{1} << 20)) {
    return makeError(ErrorCode::kInvalidArgument, path + ": implausible backing file name in its header");
  }
  std::string name(size, '\0');
  got = ::pread(fd.get(), name.data(), size, static_cast<off_t>(offset));
  if (got < 0) return makeError(ErrorCode::kInternal, "read " + path + ": " + strerror(errno));
  if (got != static_cast<ssize_t>(size)) {
    return makeError(ErrorCode::kInvalidArgument, path + ": truncated backing file name");
  }
  // Relative names are relative to the image's directory (we always write absolute ones).
  if (!name.empty() && name[0] != '/') name = std::filesystem::path(path).parent_path().string() + "/" + name;
  return name;
}

Result<std::string> qcow2BackingFile(const std::string& path) { return readQcow2Header(path, nullptr); }

bool isNodeDiskPath(const std::string& name, const std::vector<std::string>& dirs,
                    const std::vector<std::string>& images) {
  if (std::find(images.begin(), images.end(), name) != images.end()) return true;
  if (name.find("/./") != std::string::npos || name.find("/../") != std::string::npos ||
      name.find("//") != std::string::npos) {
    return false;
  }
  for (const auto& dir : dirs) {
    if (name.size() > dir.size() + 1 && name.compare(0, dir.size(), dir) == 0 && name[dir.size()] == '/') return true;
  }
  return false;
}

bool isNodeDiskName(const std::string& name, const std::vector<std::string>& dirs,
                    const std::vector<std::string>& images) {
  if (!isNodeDiskPath(name, dirs, images)) return false;
  if (std::find(images.begin(), images.end(), name) != images.end()) return true;
  std::error_code ec;
  if (std::filesystem::canonical(name, ec).string() != name) return false;  // a link on the way
  struct stat st {};
  return ::lstat(name.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::vector<std::string>> diskChain(const std::string& top,
                                           const std::function<Status(const std::string&)>& admit) {
  std::vector<std::string> chain;
  for (std::string at = top; !at.empty();) {
    if (chain.size() >= kMaxDiskChain) {
      return makeError(ErrorCode::kInvalidArgument, top + ": more than " + std::to_string(kMaxDiskChain) + " layers");
    }
    SPACE_TRY(admit(at));
    chain.push_back(at);
    bool external_data_file = false;
    auto next = readQcow2Header(at, &external_data_file);
    if (!next.ok()) {
      if (next.error().code == ErrorCode::kInvalidArgument) break;  // a raw image (or QEMU will say)
      return next.error();
    }
    if (external_data_file) {
      return makeError(ErrorCode::kPermissionDenied,
                       at + ": its qcow2 header names an external data file, which no disk of SPACE's has");
    }
    at = next.value();
  }
  return chain;
}

}  // namespace space::vmm
