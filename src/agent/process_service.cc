#include "agent/process_service.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "agentproto/base64.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

namespace space::agent {

namespace {

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
constexpr size_t kReadChunk = 64 << 10;
// After the exit, a grandchild may keep writing into a pipe we drain one last time; bound that.
constexpr size_t kFinalDrainBytes = 1 << 20;
constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 100);

RpcError invalid(const std::string& msg) { return rpcError(RpcCode::kInvalidArgument, msg); }

std::string errnoText(int err) { return std::strerror(err); }

// ---- untrusted JSON accessors. proto3-JSON: a null field is an absent field.

const Json* field(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// Integers arrive as JSON numbers or (proto3-JSON) decimal strings.
std::optional<int64_t> asInt(const Json& v) {
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    size_t digits_at = (!s.empty() && s[0] == '-') ? 1 : 0;
    if (s.size() == digits_at || s.size() > 18 || s.find_first_not_of("0123456789", digits_at) != std::string::npos) {
      return std::nullopt;
    }
    return std::strtoll(s.c_str(), nullptr, 10);
  }
  return std::nullopt;
}

bool hasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

// Reads an optional string field: absent is fine, another type or a NUL byte (these strings end
// up in exec arguments, the environment or paths) is not.
std::optional<RpcError> optString(const Json& obj, const char* name, const std::string& path, std::string* out) {
  const Json* v = field(obj, name);
  if (!v) return std::nullopt;
  if (!v->is_string()) return invalid(path + " must be a string");
  *out = v->get<std::string>();
  if (hasNul(*out)) return invalid(path + " contains a NUL byte");
  return std::nullopt;
}

std::variant<winsize, RpcError> parsePtySize(const Json& pty, const std::string& path) {
  if (!pty.is_object()) return invalid(path + " must be an object");
  winsize ws{};
  ws.ws_col = 80;
  ws.ws_row = 24;
  const Json* size = field(pty, "size");
  if (!size) return ws;
  if (!size->is_object()) return invalid(path + ".size must be an object");
  std::pair<const char*, unsigned short*> dims[] = {{"cols", &ws.ws_col}, {"rows", &ws.ws_row}};
  for (auto [name, out] : dims) {
    const Json* v = field(*size, name);
    if (!v) return invalid(path + ".size." + name + " is required");
    auto n = asInt(*v);
    if (!n || *n < 1 || *n > 65535) return invalid(path + ".size." + name + " must be an integer in 1..65535");
    *out = static_cast<unsigned short>(*n);
  }
  return ws;
}

std::variant<int, RpcError> parseSignal(const Json& request) {
  static constexpr std::pair<const char*, int> kSignals[] = {
      {"SIGNAL_SIGKILL", SIGKILL}, {"SIGNAL_SIGTERM", SIGTERM}, {"SIGNAL_SIGINT", SIGINT},
      {"SIGNAL_SIGHUP", SIGHUP},   {"SIGNAL_SIGQUIT", SIGQUIT}, {"SIGNAL_SIGUSR1", SIGUSR1},
      {"SIGNAL_SIGUSR2", SIGUSR2}, {"SIGNAL_SIGSTOP", SIGSTOP}, {"SIGNAL_SIGCONT", SIGCONT},
  };
  const Json* v = field(request, "signal");
  if (!v) return invalid("signal is required");
  if (v->is_string()) {
    for (const auto& [name, sig] : kSignals) {
      if (v->get_ref<const std::string&>() == name) return sig;
    }
  }
  // Enum numbers are the Linux signal numbers; only the listed signals may be sent.
  if (auto n = v->is_string() ? std::nullopt : asInt(*v)) {
    for (const auto& entry : kSignals) {
      if (entry.second == *n) return entry.second;
    }
  }
  if (v->is_string()) return invalid("unsupported signal \"" + v->get<std::string>() + "\"");
  if (v->is_number()) return invalid("unsupported signal number");
  return invalid("signal must be an enum name or number");
}

// Go's syscall.Signal.String() on Linux, which envd's ProcessState.String() embeds.
std::string goSignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "hangup";
    case SIGINT: return "interrupt";
    case SIGQUIT: return "quit";
    case SIGILL: return "illegal instruction";
    case SIGTRAP: return "trace/breakpoint trap";
    case SIGABRT: return "aborted";
    case SIGBUS: return "bus error";
    case SIGFPE: return "floating point exception";
    case SIGKILL: return "killed";
    case SIGUSR1: return "user defined signal 1";
    case SIGSEGV: return "segmentation fault";
    case SIGUSR2: return "user defined signal 2";
    case SIGPIPE: return "broken pipe";
    case SIGALRM: return "alarm clock";
    case SIGTERM: return "terminated";
    case SIGSTKFLT: return "stack fault";
    case SIGCHLD: return "child exited";
    case SIGCONT: return "continued";
    case SIGSTOP: return "stopped (signal)";
    case SIGTSTP: return "stopped";
    case SIGTTIN: return "stopped (tty input)";
    case SIGTTOU: return "stopped (tty output)";
    case SIGURG: return "urgent I/O condition";
    case SIGXCPU: return "CPU time limit exceeded";
    case SIGXFSZ: return "file size limit exceeded";
    case SIGVTALRM: return "virtual timer expired";
    case SIGPROF: return "profiling timer expired";
    case SIGWINCH: return "window changed";
    case SIGIO: return "I/O possible";
    case SIGPWR: return "power failure";
    case SIGSYS: return "bad system call";
    default: return "signal " + std::to_string(sig);
  }
}

