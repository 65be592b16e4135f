#include "agent/guest_stats.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>

namespace space::agent {

GuestStats parseMeminfo(std::string_view meminfo) {
  GuestStats stats;
  uint64_t cached = 0, buffers = 0;
  while (!meminfo.empty()) {
    const size_t end = meminfo.find('\n');
    std::string_view line = meminfo.substr(0, end);
    meminfo = end == std::string_view::npos ? std::string_view() : meminfo.substr(end + 1);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    value.remove_prefix(std::min(value.find_first_not_of(' '), value.size()));
    uint64_t kib = 0;
    if (std::from_chars(value.data(), value.data() + value.size(), kib).ec != std::errc()) continue;
    const uint64_t bytes = kib * 1024;
    if (name == "MemTotal") stats.mem_total = bytes;
    if (name == "MemAvailable") stats.mem_available = bytes;
    if (name == "Cached") cached = bytes;
    if (name == "Buffers") buffers = bytes;
  }
  stats.mem_cache = cached + buffers;
  return stats;
}

nlohmann::json readGuestStats() {
  std::ifstream in("/proc/meminfo");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  GuestStats stats = parseMeminfo(text);
  struct statvfs fs {};
  if (::statvfs("/", &fs) == 0) {
    stats.disk_total = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    stats.disk_used = static_cast<uint64_t>(fs.f_blocks - fs.f_bfree) * fs.f_frsize;
  }
  return {{"memTotal", stats.mem_total},
          {"memAvailable", stats.mem_available},
          {"memCache", stats.mem_cache},
          {"diskTotal", stats.disk_total},
          {"diskUsed", stats.disk_used}};
}

}  // namespace space::agent
