#include "common/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/fs.h"

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

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv, const SpawnOptions& options) {
  if (argv.empty()) return makeError(ErrorCode::kInvalidArgument, "spawn: empty argv");
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  const std::string out = options.stdout_path.empty() ? "/dev/null" : options.stdout_path;
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
  if (options.stderr_path.empty()) {
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  } else {
    posix_spawn_file_actions_addopen(&actions, 2, options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
  }
  // The child starts with default signal dispositions and an empty mask, whatever ours are.
  sigset_t all;
  sigfillset(&all);
  posix_spawnattr_setsigdefault(&attr, &all);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  int first_unpassed = 3;
  for (const auto& [ours, theirs] : options.pass_fds) {
    posix_spawn_file_actions_adddup2(&actions, ours, theirs);
    first_unpassed = std::max(first_unpassed, theirs + 1);
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
