// A template's memory, sealed: the file every clone of a template maps privately, held as a
// memfd that nobody can write any more (F_SEAL_WRITE, _GROW, _SHRINK, then _SEAL).
//
// Why: Debian 12's QEMU 7.2 opens a memory-backend file read-write even to map it privately
// (share=off), so a jailed QEMU restoring from the template's file could rewrite it, and every
// later sandbox of that template, any tenant's, would start from what it wrote. A sealed memfd
// can be opened read-write (QEMU opens /proc/self/fd/N) and mapped privately and writably, but
// every write to the file itself fails (EPERM): the guest's writes stay in its private copy.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::vmm {

// The descriptor number a VM's sealed memory gets in QEMU (its mem-path is /proc/self/fd/3).
constexpr int kSealedMemoryFd = 3;

// A sealed memfd holding a copy of the regular file at `path` (holes stay holes).
Result<UniqueFd> sealedCopy(const std::string& path);

// One sealed copy per memory file, made on first use and kept while the file is the same
// (device, inode, size, modification time) and the copy has not grown (a QEMU can fill its
// holes); other copies are dropped at the next use, and new VMs get a fresh one. Thread-safe.
class SealedMemoryCache {
 public:
  Result<std::shared_ptr<const UniqueFd>> get(const std::string& path);
  size_t size() const;

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t ino = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    blkcnt_t blocks = 0;  // what the copy held when made
    std::shared_ptr<const UniqueFd> fd;
  };
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace space::vmm
