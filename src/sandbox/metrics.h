// What a running sandbox costs the host, sampled every few seconds from its QEMU process (CPU
// time, resident memory) and its disk overlay (blocks allocated), and kept per sandbox in a
// bounded series: the figures E2B's getMetrics returns. Beside them, the guest's own view (its
// memory in use, page cache, root filesystem), which only its agent knows: asked for without
// waiting (GuestStatsCell) and taken as the guest's claim, bounded by what it was given.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::sandbox {

struct GuestFigures {
  uint64_t mem_used = 0;
  uint64_t mem_cache = 0;
  uint64_t disk_used = 0;
  uint64_t disk_total = 0;
};

struct MetricSample {
  int64_t timestamp_ms = 0;
  double cpu_used_pct = 0;  // of the sandbox's vCPUs together, 0..100
  uint32_t cpu_count = 0;
  uint64_t mem_used_bytes = 0;   // QEMU's resident memory (the guest's RAM it touched, and QEMU's own)
  uint64_t mem_total_bytes = 0;  // the guest's RAM size
  uint64_t disk_used_bytes = 0;  // blocks its disk overlay holds on the host
  // Bytes through the guest's NIC (its tap) since the sandbox's network was made or last resumed,
  // as the guest sees them: sent = out of the guest. 0 without a network.
  uint64_t net_sent_bytes = 0;
  uint64_t net_received_bytes = 0;
  bool has_nic = false;  // the counters were read (the sandbox has a network)
  // The guest's own figures (its agent's Stats), when it answered lately: memory in use
  // (MemTotal - MemAvailable), its page cache, its root filesystem's size and use. What the
  // guest says, so shown to its own tenant only and never used for limits or accounting.
  std::optional<GuestFigures> guest;
};

// The agent's Stats answer ({"memTotal", "memAvailable", "memCache", "diskTotal", "diskUsed"},
// bytes), from a guest that may lie: nullopt unless each is an integer of 0 or more; memory figures
// are held to `ram_bytes` (the guest's RAM) and to each other, disk use to the size it reports,
// and that to 1 PiB (not to its disk's real size, which this does not know).
std::optional<GuestFigures> parseGuestStats(const nlohmann::json& answer, uint64_t ram_bytes);

// The latest guest figures of one sandbox, and whether a question for them is out. Shared
// between housekeeping (asks, reads) and the agent client's thread (answers), which may answer
// after the sandbox is gone. Thread-safe.
class GuestStatsCell {
 public:
  // True (and a question is now out) if none was; false while one is.
  bool startAsking();
  // The answer to the question out (nullopt: none came, or it was refused); ends the asking.
  void answer(std::optional<GuestFigures> figures, int64_t now_ms);
  // The last figures if they are at most `max_age_ms` old.
  std::optional<GuestFigures> fresh(int64_t now_ms, int64_t max_age_ms) const;

 private:
  mutable std::mutex mu_;
  bool asking_ = false;
  std::optional<GuestFigures> figures_;
  int64_t at_ms_ = 0;
};

// The newest samples, oldest first, at most `max` of them. Thread-safe.
class MetricsSeries {
 public:
  static constexpr size_t kDefaultMax = 720;  // an hour at one sample every 5 s
  explicit MetricsSeries(size_t max = kDefaultMax) : max_(max) {}
  void add(const MetricSample& sample);
  // Samples with start_ms <= timestamp_ms <= end_ms.
  std::vector<MetricSample> between(int64_t start_ms, int64_t end_ms) const;
  std::optional<MetricSample> latest() const;

 private:
  mutable std::mutex mu_;
  std::deque<MetricSample> samples_;
  size_t max_;
};

// A process's CPU time (user + system, in clock ticks) and resident set, from /proc.
struct ProcessUsage {
  uint64_t cpu_ticks = 0;
  uint64_t rss_bytes = 0;
};
Result<ProcessUsage> readProcessUsage(pid_t pid);
// Parses /proc/<pid>/stat's text (the comm field may hold spaces and parentheses).
Result<uint64_t> cpuTicksFromStat(const std::string& stat);

// The share of `cpus` vCPUs that `ticks` of CPU time over `wall_ms` is, 0..100.
double cpuPercent(uint64_t ticks, int64_t wall_ms, uint32_t cpus, long ticks_per_second);

}  // namespace space::sandbox
