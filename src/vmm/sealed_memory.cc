#include "vmm/sealed_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace space::vmm {

namespace {

Error sysError(const std::string& what) { return makeError(ErrorCode::kInternal, what + ": " + strerror(errno)); }

int64_t mtimeNs(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

}  // namespace

Result<UniqueFd> sealedCopy(const std::string& path) {
  UniqueFd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in.valid()) return sysError("open " + path);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return sysError("stat " + path);
  if (!S_ISREG(st.st_mode)) return makeError(ErrorCode::kInvalidArgument, path + " is not a regular file");
  UniqueFd out(::memfd_create("space-template-memory", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!out.valid()) return sysError("memfd_create");
  if (::ftruncate(out.get(), st.st_size) != 0) return sysError("size the sealed copy of " + path);
  // Only the data: a guest's memory file is mostly holes (RAM it never touched).
  std::vector<char> buf(1 << 20);
  for (off_t at = 0; at < st.st_size;) {
    off_t data = ::lseek(in.get(), at, SEEK_DATA);
    if (data < 0 && errno == ENXIO) break;  // only a hole is left
    if (data < 0) return sysError("seek " + path);
    off_t hole = ::lseek(in.get(), data, SEEK_HOLE);
    if (hole < 0) return sysError("seek " + path);
    for (off_t pos = data; pos < hole;) {
      const size_t want = static_cast<size_t>(std::min<off_t>(hole - pos, static_cast<off_t>(buf.size())));
      const ssize_t n = ::pread(in.get(), buf.data(), want, pos);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return sysError("read " + path);
      if (n == 0) return makeError(ErrorCode::kInternal, path + " shrank while being copied");
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = ::pwrite(out.get(), buf.data() + done, static_cast<size_t>(n - done), pos + done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return sysError("copy " + path + " into memory");
        done += w;
      }
      pos += n;
    }
    at = hole;
  }
  if (::fcntl(out.get(), F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return sysError("seal the copy of " + path);
  }
  return out;
}

Result<std::shared_ptr<const UniqueFd>> SealedMemoryCache::get(const std::string& path) {
  {
    std::lock_guard lock(mu_);
    // Copies of files that are gone or replaced (an evicted or rebuilt template) go first, and
    // so does a copy that has grown: the seals keep its content, but a QEMU may fill its holes
    // (fallocate), which pins memory. VMs that have it keep it; new ones get a fresh copy.
    for (auto it = entries_.begin(); it != entries_.end();) {
      struct stat now {};
      struct stat held {};
      const bool same = ::stat(it->first.c_str(), &now) == 0 && now.st_dev == it->second.dev &&
                        now.st_ino == it->second.ino && now.st_size == it->second.size &&
                        mtimeNs(now) == it->second.mtime_ns && ::fstat(it->second.fd->get(), &held) == 0 &&
                        held.st_blocks <= it->second.blocks;
      it = same ? std::next(it) : entries_.erase(it);
    }
    if (auto it = entries_.find(path); it != entries_.end()) return it->second.fd;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return sysError("stat " + path);
  // Copied outside the lock (a fraction of a second, once per template): creates of other
  // templates do not wait for it. Two creates of a new template may both copy; one copy stays.
  auto copy = sealedCopy(path);
  if (!copy.ok()) return copy.error();
  struct stat made {};
  if (::fstat(copy->get(), &made) != 0) return sysError("stat the sealed copy of " + path);
  auto fd = std::make_shared<const UniqueFd>(std::move(copy.value()));
  std::lock_guard lock(mu_);
  auto [it, added] =
      entries_.try_emplace(path, Entry{st.st_dev, st.st_ino, st.st_size, mtimeNs(st), made.st_blocks, fd});
  return it->second.fd;
}

size_t SealedMemoryCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace space::vmm
