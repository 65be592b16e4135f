#include "sandbox/runtime.h"

#include <filesystem>

#include "common/process.h"

namespace space::sandbox {

Result<std::unique_ptr<net::SandboxNetwork>> SandboxRuntime::attachNetwork(const Launch& launch, vmm::VmSpec& spec) {
  if (!launch.network) return std::unique_ptr<net::SandboxNetwork>();
  auto network = launch.network->pool->attach(launch.network->policy, net::defaultPolicy(), launch.network->state_dir);
  if (!network.ok()) return network.error();
  spec.netns_path = network.value()->slot().netns_path;
  return std::move(network.value());
}

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::start(const Launch& launch) {
  vmm::VmSpec spec = launch.spec;
  auto network = attachNetwork(launch, spec);
  if (!network.ok()) return network.error();
  vmm::VmStartOptions options = launch.options;
  if (!launch.state_file.empty()) options.restore_from = launch.state_file;
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) return vm.error();
  try {
    return std::unique_ptr<SandboxRuntime>(new SandboxRuntime(std::move(network.value()), std::move(vm.value()), ""));
  } catch (...) {
    // The allocation failed (the Vm is still here): a run directory it reuses (a suspended
    // sandbox's disk and saved state) must outlive it, as SandboxRuntime::release keeps it.
    if (options.reuse_run_dir) {
      vm.value()->quit();
      vm.value()->detach();
    }
    throw;
  }
}

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::prepare(const Launch& launch) {
  if (launch.state_file.empty()) return makeError(ErrorCode::kInvalidArgument, "prepare() needs a state to restore");
  vmm::VmSpec spec = launch.spec;
  auto network = attachNetwork(launch, spec);
  if (!network.ok()) return network.error();
  auto vm = vmm::Vm::prepare(spec, launch.options);
  if (!vm.ok()) return vm.error();
  return std::unique_ptr<SandboxRuntime>(
      new SandboxRuntime(std::move(network.value()), std::move(vm.value()), launch.state_file));
}

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::adopt(const vmm::VmAdoptSpec& spec,
                                                              const std::optional<NetworkAttach>& network) {
  auto vm = vmm::Vm::adopt(spec);
  if (!vm.ok()) return vm.error();
  std::unique_ptr<net::SandboxNetwork> adopted;
  // A VM started before this node had networking has no attachment, and no NIC.
  std::error_code ec;
  if (network && std::filesystem::exists(network->state_dir + "/" + net::kAttachmentFile, ec)) {
    auto found = network->pool->adopt(network->state_dir);
    if (!found.ok()) {
      vm.value()->detach();  // what it had is still recorded; the caller decides
      return makeError(found.error().code, "its network: " + found.error().message);
    }
    adopted = std::move(found.value());
  }
  return std::unique_ptr<SandboxRuntime>(new SandboxRuntime(std::move(adopted), std::move(vm.value()), ""));
}

Status SandboxRuntime::load(Clock::time_point deadline) { return vm_->loadPrepared(state_file_, deadline); }

Status SandboxRuntime::awaitAgent(Clock::time_point deadline) { return vm_->awaitAgent(deadline); }

Status SandboxRuntime::suspendTo(const std::string& state_file, std::chrono::milliseconds timeout) {
  // Its policy comes back with it: on disk before anything records the sandbox as suspended.
  if (network_) SPACE_TRY(network_->persistPolicy());
  SPACE_TRY(vm_->saveState(state_file, timeout));  // its disks synced before the state is published
  release();
  return okStatus();
}

void SandboxRuntime::release() {
  vm_->quit();
  vm_->detach();     // the run directory stays: it holds the disk and the saved state
  network_.reset();  // the gateway stops and the slot goes back; the network's files stay
}

void SandboxRuntime::detach() {
  vm_->detach();
  if (network_) network_->detach();
}

Status SandboxRuntime::setHostNice(int nice) {
  if (vm_->pid() <= 0) return makeError(ErrorCode::kFailedPrecondition, "no QEMU process");
  return setProcessNice(vm_->pid(), nice);
}

}  // namespace space::sandbox
