// The sandbox state machine: the one place that says which lifecycle transitions are legal.
// Every change of a sandbox's state goes through checkTransition, so an illegal request is
// refused the same way (kFailedPrecondition, reason "invalid_state", naming the current state)
// wherever it comes from.
//
//   creating -> running | failed | deleted
//   running  -> paused | suspended | failed | deleted
//   paused   -> running | suspended | failed | deleted
//   suspended -> running | failed | deleted
//   failed   -> deleted
//   deleted  (final)
#pragma once

#include <string>
#include <string_view>

#include "common/result.h"

namespace space::sandbox {

enum class SandboxState { kCreating, kRunning, kPaused, kSuspended, kDeleted, kFailed };

const char* stateName(SandboxState state);
Result<SandboxState> parseState(std::string_view name);

bool transitionAllowed(SandboxState from, SandboxState to);
// `operation` names the request in the message, e.g. "pause": "sandbox is deleted; cannot pause".
Status checkTransition(SandboxState from, SandboxState to, std::string_view operation);
// For operations that need the sandbox in one state without changing it (exec, files).
Status requireState(SandboxState current, SandboxState needed, std::string_view operation);

// True for states that hold host resources (a VM or its reservation).
bool holdsResources(SandboxState state);

}  // namespace space::sandbox
