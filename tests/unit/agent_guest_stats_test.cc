#include <gtest/gtest.h>

#include "agent/guest_stats.h"

namespace space::agent {
namespace {

TEST(GuestStats, MeminfoGivesTotalAvailableAndTheCache) {
  const GuestStats stats = parseMeminfo(
      "MemTotal:         245000 kB\n"
      "MemFree:           10000 kB\n"
      "MemAvailable:     200000 kB\n"
      "Buffers:            1000 kB\n"
      "Cached:            30000 kB\n"
      "SwapCached:            0 kB\n"
      "HugePages_Total:       0\n");
  EXPECT_EQ(stats.mem_total, 245000u * 1024);
  EXPECT_EQ(stats.mem_available, 200000u * 1024);
  EXPECT_EQ(stats.mem_cache, 31000u * 1024);  // Cached + Buffers, not SwapCached
}

TEST(GuestStats, MissingOrGarbledLinesStayZero) {
  const GuestStats stats = parseMeminfo("MemTotal: lots kB\nnonsense\n:\nMemAvailable:\nCached: 5 kB");
  EXPECT_EQ(stats.mem_total, 0u);
  EXPECT_EQ(stats.mem_available, 0u);
  EXPECT_EQ(stats.mem_cache, 5u * 1024);
  EXPECT_EQ(parseMeminfo("").mem_total, 0u);
}

TEST(GuestStats, ThisMachinesFiguresAreWhole) {
  const auto json = readGuestStats();
  for (const char* field : {"memTotal", "memAvailable", "memCache", "diskTotal", "diskUsed"}) {
    ASSERT_TRUE(json.contains(field) && json[field].is_number_unsigned()) << field << " " << json.dump();
  }
  EXPECT_GT(json["memTotal"].get<uint64_t>(), 0u);
  EXPECT_LE(json["memAvailable"].get<uint64_t>(), json["memTotal"].get<uint64_t>());
  EXPECT_GT(json["diskTotal"].get<uint64_t>(), 0u);
  EXPECT_LE(json["diskUsed"].get<uint64_t>(), json["diskTotal"].get<uint64_t>());
}

}  // namespace
}  // namespace space::agent
