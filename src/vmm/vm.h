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
#include "vmm/node_facts.h"
#include "vmm/qemu_command.h"
#include "vmm/qmp_client.h"
#include "vmm/sealed_memory.h"
#include "vmm/vm_spec.h"
#include "vmm/vm_users.h"

namespace space::vmm {

struct VmStartOptions {
  // Parent of the per-VM run directories. Kept short: Unix socket paths are limited to 107 bytes.
  std::string run_root = "/run/space/vms";
  // If set, the VM's run directory is exactly this path (created; must not exist yet), so an
  // owner can find it again by name. Otherwise a fresh `<run_root>/vm-XXXXXX`.
  std::string run_dir;
  // If set, the guest is restored from this device-state file (saved by Vm::saveState) instead
  // of booted: the spec must name the snapshot's memory file (normally private) and disk.
  std::string restore_from;
  // The run directory exists already and holds the VM's disk (the newest disk[-<n>].qcow2), e.g. a suspended
  // VM's. It becomes the Vm's (removed with it) only once the start succeeded: a failed
  // resume must not lose the suspended guest.
  bool reuse_run_dir = false;
  // Restore only: the guest is loaded but left stopped (it never runs, no agent is attached),
  // so that its state can be saved again, e.g. into a snapshot of its own.
  bool stay_paused = false;
  // Must match how restore_from was saved (see Vm::saveState).
  bool restore_ignore_shared = true;
  // Overrides the probed host capacity (tests use it to check validation without a big host).
  std::optional<HostCapacity> host_capacity;
  // The node's facts, resolved by the owner at its start (must outlive the call): the VM then
  // probes nothing but the host's free memory. Unset: probed now (one-off tools, tests).
  const NodeFacts* node = nullptr;
  // The spec's memory file as a sealed copy (vmm/sealed_memory.h): QEMU gets it as descriptor
  // kSealedMemoryFd and maps /proc/self/fd/<it> privately; the file itself never enters its view.
  std::shared_ptr<const UniqueFd> sealed_memory;
};

struct BootTiming {
  std::chrono::milliseconds to_qmp{0};      // QEMU spawned -> QMP answering
  std::chrono::milliseconds to_ready{0};    // QEMU spawned -> the agent answered the handshake
  std::chrono::milliseconds to_running{0};  // restore only: QEMU spawned -> guest running again
  double guest_uptime_at_init_s = 0;        // guest kernel's own clock when the agent answered
};

enum class RunState { kRunning, kPaused, kOther };

// What identifies a VM started by an earlier owner (e.g. a daemon that restarted).
struct VmAdoptSpec {
  std::string run_dir;
  pid_t pid = -1;
  std::string identity;  // Vm::identity() as recorded then
  Accelerator accelerator = Accelerator::kTcg;
  std::chrono::milliseconds timeout{10000};
  uint64_t memory_mib = 0;  // the guest's RAM size: bounds what saveState accepts from QEMU
  // The node's cgroup layout: the VM's group (named after its run directory) goes with it.
  jail::CgroupLayout cgroups;
  // The node's VM uids: the one the QEMU runs as is held again while the VM is this owner's.
  std::shared_ptr<VmUsers> users;
  // The disk rate the node gives it now (none: unlimited). QEMU holds the rate it was given
  // last; adopt() sets this one, so that a restarted daemon's flags hold for what it adopts.
  DiskIoRate disk_io;
};

class Vm {
 public:
  static Result<std::unique_ptr<Vm>> start(const VmSpec& spec, const VmStartOptions& options = {});
  // The first half of a restore (e.g. a branch child's, whose snapshot files must stay only
  // while they load): QEMU is started with
  // `-incoming defer`, its disk overlay made, its monitor connected; the guest does not exist
  // yet. restore() then loads a state saved with a shared memory file (the spec's) and waits
  // for the agent: together they are start() with restore_from.
  static Result<std::unique_ptr<Vm>> prepare(const VmSpec& spec, const VmStartOptions& options = {});
  Status restore(const std::string& state_file, std::chrono::milliseconds timeout);
  // restore() in its two halves, for an owner that must keep the state's files in place only
  // while they are read, not while a guest takes its time to answer: loadPrepared() loads the
  // state and starts the guest (after it, QEMU needs no file it has not opened), awaitAgent()
  // waits for the agent's handshake.
  Status loadPrepared(const std::string& state_file, Clock::time_point deadline);
  Status awaitAgent(Clock::time_point deadline);
  // Takes charge of a running VM that an earlier owner detached from (or lost by crashing):
  // checks that the pid is still that QEMU, re-attaches QMP and, unless the VM is paused, the
  // agent. kNotFound if the process is gone (its run directory is removed then). On any other
  // failure the VM is killed and its files removed: nothing is left half-owned.
  static Result<std::unique_ptr<Vm>> adopt(const VmAdoptSpec& spec);
  ~Vm();
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  Status pause();                     // QMP stop: vCPUs halt, memory stays
  Status resume();                    // QMP cont; re-attaches the agent if it was not attached
  Result<std::string> queryStatus();  // QMP query-status "status", e.g. "running", "paused"

