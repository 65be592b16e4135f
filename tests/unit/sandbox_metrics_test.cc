#include <gtest/gtest.h>
#include <unistd.h>

#include "sandbox/metrics.h"

namespace space::sandbox {
namespace {

TEST(SandboxMetrics, CpuTimeIsReadPastAProcessNameWithSpacesAndParentheses) {
  // Fields 14 and 15 (utime, stime) of /proc/<pid>/stat, after a comm that could fool a split.
  const std::string stat = "4242 (qemu) (x y)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 250 0 0 20 0 3 0 99 0";
  EXPECT_EQ(cpuTicksFromStat(stat).value(), 1750u);
  EXPECT_FALSE(cpuTicksFromStat("4242 qemu S 1").ok());
  EXPECT_FALSE(cpuTicksFromStat("4242 (qemu) S 1 2 3").ok());
  EXPECT_FALSE(cpuTicksFromStat("1 (a) S 1 1 1 0 -1 0 0 0 0 0 -5 2 0").ok());
}

TEST(SandboxMetrics, CpuShareIsOfAllTheSandboxesVcpus) {
  EXPECT_DOUBLE_EQ(cpuPercent(100, 1000, 1, 100), 100.0);  // one vCPU busy for a second
  EXPECT_DOUBLE_EQ(cpuPercent(100, 1000, 2, 100), 50.0);
  EXPECT_DOUBLE_EQ(cpuPercent(25, 5000, 2, 100), 2.5);
  EXPECT_DOUBLE_EQ(cpuPercent(900, 1000, 2, 100), 100.0);  // clamped (QEMU's own threads)
  EXPECT_DOUBLE_EQ(cpuPercent(10, 0, 2, 100), 0.0);
}

TEST(SandboxMetrics, TheSeriesKeepsTheNewestAndAnswersARange) {
  MetricsSeries series(3);
  for (int64_t t = 1; t <= 5; ++t) series.add(MetricSample{.timestamp_ms = t * 1000});
  auto all = series.between(0, INT64_MAX);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.front().timestamp_ms, 3000);
  EXPECT_EQ(all.back().timestamp_ms, 5000);
  EXPECT_EQ(series.between(4000, 4999).size(), 1u);
  EXPECT_TRUE(series.between(6000, 7000).empty());
}

TEST(SandboxMetrics, ThisProcessCanBeMeasured) {
  auto usage = readProcessUsage(getpid());
  ASSERT_TRUE(usage.ok()) << usage.error().message;
  EXPECT_GT(usage->rss_bytes, 1u << 20);
  EXPECT_FALSE(readProcessUsage(-5).ok());
}

}  // namespace
}  // namespace space::sandbox
