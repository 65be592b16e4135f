// A VM's root disk: a new, empty qcow2 overlay over a read-only base (an image, a template's or
// a snapshot's disk). Made by qemu-img the first time for a base, then from memory.
#pragma once

#include <string>

#include "common/result.h"

namespace space::vmm {

// Creates `overlay` (replacing any file there) over `base` of format `format` ("raw" or
// "qcow2"). `log` gets qemu-img's output when it runs.
Status createDiskOverlay(const std::string& base, const std::string& format, const std::string& overlay,
                         const std::string& log);

// How many overlays createDiskOverlay wrote from memory, without qemu-img (for tests).
size_t diskOverlaysWrittenFromMemory();

}  // namespace space::vmm
