#include "common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <utility>

namespace space {

namespace {

std::string fromEnv(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// "<name>@<n>": the name and n (`fallback` without "@").
std::pair<std::string, long> nameAndNumber(const char* variable, long fallback) {
  std::string name = fromEnv(variable);
  long n = fallback;
  if (auto at = name.find('@'); at != std::string::npos) {
    n = std::atol(name.c_str() + at + 1);
    name.resize(at);
  }
  return {name, n};
}

void say(std::string_view what, std::string_view name) {
  // write(2) only: a point may be reached on any thread, and this must not allocate or lock.
  (void)!write(STDERR_FILENO, what.data(), what.size());
  (void)!write(STDERR_FILENO, name.data(), name.size());
  (void)!write(STDERR_FILENO, "\n", 1);
}

}  // namespace

void faultPoint(std::string_view name) {
  static const auto delay = nameAndNumber("SPACE_FAULT_DELAY", 0);
  if (!delay.first.empty() && delay.first == name && delay.second > 0) {
    // Said before the sleep: a test waits for this line to know the step is under way.
    say("spaced: fault point reached, delaying: ", name);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay.second));
  }
  static const auto throws = nameAndNumber("SPACE_FAULT_THROW", 1);
  static std::atomic<long> thrown{0};
  if (!throws.first.empty() && throws.first == name && ++thrown == throws.second) {
    say("spaced: fault point reached, throwing std::bad_alloc: ", name);
    throw std::bad_alloc();
  }
  static const std::string armed = fromEnv("SPACE_FAULT");
  if (armed.empty() || armed != name) return;
  say("spaced: fault point reached, killing myself: ", name);
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

bool faultFails(std::string_view name) {
  static const auto armed = nameAndNumber("SPACE_FAULT_FAIL", 1);
  static std::atomic<long> reached{0};
  if (armed.first.empty() || armed.first != name) return false;
  return ++reached == armed.second;
}

}  // namespace space
