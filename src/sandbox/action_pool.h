// ActionPool: the few threads that carry out what the sandbox manager's housekeeping decided is
// due (end a sandbox whose timeout passed or whose VM died, suspend an idle one), so that the
// housekeeping thread only decides: its rounds over every sandbox never wait for one action,
// and a suspend that takes minutes (the guest's RAM goes to disk) delays nobody else's checks.
//
// Rules, so that one tenant's slow actions cannot hold up another tenant's:
//  - at most one action per sandbox is queued or running (the next round asks again if it is
//    still due then);
//  - quick actions (ending a sandbox: a kill and a record) are taken before slow ones, and slow
//    ones never occupy the last worker, so a timeout or a dead VM is dealt with at once even
//    while every other worker suspends;
//  - one tenant's slow actions occupy at most `max_slow_per_tenant` workers at a time.
// Actions are queued in the order given; within those rules the oldest runs first.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"

namespace space::sandbox {

class ActionPool {
 public:
  enum class Kind { kQuick, kSlow };
  struct Action {
    std::string sandbox_id;
    std::string tenant;
    Kind kind = Kind::kQuick;
    std::function<void()> run;
  };
  struct Limits {
    size_t workers = 4;  // at least 2: slow actions never take the last one
    size_t max_slow_per_tenant = 2;
  };

  // kResourceExhausted (reason "insufficient_capacity") if a thread cannot be started; the
  // ones that were are stopped again.
  static Result<std::unique_ptr<ActionPool>> start(Limits limits);
  ~ActionPool();  // stop()
  ActionPool(const ActionPool&) = delete;
  ActionPool& operator=(const ActionPool&) = delete;

  // False if the sandbox has an action queued or running, or the pool is stopping: `action`
  // is dropped.
  bool submit(Action action);
  // Whether the sandbox has an action queued or running.
  bool busy(const std::string& sandbox_id);
  // Drops what is queued, waits for what runs, and stops the threads. Idempotent.
  void stop();

 private:
  explicit ActionPool(Limits limits) : limits_(limits) {}
  void work();
  // The next action a free worker may take under the rules, or queue_.end().
  std::deque<Action>::iterator next();

  const Limits limits_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Action> queue_;
  std::set<std::string> busy_;  // queued or running
  size_t slow_running_ = 0;
  std::map<std::string, size_t> slow_by_tenant_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// std::thread, with the failure to create one (std::system_error: the process or the host is out
// of threads) as kResourceExhausted, reason "insufficient_capacity" (503), naming `what`.
Result<std::thread> startThread(const std::string& what, std::function<void()> body);

}  // namespace space::sandbox
