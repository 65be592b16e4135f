// spacectl's own signals. The HTTP client retries reads interrupted by a signal, so a handler
// that only sets a flag would go unnoticed until the daemon answers (a silent command: never).
// Instead SIGINT, SIGTERM and SIGHUP are blocked in every thread and taken by a thread of their
// own, which runs the current command's reaction (OnSignal): delete the sandbox of `run --rm`,
// signal the remote process, remove a partial download. Without one, spacectl exits as the
// signal would have made it.
#pragma once

#include <functional>

namespace space::spacectl {

// Blocks the signals in this thread (and so in every thread started after it), ignores SIGPIPE,
// and starts the signal thread. Call once, before any other thread starts.
void startSignalThread();

// The last signal the signal thread took; 0 if none.
int interruptedBy();

// The reaction to signals while this object lives; runs on the signal thread. Leaving the scope
// waits for a reaction in progress, so it never uses a frame that is gone.
class OnSignal {
 public:
  explicit OnSignal(std::function<void(int)> reaction);
  ~OnSignal();
  OnSignal(const OnSignal&) = delete;
  OnSignal& operator=(const OnSignal&) = delete;
};

}  // namespace space::spacectl
