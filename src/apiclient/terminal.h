// The client side of a terminal session (GET /v1/sandboxes/{id}/pty, docs/api.md): a WebSocket
// that carries keystrokes and window sizes one way and the terminal's output the other, until
// the guest process exits. spacectl shell runs it on the user's terminal; tests run it on pipes.
//
// The daemon is trusted for its shape only, as in api_client.h: control messages are parsed
// within bounds and a frame is at most kMaxTerminalFrame bytes.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apiclient/api_client.h"
#include "common/result.h"

namespace space::apiclient {

inline constexpr size_t kMaxTerminalFrame = size_t{4} << 20;

struct TerminalOptions {
  int cols = 80;
  int rows = 24;
  std::string term = "xterm-256color";  // the guest's TERM
  std::string user;                     // "": the sandbox's default user
  std::string cwd;                      // "": the user's home
  // What runs: a shell command line, or an argv; neither: an interactive login shell.
  std::string command;
  std::vector<std::string> argv;
};

struct TerminalIo {
  // Keystrokes. At its end nothing more is sent; the session lasts until the process ends.
  int input_fd = -1;
  std::function<void(std::string_view)> on_output;
  // Readable when the window may have changed (a self-pipe a SIGWINCH handler writes to); its
  // bytes are drained and window_size() is asked. -1: the size never changes.
  int resize_fd = -1;
  std::function<std::optional<std::pair<int, int>>()> window_size;  // (cols, rows)
  std::function<void(int pid)> on_started;
};

struct TerminalEnd {
  int exit_code = -1;  // -1: ended by a signal
  std::string status;  // "exit status 0", "signal: killed"
};

// Opens the session and runs it to its end: the process's exit, or an error (the API's, before
// the upgrade: unknown sandbox, bad key; or the session's: lost connection, too slow a reader).
// input_fd is used non-blocking while the session runs and gets its flags back afterwards.
Result<TerminalEnd> runTerminal(const Client& client, const std::string& sandbox_id, const TerminalOptions& options,
                                const TerminalIo& io);

}  // namespace space::apiclient
