#include "sandbox/runtime.h"

#include "common/process.h"

namespace space::sandbox {

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::start(const Launch& launch) {
  vmm::VmStartOptions options = launch.options;
  if (!launch.state_file.empty()) options.restore_from = launch.state_file;
  auto vm = vmm::Vm::start(launch.spec, options);
  if (!vm.ok()) return vm.error();
  return std::unique_ptr<SandboxRuntime>(new SandboxRuntime(std::move(vm.value()), ""));
}

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::prepare(const Launch& launch) {
  if (launch.state_file.empty()) return makeError(ErrorCode::kInvalidArgument, "prepare() needs a state to restore");
  auto vm = vmm::Vm::prepare(launch.spec, launch.options);
  if (!vm.ok()) return vm.error();
  return std::unique_ptr<SandboxRuntime>(new SandboxRuntime(std::move(vm.value()), launch.state_file));
}

Result<std::unique_ptr<SandboxRuntime>> SandboxRuntime::adopt(const vmm::VmAdoptSpec& spec) {
  auto vm = vmm::Vm::adopt(spec);
  if (!vm.ok()) return vm.error();
  return std::unique_ptr<SandboxRuntime>(new SandboxRuntime(std::move(vm.value()), ""));
}

Status SandboxRuntime::load(Clock::time_point deadline) { return vm_->loadPrepared(state_file_, deadline); }

Status SandboxRuntime::awaitAgent(Clock::time_point deadline) { return vm_->awaitAgent(deadline); }

Status SandboxRuntime::suspendTo(const std::string& state_file, std::chrono::milliseconds timeout) {
  SPACE_TRY(vm_->saveState(state_file, timeout));
  release();
  return okStatus();
}

void SandboxRuntime::release() {
  vm_->quit();
  vm_->detach();  // the run directory stays: it holds the disk and the saved state
}

void SandboxRuntime::detach() { vm_->detach(); }

Status SandboxRuntime::setHostNice(int nice) {
  if (vm_->pid() <= 0) return makeError(ErrorCode::kFailedPrecondition, "no QEMU process");
  return setProcessNice(vm_->pid(), nice);
}

}  // namespace space::sandbox
