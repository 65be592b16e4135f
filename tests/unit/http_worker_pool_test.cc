#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

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
    done.get_future().wait();
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
  ASSERT_TRUE(pool.run([&] { ++started, released.wait(); }, why));
  ASSERT_TRUE(pool.run([&] { ++started, released.wait(); }, why));
  EXPECT_FALSE(pool.run([] {}, why));
  EXPECT_NE(why.find("running 2 requests"), std::string::npos) << why;
  release.set_value();
  pool.stop();
  EXPECT_EQ(started.load(), 2);
  EXPECT_FALSE(pool.run([] {}, why));
  EXPECT_NE(why.find("stopping"), std::string::npos) << why;
}

TEST(WorkerPool, IdleThreadsExit) {
  WorkerPool pool(8, 50ms);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::string why;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(pool.run([&] { released.wait(); }, why)) << why;
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
