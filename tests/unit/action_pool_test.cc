#include "sandbox/action_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace space::sandbox {
namespace {

using std::chrono::seconds;
using Kind = ActionPool::Kind;

// Actions that run until the test lets them go, and say when they started.
class Gate {
 public:
  std::function<void()> action(const std::string& name) {
    return [this, name] {
      std::unique_lock lock(mu_);
      started_.insert(name);
      changed_.notify_all();
      changed_.wait(lock, [&] { return open_ || released_.count(name); });
    };
  }
  bool waitStarted(const std::string& name) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, seconds(10), [&] { return started_.count(name) > 0; });
  }
  // Whether it has started by now (the pool had every chance: see settle()).
  bool started(const std::string& name) {
    std::lock_guard lock(mu_);
    return started_.count(name) > 0;
  }
  void release(const std::string& name) {
    std::lock_guard lock(mu_);
    released_.insert(name);
    changed_.notify_all();
  }
  void openAll() {
    std::lock_guard lock(mu_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::set<std::string> started_, released_;
  bool open_ = false;
};

// Lets every action go when a test ends early, before the pool (declared after it) is stopped.
struct OpenOnExit {
  Gate& gate;
  ~OpenOnExit() { gate.openAll(); }
};

// The rules hold whatever the order in which threads wake: a worker left idle by them stays idle,
// so what a test asserts has not started cannot start later by luck. A short wait gives a wrong
// pool the chance to show it.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

TEST(ActionPool, OneTenantsSlowActionsLeaveRoomForOtherTenantsAndForQuickOnes) {
  Gate gate;
  auto pool = ActionPool::start({4, 2});
  ASSERT_TRUE(pool.ok());
  OpenOnExit open_on_exit{gate};
  // Tenant a: four slow actions (suspends); only two run at once.
  for (const char* id : {"a1", "a2", "a3", "a4"}) {
    EXPECT_TRUE((*pool)->submit({id, "a", Kind::kSlow, gate.action(id)}));
  }
  ASSERT_TRUE(gate.waitStarted("a1"));
  ASSERT_TRUE(gate.waitStarted("a2"));
  settle();
  EXPECT_FALSE(gate.started("a3")) << "one tenant took more than its share of workers";
  // Tenant b's slow action gets the third worker at once, not after a's.
  EXPECT_TRUE((*pool)->submit({"b1", "b", Kind::kSlow, gate.action("b1")}));
  EXPECT_TRUE(gate.waitStarted("b1"));
  // A fourth slow one (tenant c) waits: the last worker is kept for quick actions...
  EXPECT_TRUE((*pool)->submit({"c1", "c", Kind::kSlow, gate.action("c1")}));
  settle();
  EXPECT_FALSE(gate.started("c1")) << "slow actions took the last worker";
  // ...which run at once while every other worker suspends.
  EXPECT_TRUE((*pool)->submit({"c2", "c", Kind::kQuick, gate.action("c2")}));
  EXPECT_TRUE(gate.waitStarted("c2"));
  // When one of a's ends, the oldest slow action that fits goes next: a3 (a runs one now).
  gate.release("c2");
  gate.release("a1");
  EXPECT_TRUE(gate.waitStarted("a3"));
  settle();
  EXPECT_FALSE(gate.started("c1")) << "three slow ones already run";
  gate.release("b1");
  EXPECT_TRUE(gate.waitStarted("c1"));
}

TEST(ActionPool, AtMostOneActionPerSandbox) {
  Gate gate;
  auto pool = ActionPool::start({2, 1});
  ASSERT_TRUE(pool.ok());
  OpenOnExit open_on_exit{gate};
  EXPECT_TRUE((*pool)->submit({"s1", "t", Kind::kQuick, gate.action("first")}));
  EXPECT_TRUE((*pool)->busy("s1"));
  EXPECT_FALSE((*pool)->submit({"s1", "t", Kind::kQuick, gate.action("second")}));
  ASSERT_TRUE(gate.waitStarted("first"));
  EXPECT_FALSE((*pool)->submit({"s1", "t", Kind::kSlow, gate.action("second")})) << "while it runs, too";
  EXPECT_FALSE((*pool)->busy("s2"));
  gate.release("first");
  for (int i = 0; i < 1000 && (*pool)->busy("s1"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE((*pool)->busy("s1"));
  EXPECT_TRUE((*pool)->submit({"s1", "t", Kind::kQuick, gate.action("third")}));
  EXPECT_TRUE(gate.waitStarted("third"));
}

TEST(ActionPool, StopDropsWhatIsQueuedAndWaitsForWhatRuns) {
  Gate gate;
  auto pool = ActionPool::start({2, 1});
  ASSERT_TRUE(pool.ok());
  OpenOnExit open_on_exit{gate};
  EXPECT_TRUE((*pool)->submit({"s1", "t", Kind::kSlow, gate.action("running")}));
  EXPECT_TRUE((*pool)->submit({"s2", "t", Kind::kSlow, gate.action("queued")}));  // over t's share
  ASSERT_TRUE(gate.waitStarted("running"));
  std::thread stopper([&] { (*pool)->stop(); });
  settle();
  gate.release("running");
  gate.release("queued");  // if it ran after all (it must not), so that stop() can end
  stopper.join();
  EXPECT_FALSE(gate.started("queued"));
  EXPECT_FALSE((*pool)->submit({"s3", "t", Kind::kQuick, gate.action("late")}));
  EXPECT_FALSE((*pool)->busy("s2"));
}

}  // namespace
}  // namespace space::sandbox
