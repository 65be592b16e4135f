#include "common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace space {

void faultPoint(std::string_view name) {
  static const std::string armed = [] {
    const char* v = std::getenv("SPACE_FAULT");
    return std::string(v ? v : "");
  }();
  if (armed.empty() || armed != name) return;
  static constexpr char kMessage[] = "spaced: fault point reached, killing myself: ";
  (void)!write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)!write(STDERR_FILENO, name.data(), name.size());
  (void)!write(STDERR_FILENO, "\n", 1);
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

}  // namespace space
