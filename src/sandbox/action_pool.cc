#include "sandbox/action_pool.h"

#include <cassert>
#include <cerrno>
#include <system_error>

#include "common/fault.h"

namespace space::sandbox {

Result<std::thread> startThread(const std::string& what, std::function<void()> body) {
  try {
    // SPACE_FAULT_FAIL=<what>: the failure a test cannot otherwise cause on demand.
    if (faultFails(what)) throw std::system_error(EAGAIN, std::generic_category(), "injected (SPACE_FAULT_FAIL)");
    return std::thread(std::move(body));
  } catch (const std::system_error& e) {
    return makeError(ErrorCode::kResourceExhausted, "cannot start a thread (" + what + "): " + e.what(),
                     "insufficient_capacity");
  }
}

Result<std::unique_ptr<ActionPool>> ActionPool::start(Limits limits) {
  assert(limits.workers >= 2 && limits.max_slow_per_tenant >= 1);
  std::unique_ptr<ActionPool> pool(new ActionPool(limits));
  for (size_t i = 0; i < limits.workers; ++i) {
    auto thread = startThread("housekeeping.worker", [p = pool.get()] { p->work(); });
    if (!thread.ok()) return thread.error();  // ~ActionPool stops the ones started
    pool->threads_.push_back(std::move(thread.value()));
  }
  return pool;
}

ActionPool::~ActionPool() { stop(); }

void ActionPool::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (const auto& action : queue_) busy_.erase(action.sandbox_id);
    queue_.clear();
  }
  changed_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool ActionPool::submit(Action action) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || !busy_.insert(action.sandbox_id).second) return false;
    queue_.push_back(std::move(action));
  }
  changed_.notify_all();
  return true;
}

bool ActionPool::busy(const std::string& sandbox_id) {
  std::lock_guard lock(mu_);
  return busy_.count(sandbox_id) > 0;
}

std::deque<ActionPool::Action>::iterator ActionPool::next() {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->kind == Kind::kQuick) return it;
  }
  if (slow_running_ + 1 >= limits_.workers) return queue_.end();  // the last worker stays free
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    auto running = slow_by_tenant_.find(it->tenant);
    if (running == slow_by_tenant_.end() || running->second < limits_.max_slow_per_tenant) return it;
  }
  return queue_.end();
}

void ActionPool::work() {
  std::unique_lock lock(mu_);
  while (true) {
    std::deque<Action>::iterator it;
    changed_.wait(lock, [&] { return stopping_ || (it = next()) != queue_.end(); });
    if (stopping_) return;
    Action action = std::move(*it);
    queue_.erase(it);
    const bool slow = action.kind == Kind::kSlow;
    if (slow) {
      ++slow_running_;
      ++slow_by_tenant_[action.tenant];
    }
    lock.unlock();
    action.run();
    action.run = nullptr;  // what it holds (a sandbox) is let go before the sandbox is free again
    lock.lock();
    if (slow) {
      --slow_running_;
      if (--slow_by_tenant_[action.tenant] == 0) slow_by_tenant_.erase(action.tenant);
    }
    busy_.erase(action.sandbox_id);
    changed_.notify_all();
  }
}

}  // namespace space::sandbox
