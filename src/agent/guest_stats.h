// What the guest itself says about its memory and root filesystem, for the host's per-sandbox
// metrics (the host sees only QEMU's resident memory and the overlay's blocks: not the guest's
// page cache, free memory or free space).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace space::agent {

struct GuestStats {
  uint64_t mem_total = 0;      // bytes: MemTotal
  uint64_t mem_available = 0;  // MemAvailable (what programs could still get without swapping)
  uint64_t mem_cache = 0;      // Cached + Buffers: the page cache, which the kernel gives back
  uint64_t disk_total = 0;     // the root filesystem's size
  uint64_t disk_used = 0;      // and what of it is in use
};

// The memory figures of /proc/meminfo's text (its "Name: N kB" lines); absent lines stay 0.
GuestStats parseMeminfo(std::string_view meminfo);

// /proc/meminfo and statvfs("/") now, as the agent's Stats answer:
// {"memTotal", "memAvailable", "memCache", "diskTotal", "diskUsed"}, all in bytes.
nlohmann::json readGuestStats();

}  // namespace space::agent
