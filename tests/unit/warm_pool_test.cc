#include "sandbox/warm_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "sandbox/pool_sizer.h"

namespace space::sandbox {
namespace {

using namespace std::chrono_literals;
using TimePoint = PoolSizer::TimePoint;

const PoolKey kDefault{"base", 1, 512};
const PoolKey kBig{"base", 2, 2048};
const PoolKey kPython{"python", 1, 512};

PoolSizerConfig sizing(size_t default_min, uint64_t budget_mb, uint32_t budget_cpus = 64) {
  PoolSizerConfig c;
  c.default_key = kDefault;
  c.default_min = default_min;
  c.budget_mb = budget_mb;
  c.budget_cpus = budget_cpus;
  return c;
}

TEST(PoolSizer, KeepsTheDefaultKindsFloorWithoutDemandEvenOverBudget) {
  PoolSizer sizer(sizing(2, 0));
  auto targets = sizer.targets(TimePoint{} + 1h);
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[kDefault], 2u);
}

TEST(PoolSizer, AKindAskedForOnceGetsNothingTwiceGetsAGuest) {
  PoolSizer sizer(sizing(0, 4096));
  TimePoint t = TimePoint{} + 1h;
  sizer.recordCreate(kPython, t);
  EXPECT_TRUE(sizer.targets(t).empty());
  sizer.recordCreate(kPython, t + 60s);
  auto targets = sizer.targets(t + 60s);
  EXPECT_EQ(targets[kPython], 1u);
}

TEST(PoolSizer, TheBudgetCountsEachGuestsTranslationBufferBesideItsMemory) {
  TimePoint t = TimePoint{} + 1h;
  auto burst = [&](PoolSizer& sizer) {
    for (int i = 0; i < 5; ++i) sizer.recordCreate(kPython, t + std::chrono::milliseconds(100 * i));
    return sizer.targets(t + 1s)[kPython];
  };
  PoolSizer guests_only(sizing(0, 2048));
  EXPECT_EQ(burst(guests_only), 4u);  // 4 x 512 MB
  auto config = sizing(0, 2048);
  config.vm_qemu_mb = 128;
  PoolSizer with_buffers(config);
  EXPECT_EQ(burst(with_buffers), 3u);  // 3 x 640 MB; a fourth would make 2560
}

TEST(PoolSizer, ABurstIsAbsorbedUpToTheLimitPerKind) {
  PoolSizer sizer(sizing(0, 1 << 20));
  TimePoint t = TimePoint{} + 1h;
  for (int i = 0; i < 5; ++i) sizer.recordCreate(kPython, t + std::chrono::milliseconds(100 * i));
  EXPECT_EQ(sizer.targets(t + 1s)[kPython], 5u);
  for (int i = 0; i < 50; ++i) sizer.recordCreate(kPython, t + 2s);
  EXPECT_EQ(sizer.targets(t + 2s)[kPython], sizer.config().max_per_key);
}

TEST(PoolSizer, ASteadyRateNeedsWhatArrivesDuringARefill) {
  PoolSizer sizer(sizing(0, 1 << 20));
  TimePoint t = TimePoint{} + 1h;
  // One create every 11 s (never two in a burst span) for the whole window, and refills that
  // take 30 s: about three arrive while one guest is made, twice that is kept.
  for (int i = 0; i < 20; ++i) sizer.recordRefill(kPython, 30s);
  for (int i = 0; i < 54; ++i) sizer.recordCreate(kPython, t + std::chrono::seconds(11 * i));
  auto now = t + std::chrono::seconds(11 * 53);
  EXPECT_EQ(sizer.targets(now)[kPython], 6u);
}

TEST(PoolSizer, DemandFadesAfterTheWindow) {
  PoolSizer sizer(sizing(1, 4096));
  TimePoint t = TimePoint{} + 1h;
  sizer.recordCreate(kPython, t);
  sizer.recordCreate(kPython, t + 1s);
  EXPECT_EQ(sizer.targets(t + 2s)[kPython], 2u);
  auto later = sizer.targets(t + sizer.config().window + 2s);
  EXPECT_EQ(later.count(kPython), 0u);
  EXPECT_EQ(later[kDefault], 1u);
}

TEST(PoolSizer, TheBudgetGoesFirstToTheKindAskedForMostAndOneAtATime) {
  // Room for 3 guests of 1 GB beyond the floor (1 x 512 MB... 3.5 GB budget).
  PoolSizer sizer(sizing(1, 512 + 3 * 1024 + 100));
  TimePoint t = TimePoint{} + 1h;
  PoolKey a{"base", 1, 1024};
  PoolKey b{"python", 1, 1024};
  for (int i = 0; i < 6; ++i) sizer.recordCreate(a, t + std::chrono::milliseconds(i));
  for (int i = 0; i < 3; ++i) sizer.recordCreate(b, t + std::chrono::milliseconds(i));
  auto targets = sizer.targets(t + 1s);
  EXPECT_EQ(targets[kDefault], 1u);
  EXPECT_EQ(targets[a], 2u);  // asked for most: the first and the third guest
  EXPECT_EQ(targets[b], 1u);  // but b is not crowded out
}

TEST(PoolSizer, TheCpuBudgetBoundsToo) {
  PoolSizer sizer(sizing(0, 1 << 20, /*budget_cpus=*/4));
  TimePoint t = TimePoint{} + 1h;
  for (int i = 0; i < 8; ++i) sizer.recordCreate(kBig, t);
  EXPECT_EQ(sizer.targets(t)[kBig], 2u);  // 2 vCPUs each
}

TEST(PoolSizer, RemembersABoundedNumberOfCreates) {
  PoolSizer sizer(sizing(0, 1 << 20));
  TimePoint t = TimePoint{} + 1h;
  for (int i = 0; i < 100000; ++i) sizer.recordCreate(kPython, t);
  EXPECT_EQ(sizer.targets(t)[kPython], sizer.config().max_per_key);
}

// A claim the test takes back by hand; it counts its own end.
struct FakeClaim : CapacityClaim {
  explicit FakeClaim(std::atomic<int>& ended) : ended(ended) {}
  ~FakeClaim() override { ++ended; }
  bool held() const override { return holds; }
  std::atomic<bool> holds{true};
  std::atomic<int>& ended;
};

// A pool whose guests are plain tokens: the maker counts what it made, and gives each guest a
// claim when `claims` is set.
struct FakeMaker {
  std::atomic<int> made{0};
  std::atomic<bool> fail{false};
  std::atomic<bool> no_capacity{false};
  std::atomic<int> give_way{0};  // this many makes end as if a sandbox took their capacity
  std::atomic<int> attempts{0};
  bool claims = false;
  std::mutex mu;
  std::vector<FakeClaim*> given;  // guarded by mu
  std::atomic<int> claims_ended{0};
  Result<WarmVm> operator()(const PoolKey& key) {
    ++attempts;
    if (give_way > 0) {
      --give_way;
      return makeError(ErrorCode::kResourceExhausted, "a sandbox took its capacity", kGivenWayReason);
    }
    if (fail) return makeError(ErrorCode::kUnavailable, "no template " + key.template_name);
    if (no_capacity) return makeError(ErrorCode::kResourceExhausted, "the node is full", kNoCapacityReason);
    WarmVm vm;
    vm.sandbox_id = key.template_name + "-" + std::to_string(++made);
    if (claims) {
      auto claim = std::make_unique<FakeClaim>(claims_ended);
      std::lock_guard lock(mu);
      given.push_back(claim.get());
      vm.claim = std::move(claim);
    }
    return vm;
  }
};

bool waitFor(const std::function<bool()>& condition, std::chrono::milliseconds limit = 5s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return condition();
}

std::unique_ptr<WarmPool> startPool(PoolSizerConfig config, FakeMaker& maker) {
  auto pool = WarmPool::start(
      std::move(config), [&maker](const PoolKey& key) { return maker(key); }, [](const WarmVm&) { return true; });
  EXPECT_TRUE(pool.ok());
  return std::move(pool.value());
}

TEST(WarmPool, FillsTheFloorAndRefillsOnlyWhatIsKept) {
  FakeMaker maker;
  auto pool = startPool(sizing(2, 0), maker);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }));
  auto taken = pool->take(kDefault);
  ASSERT_TRUE(taken);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(maker.made.load(), 2);  // taken, not yet kept: no refill
  pool->put(kDefault, std::move(*taken));
  EXPECT_EQ(pool->size(), 2u);
  taken = pool->take(kDefault);
  pool->used(kDefault);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }));
  EXPECT_EQ(maker.made.load(), 3);
}

