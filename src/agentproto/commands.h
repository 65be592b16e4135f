// Typed helpers over AgentClient for the process.Process service: build the envd-shaped
// requests, decode the event stream. runCommand is the "exec and wait" most callers want.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agentproto/agent_client.h"

namespace space::agentproto {

struct CommandSpec {
  // Either a shell command line (run as `/bin/bash -l -c <command>`) or an argv.
  std::string command;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;                                              // "" = the user's home
  std::string user;                                             // "" = the sandbox default user
  std::optional<std::string> stdin_data;                        // sent, then stdin closed; nullopt = no stdin
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // kills the process at expiry
  std::string tag;
  // A terminal of this size (cols, rows) in place of pipes: output comes as "pty" data, input
  // goes in as SendInput's "pty", and stdin_data must be nullopt.
  std::optional<std::pair<int, int>> pty;
};

// The envd Start request for a spec.
Json startRequest(const CommandSpec& spec);

struct ProcessEnd {
  int exit_code = 0;   // -1 when killed by a signal
  bool exited = true;  // false: ended by a signal
  std::string status;  // "exit status 3", "signal: killed"
};

// One decoded process event.
struct ProcessEvent {
  enum class Kind { kStart, kStdout, kStderr, kPty, kEnd, kKeepalive, kUnknown } kind = Kind::kUnknown;
  int pid = 0;
  std::string data;  // decoded bytes for stdout/stderr/pty
  ProcessEnd end;
};
Result<ProcessEvent> decodeProcessEvent(const Json& message);

struct CommandResult {
  int pid = 0;
  int exit_code = 0;
  bool exited = true;
  std::string status;
  std::string stdout_data;
  std::string stderr_data;
  std::chrono::milliseconds duration{0};
};

// Starts the command, feeds stdin (if any), collects output until the process ends.
// `max_output` bounds stdout + stderr kept in memory. `abandon`, if set, is asked about once a
// second; when it says true the wait ends with kCanceled (the process keeps running).
Result<CommandResult> runCommand(AgentClient& agent, const CommandSpec& spec, size_t max_output = 64 << 20,
                                 const std::function<bool()>& abandon = {});

}  // namespace space::agentproto
