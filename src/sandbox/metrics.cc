#include "sandbox/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "common/fs.h"

namespace space::sandbox {

void MetricsSeries::add(const MetricSample& sample) {
  std::lock_guard lock(mu_);
  samples_.push_back(sample);
  while (samples_.size() > max_) samples_.pop_front();
}

std::optional<MetricSample> MetricsSeries::latest() const {
  std::lock_guard lock(mu_);
  if (samples_.empty()) return std::nullopt;
  return samples_.back();
}

std::vector<MetricSample> MetricsSeries::between(int64_t start_ms, int64_t end_ms) const {
  std::lock_guard lock(mu_);
  std::vector<MetricSample> out;
  for (const auto& s : samples_) {
    if (s.timestamp_ms >= start_ms && s.timestamp_ms <= end_ms) out.push_back(s);
  }
  return out;
}

Result<uint64_t> cpuTicksFromStat(const std::string& stat) {
  // "pid (comm) state ppid ...": the fields after the last ')' start at field 3 (state);
  // utime and stime are fields 14 and 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return makeError(ErrorCode::kInternal, "unreadable /proc stat");
  std::istringstream in(stat.substr(close + 1));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int index = 3; index <= 15 && (in >> field); ++index) {
    if (index == 14 || index == 15) {
      if (field.empty() || field.size() > 19 || field.find_first_not_of("0123456789") != std::string::npos) {
        return makeError(ErrorCode::kInternal, "unreadable /proc stat");
      }
      (index == 14 ? utime : stime) = std::stoull(field);
    }
  }
  if (!in) return makeError(ErrorCode::kInternal, "unreadable /proc stat");
  return utime + stime;
}

Result<ProcessUsage> readProcessUsage(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  auto stat = readSmallFile(dir + "/stat", 4096);
  if (!stat.ok()) return stat.error();
  auto ticks = cpuTicksFromStat(stat.value());
  if (!ticks.ok()) return ticks.error();
  auto statm = readSmallFile(dir + "/statm", 4096);
  if (!statm.ok()) return statm.error();
  std::istringstream in(statm.value());
  uint64_t size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return makeError(ErrorCode::kInternal, "unreadable " + dir + "/statm");
  const long page = sysconf(_SC_PAGESIZE);
  return ProcessUsage{ticks.value(), resident_pages * static_cast<uint64_t>(page > 0 ? page : 4096)};
}

double cpuPercent(uint64_t ticks, int64_t wall_ms, uint32_t cpus, long ticks_per_second) {
  if (wall_ms <= 0 || cpus == 0 || ticks_per_second <= 0) return 0;
  const double used_s = static_cast<double>(ticks) / static_cast<double>(ticks_per_second);
  const double pct = 100.0 * used_s / (static_cast<double>(wall_ms) / 1000.0 * cpus);
  return std::clamp(pct, 0.0, 100.0);
}

}  // namespace space::sandbox
