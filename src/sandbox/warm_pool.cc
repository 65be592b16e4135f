#include "sandbox/warm_pool.h"

#include <spdlog/spdlog.h>

#include "common/process.h"
#include "sandbox/action_pool.h"

namespace space::sandbox {

namespace {
// Demand fades within the sizer's window; the refill thread looks again this often even when
// nothing happens, so an unused kind's guests are let go.
constexpr std::chrono::seconds kRetargetEvery{5};
// The longest a kind waits after losing guests to sandboxes: a restore under TCG costs up to
// half a second of a core at nice 10, so a kind that loses every guest costs a few percent.
constexpr std::chrono::milliseconds kMaxCoolDown{15000};
}  // namespace

WarmPool::WarmPool(PoolSizerConfig sizing, Maker make, Alive alive)
    : sizer_(std::move(sizing)), make_(std::move(make)), alive_(std::move(alive)) {
  if (!alive_) alive_ = [](const WarmVm& vm) { return vm.runtime && vm.runtime->vm().processRunning(); };
}

Result<std::unique_ptr<WarmPool>> WarmPool::start(PoolSizerConfig sizing, Maker make, Alive alive) {
  std::unique_ptr<WarmPool> pool(new WarmPool(std::move(sizing), std::move(make), std::move(alive)));
  auto thread = startThread("warm_pool.refill", [p = pool.get()] { p->refill(); });
  if (!thread.ok()) return thread.error();
  pool->thread_ = std::move(thread.value());
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
  std::map<PoolKey, Kind> dropped;
  {
    std::lock_guard lock(mu_);
    dropped.swap(kinds_);
  }
  dropped.clear();  // each runtime kills its QEMU and removes its run directory
}

void WarmPool::used(const PoolKey& key) {
  std::lock_guard lock(mu_);
  auto it = kinds_.find(key);
  if (it != kinds_.end()) {
    if (it->second.taken > 0) --it->second.taken;
    // A create took one (however the create then ended): the kind's guests serve.
    it->second.cool_down = std::chrono::milliseconds(0);
    it->second.cool_until = {};
  }
  changed_.notify_all();
}

void WarmPool::coolDownIfTakenBackLocked(const PoolKey& key, const WarmVm& vm) {
  if (vm.claim && !vm.claim->held()) coolDownLocked(key);
}

void WarmPool::coolDownLocked(const PoolKey& key) {
  Kind& kind = kinds_[key];
  const auto now = Clock::now();
  if (now < kind.cool_until) return;  // one loss: what a single reservation took
  // Churn is losses in a row: one long after the last (twice its cool-down, and a minute) is a
  // first one again.
  if (now - kind.last_loss > std::max<Clock::duration>(2 * kind.cool_down, std::chrono::minutes(1))) {
    kind.cool_down = std::chrono::milliseconds(0);
  }
  kind.last_loss = now;
  kind.cool_down =
      std::min<std::chrono::milliseconds>(std::max(kind.cool_down * 2, std::chrono::milliseconds(1000)), kMaxCoolDown);
  kind.cool_until = now + kind.cool_down;
  spdlog::info("warm pool: a VM of {} gave its capacity to a sandbox; the next one in {} s", key.describe(),
               kind.cool_down.count() / 1000);
}

std::optional<WarmVm> WarmPool::take(const PoolKey& key) {
  std::deque<WarmVm> gone;  // destroyed after the lock is released: a claim's end takes the maker's lock
  std::lock_guard lock(mu_);
  if (stopping_) return std::nullopt;
  sizer_.recordCreate(key, Clock::now());
  changed_.notify_all();  // demand changed: the refill thread retargets
  auto it = kinds_.find(key);
  if (it == kinds_.end()) return std::nullopt;
  Kind& kind = it->second;
  while (!kind.ready.empty()) {
    WarmVm vm = std::move(kind.ready.front());
    kind.ready.pop_front();
    if (usable(vm)) {
      ++kind.taken;  // its place is refilled only once the taker says it keeps it (used())
      return vm;
    }
    coolDownIfTakenBackLocked(key, vm);
    if (!vm.claim || vm.claim->held()) spdlog::warn("warm pool: VM {} died while waiting; dropped", vm.sandbox_id);
    gone.push_back(std::move(vm));
  }
  return std::nullopt;
}

void WarmPool::prune() {
  std::deque<WarmVm> gone;
  {
    std::lock_guard lock(mu_);
    for (auto& [key, kind] : kinds_) {
      for (auto it = kind.ready.begin(); it != kind.ready.end();) {
        if (usable(*it)) {
          ++it;
        } else {
          coolDownIfTakenBackLocked(key, *it);
          gone.push_back(std::move(*it));
          it = kind.ready.erase(it);
        }
      }
    }
  }
  changed_.notify_all();  // the refill sees the room (and takes it when the maker's capacity allows)
  gone.clear();           // their QEMUs are killed outside the lock
}

void WarmPool::put(const PoolKey& key, WarmVm vm) {
  std::unique_lock lock(mu_);
  auto it = kinds_.find(key);
  if (it == kinds_.end()) return;  // dropped: its runtime cleans up
  Kind& kind = it->second;
  if (kind.taken > 0) --kind.taken;
  if (stopping_ || kind.ready.size() >= kind.target || !usable(vm)) {
    coolDownIfTakenBackLocked(key, vm);
    lock.unlock();
    return;  // dropped: its runtime cleans up, outside the lock
  }
  kind.ready.push_front(std::move(vm));
}

size_t WarmPool::size() {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, kind] : kinds_) n += kind.ready.size();
  return n;
}

