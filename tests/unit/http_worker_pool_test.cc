#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "http/worker_pool.h"

namespace space::http::detail {
namespace {

using namespace std::chrono_literals;

TEST(WorkerPool, RunsTasksAndReusesIdleThreads) {
  WorkerPool pool(4, 10s);
  for (int i = 0; i < 20; ++i) {
    std::promise<void> done;
    std::string why;
    ASSERT_TRUE(pool.run([&] { done.set_value(); }, why)) << why;
    ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready) << "done never came";
    // The thread counts as idle once the task has returned; give it that moment.
    for (int wait = 0; wait < 1000 && pool.idleThreads() < pool.threads(); ++wait) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(pool.threads(), 1u);
}

TEST(WorkerPool, RefusesATaskWhenEveryThreadIsBusyAtTheMaximum) {
  WorkerPool pool(2, 10s);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<int> started{0};
  std::string why;
  ASSERT_TRUE(pool.run([&] { ++started, (void)released.wait_for(30s); }, why));
  ASSERT_TRUE(pool.run([&] { ++started, (void)released.wait_for(30s); }, why));
  EXPECT_FALSE(pool.run([] {}, why));
  EXPECT_NE(why.find("running 2 requests"), std::string::npos) << why;
  release.set_value();
  pool.stop();
  EXPECT_EQ(started.load(), 2);
  EXPECT_FALSE(pool.run([] {}, why));
  EXPECT_NE(why.find("stopping"), std::string::npos) << why;
}

TEST(WorkerPool, AQueuedTaskWaitsForTheNextFreeThreadInOrderAndTheQueueIsBounded) {
  WorkerPool pool(1, 10s, 2);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::mutex m;
  std::vector<int> order;
  auto task = [&](int n) {
    return [&, n] {
      std::lock_guard lock(m);
      order.push_back(n);
    };
  };
  std::string why;
  ASSERT_TRUE(pool.run([&] { (void)released.wait_for(30s); }, why)) << why;
  ASSERT_TRUE(pool.run(task(1), why)) << why;
  ASSERT_TRUE(pool.run(task(2), why)) << why;
  EXPECT_EQ(pool.queuedTasks(), 2u);
  EXPECT_EQ(pool.idleThreads(), 0u);
  EXPECT_FALSE(pool.run(task(3), why));
  EXPECT_NE(why.find("2 tasks wait for one (the limit is 2)"), std::string::npos) << why;
  EXPECT_EQ(pool.threads(), 1u);  // queued, not given threads over the maximum
  release.set_value();
  auto ran = [&] {
    std::lock_guard lock(m);
    return order.size();
  };
  // Run by the thread that finished, not by stop() below.
  for (int wait = 0; wait < 5000 && ran() < 2; ++wait) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(ran(), 2u);
  EXPECT_EQ(pool.queuedTasks(), 0u);
  pool.stop();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(WorkerPool, TasksQueuedWhenTheStopBeginsStillRun) {
  std::atomic<int> ran{0};
  std::promise<void> release;
  auto released = release.get_future().share();
  WorkerPool pool(1, 10s, 4);
  std::string why;
  ASSERT_TRUE(pool.run([&] { (void)released.wait_for(30s), ++ran; }, why)) << why;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pool.run([&] { ++ran; }, why)) << why;
  std::thread stopper([&] { pool.stop(); });
  // The queue is full, so a refusal says why: busy until the stop has begun.
  for (int i = 0; i < 5000 && why.find("stopping") == std::string::npos; ++i) {
    ASSERT_FALSE(pool.run([] {}, why));
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(why, "the server is stopping");
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 5);  // a queued task was taken, so whoever handed it need not answer for it
}

TEST(WorkerPool, IdleThreadsExit) {
  WorkerPool pool(8, 50ms);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::string why;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(pool.run([&] { (void)released.wait_for(30s); }, why)) << why;
  EXPECT_EQ(pool.threads(), 8u);
  release.set_value();
  for (int wait = 0; wait < 200 && pool.threads() > 0; ++wait) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(pool.threads(), 0u);
  // And come back when needed.
  std::promise<void> done;
  ASSERT_TRUE(pool.run([&] { done.set_value(); }, why)) << why;
  EXPECT_EQ(done.get_future().wait_for(5s), std::future_status::ready);
}

TEST(WorkerPool, StopWaitsForRunningTasks) {
  std::atomic<bool> finished{false};
  {
    WorkerPool pool(2, 10s);
    std::string why;
    ASSERT_TRUE(pool.run(
        [&] {
          std::this_thread::sleep_for(100ms);
          finished = true;
        },
        why));
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace space::http::detail
