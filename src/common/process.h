// ChildProcess: a handle on one spawned child. The child is always reaped: by wait(), or by
// the destructor, which kills it first if it still runs. A pidfd makes the exit pollable next
// to sockets, so a supervisor can watch "the process died" and "a message arrived" at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace space {

struct SpawnOptions {
  // Opened for appending, never through a symbolic link (logs live in run directories that a
  // jailed QEMU can write).
  std::string stdout_path;  // empty: /dev/null
  std::string stderr_path;  // empty: same as stdout
  bool new_session = true;  // detach from our terminal and process group
  // A network namespace (a bind-mounted nsfs path) the child starts in; empty: ours.
  std::string netns_path;
  // Descriptors the child gets: {ours, its number}; everything else is closed (CLOEXEC).
  std::vector<std::pair<int, int>> pass_fds;
  // The child is pid 1 of a new PID namespace (it sees only itself and what it starts); its
  // pid here is the one returned. argv[0] must then be a path (no PATH search).
  bool new_pid_namespace = false;
};

struct ExitStatus {
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // valid when signaled
  bool signaled = false;
  bool known = true;  // false for an adopted process: only its parent learns how it ended
  std::string describe() const;
};

class ChildProcess {
 public:
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv, const SpawnOptions& options);
  // Takes charge of a process that is not our child (e.g. one a previous daemon started): it
  // can be watched (pidfd) and killed, but not reaped; its exit status is unknown.
  static Result<ChildProcess> adopt(pid_t pid);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // Readable (POLLIN) once the child has exited; owned by this object.
  int pidfd() const { return pidfd_; }

  // Reaps the child if it has exited; nullopt while it runs.
  std::optional<ExitStatus> tryWait();
  // Waits up to `timeout`; nullopt if it still runs then.
  std::optional<ExitStatus> waitFor(std::chrono::milliseconds timeout);
  // SIGTERM, then SIGKILL after `grace`; always returns with the child reaped.
  ExitStatus terminate(std::chrono::milliseconds grace);
  ExitStatus kill();

  // Lets the process run on without us (it is not killed); the handle becomes empty.
  void disown();

  bool reaped() const { return exit_.has_value(); }
  const std::optional<ExitStatus>& exitStatus() const { return exit_; }

 private:
  ChildProcess(pid_t pid, int pidfd, bool adopted) : pid_(pid), pidfd_(pidfd), adopted_(adopted) {}
  void release();
  bool pidfdReadable(std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool adopted_ = false;
  std::optional<ExitStatus> exit_;
};

// The kernel's start time of a process (clock ticks since boot, /proc/<pid>/stat field 22):
// with the pid, it names one process for good, since pids are reused.
Result<std::string> processStartTime(pid_t pid);
// The process's argv, NUL-separated as in /proc/<pid>/cmdline.
Result<std::string> processCmdline(pid_t pid);
// The real uid of process `pid` (its /proc status).
Result<uid_t> processUid(pid_t pid);
// Sets the nice value of every thread of `pid` (nice is per thread on Linux, and a thread that
// is created later inherits its creator's). Lowering it needs CAP_SYS_NICE.
Status setProcessNice(pid_t pid, int nice);
// The calling thread's nice value becomes `nice`; what it spawns inherits it.
Status setThreadNice(int nice);
// Whether the process has `path` open (one of its /proc/<pid>/fd links names it).
bool processHasOpen(pid_t pid, const std::string& path);

}  // namespace space
