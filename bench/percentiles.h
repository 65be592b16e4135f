// Percentiles of a benchmark's samples, shared by the benchmarks.
#pragma once

#include <algorithm>
#include <vector>

namespace space::bench {

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles; `v` must not be empty.
inline Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))]; };
  return {at(0.50), at(0.90), at(0.99), v.back()};
}

}  // namespace space::bench
