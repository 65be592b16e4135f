// SandboxRuntime: everything a running sandbox owns on the host, held in one object with one
// teardown and one re-adoption routine. Today that is its VM (QEMU process, run directory,
// sockets, disk overlay); the network slot, gateway process and jail come next and belong
// here, so that pause, resume, suspend, teardown and re-adoption cover them without the
// manager knowing each part.
//
// Destroying a runtime tears everything down (QEMU killed, files removed). detach() leaves it
// all running for the next daemon; release() keeps the run directory (a suspended sandbox's
// disk and saved state) and stops the rest.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "net/policy.h"
#include "net/sandbox_network.h"
#include "vmm/vm.h"

namespace space::sandbox {

// The network a sandbox's VM gets: a slot from `pool` and a gateway enforcing its policy, with
// its files (policy, audit log) in `state_dir`, which outlives the VM (suspend, resume).
struct NetworkAttach {
  std::shared_ptr<net::NetworkPool> pool;
  std::string state_dir;
  // Written before the gateway starts; nullopt: the policy already in state_dir stays (a
  // resume), or the node's default where there is none.
  std::optional<net::Policy> policy;
};

// How to start a sandbox's VM: what Launcher makes from a template, a snapshot, a suspended
// sandbox or a pool entry.
struct Launch {
  vmm::VmSpec spec;
  vmm::VmStartOptions options;  // options.node is set: nothing is probed at start
  // The saved device state it is restored from; empty: a cold boot.
  std::string state_file;
  const char* how = "booted";  // for the log: booted, restored, branched, resumed
  // Set on nodes with networking: the VM starts in the slot it gets (spec.netns_path).
  std::optional<NetworkAttach> network;
  // From a template: keeps it from eviction until this Launch goes, by which time the VM's
  // overlay stands on the template's disk (see TemplateCache::evictUnused).
  std::shared_ptr<void> template_in_use;
};

class SandboxRuntime {
 public:
  // Boots, or restores launch.state_file, and returns once the agent answered (or, with
  // launch.options.stay_paused, once the guest is loaded and stopped).
  static Result<std::unique_ptr<SandboxRuntime>> start(const Launch& launch);
  // Starts QEMU waiting for launch.state_file (a child whose snapshot files must stay open
  // only while they load): load() and awaitAgent() finish the start.
  static Result<std::unique_ptr<SandboxRuntime>> prepare(const Launch& launch);
  // Takes charge of what an earlier daemon left running (see vmm::Vm::adopt).
  // `network`: the sandbox's network files, when the node has networking (its slot and gateway
  // are adopted too; a gateway that is gone is started again).
  static Result<std::unique_ptr<SandboxRuntime>> adopt(const vmm::VmAdoptSpec& spec,
                                                       const std::optional<NetworkAttach>& network);
  ~SandboxRuntime() = default;  // teardown: QEMU killed, files removed
  SandboxRuntime(const SandboxRuntime&) = delete;
  SandboxRuntime& operator=(const SandboxRuntime&) = delete;

  // prepare()d only: loads the state and starts the guest (QEMU needs no file it has not
  // opened after this), then waits for the agent's handshake.
  Status load(Clock::time_point deadline);
  Status awaitAgent(Clock::time_point deadline);

  Status pause() { return vm_->pause(); }
  Status resume() { return vm_->resume(); }
  // Saves the guest to `state_file` (see vmm::Vm::saveState). On success everything stops and
  // only the run directory stays (its disk and the state), and the runtime is empty; on
  // failure the guest is stopped but intact, and the caller decides whether it continues.
  Status suspendTo(const std::string& state_file, std::chrono::milliseconds timeout);
  // Stops everything but keeps the run directory (a suspended sandbox's files): for a resume
  // that must be undone. The runtime is empty afterwards.
  void release();
  // Leaves everything running and in place for the next daemon's adopt(); the runtime is
  // empty afterwards.
  void detach();

  // The host scheduling priority of everything the sandbox runs on the host (all QEMU threads).
  Status setHostNice(int nice);

  // The sandbox's slot and gateway; null on a node without networking.
  net::SandboxNetwork* network() { return network_.get(); }

  // The VM, for what only asks it (state, agent, console) or acts on the guest alone.
  vmm::Vm& vm() { return *vm_; }
  const vmm::Vm& vm() const { return *vm_; }

 private:
  SandboxRuntime(std::unique_ptr<net::SandboxNetwork> network, std::unique_ptr<vmm::Vm> vm, std::string state_file)
      : network_(std::move(network)), vm_(std::move(vm)), state_file_(std::move(state_file)) {}
  // Attaches the launch's network (if any) and points the spec at its slot.
  static Result<std::unique_ptr<net::SandboxNetwork>> attachNetwork(const Launch& launch, vmm::VmSpec& spec);
  // Declared before the VM, so destroyed after it: the gateway outlives QEMU, never the reverse.
  std::unique_ptr<net::SandboxNetwork> network_;
  std::unique_ptr<vmm::Vm> vm_;
  std::string state_file_;  // prepare()d: what load() loads
};

}  // namespace space::sandbox
