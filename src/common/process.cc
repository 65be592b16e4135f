#include "common/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/unix_socket.h"

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000  // linux/sched.h; not in every libc's <sched.h>
#endif

extern char** environ;

namespace space {

std::string ExitStatus::describe() const {
  if (!known) return "exited (status unknown: not our child)";
  if (signaled) return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "exited with code " + std::to_string(exit_code);
}

namespace {

ExitStatus decode(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signaled = true;
    s.signal = WTERMSIG(status);
  } else {
    s.exit_code = WEXITSTATUS(status);
  }
  return s;
}

}  // namespace

namespace {

// The child's standard descriptors, opened here rather than between fork and exec: a log path
// in a run directory (QEMU's to write) may have become a link or a FIFO, which must neither be
// followed nor block the spawn. A log must be a regular file (or /dev/null).
struct ChildIo {
  UniqueFd in, out, err;
};

Result<UniqueFd> openLog(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0640));
  if (!fd.valid()) return makeError(ErrorCode::kInternal, "open " + path + ": " + strerror(errno));
  struct stat st {};
  // One name only, too: in a run directory a jailed QEMU could rename a second name of a file
  // others depend on (a frozen disk layer) to a log's name, for us to hand its successor.
  if (::fstat(fd.get(), &st) != 0 ||
      !((S_ISREG(st.st_mode) && st.st_nlink == 1) || (S_ISCHR(st.st_mode) && path == "/dev/null"))) {
    return makeError(ErrorCode::kInvalidArgument, path + " is not a regular file of one name; refused as a log");
  }
  return fd;
}

Result<ChildIo> openChildIo(const SpawnOptions& options) {
  ChildIo io;
  io.in = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!io.in.valid()) return makeError(ErrorCode::kInternal, std::string("open /dev/null: ") + strerror(errno));
  auto out = openLog(options.stdout_path.empty() ? "/dev/null" : options.stdout_path);
  if (!out.ok()) return out.error();
  io.out = std::move(out.value());
  if (options.stderr_path.empty()) {
    io.err = UniqueFd(::fcntl(io.out.get(), F_DUPFD_CLOEXEC, 0));
    if (!io.err.valid()) return makeError(ErrorCode::kInternal, std::string("dup: ") + strerror(errno));
  } else {
    auto err = openLog(options.stderr_path);
    if (!err.ok()) return err.error();
    io.err = std::move(err.value());
  }
  return io;
}

// The child's side of spawnInNewPidNamespace: between clone and exec, in a copy of a
// multithreaded process, so only async-signal-safe calls, and nothing allocates. Never returns:
// an error is reported through `report` (the errno) before _exit(127).
[[noreturn]] void childFailed(int report) {
  const int e = errno;
  [[maybe_unused]] ssize_t n = ::write(report, &e, sizeof e);
  ::_exit(127);
}

[[noreturn]] void becomeChild(const char* path, char* const* argv, int in, int out, int err, bool new_session,
                              const std::vector<std::pair<int, int>>& pass_fds, int first_unpassed, int report) {
  auto fail = [report]() { childFailed(report); };
  // dup2 onto itself leaves FD_CLOEXEC set: cleared by hand, as posix_spawn does.
  auto move = [](int from, int to) { return from == to ? ::fcntl(from, F_SETFD, 0) : ::dup2(from, to); };
  if (move(in, 0) < 0 || move(out, 1) < 0 || move(err, 2) < 0) fail();
  for (const auto& [ours, theirs] : pass_fds) {
    if (move(ours, theirs) < 0) fail();
  }
  // Below first_unpassed, what is not passed is closed: a number between two passed ones is
  // not the child's either.
  for (int fd = 3; fd < first_unpassed; ++fd) {
    bool passed = false;
    for (const auto& pass : pass_fds) passed = passed || pass.second == fd;
    if (!passed) ::close(fd);
  }
  // CLOEXEC rather than closed: `report` (above first_unpassed) must last until exec.
  if (::syscall(SYS_close_range, first_unpassed, ~0U, CLOSE_RANGE_CLOEXEC) != 0) fail();
  if (new_session && ::setsid() < 0) fail();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) (void)::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(path, argv, environ);
  childFailed(report);
}