// envd's EndEvent: exitCode (omitted when 0, proto3 default), exited, status = Go's
// ProcessState.String(), error = the Wait error text, present whenever the exit was not clean.
Json endEvent(int status) {
  Json end = Json::object();
  std::string text;
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    if (code != 0) end["exitCode"] = code;
    end["exited"] = true;
    text = "exit status " + std::to_string(code);
    end["status"] = text;
    if (code != 0) end["error"] = text;
  } else {
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    end["exitCode"] = -1;
    end["exited"] = false;  // a proto3 default, spelled out as the project's protocol digest shows it
    text = "signal: " + goSignalName(sig);
    if (WIFSIGNALED(status) && WCOREDUMP(status)) text += " (core dumped)";
    end["status"] = text;
    end["error"] = text;
  }
  return Json{{"event", {{"end", std::move(end)}}}};
}

Json startEvent(pid_t pid) { return Json{{"event", {{"start", {{"pid", pid}}}}}}; }

// Sends `sig` to the process group the child created with setsid(), falling back to the pid.
int signalGroup(pid_t pid, int sig) {
  if (pid <= 0) return ESRCH;  // never let kill() reach our own group or everyone
  if (kill(-pid, sig) == 0) return 0;
  if (errno != ESRCH) return errno;
  return kill(pid, sig) == 0 ? 0 : errno;
}

// write() without dying of SIGPIPE when the process closed its end, whatever the host process's
// SIGPIPE disposition is: block it around the write and swallow the one the write raised.
ssize_t writeNoSigpipe(int fd, const char* data, size_t len) {
  sigset_t pipe_set, old_mask, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigpending(&pending);
  bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
  ssize_t n = write(fd, data, len);
  int err = errno;
  if (n < 0 && err == EPIPE && !was_pending) {
    timespec zero{};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  errno = err;
  return n;
}

class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() { reset(); }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

bool setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// ---- the child side of fork(). Only async-signal-safe calls on memory prepared before fork().

enum ChildStage : int { kStageSetup = 1, kStageCredentials, kStageCwd, kStageExec };
struct ChildFailure {
  int stage;
  int err;
};

struct ChildPlan {
  int stdio[3];  // become fds 0, 1, 2 (a PTY: the slave three times)
  bool pty;
  int status_fd;  // close-on-exec; a ChildFailure is written to it if exec is not reached
  bool switch_user;
  uid_t uid;
  gid_t gid;
  const gid_t* groups;
  size_t ngroups;
  const char* cwd;
  char* const* argv;
  char* const* envp;
  const char* const* candidates;  // exec paths to try in order (execvp's search, done with the child's PATH)
  size_t ncandidates;
  int fd_limit;  // bound for the close-on-exec loop when close_range() is unavailable
};

[[noreturn]] void childFail(const ChildPlan& plan, int stage, int err) {
  ChildFailure f{stage, err};
  ssize_t ignored = write(plan.status_fd, &f, sizeof f);
  (void)ignored;
  _exit(127);
}

[[noreturn]] void childMain(const ChildPlan& plan) {
  // The agent blocks SIGCHLD (signalfd) and ignores SIGPIPE; a command must start with neither.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  if (setsid() < 0) childFail(plan, kStageSetup, errno);
  // Move the sources above 2 first: a source may itself be 0..2 (PID 1 can start without stdio),
  // and dup2 onto an identical fd would neither copy nor clear close-on-exec.
  int moved[3];
  for (int i = 0; i < 3; ++i) {
    moved[i] = fcntl(plan.stdio[i], F_DUPFD, 3);
    if (moved[i] < 0) childFail(plan, kStageSetup, errno);
  }
  for (int i = 0; i < 3; ++i) {
    if (dup2(moved[i], i) < 0) childFail(plan, kStageSetup, errno);
  }
  if (plan.pty && ioctl(0, TIOCSCTTY, 0) < 0) childFail(plan, kStageSetup, errno);

  if (plan.switch_user) {
    if (setgroups(plan.ngroups, plan.groups) < 0) childFail(plan, kStageCredentials, errno);
    if (setgid(plan.gid) < 0) childFail(plan, kStageCredentials, errno);
    if (setuid(plan.uid) < 0) childFail(plan, kStageCredentials, errno);
  }
  // After setuid, so that the user's own permissions decide.
  if (chdir(plan.cwd) < 0) childFail(plan, kStageCwd, errno);

  // Everything above 2 (including the status pipe) closes at exec and stays open if exec fails.
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
    for (int fd = 3; fd < plan.fd_limit; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }

  // execvp's rules: skip candidates that do not exist, remember EACCES, stop at other errors.
  int err = ENOENT;
  bool saw_eacces = false;
  for (size_t i = 0; i < plan.ncandidates; ++i) {
    execve(plan.candidates[i], plan.argv, plan.envp);
    err = errno;
    if (err == EACCES) {
      saw_eacces = true;
    } else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ENODEV && err != ETIMEDOUT) {
      break;
    }
  }
  if (saw_eacces && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  childFail(plan, kStageExec, err);
}

struct StartSpec {
  std::string cmd;
  std::vector<std::string> args;
  std::map<std::string, std::string> envs;
  std::string cwd;
  bool pty = false;
  winsize size{};
  bool stdin_pipe = true;
  std::string tag;
};

std::variant<StartSpec, RpcError> parseStart(const Json& req) {
  StartSpec spec;
  if (!req.is_object()) return invalid("request must be a JSON object");
  const Json* proc = field(req, "process");
  if (!proc) return invalid("process is required");
  if (!proc->is_object()) return invalid("process must be an object");
  size_t total = 0;

  const Json* cmd = field(*proc, "cmd");
  if (!cmd) return invalid("process.cmd is required");
  if (auto e = optString(*proc, "cmd", "process.cmd", &spec.cmd)) return *e;
  if (spec.cmd.empty()) return invalid("process.cmd must not be empty");
  total += spec.cmd.size() + 1;

  if (const Json* args = field(*proc, "args")) {
    if (!args->is_array()) return invalid("process.args must be an array of strings");
    for (const auto& a : *args) {
      if (!a.is_string()) return invalid("process.args must be an array of strings");
      spec.args.push_back(a.get<std::string>());
      if (hasNul(spec.args.back())) return invalid("process.args contains a NUL byte");
      total += spec.args.back().size() + 1 + sizeof(char*);
      if (total >= ProcessService::kMaxSpecBytes) break;
    }
  }
  if (const Json* envs = field(*proc, "envs")) {
    if (!envs->is_object()) return invalid("process.envs must be an object of strings");
    for (const auto& [k, v] : envs->items()) {
      if (!v.is_string()) return invalid("process.envs[\"" + k + "\"] must be a string");
      const auto& value = v.get_ref<const std::string&>();
      if (k.empty() || k.find('=') != std::string::npos || hasNul(k)) {
        return invalid("process.envs has an invalid name \"" + k + "\"");
      }
      if (hasNul(value)) return invalid("process.envs[\"" + k + "\"] contains a NUL byte");
      total += k.size() + value.size() + 2 + sizeof(char*);
      if (total >= ProcessService::kMaxSpecBytes) break;
      spec.envs[k] = value;
    }
  }
  if (auto e = optString(*proc, "cwd", "process.cwd", &spec.cwd)) return *e;
  if (auto e = optString(req, "tag", "tag", &spec.tag)) return *e;
  total += spec.cwd.size() + spec.tag.size();
  if (total >= ProcessService::kMaxSpecBytes) {
    return rpcError(RpcCode::kResourceExhausted, "process cmd, args, envs, cwd and tag exceed 1 MiB");
  }
  if (const Json* pty = field(req, "pty")) {
    auto size = parsePtySize(*pty, "pty");
    if (auto* e = std::get_if<RpcError>(&size)) return *e;
    spec.pty = true;
    spec.size = std::get<winsize>(size);
  }
  if (const Json* in = field(req, "stdin")) {
    if (!in->is_boolean()) return invalid("stdin must be a boolean");
    spec.stdin_pipe = in->get<bool>();
  }
  return spec;
}

// The child's environment in merge order; a later definition replaces an earlier one in place.
std::vector<std::string> mergeEnv(const UserInfo& user, const std::map<std::string, std::string>& sandbox,
                                  const std::map<std::string, std::string>& request, std::string* path) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"PATH", kDefaultPath}, {"HOME", user.home}, {"USER", user.name}, {"LOGNAME", user.name}};
  auto set = [&env](const std::string& k, const std::string& v) {
    for (auto& kv : env) {
      if (kv.first == k) {
        kv.second = v;
        return;
      }
    }
    env.emplace_back(k, v);
  };
  for (const auto& [k, v] : sandbox) set(k, v);
  for (const auto& [k, v] : request) set(k, v);
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) {
    if (k == "PATH") *path = v;
    out.push_back(k + "=" + v);
  }
  return out;
}

