// PoolSizer: how many guests the hot pool keeps for each (template, size), from the creates it
// saw recently, within a budget.
//
// A create that finds its kind in the pool costs one agent call; one that does not restores a
// guest while the client waits. The pool should therefore hold, for each kind, what the next
// burst of creates will take before refills catch up, and nothing for kinds nobody asks for:
// an idle pooled guest costs its memory. Pure logic (time is passed in), so it is tested fast.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "common/result.h"

namespace space::sandbox {

struct PoolKey {
  std::string template_name;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;
  auto operator<=>(const PoolKey&) const = default;
  std::string describe() const;  // "base 1 vCPU 512 MB"
};

struct PoolSizerConfig {
  PoolKey default_key;     // template base at the default size
  size_t default_min = 0;  // kept for default_key whatever the demand (--warm-pool)
  // What all pooled guests together may hold (--warm-pool-budget-mb, --warm-pool-budget-cpus).
  // default_min is kept even beyond them: the operator asked for it by name.
  uint64_t budget_mb = 0;
  uint32_t budget_cpus = 0;
  // What each guest holds of the host beyond its memory, charged to budget_mb with it (its
  // QEMU's own memory and, under TCG, translation buffer), as the node counts it.
  uint64_t vm_qemu_mb = 0;
  size_t max_per_key = 8;
  // Demand is what was asked for within this window; a kind not asked for in it gets nothing.
  std::chrono::seconds window{600};
  // A burst is the creates of one kind within this span: the pool should absorb the largest.
  std::chrono::seconds burst_span{10};
};

class PoolSizer {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  explicit PoolSizer(PoolSizerConfig config) : config_(std::move(config)) {}

  // A create of `key` that could have been served from the pool (hit or miss).
  void recordCreate(const PoolKey& key, TimePoint now);
  // How long making one pooled guest of `key` took (smoothed): the time a pool must bridge.
  void recordRefill(const PoolKey& key, std::chrono::milliseconds took);

  // Each kind's target, within the budget: kinds with more recent demand first.
  std::map<PoolKey, size_t> targets(TimePoint now);

  const PoolSizerConfig& config() const { return config_; }

 private:
  struct Demand {
    std::deque<TimePoint> creates;  // within the window, oldest first; at most kMaxRemembered
    double refill_ms = 500;         // a restore under TCG takes ~0.1-0.5 s until measured
  };
  static constexpr size_t kMaxRemembered = 4096;
  void forget(Demand& demand, TimePoint now) const;
  size_t wanted(const Demand& demand) const;

  PoolSizerConfig config_;
  std::map<PoolKey, Demand> demand_;
};

}  // namespace space::sandbox
