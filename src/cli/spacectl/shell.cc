#include "cli/spacectl/shell.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string_view>
#include <utility>

#include "apiclient/terminal.h"
#include "cli/spacectl/output.h"
#include "cli/spacectl/processes.h"
#include "cli/spacectl/signals.h"

namespace space::spacectl {

namespace {

// The terminal's settings before raw mode; restored by the guard, and by the signal thread
// before spacectl exits on SIGTERM or SIGHUP.
struct termios g_saved;
bool g_raw = false;
// stdin's file status flags before the session: the session's loop makes the open file (shared
// with the shell that started us) non-blocking, which later programs must not inherit.
int g_stdin_flags = -1;
// SIGWINCH's handler writes a byte here (a self-pipe: the only async-signal-safe way to wake
// the session's loop).
int g_winch_pipe = -1;

void restoreTerminal() {
  if (g_raw) (void)::tcsetattr(STDIN_FILENO, TCSADRAIN, &g_saved);
  if (g_stdin_flags >= 0) (void)::fcntl(STDIN_FILENO, F_SETFL, g_stdin_flags);
}

void onWindowChange(int) {
  int saved = errno;
  char byte = 0;
  (void)!::write(g_winch_pipe, &byte, 1);
  errno = saved;
}

class RawMode {
 public:
  RawMode() {
    g_stdin_flags = ::fcntl(STDIN_FILENO, F_GETFL);
    if (!::isatty(STDIN_FILENO) || ::tcgetattr(STDIN_FILENO, &g_saved) != 0) return;
    struct termios raw = g_saved;
    ::cfmakeraw(&raw);
    if (::tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) == 0) g_raw = true;
  }
  ~RawMode() {
    restoreTerminal();
    g_raw = false;
    g_stdin_flags = -1;
  }
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;
};

std::optional<std::pair<int, int>> windowSize() {
  struct winsize ws {};
  for (int fd : {STDIN_FILENO, STDOUT_FILENO}) {
    if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
      return std::pair{static_cast<int>(ws.ws_col), static_cast<int>(ws.ws_row)};
    }
  }
  return std::nullopt;
}

void writeOut(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(STDOUT_FILENO, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stdout is gone; the session ends when the process does
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

int cmdShell(const apiclient::Client& api, const std::string& id, const ShellOptions& o) {
  apiclient::TerminalOptions options;
  if (auto size = windowSize()) std::tie(options.cols, options.rows) = *size;
  if (const char* term = std::getenv("TERM"); term && *term && std::string_view(term) != "dumb") options.term = term;
  options.user = o.user;
  options.cwd = o.cwd;
  if (o.command.size() == 1) {
    options.command = o.command.front();
  } else {
    options.argv = o.command;
  }

  int winch[2];
  if (::pipe2(winch, O_NONBLOCK | O_CLOEXEC) != 0) return fail("pipe: " + std::string(std::strerror(errno)));
  g_winch_pipe = winch[1];
  struct sigaction action {};
  action.sa_handler = onWindowChange;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGWINCH, &action, nullptr);

  Result<apiclient::TerminalEnd> end = makeError(ErrorCode::kInternal, "not run");
  {
    RawMode raw;
    // SIGTERM or SIGHUP (the terminal closed): put the terminal back, then go as the signal says.
    OnSignal reaction([](int sig) {
      restoreTerminal();
      _exit(128 + sig);
    });
    apiclient::TerminalIo io;
    io.input_fd = STDIN_FILENO;
    io.on_output = writeOut;
    io.resize_fd = winch[0];
    io.window_size = windowSize;
    try {
      end = apiclient::runTerminal(api, id, options, io);
    } catch (const std::exception& e) {  // the terminal goes back to normal on this way out too
      end = makeError(ErrorCode::kInternal, std::string("terminal session: ") + e.what());
    }
  }
  ::signal(SIGWINCH, SIG_DFL);
  ::close(winch[0]);
  ::close(winch[1]);
  g_winch_pipe = -1;
  if (!end.ok()) return fail(end.error());
  return exitCodeOf(end->exit_code, end->status);
}

}  // namespace space::spacectl