// execvp's search list, computed with the child's PATH (execvp itself would use the agent's).
std::vector<std::string> execCandidates(const std::string& cmd, const std::string& path) {
  if (cmd.find('/') != std::string::npos) return {cmd};
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    size_t end = path.find(':', begin);
    std::string dir = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    out.push_back((dir.empty() ? std::string(".") : dir) + "/" + cmd);
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return out;
}

RpcError childFailureError(const ChildFailure& f, const std::string& cmd, const std::string& cwd, bool searched) {
  std::string why = errnoText(f.err);
  switch (f.stage) {
    case kStageExec:
      if (f.err == ENOENT) {
        return rpcError(RpcCode::kNotFound, searched ? "exec: \"" + cmd + "\": executable file not found in $PATH"
                                                     : "fork/exec " + cmd + ": " + why);
      }
      if (f.err == EACCES) return rpcError(RpcCode::kPermissionDenied, "fork/exec " + cmd + ": " + why);
      return rpcError(agentproto::rpcCodeFromErrno(f.err), "fork/exec " + cmd + ": " + why);
    case kStageCwd:
      if (f.err == EACCES || f.err == EPERM) return rpcError(RpcCode::kPermissionDenied, "chdir " + cwd + ": " + why);
      return invalid("chdir " + cwd + ": " + why);
    case kStageCredentials: return rpcError(RpcCode::kPermissionDenied, "switching user: " + why);
    default: return rpcError(RpcCode::kInternal, "setting up the process: " + why);
  }
}

}  // namespace

