// Vm: one running microVM and everything it owns (QEMU process, run directory, sockets, disk
// overlay). start() returns only once the guest agent has answered on its port; a guest
// that crashes, panics or hangs first is reported with the tail of its console, and nothing of
// it is left behind. Destroying a Vm kills QEMU (if still running) and removes its files.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "agentproto/agent_client.h"
#include "agentproto/commands.h"
#include "common/fs.h"
#include "common/process.h"
#include "common/result.h"
#include "vmm/qemu_command.h"
#include "vmm/qmp_client.h"
#include "vmm/vm_spec.h"

namespace space::vmm {

struct VmStartOptions {
  // Parent of the per-VM run directories. Kept short: Unix socket paths are limited to 107 bytes.
  std::string run_root = "/run/space/vms";
  // Overrides the probed host capacity (tests use it to check validation without a big host).
  std::optional<HostCapacity> host_capacity;
};

struct BootTiming {
  std::chrono::milliseconds to_qmp{0};    // QEMU spawned -> QMP answering
  std::chrono::milliseconds to_ready{0};  // QEMU spawned -> the agent answered the handshake
  double guest_uptime_at_init_s = 0;      // guest kernel's own clock when the agent answered
};

enum class RunState { kRunning, kPaused, kOther };

class Vm {
 public:
  static Result<std::unique_ptr<Vm>> start(const VmSpec& spec, const VmStartOptions& options = {});
  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  Status pause();                     // QMP stop: vCPUs halt, memory stays
  Status resume();                    // QMP cont
  Result<std::string> queryStatus();  // QMP query-status "status", e.g. "running", "paused"

  // The channel to the guest agent (processes, files). Valid while the VM lives.
  agentproto::AgentClient& agent() { return *agent_; }
  // Runs a command through the agent and waits for it (see agentproto::runCommand).
  Result<agentproto::CommandResult> exec(const agentproto::CommandSpec& spec);
  Result<agentproto::CommandResult> exec(const std::string& command,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Drops the agent connection and makes a new one (the agent keeps its processes).
  Status reconnectAgent(std::chrono::milliseconds timeout);

  // Asks the guest to sync and power off, waits for QEMU to exit; falls back to QMP quit and kill.
  Status shutdown(std::chrono::milliseconds timeout);

  // Last bytes of the guest console.
  std::string consoleTail(size_t max_bytes = 4096) const;

  Accelerator accelerator() const { return accelerator_; }
  const BootTiming& bootTiming() const { return timing_; }
  const agentproto::AgentInfo& guestInfo() const { return agent_->info(); }
  const VmPaths& paths() const { return paths_; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  bool processRunning();

 private:
  Vm() = default;
  Status boot(const VmSpec& spec, const VmStartOptions& options);
  Status waitForAgent(Clock::time_point spawned, Clock::time_point deadline);
  std::optional<Error> checkAlive();
  Error bootFailure(const std::string& what);
  void destroy();

  std::optional<TempDir> run_dir_;
  VmPaths paths_;
  Accelerator accelerator_ = Accelerator::kTcg;
  std::optional<ChildProcess> process_;
  std::optional<QmpClient> qmp_;
  std::unique_ptr<agentproto::AgentClient> agent_;
  BootTiming timing_;
};

}  // namespace space::vmm
