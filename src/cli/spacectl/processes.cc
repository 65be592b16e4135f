#include "cli/spacectl/processes.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>

#include "agentproto/base64.h"
#include "cli/spacectl/output.h"
#include "cli/spacectl/signals.h"

namespace space::spacectl {

using apiclient::field;
using apiclient::sandboxPath;
using std::chrono::milliseconds;

namespace {

// What the daemon may take beyond a command's own timeout before we stop waiting for it.
constexpr milliseconds kExecSlack = std::chrono::seconds(30);
constexpr int64_t kDaemonExecTimeoutS = 60;  // the daemon's default when a request names none

// Go's signal names (the agent reports "signal: killed"), indexed by Linux signal number.
// clang-format off
constexpr const char* kSignalNames[] = {
    "", "hangup", "interrupt", "quit", "illegal instruction",                                // 0-4
    "trace/breakpoint trap", "aborted", "bus error", "floating point exception", "killed",   // 5-9
    "user defined signal 1", "segmentation fault", "user defined signal 2", "broken pipe",   // 10-13
    "alarm clock", "terminated", "stack fault", "child exited", "continued",                 // 14-18
    "stopped (signal)", "stopped", "stopped (tty input)", "stopped (tty output)",             // 19-22
    "urgent I/O condition", "CPU time limit exceeded", "file size limit exceeded",           // 23-25
    "virtual timer expired", "profiling timer expired", "window changed", "I/O possible",    // 26-29
    "power failure", "bad system call"};                                                      // 30-31
// clang-format on

std::optional<int> signalFromStatus(std::string status) {
  constexpr std::string_view kPrefix = "signal: ";
  if (!status.starts_with(kPrefix)) return std::nullopt;
  status.erase(0, kPrefix.size());
  if (auto core = status.find(" (core dumped)"); core != std::string::npos) status.erase(core);
  for (int i = 1; i < static_cast<int>(std::size(kSignalNames)); ++i) {
    if (status == kSignalNames[i]) return i;
  }
  if (status.starts_with("signal ")) {
    int n = std::atoi(status.c_str() + 7);
    if (n > 0 && n < 128) return n;
  }
  return std::nullopt;
}

// Read before anything is created, so a failing stdin leaves nothing behind.
Result<json> execRequest(const ExecOptions& o) {
  json request = json::object();
  // One argument is a command line for the guest's shell (pipes, globs); several are an argv.
  if (o.command.size() == 1) {
    request["command"] = o.command[0];
  } else {
    request["argv"] = o.command;
  }
  if (!o.env.empty()) request["env"] = pairs(o.env);
  if (!o.cwd.empty()) request["cwd"] = o.cwd;
  if (!o.user.empty()) request["user"] = o.user;
  if (o.timeout_s >= 0) request["timeout_s"] = o.timeout_s;
  if (o.send_stdin) {
    auto data = readAll(STDIN_FILENO, "stdin");
    if (!data.ok()) return data.error();
    request["stdin"] = agentproto::base64Encode(data.value());
  }
  return request;
}

// How long to wait for the daemon's next word: the command may be silent for its whole timeout.
milliseconds execWait(const json& request) {
  const json& t = field(request, "timeout_s");
  int64_t seconds = t.is_number_integer() ? t.get<int64_t>() : kDaemonExecTimeoutS;
  if (seconds == 0) return milliseconds(0);  // no limit on the command: none on waiting either
  return std::chrono::seconds(seconds) + kExecSlack;
}

std::string processPath(const std::string& id, int pid) {
  return sandboxPath(id) + "/processes/" + std::to_string(pid);
}

// The remote process of a streamed exec, for the signal thread.
struct RemoteProcess {
  std::string sandbox_id;
  std::atomic<int> pid{0};
  int signals = 0;  // only the signal thread touches it
};

const char* signalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; }

// Ctrl-C during exec: the first is passed on to the remote command (which may want to clean up),
// the second detaches and leaves it running.
void forwardSignal(const apiclient::Client& api, RemoteProcess& process, int sig) {
  int pid = process.pid;
  if (pid == 0) {
    std::cerr << "\nspacectl: interrupted; if the command started, spacectl ps " << process.sandbox_id << " shows it\n";
    _exit(128 + sig);
  }
  if (++process.signals > 1) {
    std::cerr << "\nspacectl: detached; process " << pid << " may still be running in " << process.sandbox_id << "\n";
    _exit(128 + sig);
  }
  auto sent = api.call("POST", processPath(process.sandbox_id, pid) + "/signal", json{{"signal", signalName(sig)}});
  if (!sent.ok()) {
    std::cerr << "\nspacectl: could not pass " << signalName(sig) << " on: " << describe(sent.error()) << "\n";
    _exit(128 + sig);
  }
  std::cerr << "\nspacectl: sent " << signalName(sig) << " to process " << pid << " in " << process.sandbox_id
            << " (again to detach)\n";
}

// Runs the command with its output streamed to ours as it arrives (NDJSON lines); returns the
// exit code spacectl should end with.
int streamExec(const apiclient::Client& api, json request, RemoteProcess& process) {
  request["stream"] = true;
  json exit_code, exit_status;
  bool exited = false;
  std::optional<Error> stream_error;
  auto onEvent = [&](const json& event) -> Status {
    std::string type = text(field(event, "type"));
    if (type == "start") {
      process.pid = field(event, "pid").is_number_integer() ? field(event, "pid").get<int>() : 0;
    } else if (type == "stdout" || type == "stderr") {
      auto data = agentproto::base64Decode(text(field(event, "data")));
      if (!data) return makeError(ErrorCode::kInternal, "spaced sent output that is not base64");
      return type == "stdout" ? writeAll(STDOUT_FILENO, *data, "stdout") : writeAll(STDERR_FILENO, *data, "stderr");
    } else if (type == "exit") {
      exited = true;
      exit_code = field(event, "exit_code");
      exit_status = field(event, "status");
    } else if (type == "error") {
      const json& e = field(event, "error");
      stream_error = makeError(ErrorCode::kInternal, text(field(e, "message")), text(field(e, "code")));
    }
    return okStatus();  // other types: a newer daemon's additions
  };
  auto done = api.streamLines("POST", sandboxPath(process.sandbox_id) + "/exec", request, onEvent, execWait(request));
  if (!done.ok()) return done.error().reason == kBrokenPipe ? 128 + SIGPIPE : fail(done.error());
  if (stream_error) return fail(*stream_error);
  if (!exited) return fail("the output stream ended before the command's exit status arrived");
  return exitCodeOf(exit_code, exit_status);
}

// The non-streamed exec: one JSON document with all the output, for scripts.
int jsonExec(const apiclient::Client& api, const std::string& id, const json& request) {
  auto result = api.call("POST", sandboxPath(id) + "/exec", request, execWait(request));
  if (!result.ok()) return fail(result.error());
  printJson(*result);
  return exitCodeOf(field(*result, "exit_code"), field(*result, "status"));
}

// Deletes the sandbox of `run --rm` once, from whichever thread gets there first: the main one
// when the command is over, or the signal thread on Ctrl-C.
class SandboxCleanup {
 public:
  explicit SandboxCleanup(const apiclient::Client& api) : api_(api) {}

