// Percentiles of a benchmark's samples, shared by the benchmarks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace space::bench {

struct Stats {
  size_t n = 0;
  double p50 = 0, p90 = 0, p99 = NAN, max = 0;  // p99 is NaN (not reported) below kMinSamplesForP99
};

// Below this many samples the 99th percentile is just the largest or second largest sample.
inline constexpr size_t kMinSamplesForP99 = 100;

// Nearest-rank percentiles: the smallest sample with at least q·n samples at or below it, i.e.
// v[ceil(q·n) - 1] in sorted order. `v` must not be empty.
inline Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
    return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
  };
  Stats s{v.size(), at(0.50), at(0.90), NAN, v.back()};
  if (v.size() >= kMinSamplesForP99) s.p99 = at(0.99);
  return s;
}

// "p99 12.3" or "p99    -" when there are too few samples for it, in a fixed width.
inline std::string p99Text(const Stats& s, int width = 8) {
  char buf[64];
  if (std::isnan(s.p99)) {
    snprintf(buf, sizeof buf, "p99 %*s", width, "-");
  } else {
    snprintf(buf, sizeof buf, "p99 %*.1f", width, s.p99);
  }
  return buf;
}

}  // namespace space::bench
