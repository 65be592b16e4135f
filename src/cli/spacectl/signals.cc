#include "cli/spacectl/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <utility>

namespace space::spacectl {

namespace {

// Process-wide because signals are: one signal thread, one reaction at a time.
std::mutex g_signal_mutex;
std::function<void(int)> g_on_signal;  // guarded by g_signal_mutex
std::atomic<int> g_interrupted{0};     // the last signal taken, 0 if none

}  // namespace

void startSignalThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A reader that went away (spacectl exec ... | head) must not kill us before `run --rm` cleans up.
  signal(SIGPIPE, SIG_IGN);
  std::thread([set] {
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      g_interrupted = sig;
      std::lock_guard lock(g_signal_mutex);
      if (!g_on_signal) _exit(128 + sig);
      g_on_signal(sig);
    }
  }).detach();
}

int interruptedBy() { return g_interrupted; }

OnSignal::OnSignal(std::function<void(int)> reaction) {
  std::lock_guard lock(g_signal_mutex);
  g_on_signal = std::move(reaction);
}

OnSignal::~OnSignal() {
  std::lock_guard lock(g_signal_mutex);
  g_on_signal = nullptr;
}

}  // namespace space::spacectl
