// ChildProcess: a handle on one spawned child. The child is always reaped: by wait(), or by
// the destructor, which kills it first if it still runs. A pidfd makes the exit pollable next
// to sockets, so a supervisor can watch "the process died" and "a message arrived" at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace space {

struct SpawnOptions {
  std::string stdout_path;  // empty: /dev/null
  std::string stderr_path;  // empty: same as stdout
  bool new_session = true;  // detach from our terminal and process group
};

struct ExitStatus {
  int exit_code = -1;  // valid when !signaled
  int signal = 0;      // valid when signaled
  bool signaled = false;
  std::string describe() const;
};

class ChildProcess {
 public:
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv, const SpawnOptions& options);

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

  bool reaped() const { return exit_.has_value(); }
  const std::optional<ExitStatus>& exitStatus() const { return exit_; }

 private:
  ChildProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  void release();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<ExitStatus> exit_;
};

}  // namespace space