// posix_spawn cannot start a child in a new PID namespace: it shares our memory (CLONE_VM),
// which the kernel refuses across PID namespaces. So: a thread of its own enters the slot's
// network namespace if asked, unshares the PID namespace for its children, and clones without
// CLONE_VM (a fork); the child only moves descriptors and executes.
Result<std::pair<pid_t, int>> spawnInNewPidNamespace(const std::vector<std::string>& argv,
                                                     const SpawnOptions& options) {
  if (argv[0].find('/') == std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "spawn in a new PID namespace needs a path, not " + argv[0]);
  }
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  auto io = openChildIo(options);
  if (!io.ok()) return io.error();
  int first_unpassed = 3;
  for (const auto& [ours, theirs] : options.pass_fds) first_unpassed = std::max(first_unpassed, theirs + 1);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    return makeError(ErrorCode::kInternal, std::string("pipe: ") + strerror(errno));
  UniqueFd read_end(pipe_fds[0]);
  // Above every descriptor the child is given, so no dup2 there replaces it.
  UniqueFd write_end(::fcntl(pipe_fds[1], F_DUPFD_CLOEXEC, first_unpassed));
  ::close(pipe_fds[1]);
  if (!write_end.valid()) return makeError(ErrorCode::kInternal, std::string("dup: ") + strerror(errno));

  pid_t pid = -1;
  int pidfd = -1;
  std::string failure;
  std::thread spawner([&] {
    // No signal handler of ours may run in the child before it resets them.
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    if (!options.netns_path.empty()) {
      UniqueFd ns(::open(options.netns_path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns.valid() || ::setns(ns.get(), CLONE_NEWNET) != 0) {
        failure = "enter " + options.netns_path + ": " + strerror(errno);
        return;
      }
    }
    if (::unshare(CLONE_NEWPID) != 0) {
      failure = std::string("unshare(CLONE_NEWPID): ") + strerror(errno);
      return;
    }
    const long rc = ::syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, nullptr, &pidfd, nullptr, nullptr);
    if (rc == 0) {
      becomeChild(cargv[0], cargv.data(), io->in.get(), io->out.get(), io->err.get(), options.new_session,
                  options.pass_fds, first_unpassed, write_end.get());
    }
    if (rc < 0) {
      failure = std::string("clone: ") + strerror(errno);
      return;
    }
    pid = static_cast<pid_t>(rc);
  });
  spawner.join();
  write_end.reset();
  if (!failure.empty()) return makeError(ErrorCode::kInternal, "cannot start " + argv[0] + ": " + failure);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(read_end.get(), &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {  // it never executed
    waitpid(pid, nullptr, 0);
    ::close(pidfd);
    return makeError(ErrorCode::kInternal, "cannot start " + argv[0] + ": " + strerror(child_errno));
  }
  return std::make_pair(pid, pidfd);
}

}  // namespace

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv, const SpawnOptions& given) {
  if (argv.empty()) return makeError(ErrorCode::kInvalidArgument, "spawn: empty argv");
  // Each passed descriptor is first copied above every number the child gets, so that moving
  // one onto its number never replaces another not yet moved (ours 3 -> 4 after 5 -> 3 would
  // pass the wrong file).
  SpawnOptions options = given;
  int first_unpassed = 3;
  for (const auto& pass : given.pass_fds) first_unpassed = std::max(first_unpassed, pass.second + 1);
  std::vector<UniqueFd> lifted;
  for (auto& pass : options.pass_fds) {
    lifted.emplace_back(::fcntl(pass.first, F_DUPFD_CLOEXEC, first_unpassed));
    if (!lifted.back().valid()) return makeError(ErrorCode::kInternal, std::string("dup: ") + strerror(errno));
    pass.first = lifted.back().get();
  }
  if (options.new_pid_namespace) {
    auto started = spawnInNewPidNamespace(argv, options);
    if (!started.ok()) return started.error();
    return ChildProcess(started->first, started->second, false);
  }
  auto io = openChildIo(options);
  if (!io.ok()) return io.error();
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&actions, io->in.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, io->out.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, io->err.get(), 2);
  // The child starts with default signal dispositions and an empty mask, whatever ours are.
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigdefault(&attr, &all);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  for (const auto& [ours, theirs] : options.pass_fds) posix_spawn_file_actions_adddup2(&actions, ours, theirs);
  for (int fd = 3; fd < first_unpassed; ++fd) {  // numbers between passed ones: closed too
    bool passed = false;
    for (const auto& pass : options.pass_fds) passed = passed || pass.second == fd;
    if (!passed) posix_spawn_file_actions_addclose(&actions, fd);
  }
  // Every other descriptor is closed, CLOEXEC or not: libraries we use (libnftables) open
  // sockets without it, and a child must never inherit one from another sandbox's slot.
  posix_spawn_file_actions_addclosefrom_np(&actions, first_unpassed);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (options.new_session) flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setflags(&attr, flags);

  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int rc = 0;
  if (options.netns_path.empty()) {
    rc = posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), environ);
  } else {
    // setns(2) moves only the calling thread, and a child starts in its parent thread's
    // namespaces: so the spawn runs on a thread of its own that entered the namespace first.
    std::thread spawner([&] {
      int ns = ::open(options.netns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0) {
        rc = errno;
        return;
      }
      if (::setns(ns, CLONE_NEWNET) != 0) {
        rc = errno;
        ::close(ns);
        return;
      }
      ::close(ns);
      rc = posix_spawnp(&pid, cargv[0], &actions, &attr, cargv.data(), environ);
    });
    spawner.join();
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    std::string where = options.netns_path.empty() ? "" : " in " + options.netns_path;
    return makeError(ErrorCode::kInternal, "cannot start " + argv[0] + where + ": " + strerror(rc));
  }

  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    int err = errno;
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return makeError(ErrorCode::kInternal, std::string("pidfd_open: ") + strerror(err));
  }
  return ChildProcess(pid, pidfd, false);
}

