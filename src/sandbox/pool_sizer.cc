#include "sandbox/pool_sizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace space::sandbox {

std::string PoolKey::describe() const {
  return template_name + " " + std::to_string(cpus) + " vCPU " + std::to_string(memory_mb) + " MB";
}

void PoolSizer::forget(Demand& demand, TimePoint now) const {
  while (!demand.creates.empty() && now - demand.creates.front() > config_.window) demand.creates.pop_front();
}

void PoolSizer::recordCreate(const PoolKey& key, TimePoint now) {
  Demand& demand = demand_[key];
  forget(demand, now);
  demand.creates.push_back(now);
  // A flood of creates needs no more memory than a pool of max_per_key can use.
  if (demand.creates.size() > kMaxRemembered) demand.creates.pop_front();
}

void PoolSizer::recordRefill(const PoolKey& key, std::chrono::milliseconds took) {
  Demand& demand = demand_[key];
  demand.refill_ms = 0.7 * demand.refill_ms + 0.3 * static_cast<double>(took.count());
}

size_t PoolSizer::wanted(const Demand& demand) const {
  const auto& creates = demand.creates;
  // One create in the window may have been a one-off: a kind is pooled from its second.
  if (creates.size() < 2) return 0;
  // The largest burst: most creates within any burst_span (two pointers over sorted times).
  size_t burst = 0;
  size_t first = 0;
  for (size_t last = 0; last < creates.size(); ++last) {
    while (creates[last] - creates[first] > config_.burst_span) ++first;
    burst = std::max(burst, last - first + 1);
  }
  // The steady rate: creates that arrive while one guest is being made, twice over.
  double per_ms = static_cast<double>(creates.size()) /
                  static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(config_.window).count());
  auto steady = static_cast<size_t>(std::ceil(per_ms * demand.refill_ms * 2));
  return std::min(config_.max_per_key, std::max<size_t>({1, burst, steady}));
}

std::map<PoolKey, size_t> PoolSizer::targets(TimePoint now) {
  struct Candidate {
    const PoolKey* key;
    size_t want;
    size_t recent;
  };
  std::vector<Candidate> candidates;
  for (auto it = demand_.begin(); it != demand_.end();) {
    forget(it->second, now);
    if (it->second.creates.empty() && !(it->first == config_.default_key)) {
      it = demand_.erase(it);  // nobody asked for it in the window: its smoothing goes too
      continue;
    }
    candidates.push_back({&it->first, wanted(it->second), it->second.creates.size()});
    ++it;
  }
  std::map<PoolKey, size_t> out;
  uint64_t used_mb = 0;
  uint64_t used_cpus = 0;
  auto charge = [&](const PoolKey& key, size_t n) {
    used_mb += (key.memory_mb + config_.vm_qemu_mb) * n;
    used_cpus += static_cast<uint64_t>(key.cpus) * n;
  };
  if (config_.default_min > 0) {
    out[config_.default_key] = config_.default_min;
    charge(config_.default_key, config_.default_min);
  }
  // The budget goes one guest at a time to the kind asked for most, so a rare kind cannot
  // crowd out a common one, and each kind in demand gets its first guest before any gets more.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.recent > b.recent; });
  bool gave = true;
  while (gave) {
    gave = false;
    for (const Candidate& c : candidates) {
      size_t& target = out[*c.key];
      if (target >= c.want) continue;
      if (used_mb + c.key->memory_mb + config_.vm_qemu_mb > config_.budget_mb ||
          used_cpus + c.key->cpus > config_.budget_cpus) {
        continue;
      }
      ++target;
      charge(*c.key, 1);
      gave = true;
    }
  }
  for (auto it = out.begin(); it != out.end();) it = it->second == 0 ? out.erase(it) : std::next(it);
  return out;
}

}  // namespace space::sandbox
