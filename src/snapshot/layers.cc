#include "snapshot/layers.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "common/unix_socket.h"

namespace space::snapshot {

std::optional<std::set<std::string>> reachableLayers(const std::vector<std::string>& roots,
                                                     const std::function<bool(const std::string&)>& followable) {
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
      if (!at.empty() && !followable(at)) break;  // not one of the node's disks: never opened
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
