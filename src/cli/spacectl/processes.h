// Process commands: exec and run (the command's output streamed as it runs, Ctrl-C passed on,
// the remote exit code spacectl's own), ps and kill. Same conventions as sandboxes.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apiclient/api_client.h"
#include "cli/spacectl/sandboxes.h"

namespace space::spacectl {

struct ExecOptions {
  std::string user;
  std::string cwd;
  std::vector<std::string> env;
  int64_t timeout_s = -1;  // -1: the daemon's default
  bool send_stdin = false;
  bool tty = false;  // on a terminal: spacectl shell's session (cmdShell) instead
  std::vector<std::string> command;
};

// The remote command's exit code (128+N if signal N ended it), or kExitFailure.
int cmdExec(const apiclient::Client& api, const std::string& id, const ExecOptions& o, bool as_json);

// Creates a sandbox and execs in it; with `remove`, deletes it afterwards, Ctrl-C included.
int cmdRun(const apiclient::Client& api, const CreateOptions& create, const ExecOptions& exec, bool remove,
           bool as_json);

// The remote command's exit code as a shell would give it (an API exit_code and status): 128+N
// for signal N, 1 if the signal is not recognisable.
int exitCodeOf(const nlohmann::json& exit_code, const nlohmann::json& status);

int cmdProcesses(const apiclient::Client& api, const std::string& id, bool as_json);

// `signal`: SIGTERM, TERM, term or 15 alike.
int cmdKill(const apiclient::Client& api, const std::string& id, int pid, std::string signal, bool as_json);

}  // namespace space::spacectl
