// WarmPool: sandboxes-to-be kept running ahead of need (a hot pool), so that a create request
// pays for one agent call (the sandbox's identity) and its record, not for starting QEMU,
// loading the guest's state or the guest's first, untranslated answers.
//
// The pool holds guests of each kind (template, size) that creates asked for recently, as many
// as PoolSizer decides within the budget; a background thread refills it, one VM at a time, at
// low priority, and lets go of guests whose kind is no longer asked for. Each entry is a guest
// restored from its kind's template snapshot, with its agent connected, its own entropy and
// clock given at once, and a warm-up command run (so the guest code on the exec path is
// already translated under TCG). It already has its sandbox id (its run directory is named by
// it). Entries hold no record, and their capacity only as a claim the maker gives them
// (CapacityClaim): a daemon that dies leaves them to the next start's orphan sweep, and
// shutting the pool down kills them. An idle entry costs about 0.1%
// of a core under TCG (bench/RESULTS.md, idle CPU).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/result.h"
#include "sandbox/pool_sizer.h"
#include "sandbox/runtime.h"

namespace space::sandbox {

// The nice value the pool's refill, and the guests it starts, run at until taken.
inline constexpr int kRefillNice = 10;
// The reason a maker gives when the node has no capacity for one more waiting guest: the pool
// then looks again each second (capacity comes back when a sandbox goes), and says so once.
inline constexpr const char* kNoCapacityReason = "pool_no_capacity";
// The reason a maker gives when a sandbox took its guest's capacity back while it was made: a
// loss like that of a waiting guest (the kind cools down), not a full node.
inline constexpr const char* kGivenWayReason = "pool_given_way";

// What a waiting guest holds of the node's capacity (the maker's accounting: SandboxManager
// counts pooled guests against the node's vCPUs and memory, and takes that back for a sandbox
// that would not fit otherwise). A guest whose claim was taken back is dropped, never handed out.
class CapacityClaim {
 public:
  virtual ~CapacityClaim() = default;  // gives back what it still holds
  virtual bool held() const = 0;
};

struct WarmVm {
  std::string sandbox_id;  // the id the sandbox will have
  // Declared before the runtime, so it goes after it: the capacity is given back once the
  // guest's QEMU is gone. Null: the guest counts against nothing (tests).
  std::unique_ptr<CapacityClaim> claim;
  std::unique_ptr<SandboxRuntime> runtime;  // running, agent connected, warmed up
};

class WarmPool {
 public:
  using Maker = std::function<Result<WarmVm>(const PoolKey&)>;
  // Whether a waiting entry can still become a sandbox (its QEMU runs); tests give their own.
  using Alive = std::function<bool(const WarmVm&)>;
  // Starts the refill thread; `make` runs on it, one VM at a time. kResourceExhausted (reason
  // "insufficient_capacity") if the thread cannot be started.
  static Result<std::unique_ptr<WarmPool>> start(PoolSizerConfig sizing, Maker make, Alive alive = {});
  ~WarmPool();  // stops refilling; waiting VMs are killed and their files removed
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  // A waiting VM of this kind, or nothing (never waits); either way the create counts as demand
  // for the kind. Entries whose QEMU died while waiting are dropped, not returned. Taking does
  // not start a refill: used() does, once the taker knows it keeps the VM, so that requests
  // refused after a take (a node limit) cannot make the pool build and throw away guests
  // without end.
  std::optional<WarmVm> take(const PoolKey& key);
  // The VM taken is kept: refill its place.
  void used(const PoolKey& key);
  // Returns a VM taken but not used (e.g. the request was refused by a node limit).
  void put(const PoolKey& key, WarmVm vm);
  // Kills the waiting VMs whose capacity was taken back (or whose QEMU died) now, rather than
  // when a take() passes them: a reservation that took their capacity is about to use it.
  void prune();
  // Stops refilling and kills the waiting VMs; take() finds nothing and put() drops, from now on.
  void stop();
  size_t size();                      // waiting guests, all kinds
  size_t target();                    // what the pool is being filled to, all kinds
  std::map<PoolKey, size_t> sizes();  // waiting guests by kind

 private:
  WarmPool(PoolSizerConfig sizing, Maker make, Alive alive);
  struct Kind {
    std::deque<WarmVm> ready;
    size_t taken = 0;  // taken, and neither used() nor put() back yet
    size_t target = 0;
    Clock::time_point retry_after{};  // after a failed make: backing off
    std::chrono::milliseconds backoff{0};
    bool waiting_for_capacity = false;  // said once, until a guest is made again
    // After a guest of the kind gave its capacity to a sandbox: none is made before cool_until.
    Clock::time_point cool_until{};
    std::chrono::milliseconds cool_down{0};
    Clock::time_point last_loss{};
  };
  void refill();
  // Whether a waiting guest can still be handed out: its capacity is its own and its QEMU runs.
  bool usable(const WarmVm& vm) const { return (!vm.claim || vm.claim->held()) && alive_(vm); }
  // Under mu_: if `vm`'s capacity was taken back for a sandbox, a loss (coolDownLocked).
  void coolDownIfTakenBackLocked(const PoolKey& key, const WarmVm& vm);
  // Under mu_: a guest of `key` (waiting, or being made) gave its capacity to a sandbox. The
  // kind's next guest waits a cool-down, 1 s doubling with each loss up to kMaxCoolDown, until
  // a create takes one of its guests (used()); a loss long after the last starts at 1 s again.
  // On a node kept full by creates of other sizes the pool would otherwise restore guests only
  // to have them taken back, one after another (review helper-69). Losses while the kind cools
  // down (several guests of one reservation) count as one.
  void coolDownLocked(const PoolKey& key);
  // Under mu_: new targets from the sizer; guests over a kind's target move to `surplus`.
  void retarget(std::deque<WarmVm>& surplus);

  PoolSizer sizer_;
  Maker make_;
  Alive alive_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<PoolKey, Kind> kinds_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace space::sandbox
