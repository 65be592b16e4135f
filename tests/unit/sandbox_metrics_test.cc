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

// What a guest says of itself is bounded by what it really has: its RAM, and its disk's size.
TEST(SandboxMetrics, AGuestsOwnFiguresAreHeldToWhatItCouldHave) {
  const uint64_t ram = 256 << 20;
  auto honest = parseGuestStats(nlohmann::json{{"memTotal", 240 << 20},
                                               {"memAvailable", 200 << 20},
                                               {"memCache", 30 << 20},
                                               {"diskTotal", uint64_t{2} << 30},
                                               {"diskUsed", 600 << 20}},
                                ram);
  ASSERT_TRUE(honest.has_value());
  EXPECT_EQ(honest->mem_used, 40u << 20);
  EXPECT_EQ(honest->mem_cache, 30u << 20);
  EXPECT_EQ(honest->disk_total, uint64_t{2} << 30);
  EXPECT_EQ(honest->disk_used, 600u << 20);
  // Lies: more memory than its RAM, more available than total, more disk used than there is.
  auto lying = parseGuestStats(nlohmann::json{{"memTotal", uint64_t{1} << 40},
                                              {"memAvailable", 0},
                                              {"memCache", UINT64_MAX},
                                              {"diskTotal", UINT64_MAX},
                                              {"diskUsed", UINT64_MAX}},
                               ram);
  ASSERT_TRUE(lying.has_value());
  EXPECT_EQ(lying->mem_used, ram);
  EXPECT_EQ(lying->mem_cache, ram);
  EXPECT_EQ(lying->disk_total, uint64_t{1} << 50);
  EXPECT_EQ(lying->disk_used, uint64_t{1} << 50);
  auto upside_down = parseGuestStats(
      nlohmann::json{{"memTotal", 100}, {"memAvailable", 500}, {"memCache", 0}, {"diskTotal", 10}, {"diskUsed", 20}},
      ram);
  ASSERT_TRUE(upside_down.has_value());
  EXPECT_EQ(upside_down->mem_used, 0u);
  EXPECT_EQ(upside_down->disk_used, 10u);
  // Anything but five unsigned integers is no answer.
  EXPECT_FALSE(parseGuestStats(nlohmann::json::array(), ram).has_value());
  EXPECT_FALSE(parseGuestStats(nlohmann::json{{"memTotal", 1}}, ram).has_value());
  EXPECT_FALSE(
      parseGuestStats(
          nlohmann::json{{"memTotal", -1}, {"memAvailable", 0}, {"memCache", 0}, {"diskTotal", 0}, {"diskUsed", 0}},
          ram)
          .has_value());
  EXPECT_FALSE(
      parseGuestStats(
          nlohmann::json{{"memTotal", "1"}, {"memAvailable", 0}, {"memCache", 0}, {"diskTotal", 0}, {"diskUsed", 0}},
          ram)
          .has_value());
  EXPECT_FALSE(
      parseGuestStats(
          nlohmann::json{{"memTotal", 1.5}, {"memAvailable", 0}, {"memCache", 0}, {"diskTotal", 0}, {"diskUsed", 0}},
          ram)
          .has_value());
}

// One question out at a time; an answer counts for a while, no answer keeps the last one.
TEST(SandboxMetrics, AGuestIsAskedOnceAtATimeAndItsAnswerAges) {
  GuestStatsCell cell;
  EXPECT_FALSE(cell.fresh(1000, 5000).has_value());
  EXPECT_TRUE(cell.startAsking());
  EXPECT_FALSE(cell.startAsking());  // still out
  cell.answer(GuestFigures{.mem_used = 7}, 1000);
  ASSERT_TRUE(cell.fresh(6000, 5000).has_value());
  EXPECT_EQ(cell.fresh(6000, 5000)->mem_used, 7u);
  EXPECT_FALSE(cell.fresh(6001, 5000).has_value());
  EXPECT_TRUE(cell.startAsking());
  cell.answer(std::nullopt, 7000);  // no answer (a timeout): the old one stays, aging
  EXPECT_EQ(cell.fresh(5000, 5000)->mem_used, 7u);
  EXPECT_TRUE(cell.startAsking());
}

TEST(SandboxMetrics, ThisProcessCanBeMeasured) {
  auto usage = readProcessUsage(getpid());
  ASSERT_TRUE(usage.ok()) << usage.error().message;
  EXPECT_GT(usage->rss_bytes, 1u << 20);
  EXPECT_FALSE(readProcessUsage(-5).ok());
}

}  // namespace
}  // namespace space::sandbox
