#include "sandbox/warm_pool.h"

#include <spdlog/spdlog.h>

#include "common/process.h"
#include "sandbox/action_pool.h"

namespace space::sandbox {

Result<std::unique_ptr<WarmPool>> WarmPool::start(size_t target, Maker make) {
  std::unique_ptr<WarmPool> pool(new WarmPool(target, std::move(make)));
  if (target > 0) {
    auto thread = startThread("warm_pool.refill", [p = pool.get()] { p->refill(); });
    if (!thread.ok()) return thread.error();
    pool->thread_ = std::move(thread.value());
  }
  return pool;
}

WarmPool::~WarmPool() { stop(); }

void WarmPool::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<WarmVm> dropped;
  {
    std::lock_guard lock(mu_);
    dropped.swap(ready_);
  }
  dropped.clear();  // each runtime kills its QEMU and removes its run directory
}

void WarmPool::used() {
  std::lock_guard lock(mu_);
  if (taken_ > 0) --taken_;
  changed_.notify_all();
}

std::optional<WarmVm> WarmPool::take() {
  std::lock_guard lock(mu_);
  while (!ready_.empty()) {
    WarmVm vm = std::move(ready_.front());
    ready_.pop_front();
    if (vm.runtime && vm.runtime->vm().processRunning()) {
      ++taken_;  // its place is refilled only once the taker says it keeps it (used())
      return vm;
    }
    spdlog::warn("warm pool: VM {} died while waiting; dropped", vm.sandbox_id);
    changed_.notify_all();  // its place is free: refill it
  }
  return std::nullopt;
}

void WarmPool::put(WarmVm vm) {
  std::unique_lock lock(mu_);
  if (taken_ > 0) --taken_;
  if (stopping_ || ready_.size() >= target_) {
    lock.unlock();
    return;  // dropped: its runtime cleans up, outside the lock
  }
  ready_.push_front(std::move(vm));
}

size_t WarmPool::size() {
  std::lock_guard lock(mu_);
  return ready_.size();
}

void WarmPool::refill() {
  // Refilling is background work: it runs, and the QEMUs it starts run, below the sandboxes in
  // use (their nice stays 0), so a refill never slows a running sandbox. A taker gives its guest
  // normal priority again (SandboxRuntime::setHostNice).
  if (auto lowered = setThreadNice(kRefillNice); !lowered.ok()) {
    spdlog::warn("warm pool: refill runs at normal priority: {}", lowered.error().message);
  }
  std::chrono::milliseconds backoff{0};
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (backoff.count() > 0 && changed_.wait_for(lock, backoff, [this] { return stopping_; })) return;
    changed_.wait(lock, [this] { return stopping_ || ready_.size() + taken_ < target_; });
    if (stopping_) return;
    lock.unlock();
    auto made = make_();
    lock.lock();
    if (made.ok()) {
      backoff = std::chrono::milliseconds(0);
      // Full meanwhile (a taker put its VM back): the new one is dropped, never kept over size.
      if (!stopping_ && ready_.size() + taken_ < target_) {
        ready_.push_back(std::move(made.value()));
      } else {
        lock.unlock();
        made = makeError(ErrorCode::kCanceled, "");  // the VM goes here, outside the lock
        lock.lock();
      }
    } else {
      // E.g. the template cannot be built: said once per attempt, retried less and less often.
      backoff = std::min<std::chrono::milliseconds>(std::max(backoff * 2, std::chrono::milliseconds(1000)),
                                                    std::chrono::milliseconds(60000));
      spdlog::warn("warm pool: cannot start a waiting VM (retry in {} s): {}", backoff.count() / 1000,
                   made.error().message.substr(0, made.error().message.find('\n')));
    }
  }
}

}  // namespace space::sandbox