TEST(WarmPool, AKindInDemandGetsGuestsAndLosesThemWhenDemandFades) {
  FakeMaker maker;
  auto config = sizing(0, 4096);
  config.window = std::chrono::seconds(1);
  auto pool = startPool(config, maker);
  EXPECT_FALSE(pool->take(kPython));  // a miss still counts as demand
  EXPECT_FALSE(pool->take(kPython));
  ASSERT_TRUE(waitFor([&] { return pool->sizes()[kPython] == 2; })) << pool->size();
  auto taken = pool->take(kPython);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->sandbox_id.rfind("python-", 0), 0u);
  pool->used(kPython);
  // No create for longer than the window: the kind's guests are let go (the refill thread
  // looks again every few seconds).
  ASSERT_TRUE(waitFor([&] { return pool->size() == 0 && pool->target() == 0; }, 10s)) << pool->size();
}

TEST(WarmPool, AFailingKindBacksOffWithoutStoppingTheOthers) {
  FakeMaker maker;
  maker.fail = true;
  auto pool = startPool(sizing(1, 0), maker);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(pool->size(), 0u);
  maker.fail = false;
  // The first retry comes after a second.
  ASSERT_TRUE(waitFor([&] { return pool->size() == 1; }, 5s));
}

// A waiting guest whose capacity was taken back for a sandbox is never handed out: prune() kills
// it at once, and one put back after its claim was taken is dropped too.
TEST(WarmPool, AGuestWhoseCapacityWasTakenBackIsDroppedNotHandedOut) {
  FakeMaker maker;
  maker.claims = true;
  auto pool = startPool(sizing(2, 0), maker);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }));
  maker.no_capacity = true;  // what is taken back is not made again while the node is full
  {
    std::lock_guard lock(maker.mu);
    maker.given[0]->holds = false;
  }
  pool->prune();
  EXPECT_EQ(pool->size(), 1u);
  EXPECT_EQ(maker.claims_ended.load(), 1);
  auto taken = pool->take(kDefault);
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->sandbox_id, "base-2");
  EXPECT_TRUE(taken->claim->held());
  static_cast<FakeClaim*>(taken->claim.get())->holds = false;  // taken back while the create reserved
  pool->put(kDefault, std::move(*taken));
  EXPECT_EQ(pool->size(), 0u);
  EXPECT_EQ(maker.claims_ended.load(), 2);
  EXPECT_FALSE(pool->take(kDefault));
}