  void adopt(const std::string& id) {
    std::lock_guard lock(m_);
    id_ = id;
  }
  bool known() {
    std::lock_guard lock(m_);
    return !id_.empty();
  }
  // False if the sandbox may have been left behind (said on stderr).
  bool run() {
    std::lock_guard lock(m_);
    if (id_.empty() || attempted_) return ok_;
    attempted_ = true;
    auto done = api_.call("DELETE", sandboxPath(id_));
    ok_ = done.ok() || done.error().code == ErrorCode::kNotFound;
    if (!ok_) std::cerr << "spacectl: could not delete sandbox " << id_ << ": " << describe(done.error()) << "\n";
    if (!ok_) std::cerr << "spacectl: delete it with: spacectl rm " << id_ << "\n";
    return ok_;
  }
  std::string id() {
    std::lock_guard lock(m_);
    return id_;
  }

 private:
  const apiclient::Client& api_;
  std::mutex m_;
  std::string id_;
  bool attempted_ = false;
  bool ok_ = true;
};

}  // namespace

int exitCodeOf(const json& exit_code, const json& status) {
  int code = exit_code.is_number_integer() ? exit_code.get<int>() : -1;
  if (code >= 0) return code & 0xff;
  if (auto sig = signalFromStatus(text(status))) return 128 + *sig;
  return kExitFailure;
}

