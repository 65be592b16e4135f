// Node facts: the TSC frequency TCG guests are told, and how it stays the same across starts
// (it is part of the template key) without hiding a real change.
#include "vmm/node_facts.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/fs.h"

namespace space::vmm {
namespace {

TEST(NodeFacts, TscIsMeasuredToWithinAFewPpm) {
#if defined(__x86_64__)
  const uint64_t a = measureTscKhz(50);
  const uint64_t b = measureTscKhz(50);
  ASSERT_GT(a, 100000u) << "a TSC slower than 100 MHz";
  const uint64_t diff = a > b ? a - b : b - a;
  EXPECT_LT(diff * 1000000 / a, 200u) << a << " vs " << b << " kHz";  // ppm, on a busy machine
#else
  GTEST_SKIP() << "no TSC on this architecture";
#endif
}

TEST(NodeFacts, TheRememberedTscFigureIsKeptWithin100PpmAndReplacedBeyond) {
  auto dir = TempDir::create("/tmp", "space-node-facts-");
  ASSERT_TRUE(dir.ok());
  const std::string file = dir->path() + "/node-tsc.json";
  EXPECT_EQ(rememberedTscKhz(file, 0), 0u);
  EXPECT_EQ(rememberedTscKhz(file, 2100000), 2100000u);  // first start: measured, remembered
  EXPECT_EQ(rememberedTscKhz(file, 2100150), 2100000u);  // 71 ppm off: the same key as before
  EXPECT_EQ(rememberedTscKhz(file, 2099800), 2100000u);
  EXPECT_EQ(rememberedTscKhz(file, 2101000), 2101000u);  // 476 ppm: another host or a real change
  EXPECT_EQ(rememberedTscKhz(file, 2101000), 2101000u);
  std::ofstream(file) << "{not json";
  EXPECT_EQ(rememberedTscKhz(file, 2100000), 2100000u);  // a damaged file is replaced
  EXPECT_EQ(rememberedTscKhz(file, 2100100), 2100000u);
}

TEST(NodeFacts, GuestKernelArgsOnlyUnderTcg) {
  NodeFacts facts;
  facts.tsc_khz = 2100123;
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kTcg), "tsc_early_khz=2100123");
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kKvm), "");  // kvm-clock
  facts.tsc_khz = 0;
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kTcg), "");
}

}  // namespace
}  // namespace space::vmm