// A kind whose guests keep giving their capacity to sandboxes (a node kept full by creates of
// other sizes) is refilled after a cool-down that doubles with each loss, not at once: the pool
// does not restore guests only to lose them. A create that takes one of its guests ends it.
TEST(WarmPool, AKindWhoseGuestsAreTakenBackWaitsLongerEachTime) {
  FakeMaker maker;
  maker.claims = true;
  auto pool = startPool(sizing(1, 0), maker);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 1; }));
  auto takeBack = [&](size_t i) {
    {
      std::lock_guard lock(maker.mu);
      maker.given.at(i)->holds = false;
    }
    pool->prune();
  };
  takeBack(0);
  EXPECT_EQ(pool->size(), 0u);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(maker.made.load(), 1) << "made again at once";
  ASSERT_TRUE(waitFor([&] { return pool->size() == 1; }, 5s));  // after 1 s
  EXPECT_EQ(maker.made.load(), 2);
  takeBack(1);
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(maker.made.load(), 2) << "the second cool-down is 2 s";
  ASSERT_TRUE(waitFor([&] { return pool->size() == 1; }, 5s));
  EXPECT_EQ(maker.made.load(), 3);
  // One is taken: its place is made at once, and the next loss is a first one again (1 s, not 4).
  auto taken = pool->take(kDefault);
  ASSERT_TRUE(taken);
  pool->used(kDefault);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 1; }, 3s));
  EXPECT_EQ(maker.made.load(), 4);
  takeBack(3);
  EXPECT_TRUE(waitFor([&] { return pool->size() == 1; }, 3s)) << "cooling down as after a fourth loss";
}

// Guests a sandbox takes at once (one reservation) are one loss; so is one taken while it was
// made, which its maker says with kGivenWayReason.
TEST(WarmPool, GuestsLostTogetherOrWhileMadeCoolTheirKindDownToo) {
  FakeMaker maker;
  maker.claims = true;
  auto pool = startPool(sizing(2, 0), maker);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }));
  {
    std::lock_guard lock(maker.mu);
    for (FakeClaim* claim : maker.given) claim->holds = false;
  }
  pool->prune();
  EXPECT_EQ(pool->size(), 0u);
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(maker.made.load(), 2);
  std::this_thread::sleep_for(1300ms);  // after a second loss it would wait 2 s
  EXPECT_GE(maker.made.load(), 3) << "cooling down as after a second loss";
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }, 5s));

  // Two makes in a row are given way: 1 s, then 2 s, before the next try (not a try each
  // second, as for a full node).
  pool.reset();
  maker.attempts = 0;
  maker.give_way = 2;
  auto second = WarmPool::start(
      sizing(1, 0), [&maker](const PoolKey& key) { return maker(key); }, [](const WarmVm&) { return true; });
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(waitFor([&] { return maker.attempts.load() == 2; }, 5s));  // the first at once, the second after 1 s
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(maker.attempts.load(), 2) << "the second cool-down is 2 s";
  EXPECT_TRUE(waitFor([&] { return second.value()->size() == 1; }, 5s));
}

// A node without room for a waiting guest is no fault: the pool looks again each second, not
// less and less often, so it refills soon after a sandbox gives the capacity back.
TEST(WarmPool, ANodeWithoutRoomIsAskedAgainEachSecond) {
  FakeMaker maker;
  maker.no_capacity = true;
  auto pool = startPool(sizing(1, 0), maker);
  std::this_thread::sleep_for(3500ms);  // backing off as for a fault, the next try would be at 7 s
  EXPECT_EQ(pool->size(), 0u);
  maker.no_capacity = false;
  EXPECT_TRUE(waitFor([&] { return pool->size() == 1; }, 2500ms));
}

TEST(WarmPool, StopDropsWaitingGuestsAndRefusesTakes) {
  FakeMaker maker;
  auto pool = startPool(sizing(2, 0), maker);
  ASSERT_TRUE(waitFor([&] { return pool->size() == 2; }));
  pool->stop();
  EXPECT_EQ(pool->size(), 0u);
  EXPECT_FALSE(pool->take(kDefault));
}

}  // namespace
}  // namespace space::sandbox