Result<ChildProcess> ChildProcess::adopt(pid_t pid) {
  if (pid <= 0) return makeError(ErrorCode::kInvalidArgument, "adopt: bad pid " + std::to_string(pid));
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    int err = errno;
    if (err == ESRCH) return makeError(ErrorCode::kNotFound, "process " + std::to_string(pid) + " is gone");
    return makeError(ErrorCode::kInternal, "pidfd_open " + std::to_string(pid) + ": " + strerror(err));
  }
  return ChildProcess(pid, pidfd, true);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), pidfd_(other.pidfd_), adopted_(other.adopted_), exit_(other.exit_) {
  other.pid_ = -1;
  other.pidfd_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    release();
    pid_ = other.pid_;
    pidfd_ = other.pidfd_;
    adopted_ = other.adopted_;
    exit_ = other.exit_;
    other.pid_ = -1;
    other.pidfd_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { release(); }

void ChildProcess::release() {
  if (pid_ > 0 && !exit_) kill();
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
}

void ChildProcess::disown() {
  if (pidfd_ >= 0) close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
}

bool ChildProcess::pidfdReadable(std::chrono::milliseconds timeout) {
  pollfd p{pidfd_, POLLIN, 0};
  int rc;
  do {
    rc = poll(&p, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

std::optional<ExitStatus> ChildProcess::tryWait() {
  if (exit_ || pid_ <= 0) return exit_;
  if (adopted_) {
    // Not our child: waitpid cannot see it, but its pidfd turns readable when it exits.
    if (pidfdReadable(std::chrono::milliseconds(0))) exit_ = ExitStatus{-1, 0, false, false};
    return exit_;
  }
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) exit_ = decode(status);
  return exit_;
}

std::optional<ExitStatus> ChildProcess::waitFor(std::chrono::milliseconds timeout) {
  if (auto s = tryWait()) return s;
  pidfdReadable(timeout);
  return tryWait();
}

ExitStatus ChildProcess::terminate(std::chrono::milliseconds grace) {
  if (auto s = tryWait()) return *s;
  syscall(SYS_pidfd_send_signal, pidfd_, SIGTERM, nullptr, 0);
  if (auto s = waitFor(grace)) return *s;
  return kill();
}

ExitStatus ChildProcess::kill() {
  if (auto s = tryWait()) return *s;
  // Through the pidfd: never signals a stranger that reused the pid.
  syscall(SYS_pidfd_send_signal, pidfd_, SIGKILL, nullptr, 0);
  if (adopted_) {
    // SIGKILL cannot be blocked; the wait only covers the kernel tearing the process down.
    pidfdReadable(std::chrono::milliseconds(10000));
    exit_ = ExitStatus{-1, SIGKILL, true, false};
    return *exit_;
  }
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exit_ = decode(status);
  return *exit_;
}

Result<std::string> processCmdline(pid_t pid) {
  auto text = readSmallFile("/proc/" + std::to_string(pid) + "/cmdline", 1 << 20);
  if (!text.ok()) return makeError(ErrorCode::kNotFound, "process " + std::to_string(pid) + " is gone");
  return text;
}

bool processHasOpen(pid_t pid, const std::string& path) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    if (std::filesystem::read_symlink(entry.path(), link_ec).string() == path) return true;
  }
  return false;
}

Result<std::string> processStartTime(pid_t pid) {
  auto stat = readSmallFile("/proc/" + std::to_string(pid) + "/stat", 1 << 16);
  if (!stat.ok()) return makeError(ErrorCode::kNotFound, "process " + std::to_string(pid) + " is gone");
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count fields from
  // the last ')'. starttime is field 22, the 20th after it.
  auto close = stat->rfind(')');
  if (close == std::string::npos) {
    return makeError(ErrorCode::kInternal, "unreadable /proc stat of " + std::to_string(pid));
  }
  size_t pos = close + 1;
  for (int field = 0; field < 20; ++field) {
    pos = stat->find(' ', pos);
    if (pos == std::string::npos) break;
    ++pos;
  }
  if (pos == std::string::npos) {
    return makeError(ErrorCode::kInternal, "unreadable /proc stat of " + std::to_string(pid));
  }
  auto end = stat->find(' ', pos);
  return stat->substr(pos, end == std::string::npos ? std::string::npos : end - pos);
}

Result<uid_t> processUid(pid_t pid) {
  auto status = readSmallFile("/proc/" + std::to_string(pid) + "/status", 1 << 16);
  if (!status.ok()) return makeError(ErrorCode::kNotFound, "process " + std::to_string(pid) + " is gone");
  const auto at = status->find("\nUid:");
  unsigned long uid = 0;
  if (at == std::string::npos || std::sscanf(status->c_str() + at + 5, "%lu", &uid) != 1) {
    return makeError(ErrorCode::kInternal, "unreadable /proc status of " + std::to_string(pid));
  }
  return static_cast<uid_t>(uid);
}

Status setProcessNice(pid_t pid, int nice) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* tasks = opendir(dir.c_str());
  if (!tasks) return makeError(ErrorCode::kNotFound, "process " + std::to_string(pid) + " is gone");
  int failed_errno = 0;
  while (dirent* entry = readdir(tasks)) {
    char* rest = nullptr;
    long tid = strtol(entry->d_name, &rest, 10);
    if (*rest != '\0' || tid <= 0) continue;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) != 0 && errno != ESRCH) failed_errno = errno;
  }
  closedir(tasks);
  if (failed_errno != 0) {
    return makeError(ErrorCode::kInternal, "setpriority(" + std::to_string(pid) + ", " + std::to_string(nice) +
                                               "): " + strerror(failed_errno));
  }
  return okStatus();
}

Status setThreadNice(int nice) {
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) != 0) {
    return makeError(ErrorCode::kInternal, std::string("setpriority: ") + strerror(errno));
  }
  return okStatus();
}

}  // namespace space