struct ProcessService::Proc {
  uint64_t id = 0;
  pid_t pid = 0;
  std::string tag;
  Json config;
  bool pty = false;
  // Parent-side fds. A PTY uses out_fd (the master) for output and input; err_fd/in_fd stay -1.
  int out_fd = -1, err_fd = -1, in_fd = -1;
  uint32_t out_ev = 0, err_ev = 0, in_ev = 0;  // epoll interest registered; 0 = not in the loop
  bool out_eof = false, err_eof = false;
  bool accepts_input = false;  // a stdin pipe or PTY that SendInput may still write to
  bool close_after_flush = false;
  std::string in_buf;  // pending input from in_off on
  size_t in_off = 0;
  bool paused = false;  // an attached stream is above the high-water mark
  bool exited = false;
  int wait_status = 0;
  EventLoop::TimerId timeout_timer = 0, linger_timer = 0;
  std::vector<std::shared_ptr<ServerStream>> streams;

  bool inputPending() const { return in_off < in_buf.size(); }
};

// The DataEvent field an fd's output is reported in.
const char* ProcessService::dataKind(const Proc& p, FdRole role) {
  return p.pty ? "pty" : (role == kErr ? "stderr" : "stdout");
}

ProcessService::ProcessService(EventLoop& loop, const UserDb& users)
    : loop_(loop), users_(users), read_buf_(kReadChunk) {}

ProcessService::~ProcessService() {
  auto procs = std::move(procs_);
  procs_.clear();
  for (auto& [id, p] : procs) {
    if (!p->exited) signalGroup(p->pid, SIGKILL);
    release(*p);
    for (auto& s : p->streams) s->finish(rpcError(RpcCode::kUnavailable, "process service shut down"));
  }
}

void ProcessService::registerWith(Router& router) {
  router.serverStream("/process.Process/Start", [this](const Json& req, const CallContext& ctx,
                                                       std::shared_ptr<ServerStream> s) { start(req, ctx, s); });
  router.serverStream("/process.Process/Connect", [this](const Json& req, const CallContext&,
                                                         std::shared_ptr<ServerStream> s) { connect(req, s); });
  router.unary("/process.Process/List", [this](const Json&, const CallContext&) { return list(); });
  router.unary("/process.Process/SendInput", [this](const Json& req, const CallContext&) { return sendInput(req); });
  router.unary("/process.Process/CloseStdin", [this](const Json& req, const CallContext&) { return closeStdin(req); });
  router.unary("/process.Process/SendSignal", [this](const Json& req, const CallContext&) { return sendSignal(req); });
  router.unary("/process.Process/Update", [this](const Json& req, const CallContext&) { return update(req); });
}

// ---- Start

