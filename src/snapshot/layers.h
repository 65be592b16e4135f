// Disk layers: frozen qcow2 images shared by snapshots and the sandboxes branched from them.
// A layer is referenced by qcow2 backing-file names (a sandbox's overlay names the layer it
// sits on, a layer names the one below it) and by snapshots' metadata. Nothing counts
// references by hand: the sweep follows the names from the live roots and removes the
// layers nobody reaches, so a deleted snapshot's layer stays exactly as long as some disk
// still stands on it.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "vmm/disk_overlay.h"

namespace space::snapshot {

// The backing file named in a qcow2 header (vmm/disk_overlay.h).
using vmm::qcow2BackingFile;

// Every file reachable from `roots` by following backing-file names (roots included).
// Missing files and cycles end a chain; they are not errors (a root may be mid-removal). Any
// other failure to read a header gives nullopt: then nothing is known to be unreferenced.
// Only names `followable` accepts are followed (the node's own disks, vmm::isNodeDiskName):
// another name ends its chain unopened, since a QEMU can write any name into its overlay.
std::optional<std::set<std::string>> reachableLayers(const std::vector<std::string>& roots,
                                                     const std::function<bool(const std::string&)>& followable);

// The files in `layers_dir` not in `keep`.
std::vector<std::string> unreachableLayers(const std::string& layers_dir, const std::set<std::string>& keep);
// Removes them; returns how many. Apart from the listing on purpose: unlinking big layers takes
// time that nothing which makes disks needs to wait for (see SandboxManager::collectLayers).
int removeLayers(const std::vector<std::string>& layers);
// Both at once.
int sweepLayers(const std::string& layers_dir, const std::set<std::string>& keep);

}  // namespace space::snapshot
