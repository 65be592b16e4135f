// WarmPool: sandboxes-to-be kept running ahead of need (a hot pool), so that a create request
// pays for one agent call (the sandbox's identity) and its record, not for starting QEMU,
// loading the guest's state or the guest's first, untranslated answers.
//
// A background thread keeps the pool at its target size. Each entry is a guest restored from
// the template snapshot of the default size, with its agent connected, its own entropy and
// clock given at once, and a warm-up command run (so the guest code on the exec path is
// already translated under TCG). It already has its sandbox id (its run directory is named by
// it). Entries hold no reservation and no record: a daemon that dies leaves them to the next
// start's orphan sweep, and shutting the pool down kills them. An idle entry costs about 0.1%
// of a core under TCG (bench/RESULTS.md, idle CPU).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/result.h"
#include "sandbox/runtime.h"

namespace space::sandbox {

// The nice value the pool's refill, and the guests it starts, run at until taken.
inline constexpr int kRefillNice = 10;

struct WarmVm {
  std::string sandbox_id;                   // the id the sandbox will have
  std::unique_ptr<SandboxRuntime> runtime;  // running, agent connected, warmed up
};

class WarmPool {
 public:
  using Maker = std::function<Result<WarmVm>()>;
  // Starts the refill thread; `make` runs on it, one VM at a time. kResourceExhausted (reason
  // "insufficient_capacity") if the thread cannot be started.
  static Result<std::unique_ptr<WarmPool>> start(size_t target, Maker make);
  ~WarmPool();  // stops refilling; waiting VMs are killed and their files removed
  WarmPool(const WarmPool&) = delete;
  WarmPool& operator=(const WarmPool&) = delete;

  // A waiting VM, or nothing if the pool is empty (never waits). Entries whose QEMU died
  // while waiting are dropped, not returned. Taking does not start a refill: used() does, once
  // the taker knows it keeps the VM, so that requests refused after a take (a node limit)
  // cannot make the pool build and throw away guests without end.
  std::optional<WarmVm> take();
  // The VM taken is kept: refill its place.
  void used();
  // Returns a VM taken but not used (e.g. the request was refused by a node limit).
  void put(WarmVm vm);
  // Stops refilling and kills the waiting VMs; take() finds nothing and put() drops, from now on.
  void stop();
  size_t size();

 private:
  WarmPool(size_t target, Maker make) : target_(target), make_(std::move(make)) {}
  void refill();

  const size_t target_;
  Maker make_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<WarmVm> ready_;
  size_t taken_ = 0;  // taken, and neither used() nor put() back yet
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace space::sandbox
