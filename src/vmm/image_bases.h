// The image-cache entries (images/lib.sh) that a data directory's saved disks stand on.
//
// A template's disk is an overlay that names the root filesystem it was built from by path, and
// every sandbox, suspended sandbox and snapshot of that template stands on it. A `make images`
// that builds a newer root filesystem prunes older cache entries, and a restarted spaced moves
// its templates to the new one; the sandboxes saved before must keep what they stand on, and a
// jailed VM must be let open it (vmm::Vm admits only the node's images by exact path).
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::vmm {

struct ImageBases {
  // Canonical paths: `current` first, then the older images templates stand on.
  std::vector<std::string> images;
  // Shared flocks on their entries' manifests: the cache's prune keeps them while held.
  std::vector<UniqueFd> held;
};

// Finds the images the templates under `data_dir`/templates stand on (the backing names in
// templates/*/disk.qcow2). Only a regular file of the same name in an entry of the same cache
// directory as one of `current` counts (a header may name anything; nothing else is admitted).
// Holds each entry, and pins it for while spaced is stopped: <entry>/pins/<hash of data_dir>
// names data_dir, and the prune keeps an entry while one of its pins names a directory that
// exists. This data dir's pins on entries it no longer stands on are removed. Pinning is best
// effort (a read-only cache): a failure is logged, not returned.
Result<ImageBases> holdImageBases(const std::string& data_dir, const std::vector<std::string>& current);

// The pin's file name for `data_dir` (16 hex digits of its SHA-256).
std::string imagePinName(const std::string& data_dir);

}  // namespace space::vmm