size_t WarmPool::target() {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, kind] : kinds_) n += kind.target;
  return n;
}

std::map<PoolKey, size_t> WarmPool::sizes() {
  std::lock_guard lock(mu_);
  std::map<PoolKey, size_t> out;
  for (const auto& [key, kind] : kinds_) {
    if (!kind.ready.empty()) out[key] = kind.ready.size();
  }
  return out;
}

void WarmPool::retarget(std::deque<WarmVm>& surplus) {
  auto targets = sizer_.targets(Clock::now());
  for (auto& [key, target] : targets) kinds_[key];  // new kinds in demand
  for (auto it = kinds_.begin(); it != kinds_.end();) {
    Kind& kind = it->second;
    auto found = targets.find(it->first);
    size_t target = found == targets.end() ? 0 : found->second;
    if (target != kind.target) {
      spdlog::info("warm pool: {} guest(s) of {} (was {})", target, it->first.describe(), kind.target);
      kind.target = target;
    }
    // The oldest waiting guests go first: they have waited longest for a create.
    while (kind.ready.size() > target) {
      surplus.push_back(std::move(kind.ready.front()));
      kind.ready.pop_front();
    }
    if (target == 0 && kind.ready.empty() && kind.taken == 0) {
      it = kinds_.erase(it);
    } else {
      ++it;
    }
  }
}

void WarmPool::refill() {
  // Refilling is background work: it runs, and the QEMUs it starts run, below the sandboxes in
  // use (their nice stays 0), so a refill never slows a running sandbox. A taker gives its guest
  // normal priority again (SandboxRuntime::setHostNice).
  if (auto lowered = setThreadNice(kRefillNice); !lowered.ok()) {
    spdlog::warn("warm pool: refill runs at normal priority: {}", lowered.error().message);
  }
  std::unique_lock lock(mu_);
  while (!stopping_) {
    std::deque<WarmVm> surplus;
    retarget(surplus);
    if (!surplus.empty()) {
      lock.unlock();
      surplus.clear();  // their QEMUs are killed outside the lock
      lock.lock();
      continue;
    }
    // The kind furthest below its target, among those not backing off after a failure.
    auto now = Clock::now();
    const PoolKey* next = nullptr;
    size_t largest = 0;
    Clock::time_point soonest_retry = now + kRetargetEvery;
    for (auto& [key, kind] : kinds_) {
      size_t have = kind.ready.size() + kind.taken;
      if (have >= kind.target) continue;
      if (const auto after = std::max(kind.retry_after, kind.cool_until); after > now) {
        soonest_retry = std::min(soonest_retry, after);
        continue;
      }
      if (kind.target - have > largest) {
        largest = kind.target - have;
        next = &key;
      }
    }
    if (!next) {
      changed_.wait_until(lock, soonest_retry);
      continue;
    }
    PoolKey key = *next;
    lock.unlock();
    auto started = Clock::now();
    auto made = make_(key);
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    lock.lock();
    if (stopping_) {
      lock.unlock();  // `made` goes with the scope, outside the lock
      return;
    }
    Kind& kind = kinds_[key];
    if (made.ok()) {
      sizer_.recordRefill(key, took);
      kind.waiting_for_capacity = false;
      kind.backoff = std::chrono::milliseconds(0);
      kind.retry_after = {};
      // Full meanwhile (a taker put its VM back, or demand fell): never kept over the target.
      // Checked under the lock that prune() takes: a guest whose claim was taken back after
      // its maker looked is never left waiting, uncounted.
      if (kind.ready.size() + kind.taken < kind.target && usable(made.value())) {
        kind.ready.push_back(std::move(made.value()));
      } else {
        coolDownIfTakenBackLocked(key, made.value());
        lock.unlock();
        made = makeError(ErrorCode::kCanceled, "");  // the VM goes here, outside the lock
        lock.lock();
      }
    } else if (made.error().reason == kGivenWayReason) {
      coolDownLocked(key);  // taken back while it was made: a loss like a waiting guest's
    } else if (made.error().reason == kNoCapacityReason) {
      // The node's sandboxes hold its capacity: not a fault, and over as soon as one goes.
      kind.backoff = std::chrono::milliseconds(0);
      kind.retry_after = Clock::now() + std::chrono::seconds(1);
      if (!kind.waiting_for_capacity) {
        kind.waiting_for_capacity = true;
        spdlog::info("warm pool: no room for a waiting VM of {} until capacity frees: {}", key.describe(),
                     made.error().message);
      }
    } else {
      // E.g. the template cannot be built: said once per attempt, retried less and less often.
      kind.backoff = std::min<std::chrono::milliseconds>(std::max(kind.backoff * 2, std::chrono::milliseconds(1000)),
                                                         std::chrono::milliseconds(60000));
      kind.retry_after = Clock::now() + kind.backoff;
      spdlog::warn("warm pool: cannot start a waiting VM of {} (retry in {} s): {}", key.describe(),
                   kind.backoff.count() / 1000, made.error().message.substr(0, made.error().message.find('\n')));
    }
  }
}

}  // namespace space::sandbox
