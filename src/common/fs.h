// Filesystem helpers: crash-safe writes, owned temporary directories, bounded reads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <set>
#include <string>
#include <utility>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space {

// Writes `data` to `path` so that a crash leaves either the old file or the new one:
// temp file in the same directory, fsync, rename, fsync of the directory.
Status writeFileAtomic(const std::string& path, const std::string& data, int mode = 0644);
// The same without the fsyncs: readers see the old file or the new one, never a mix, but a host
// crash may leave either (or an empty file). For files whose owner makes them durable later
// (fsyncPath) when it matters, on paths where a millisecond counts.
Status replaceFile(const std::string& path, const std::string& data, int mode = 0644);

// Flushes a file or a directory (its entries, e.g. after a rename) to disk. ENOSPC/EDQUOT are
// kResourceExhausted.
Status fsyncPath(const std::string& path);

// Reads at most the last `max_bytes` of a file (the whole file if smaller). A regular file
// only, not through a symbolic link at its last component (kInvalidArgument / ELOOP).
Result<std::string> readFileTail(const std::string& path, size_t max_bytes);

// Reads a whole small file, refusing files larger than `max_bytes`.
Result<std::string> readSmallFile(const std::string& path, size_t max_bytes);

// The disk that `path` and everything under it take (allocated blocks, so a sparse file counts
// what it holds, not its size; hard links once); symbolic links are not followed; 0 if any of
// it cannot be read (an estimate: see chargeableBytesUnder for a charge).
uint64_t allocatedBytesUnder(const std::string& path);
// The same for charging a tenant: none whose identity (device, inode) is in
// `counted_elsewhere`, and an error for what cannot be read rather than 0, so a quota check
// fails closed. A path that is gone holds 0 bytes.
Result<uint64_t> chargeableBytesUnder(const std::string& path,
                                      const std::set<std::pair<dev_t, ino_t>>& counted_elsewhere);

// A directory created with mkdtemp and removed with everything in it when the owner dies,
// unless release() handed it over.
class TempDir {
 public:
  static Result<TempDir> create(const std::string& parent, const std::string& prefix);
  // Creates exactly `path` (mode 0700; its parent must exist); kAlreadyExists if it does.
  static Result<TempDir> createAt(const std::string& path);
  // Takes ownership of an existing directory (e.g. one a previous daemon left running).
  static TempDir adopt(std::string path) { return TempDir(std::move(path)); }
  TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { remove(); }

  const std::string& path() const { return path_; }
  void remove();
  // Hands the directory over: it is no longer removed by this object.
  std::string release() { return std::exchange(path_, std::string()); }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Marks the image-cache entry that holds `file` (a build of images/lib.sh: a directory with a
// manifest.json beside the file) as in use while the returned descriptor stays open: a shared
// flock on the manifest, which the cache's prune respects. A daemon that resolved an image at
// start starts every VM from that path. Invalid when `file` is in no such entry.
UniqueFd holdImageCacheEntry(const std::string& file);

}  // namespace space