  // A guest can stop without being told to: QEMU stops it when its disk cannot be written
  // (ENOSPC on the host: the drive's werror=enospc), rather than fail the guest's write.
  // stopReported() reads the events QEMU sent since the last look, never waiting, and is true
  // while one of them said the guest stopped (STOP, BLOCK_IO_ERROR) and diskErrorStop() has not
  // looked since. diskErrorStop() asks QEMU (query-status "io-error"): the error QEMU gave
  // (e.g. "No space left on device"), or nullopt if the guest is not stopped on one.
  bool stopReported();
  Result<std::optional<std::string>> diskErrorStop();
  // Ends the agent connection now (calls in progress, e.g. an exec waiting for a stopped
  // guest, fail with `unavailable`); agent() answers `reason` until resume() reconnects.
  void disconnectAgent(const std::string& reason);

  // The channel to the guest agent (processes, files). Valid while the VM lives.
  agentproto::AgentClient& agent() { return *agent_; }
  // The same, shared: a caller on another thread keeps a working object even if the VM is
  // destroyed or reconnects meanwhile (its calls then fail with `unavailable`).
  std::shared_ptr<agentproto::AgentClient> sharedAgent() const { return agent_; }
  // Runs a command through the agent and waits for it (see agentproto::runCommand).
  Result<agentproto::CommandResult> exec(const agentproto::CommandSpec& spec);
  Result<agentproto::CommandResult> exec(const std::string& command,
                                         std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Drops the agent connection and makes a new one (the agent keeps its processes).
  Status reconnectAgent(std::chrono::milliseconds timeout);

  // Asks the guest to sync and power off, waits for QEMU to exit; falls back to QMP quit and kill.
  Status shutdown(std::chrono::milliseconds timeout);

  // Saves the guest's device state (CPU, devices; RAM only if it is not in a shared memory
  // file) to `state_file`, crash-safely (temp, fsync, rename). The VM is stopped (paused)
  // afterwards and every disk in its run directory is on stable storage before the state file
  // is (QEMU does not sync them itself: cache.no-flush): with a shared memory file, that file, the disk and the
  // state file together are a snapshot. QEMU runs guest code: a stream larger than the guest's
  // RAM plus device state is refused rather than allowed to fill the disk.
  // `ignore_shared` false streams every RAM block, shared or not: the stream then carries the
  // whole guest and can be loaded into a VM whose RAM is a (new) shared file.
  Status saveState(const std::string& state_file, std::chrono::milliseconds timeout, bool ignore_shared = true);
  // Freezes the disk as it is now into `layer_path` and moves the running guest onto a new,
  // empty copy-on-write overlay over it, so `layer_path` never changes again and snapshots and
  // their children can share it. No data is copied: the current overlay file becomes the layer
  // (a hard link on the same filesystem) and a new overlay, disk-<n>.qcow2 in the run
  // directory, becomes paths().disk.
  // The VM must be stopped (after saveState or pause) so that the layer is consistent.
  Status freezeDisk(const std::string& layer_path);
  // After saveState QEMU has handed its disk images over (inactive, as for a migration) and
  // in QEMU 7.2 only `cont` takes them back. For a guest that must stay stopped, this
  // continues it and stops it again at once (it runs for an instant). No-op unless needed.
  Status reactivateStopped();
  // Makes QEMU exit (QMP quit, then kill); the run directory stays until the Vm is destroyed.
  void quit();

  // Leaves QEMU running and its files in place for a later adopt(); this object becomes empty.
  void detach();

  // Last bytes of the guest console.
  std::string consoleTail(size_t max_bytes = 4096) const;
  // Bounds the console file: once it exceeds `max_bytes`, only its last `keep_bytes` stay.
  // (A guest printing without end would otherwise fill the host's disk.)
  void trimConsole(size_t max_bytes, size_t keep_bytes);

  Accelerator accelerator() const { return accelerator_; }
  const BootTiming& bootTiming() const { return timing_; }
  const agentproto::AgentInfo& guestInfo() const { return agent_->info(); }
  const VmPaths& paths() const { return paths_; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  // The QEMU process's start time: with pid(), what adopt() checks to avoid a reused pid.
  const std::string& identity() const { return identity_; }
  bool processRunning();
  // How QEMU ended, once it has (see ExitStatus::known for adopted VMs).
  std::optional<ExitStatus> exitStatus() const { return process_ ? process_->exitStatus() : std::nullopt; }
  // The memory limit of QEMU's cgroup, as spaced wrote it (nullopt: no group, or none written).
  std::optional<uint64_t> cgroupMemoryLimit() const { return cgroup_ ? cgroup_->memoryLimitBytes() : std::nullopt; }

 private:
  Vm() = default;
  static Result<std::unique_ptr<Vm>> launch(const VmSpec& spec, const VmStartOptions& options, bool defer_state);
  Status boot(const VmSpec& spec, const VmStartOptions& options, bool defer_state);
  Status waitForAgent(Clock::time_point spawned, Clock::time_point deadline);
  // Connects to the agent port and shakes hands; the new client becomes agent_ (the old
  // connection, if any, was ended first: QEMU serves one at a time).
  Status connectAgent(Clock::time_point deadline, const agentproto::HandshakeWatch& watch);
  Status loadState(const std::string& state_file, Clock::time_point deadline, bool start, bool ignore_shared);
  std::optional<Error> checkAlive();
  Error bootFailure(const std::string& what);
  // QEMU throttles the guest's disk to `rate` (on the device's block backend, so it stays
  // through freezeDisk's switch to a new overlay). Set at every start: it is not saved state.
  Status limitDiskIo(const DiskIoRate& rate);

 public:
  // Files in the guest's disk chain now: its overlay and every layer and image below it, each
  // name judged as at start (layersBelow). What a restart of this disk would open.
  Result<size_t> diskChainLength(const NodeFacts* node) const;

 private:
  // Puts space-jail (and, where the node has cgroups, the VM's new group) in front of argv; where
  // the node has VM uids, takes one (user_) and gives it the run directory.
  Status jailArgv(const VmSpec& spec, const NodeFacts& node, std::vector<std::string>& argv);
  // The images below the overlay (paths_.disk), top first, as QEMU is to be given them; for a
  // jailed VM each name is judged first (only the node's own disks).
  Result<std::vector<DiskLayer>> layersBelow(const NodeFacts* node) const;
  // The view's --ro/--rw/--dev paths; a memory file or image the VM owns is given to its uid
  // and remembered in owned_files_.
  Status addJailView(const VmSpec& spec, std::vector<std::string>& jailed);
  void removeCgroup();
  // Once QEMU is gone: its cgroup, what its uid owns back to root, its uid back to the node's
  // range. A QEMU not gone keeps its uid.
  void releaseJail(bool qemu_gone, bool run_dir_stays);
  void destroy();

  std::optional<TempDir> run_dir_;
  VmPaths paths_;
  Accelerator accelerator_ = Accelerator::kTcg;
  std::optional<ChildProcess> process_;
  std::optional<jail::VmCgroup> cgroup_;  // QEMU's group; removed once QEMU is reaped
  VmUsers::Lease user_;                   // the uid QEMU runs as; given back once it is reaped
  std::vector<std::string> owned_files_;  // outside the run directory, given to user_ (memory file)
  std::optional<QmpClient> qmp_;
  std::shared_ptr<agentproto::AgentClient> agent_;
  // A second descriptor of agent_'s connection: holders of the client (leases) may keep it
  // alive after the Vm replaced it, and shutdown(2) on this ends the connection regardless.
  UniqueFd agent_connection_;
  bool stop_reported_ = false;
  std::string disk_error_;  // what the last BLOCK_IO_ERROR said
  Clock::time_point restore_started_{};
  BootTiming timing_;
  std::string identity_;
  uint64_t memory_mib_ = 0;
  bool waiting_for_state_ = false;  // prepared, restore() not yet called
};

}  // namespace space::vmm
