#include "sandbox/lifecycle.h"

#include <array>

namespace space::sandbox {

namespace {

constexpr std::array<SandboxState, 6> kAll = {SandboxState::kCreating,  SandboxState::kRunning, SandboxState::kPaused,
                                              SandboxState::kSuspended, SandboxState::kDeleted, SandboxState::kFailed};

}  // namespace

const char* stateName(SandboxState state) {
  switch (state) {
    case SandboxState::kCreating: return "creating";
    case SandboxState::kRunning: return "running";
    case SandboxState::kPaused: return "paused";
    case SandboxState::kSuspended: return "suspended";
    case SandboxState::kDeleted: return "deleted";
    case SandboxState::kFailed: return "failed";
  }
  return "unknown";
}

Result<SandboxState> parseState(std::string_view name) {
  for (SandboxState s : kAll) {
    if (name == stateName(s)) return s;
  }
  return makeError(
      ErrorCode::kInvalidArgument,
      "unknown state \"" + std::string(name) + "\" (one of: creating, running, paused, suspended, deleted, failed)");
}

bool transitionAllowed(SandboxState from, SandboxState to) {
  using S = SandboxState;
  switch (from) {
    case S::kCreating: return to == S::kRunning || to == S::kFailed || to == S::kDeleted;
    case S::kRunning: return to == S::kPaused || to == S::kSuspended || to == S::kFailed || to == S::kDeleted;
    case S::kPaused: return to == S::kRunning || to == S::kSuspended || to == S::kFailed || to == S::kDeleted;
    case S::kSuspended: return to == S::kRunning || to == S::kFailed || to == S::kDeleted;
    case S::kFailed: return to == S::kDeleted;
    case S::kDeleted: return false;
  }
  return false;
}

Status checkTransition(SandboxState from, SandboxState to, std::string_view operation) {
  if (transitionAllowed(from, to)) return okStatus();
  return makeError(ErrorCode::kFailedPrecondition,
                   std::string("sandbox is ") + stateName(from) + "; cannot " + std::string(operation),
                   "invalid_state");
}

Status requireState(SandboxState current, SandboxState needed, std::string_view operation) {
  if (current == needed) return okStatus();
  return makeError(ErrorCode::kFailedPrecondition,
                   std::string("sandbox is ") + stateName(current) + "; cannot " + std::string(operation) + " (needs " +
                       stateName(needed) + ")",
                   "invalid_state");
}

bool holdsResources(SandboxState state) {
  return state == SandboxState::kCreating || state == SandboxState::kRunning || state == SandboxState::kPaused;
}

}  // namespace space::sandbox
