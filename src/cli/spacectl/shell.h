// spacectl shell: the local terminal attached to a process on a terminal in the sandbox, like
// `docker exec -it` (GET /v1/sandboxes/{id}/pty). Same conventions as sandboxes.h.
#pragma once

#include <string>
#include <vector>

#include "apiclient/api_client.h"

namespace space::spacectl {

struct ShellOptions {
  std::string user;
  std::string cwd;
  // None: an interactive login shell; one: a shell command line; several: an argv.
  std::vector<std::string> command;
};

// The remote process's exit code (128+N if signal N ended it), or kExitFailure. The local
// terminal is in raw mode while the session runs and is restored on every way out.
int cmdShell(const apiclient::Client& api, const std::string& id, const ShellOptions& o);

}  // namespace space::spacectl
