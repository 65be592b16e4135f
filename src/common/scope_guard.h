// An undo step that runs on every way out of a scope unless the work it guards completed.
//
// Error paths that each call their own undo miss the exits nobody wrote: an exception
// (std::bad_alloc, std::system_error from a thread that cannot start) leaves the scope without
// passing them. A guard covers those too. Written here because neither GCC 12's library
// (std::experimental::scope_fail) nor Debian 12's Boost 1.74 (boost/scope, from 1.85) has one.
#pragma once

#include <utility>

namespace space {

template <typename Undo>
class ScopeGuard {
 public:
  explicit ScopeGuard(Undo undo) : undo_(std::move(undo)) {}
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ~ScopeGuard() {
    if (!armed_) return;
    // A destructor that throws while an exception unwinds ends the process: the undo is best
    // effort, and what it could not undo is what recovery finds after a restart.
    try {
      undo_();
    } catch (...) {
    }
  }

  // The work completed: nothing to undo.
  void dismiss() { armed_ = false; }

 private:
  Undo undo_;
  bool armed_ = true;
};

}  // namespace space