int cmdExec(const apiclient::Client& api, const std::string& id, const ExecOptions& o, bool as_json) {
  auto request = execRequest(o);
  if (!request.ok()) return fail(request.error());
  RemoteProcess process;
  process.sandbox_id = id;
  OnSignal reaction([&](int sig) { forwardSignal(api, process, sig); });
  return as_json ? jsonExec(api, id, *request) : streamExec(api, *request, process);
}

int cmdRun(const apiclient::Client& api, const CreateOptions& create, const ExecOptions& exec, bool remove,
           bool as_json) {
  auto request = execRequest(exec);
  if (!request.ok()) return fail(request.error());
  SandboxCleanup cleanup(api);
  RemoteProcess process;  // its sandbox_id is set before cleanup knows the id, and read after
  int signals = 0;
  OnSignal reaction([&](int sig) {
    if (!cleanup.known()) {
      if (remove && ++signals < 3) {
        std::cerr << "\nspacectl: interrupted; the sandbox is deleted as soon as it exists (Ctrl-C "
                  << (signals == 1 ? "twice more" : "once more") << " to leave it)\n";
        return;  // the main thread checks interruptedBy() once the create returns
      }
      std::cerr << "\nspacectl: interrupted; the sandbox being created may be left behind (spacectl ls)\n";
      _exit(128 + sig);
    }
    if (!remove) return forwardSignal(api, process, sig);
    // Deleting the sandbox ends the command; waiting for its stream to say so gains nothing.
    std::cerr << "\nspacectl: interrupted; deleting sandbox " << cleanup.id() << "\n";
    cleanup.run();
    _exit(128 + sig);
  });

  auto create_request = createRequest(create);
  if (!create_request.ok()) return fail(create_request.error());
  Result<json> created = [&] {
    Progress progress("creating a sandbox", /*as_json=*/false);
    return api.call("POST", "/v1/sandboxes", create_request.value(), kCreateTimeout);
  }();
  if (!created.ok()) return interruptedBy() != 0 ? 128 + interruptedBy() : fail(created.error());
  const std::string id = text(field(*created, "id"));
  process.sandbox_id = id;
  cleanup.adopt(id);
  if (!remove) std::cerr << id << "\n";
  int rc = interruptedBy() != 0 ? 128 + interruptedBy()
                                : (as_json ? jsonExec(api, id, *request) : streamExec(api, *request, process));
  if (remove && !cleanup.run() && rc == 0) rc = kExitFailure;
  return rc;
}

int cmdProcesses(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto list = api.call("GET", sandboxPath(id) + "/processes");
  if (!list.ok()) return fail(list.error());
  if (as_json) {
    printJson(*list);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"PID", "CWD", "TAG", "COMMAND"}};
  for (const auto& p : field(*list, "processes")) {
    std::string command = text(field(p, "cmd"));
    for (const auto& arg : field(p, "args")) command += " " + text(arg);
    std::string cwd = text(field(p, "cwd")), tag = text(field(p, "tag"));
    rows.push_back({text(field(p, "pid")), cwd.empty() ? "-" : cwd, tag.empty() ? "-" : tag, command});
  }
  printTable(rows);
  return 0;
}

int cmdKill(const apiclient::Client& api, const std::string& id, int pid, std::string signal, bool as_json) {
  static const std::map<std::string, std::string> kNumbers = {{"1", "SIGHUP"},   {"2", "SIGINT"},   {"3", "SIGQUIT"},
                                                              {"9", "SIGKILL"},  {"10", "SIGUSR1"}, {"12", "SIGUSR2"},
                                                              {"15", "SIGTERM"}, {"18", "SIGCONT"}, {"19", "SIGSTOP"}};
  for (char& c : signal) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (auto it = kNumbers.find(signal); it != kNumbers.end()) signal = it->second;
  if (!signal.starts_with("SIG")) signal = "SIG" + signal;
  auto sent = api.call("POST", processPath(id, pid) + "/signal", json{{"signal", signal}});
  if (!sent.ok()) return fail(sent.error());
  if (as_json) printJson(json{{"id", id}, {"pid", pid}, {"signal", signal}});
  return 0;
}

}  // namespace space::spacectl
