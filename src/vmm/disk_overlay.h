// A VM's root disk: a new, empty qcow2 overlay over a read-only base (an image, a template's or
// a snapshot's disk). Made by qemu-img the first time for a base, then from memory.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::vmm {

// Creates `overlay` (replacing any file there) over `base` of format `format` ("raw" or
// "qcow2"). `log` gets qemu-img's output when it runs.
Status createDiskOverlay(const std::string& base, const std::string& format, const std::string& overlay,
                         const std::string& log);

// The backing file named in a qcow2 header ("" if none). Reads only the header (bounded):
// these are files our own QEMU wrote, but a guest can never make the name exceed 1023 bytes
// (QEMU's own limit) without it being refused here. kInvalidArgument: not a qcow2 image.
Result<std::string> qcow2BackingFile(const std::string& path);

// Whether `name` (from a qcow2 header) names one of the node's own disks, by name alone (nothing
// is looked at): exactly one of `images`, or a path under one of `dirs` (where only spaced makes
// names) without "." or ".." parts.
bool isNodeDiskPath(const std::string& name, const std::vector<std::string>& dirs,
                    const std::vector<std::string>& images);
// That, and (for a path under `dirs`) a regular file reached without links: what may enter a
// jail's view.
bool isNodeDiskName(const std::string& name, const std::vector<std::string>& dirs,
                    const std::vector<std::string>& images);

// `top` and every file below it by backing-file names, top first; a raw image (or anything not
// a regular file) ends the chain. What a VM over `top` opens. At most kMaxDiskChain files.
// `admit` sees each name before anything opens it; its error ends the walk with that error.
// A qcow2 file whose header names an external data file is refused (kPermissionDenied).
constexpr size_t kMaxDiskChain = 4096;
Result<std::vector<std::string>> diskChain(const std::string& top,
                                           const std::function<Status(const std::string&)>& admit);

// The size of the disk a guest sees over `image` of format `format` ("raw": its length;
// "qcow2": its header's virtual size, at most 16 TiB). Overlays over it get that size.
Result<uint64_t> diskVirtualSize(const std::string& image, const std::string& format);

// How many overlays createDiskOverlay wrote from memory, without qemu-img (for tests).
size_t diskOverlaysWrittenFromMemory();

}  // namespace space::vmm
