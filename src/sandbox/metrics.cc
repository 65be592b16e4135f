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

std::optional<GuestFigures> parseGuestStats(const nlohmann::json& answer, uint64_t ram_bytes) {
  constexpr uint64_t kMaxDiskBytes = uint64_t{1} << 50;
  if (!answer.is_object()) return std::nullopt;
  uint64_t values[5] = {};
  const char* names[5] = {"memTotal", "memAvailable", "memCache", "diskTotal", "diskUsed"};
  for (int i = 0; i < 5; ++i) {
    auto it = answer.find(names[i]);
    if (it == answer.end() || !it->is_number_integer()) return std::nullopt;
    if (!it->is_number_unsigned() && it->get<int64_t>() < 0) return std::nullopt;
    values[i] = it->get<uint64_t>();
  }
  const uint64_t mem_total = std::min(values[0], ram_bytes);
  const uint64_t mem_available = std::min(values[1], mem_total);
  GuestFigures figures;
  figures.mem_used = mem_total - mem_available;
  figures.mem_cache = std::min(values[2], mem_total);
  figures.disk_total = std::min(values[3], kMaxDiskBytes);
  figures.disk_used = std::min(values[4], figures.disk_total);
  return figures;
}

bool GuestStatsCell::startAsking() {
  std::lock_guard lock(mu_);
  if (asking_) return false;
  asking_ = true;
  return true;
}

void GuestStatsCell::answer(std::optional<GuestFigures> figures, int64_t now_ms) {
  std::lock_guard lock(mu_);
  asking_ = false;
  if (!figures) return;
  figures_ = figures;
  at_ms_ = now_ms;
}

std::optional<GuestFigures> GuestStatsCell::fresh(int64_t now_ms, int64_t max_age_ms) const {
  std::lock_guard lock(mu_);
  if (!figures_ || now_ms - at_ms_ > max_age_ms) return std::nullopt;
  return figures_;
}

}  // namespace space::sandbox