void ProcessService::start(const Json& request, const CallContext& ctx, const std::shared_ptr<ServerStream>& stream) {
  auto fail = [&stream](RpcError e) { stream->finish(std::move(e)); };
  auto parsed = parseStart(request);
  if (auto* e = std::get_if<RpcError>(&parsed)) return fail(*e);
  StartSpec& spec = std::get<StartSpec>(parsed);

  auto looked_up = users_.lookup(ctx.user);
  if (auto* e = std::get_if<RpcError>(&looked_up)) return fail(*e);
  const UserInfo& user = std::get<UserInfo>(looked_up);

  auto resolved = resolvePath(spec.cwd, user);
  if (auto* e = std::get_if<RpcError>(&resolved)) return fail(*e);
  const std::string& cwd = std::get<std::string>(resolved);
  struct stat st {};
  if (stat(cwd.c_str(), &st) != 0) return fail(invalid("cwd \"" + cwd + "\" does not exist"));
  if (!S_ISDIR(st.st_mode)) return fail(invalid("cwd \"" + cwd + "\" is not a directory"));

  if (procs_.size() >= kMaxProcesses) {
    return fail(rpcError(RpcCode::kResourceExhausted, "too many processes (" + std::to_string(kMaxProcesses) + ")"));
  }

  // Everything the child needs, allocated now: the child must not allocate.
  std::string path;
  std::map<std::string, std::string> sandbox_env = base_env_;
  for (const auto& [k, v] : sandbox_env_) sandbox_env[k] = v;
  std::vector<std::string> env = mergeEnv(user, sandbox_env, spec.envs, &path);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_store;
  argv_store.push_back(spec.cmd);
  argv_store.insert(argv_store.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> candidates = execCandidates(spec.cmd, path);
  std::vector<const char*> candidate_ptrs;
  for (auto& c : candidates) candidate_ptrs.push_back(c.c_str());
  rlimit nofile{};
  int fd_limit = 1 << 16;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < static_cast<rlim_t>(fd_limit)) {
    fd_limit = static_cast<int>(nofile.rlim_cur);
  }

  auto sysFail = [&](const char* what) {
    int err = errno;
    RpcCode code = (err == EMFILE || err == ENFILE || err == EAGAIN || err == ENOMEM || err == ENOSPC)
                       ? RpcCode::kResourceExhausted
                       : RpcCode::kInternal;
    fail(rpcError(code, std::string(what) + ": " + errnoText(err)));
  };

  // Parent ends (kept) and child ends (closed after fork). All close-on-exec, so no other child
  // inherits them past its exec.
  ScopedFd out_r, out_w, err_r, err_w, in_r, in_w, master, slave;
  if (spec.pty) {
    master.reset(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (master.get() < 0) return sysFail("posix_openpt");
    char name[128];
    if (grantpt(master.get()) != 0 || unlockpt(master.get()) != 0 || ptsname_r(master.get(), name, sizeof name) != 0) {
      return sysFail("pty setup");
    }
    // Opened here rather than in the child so the master never sees a slave-less hangup, and
    // O_NOCTTY so it does not become the agent's controlling terminal.
    slave.reset(open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (slave.get() < 0) return sysFail("open pty slave");
    // The terminal belongs to the user it runs for (as login would set it), so tools that
    // reopen ttyname() work; group tty (5), mode 0620.
    if (fchown(slave.get(), user.uid, 5) != 0 || fchmod(slave.get(), 0620) != 0) return sysFail("chown pty slave");
    if (ioctl(master.get(), TIOCSWINSZ, &spec.size) != 0 || !setNonBlocking(master.get())) {
      return sysFail("pty setup");
    }
  } else {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return sysFail("pipe");
    out_r.reset(fds[0]);
    out_w.reset(fds[1]);
    if (pipe2(fds, O_CLOEXEC) != 0) return sysFail("pipe");
    err_r.reset(fds[0]);
    err_w.reset(fds[1]);
    if (spec.stdin_pipe) {
      if (pipe2(fds, O_CLOEXEC) != 0) return sysFail("pipe");
      in_r.reset(fds[0]);
      in_w.reset(fds[1]);
    } else {
      in_r.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (in_r.get() < 0) return sysFail("open /dev/null");
    }
    if (!setNonBlocking(out_r.get()) || !setNonBlocking(err_r.get()) ||
        (in_w.get() >= 0 && !setNonBlocking(in_w.get()))) {
      return sysFail("fcntl");
    }
  }
  int status_fds[2];
  if (pipe2(status_fds, O_CLOEXEC) != 0) return sysFail("pipe");
  ScopedFd status_r(status_fds[0]), status_w(status_fds[1]);

  ChildPlan plan{};
  if (spec.pty) {
    plan.stdio[0] = plan.stdio[1] = plan.stdio[2] = slave.get();
  } else {
    plan.stdio[0] = in_r.get();
    plan.stdio[1] = out_w.get();
    plan.stdio[2] = err_w.get();
  }
  plan.pty = spec.pty;
  plan.status_fd = status_w.get();
  // An unprivileged agent (development runs) can still start processes as itself.
  plan.switch_user = !(geteuid() != 0 && user.uid == geteuid());
  plan.uid = user.uid;
  plan.gid = user.gid;
  plan.groups = user.groups.data();
  plan.ngroups = user.groups.size();
  plan.cwd = cwd.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.candidates = candidate_ptrs.data();
  plan.ncandidates = candidate_ptrs.size();
  plan.fd_limit = fd_limit;

  pid_t pid = fork();
  if (pid < 0) return sysFail("fork");
  if (pid == 0) childMain(plan);

  status_w.reset();
  slave.reset();
  out_w.reset();
  err_w.reset();
  in_r.reset();
  // Waits until exec succeeds (EOF via close-on-exec) or the child reports why it failed. The
  // wait is bounded: between setuid and exec the child belongs to the user, whose processes
  // could SIGSTOP it and would otherwise freeze PID 1 here.
  ChildFailure failure{};
  ssize_t n = -1;
  {
    pollfd p{status_r.get(), POLLIN, 0};
    int ready;
    do {
      ready = poll(&p, 1, static_cast<int>(kExecHandshakeTimeout.count()));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) {
      kill(pid, SIGKILL);
      failed_children_.insert(pid);
      return fail(rpcError(RpcCode::kInternal, "the child did not reach exec within " +
                                                   std::to_string(kExecHandshakeTimeout.count()) + " ms"));
    }
  }
  do {
    n = read(status_r.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n != 0) {
    failed_children_.insert(pid);  // reaped later by the agent; onChildExit forgets it
    if (n != static_cast<ssize_t>(sizeof failure)) {
      kill(pid, SIGKILL);  // it may be running, but nobody could ever attach to it
      return fail(rpcError(RpcCode::kInternal, "lost the exec status of the child"));
    }
    return fail(childFailureError(failure, spec.cmd, cwd, spec.cmd.find('/') == std::string::npos));
  }

  auto owned = std::make_unique<Proc>();
  Proc& p = *owned;
  p.id = next_id_++;
  p.pid = pid;
  p.tag = spec.tag;
  p.pty = spec.pty;
  Json config{{"cmd", spec.cmd}, {"args", spec.args}, {"envs", spec.envs}, {"cwd", cwd}};
  p.config = std::move(config);
  if (spec.pty) {
    p.out_fd = master.release();
    p.err_eof = true;
    p.accepts_input = true;
  } else {
    p.out_fd = out_r.release();
    p.err_fd = err_r.release();
    p.in_fd = in_w.release();
    p.accepts_input = p.in_fd >= 0;
  }
  procs_[p.id] = std::move(owned);
  running_[pid] = p.id;

  if (ctx.timeout) {
    auto ms = std::clamp(*ctx.timeout, std::chrono::milliseconds(0), std::chrono::milliseconds(kMaxTimeout));
    p.timeout_timer = loop_.addTimer(ms, [this, id = p.id] { onTimeout(id); });
  }
  attach(p, stream);
  updateInterest(p);
}

// ---- Connect, List and the unary controls

void ProcessService::connect(const Json& request, const std::shared_ptr<ServerStream>& stream) {
  auto found = select(request);
  if (auto* e = std::get_if<RpcError>(&found)) return stream->finish(*e);
  attach(*std::get<Proc*>(found), stream);
}

UnaryResult ProcessService::list() const {
  Json processes = Json::array();
  for (const auto& [id, p] : procs_) {
    if (p->exited) continue;
    Json entry{{"config", p->config}, {"pid", p->pid}};
    if (!p->tag.empty()) entry["tag"] = p->tag;
    processes.push_back(std::move(entry));
  }
  return Json{{"processes", std::move(processes)}};
}

UnaryResult ProcessService::sendInput(const Json& request) {
  if (!request.is_object()) return invalid("request must be a JSON object");
  const Json* input = field(request, "input");
  if (!input) return invalid("input is required");
  if (!input->is_object()) return invalid("input must be an object");
  const Json* stdin_b64 = field(*input, "stdin");
  const Json* pty_b64 = field(*input, "pty");
  if ((stdin_b64 != nullptr) == (pty_b64 != nullptr)) return invalid("input must have exactly one of stdin, pty");
  const char* name = stdin_b64 ? "input.stdin" : "input.pty";
  const Json& encoded = stdin_b64 ? *stdin_b64 : *pty_b64;
  if (!encoded.is_string()) return invalid(std::string(name) + " must be a base64 string");
  auto data = agentproto::base64Decode(encoded.get_ref<const std::string&>());
  if (!data) return invalid(std::string(name) + " is not valid base64");

  auto found = select(request);
  if (auto* e = std::get_if<RpcError>(&found)) return *e;
  Proc& p = *std::get<Proc*>(found);
  if (pty_b64 && !p.pty) return rpcError(RpcCode::kFailedPrecondition, "process has no PTY");
  if (stdin_b64 && p.pty) return rpcError(RpcCode::kFailedPrecondition, "PTY process: send input as pty");
  if (!p.accepts_input || p.close_after_flush) {
    return rpcError(RpcCode::kFailedPrecondition, p.pty ? "the PTY is closed" : "process stdin is not open");
  }
  if (p.in_buf.size() - p.in_off + data->size() > kMaxPendingInput) {
    return rpcError(RpcCode::kResourceExhausted, "process is not reading its input fast enough");
  }
  if (data->empty()) return Json::object();
  p.in_buf.erase(0, p.in_off);
  p.in_off = 0;
  p.in_buf += *data;
  int err = flushInput(p);
  if (err != 0) {
    dropInput(p);
    updateInterest(p);
    return rpcError(RpcCode::kFailedPrecondition, "writing input: " + errnoText(err));
  }
  updateInterest(p);
  return Json::object();
}

UnaryResult ProcessService::closeStdin(const Json& request) {
  auto found = select(request);
  if (auto* e = std::get_if<RpcError>(&found)) return *e;
  Proc& p = *std::get<Proc*>(found);
  if (p.pty) return rpcError(RpcCode::kFailedPrecondition, "PTY process has no separate stdin");
  if (!p.accepts_input) return Json::object();  // already closed, or started with stdin:false
  if (p.inputPending()) {
    p.close_after_flush = true;  // flushInput closes it once the buffer is written
  } else {
    dropInput(p);
  }
  updateInterest(p);
  return Json::object();
}

UnaryResult ProcessService::sendSignal(const Json& request) {
  if (!request.is_object()) return invalid("request must be a JSON object");
  auto sig = parseSignal(request);
  if (auto* e = std::get_if<RpcError>(&sig)) return *e;
  auto found = select(request);
  if (auto* e = std::get_if<RpcError>(&found)) return *e;
  int err = signalGroup(std::get<Proc*>(found)->pid, std::get<int>(sig));
  if (err == ESRCH) return rpcError(RpcCode::kNotFound, "process not found");
  if (err != 0) return rpcError(agentproto::rpcCodeFromErrno(err), "kill: " + errnoText(err));
  return Json::object();
}

UnaryResult ProcessService::update(const Json& request) {
  if (!request.is_object()) return invalid("request must be a JSON object");
  std::optional<winsize> size;
  if (const Json* pty = field(request, "pty")) {
    auto parsed = parsePtySize(*pty, "pty");
    if (auto* e = std::get_if<RpcError>(&parsed)) return *e;
    size = std::get<winsize>(parsed);
  }
  auto found = select(request);
  if (auto* e = std::get_if<RpcError>(&found)) return *e;
  Proc& p = *std::get<Proc*>(found);
  if (!p.pty) return rpcError(RpcCode::kFailedPrecondition, "process has no PTY");
  if (size && ioctl(p.out_fd, TIOCSWINSZ, &*size) != 0) {
    return rpcError(RpcCode::kInternal, std::string("resizing the PTY: ") + errnoText(errno));
  }
  return Json::object();
}

ProcessService::Proc* ProcessService::find(uint64_t id) {
  auto it = procs_.find(id);
  return it == procs_.end() ? nullptr : it->second.get();
}

std::variant<ProcessService::Proc*, RpcError> ProcessService::select(const Json& request) {
  if (!request.is_object()) return invalid("request must be a JSON object");
  const Json* sel = field(request, "process");
  if (!sel) return invalid("process is required");
  if (!sel->is_object()) return invalid("process must be an object");
  const Json* pid_v = field(*sel, "pid");
  const Json* tag_v = field(*sel, "tag");
  if (pid_v && tag_v) return invalid("process must have only one of pid, tag");
  if (pid_v) {
    auto pid = asInt(*pid_v);
    if (!pid || *pid < 0 || *pid > UINT32_MAX) return invalid("process.pid must be a non-negative integer");
    if (*pid > 0 && *pid <= INT_MAX) {
      auto it = running_.find(static_cast<pid_t>(*pid));
      if (it != running_.end()) return find(it->second);
    }
    return rpcError(RpcCode::kNotFound, "process with pid " + std::to_string(*pid) + " not found");
  }
  if (tag_v) {
    if (!tag_v->is_string()) return invalid("process.tag must be a string");
    const auto& tag = tag_v->get_ref<const std::string&>();
    // Tags need not be unique (envd does not enforce it); the oldest running one wins.
    for (auto& [id, p] : procs_) {
      if (!p->exited && !tag.empty() && p->tag == tag) return p.get();
    }
    return rpcError(RpcCode::kNotFound, "process with tag \"" + tag + "\" not found");
  }
  return invalid("process.pid or process.tag is required");
}

// ---- streams and flow control

void ProcessService::attach(Proc& p, std::shared_ptr<ServerStream> stream) {
  stream->send(startEvent(p.pid));
  if (!stream->open()) return;
  std::weak_ptr<int> alive = alive_;
  const ServerStream* raw = stream.get();
  stream->setOnClose([this, alive, id = p.id, raw] {
    if (!alive.expired()) detach(id, raw);
  });
  stream->setOnDrain([this, alive, id = p.id] {
    if (!alive.expired()) onDrain(id);
  });
  p.streams.push_back(std::move(stream));
}

void ProcessService::detach(uint64_t id, const ServerStream* stream) {
  Proc* p = find(id);
  if (!p) return;
  std::erase_if(p->streams, [stream](const auto& s) { return s.get() == stream; });
  onDrain(id);  // the stream that was holding output back may be the one that left
}

bool ProcessService::overHighWater(const Proc& p) const {
  return std::any_of(p.streams.begin(), p.streams.end(),
                     [](const auto& s) { return s->open() && s->queuedBytes() > ServerStream::kHighWater; });
}

void ProcessService::onDrain(uint64_t id) {
  Proc* p = find(id);
  if (!p || !p->paused || overHighWater(*p)) return;
  p->paused = false;
  updateInterest(*p);  // level-triggered: the loop reports the waiting output on its next turn
}

void ProcessService::broadcast(Proc& p, const char* kind, const char* data, size_t len) {
  if (p.streams.empty()) return;  // nobody attached: envd drops the output
  Json msg{{"event", {{"data", {{kind, agentproto::base64Encode(std::string_view(data, len))}}}}}};
  auto streams = p.streams;  // a send may close a stream and detach it
  for (auto& s : streams) {
    if (s->open()) s->send(msg);
  }
  if (!p.paused && overHighWater(p)) {
    p.paused = true;
    updateInterest(p);
  }
}

// ---- fds

void ProcessService::updateInterest(Proc& p) {
  // An fd with nothing to wait for leaves the loop altogether: epoll reports EPOLLHUP even for an
  // empty interest set, which a paused pipe whose writer exited would turn into a busy loop.
  auto apply = [this, &p](int fd, uint32_t& cur, uint32_t want, FdRole role) {
    if (fd < 0 || want == cur) return;
    if (want == 0) {
      loop_.removeFd(fd);
    } else if (cur == 0) {
      loop_.addFd(fd, want, [this, id = p.id, role](uint32_t events) { onFd(id, role, events); });
    } else {
      loop_.modifyFd(fd, want);
    }
    cur = want;
  };
  constexpr uint32_t kRead = EPOLLIN, kWrite = EPOLLOUT, kNone = 0;
  uint32_t read_out = (!p.out_eof && !p.paused) ? kRead : kNone;
  uint32_t write_pty = (p.pty && p.inputPending()) ? kWrite : kNone;
  apply(p.out_fd, p.out_ev, read_out | write_pty, kOut);
  apply(p.err_fd, p.err_ev, (!p.err_eof && !p.paused) ? kRead : kNone, kErr);
  if (!p.pty) apply(p.in_fd, p.in_ev, p.inputPending() ? kWrite : kNone, kIn);
}

void ProcessService::onFd(uint64_t id, FdRole role, uint32_t events) {
  Proc* p = find(id);
  if (!p) return;
  bool input_fd = role == kIn || (role == kOut && p->pty);
  if (input_fd && p->inputPending()) {
    // A PTY hangup means no slave is left to read; a pipe error means the reader is gone.
    bool gone = p->pty && (events & (EPOLLHUP | EPOLLERR));
    if (gone || ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && flushInput(*p) != 0)) dropInput(*p);
  }
  if (role != kIn && !p->paused && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) readOnce(*p, role);
  updateInterest(*p);
  maybeEnd(id);
}

void ProcessService::readOnce(Proc& p, FdRole role) {
  int fd = role == kOut ? p.out_fd : p.err_fd;
  bool& eof = role == kOut ? p.out_eof : p.err_eof;
  if (fd < 0 || eof) return;
  ssize_t n = read(fd, read_buf_.data(), read_buf_.size());
  if (n > 0) {
    broadcast(p, dataKind(p, role), read_buf_.data(), static_cast<size_t>(n));
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  // 0 on a pipe, EIO on a PTY master once every slave fd is closed; any other error ends it too.
  markEof(p, role);
}

void ProcessService::markEof(Proc& p, FdRole role) {
  if (role == kErr) {
    p.err_eof = true;
    if (p.err_ev != 0) loop_.removeFd(p.err_fd);
    close(p.err_fd);
    p.err_fd = -1;
    p.err_ev = 0;
    return;
  }
  p.out_eof = true;
  if (p.pty) {
    // The master stays open for Update until the end; only input is pointless now.
    dropInput(p);
    return;
  }
  if (p.out_ev != 0) loop_.removeFd(p.out_fd);
  close(p.out_fd);
  p.out_fd = -1;
  p.out_ev = 0;
}

// Writes pending input; returns 0 or the errno that makes further input impossible.
int ProcessService::flushInput(Proc& p) {
  int fd = p.pty ? p.out_fd : p.in_fd;
  while (p.inputPending()) {
    ssize_t n = writeNoSigpipe(fd, p.in_buf.data() + p.in_off, p.in_buf.size() - p.in_off);
    if (n > 0) {
      p.in_off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return 0;
    } else {
      return n < 0 ? errno : EIO;
    }
  }
  p.in_buf.clear();
  p.in_off = 0;
  if (p.close_after_flush) dropInput(p);
  return 0;
}

void ProcessService::dropInput(Proc& p) {
  p.in_buf.clear();
  p.in_off = 0;
  p.accepts_input = false;
  p.close_after_flush = false;
  if (p.pty || p.in_fd < 0) return;
  if (p.in_ev != 0) loop_.removeFd(p.in_fd);
  close(p.in_fd);
  p.in_fd = -1;
  p.in_ev = 0;
}

// ---- exit and end

bool ProcessService::onChildExit(pid_t pid, int wait_status) {
  if (failed_children_.erase(pid) > 0) return true;
  auto it = running_.find(pid);
  if (it == running_.end()) return false;
  if (!WIFEXITED(wait_status) && !WIFSIGNALED(wait_status)) return true;  // stopped/continued
  uint64_t id = it->second;
  // The pid is free for reuse from now on, so it no longer names this process.
  running_.erase(it);
  Proc* p = find(id);
  if (!p) return true;
  p->exited = true;
  p->wait_status = wait_status;
  loop_.cancelTimer(p->timeout_timer);
  p->timeout_timer = 0;
  p->linger_timer = loop_.addTimer(kExitLinger, [this, id] {
    if (Proc* q = find(id)) {
      q->linger_timer = 0;
      endProcess(id, /*drain_first=*/true);
    }
  });
  maybeEnd(id);
  return true;
}

void ProcessService::onTimeout(uint64_t id) {
  Proc* p = find(id);
  if (!p || p->exited) return;
  p->timeout_timer = 0;
  signalGroup(p->pid, SIGKILL);  // the end event then reports "signal: killed"
}

void ProcessService::maybeEnd(uint64_t id) {
  Proc* p = find(id);
  if (p && p->exited && p->out_eof && p->err_eof) endProcess(id, /*drain_first=*/false);
}

void ProcessService::endProcess(uint64_t id, bool drain_first) {
  auto it = procs_.find(id);
  if (it == procs_.end()) return;
  Proc& p = *it->second;
  if (drain_first) {
    // A pipe is still held open (by a grandchild, or we were paused by a slow host): send what
    // the process left in it, ignoring the high-water mark once, then give up on the rest.
    for (FdRole role : {kOut, kErr}) {
      size_t budget = kFinalDrainBytes;
      while (budget > 0 && !(role == kOut ? p.out_eof : p.err_eof)) {
        int fd = role == kOut ? p.out_fd : p.err_fd;
        ssize_t n = read(fd, read_buf_.data(), std::min(read_buf_.size(), budget));
        if (n > 0) {
          broadcast(p, dataKind(p, role), read_buf_.data(), static_cast<size_t>(n));
          budget -= static_cast<size_t>(n);
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else if (n < 0 && errno == EAGAIN) {
          break;
        } else {
          markEof(p, role);
        }
      }
    }
  }
  Json end = endEvent(p.wait_status);
  // Out of the table before calling into the transport, so nothing can reach a half-ended process.
  std::unique_ptr<Proc> owned = std::move(it->second);
  procs_.erase(it);
  release(*owned);
  for (auto& s : owned->streams) {
    s->send(end);
    s->finish();
  }
}

void ProcessService::release(Proc& p) {
  loop_.cancelTimer(p.timeout_timer);
  loop_.cancelTimer(p.linger_timer);
  p.timeout_timer = p.linger_timer = 0;
  std::pair<int*, uint32_t*> fds[] = {{&p.out_fd, &p.out_ev}, {&p.err_fd, &p.err_ev}, {&p.in_fd, &p.in_ev}};
  for (auto [fd, ev] : fds) {
    if (*fd < 0) continue;
    if (*ev != 0) loop_.removeFd(*fd);
    close(*fd);
    *fd = -1;
    *ev = 0;
  }
  auto it = running_.find(p.pid);
  if (it != running_.end() && it->second == p.id) running_.erase(it);
}

}  // namespace space::agent
