#include "common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace space {

namespace {

std::string fromEnv(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

void faultPoint(std::string_view name) {
  static const std::string armed = fromEnv("SPACE_FAULT");
  if (armed.empty() || armed != name) return;
  static constexpr char kMessage[] = "spaced: fault point reached, killing myself: ";
  (void)!write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)!write(STDERR_FILENO, name.data(), name.size());
  (void)!write(STDERR_FILENO, "\n", 1);
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

bool faultFails(std::string_view name) {
  struct Armed {
    std::string name;
    long nth = 1;
  };
  static const Armed armed = [] {
    Armed a{fromEnv("SPACE_FAULT_FAIL")};
    if (auto at = a.name.find('@'); at != std::string::npos) {
      a.nth = std::atol(a.name.c_str() + at + 1);
      a.name.resize(at);
    }
    return a;
  }();
  static std::atomic<long> reached{0};
  if (armed.name.empty() || armed.name != name) return false;
  return ++reached == armed.nth;
}

}  // namespace space
