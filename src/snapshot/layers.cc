#include "snapshot/layers.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/unix_socket.h"

namespace space::snapshot {

namespace {

uint64_t bigEndian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

Result<std::string> qcow2BackingFile(const std::string& path) {
  // qcow2 header: magic "QFI\xfb" at 0, version at 4, backing_file_offset (u64) at 8,
  // backing_file_size (u32) at 16, all big-endian (QEMU's docs/interop/qcow2.txt).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    return makeError(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal,
                     "open " + path + ": " + strerror(errno));
  }
  unsigned char header[20];
  ssize_t got = ::pread(fd.get(), header, sizeof header, 0);
  if (got < 0) return makeError(ErrorCode::kInternal, "read " + path + ": " + strerror(errno));
  if (got != static_cast<ssize_t>(sizeof header) || memcmp(header, "QFI\xfb", 4) != 0) {
    return makeError(ErrorCode::kInvalidArgument, path + " is not a qcow2 image");
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

std::optional<std::set<std::string>> reachableLayers(const std::vector<std::string>& roots) {
  std::set<std::string> seen;
  for (const auto& root : roots) {
    std::string at = root;
    // A chain is as long as the snapshots taken in a row; the bound only stops a cycle.
    for (int depth = 0; depth < 4096 && !at.empty() && seen.insert(at).second; ++depth) {
      auto next = qcow2BackingFile(at);
      if (!next.ok()) {
        // Gone, or not qcow2 (a template's raw root filesystem): the chain ends. Anything else
        // (EMFILE, EIO, EACCES) means the layers below are unknown, so none may be swept.
        if (next.error().code == ErrorCode::kNotFound || next.error().code == ErrorCode::kInvalidArgument) break;
        return std::nullopt;
      }
      at = next.value();
    }
  }
  return seen;
}

std::vector<std::string> unreachableLayers(const std::string& layers_dir, const std::set<std::string>& keep) {
  std::vector<std::string> out;
  std::error_code ec;
  // increment(ec): a listing cut short removes less, and never throws on a housekeeping thread.
  std::filesystem::directory_iterator it(layers_dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (!keep.count(it->path().string())) out.push_back(it->path().string());
  }
  return out;
}

int removeLayers(const std::vector<std::string>& layers) {
  int removed = 0;
  std::error_code ec;
  for (const auto& layer : layers) removed += std::filesystem::remove(layer, ec);
  return removed;
}

int sweepLayers(const std::string& layers_dir, const std::set<std::string>& keep) {
  return removeLayers(unreachableLayers(layers_dir, keep));
}

}  // namespace space::snapshot
