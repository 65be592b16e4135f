// space-vm: boots one microVM from the guest images and runs a command in it. The low-level
// tool of the VM layer (no daemon, no state): for `make run`, for debugging images, and for the
// boot benchmark. Exit code: the guest command's, or 2 for usage errors, 3 when the VM failed.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/default_images.h"
#include "common/log.h"
#include "vmm/vm.h"

namespace {

using namespace space;
using namespace space::vmm;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "space-vm: boot one SPACE microVM (QEMU microvm) and run a command in it.\n"
      "Example: space-vm run -- uname -a"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  bool log_json = false;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  app.add_flag("--log-json", log_json, "log one JSON object per line (stderr)");

  VmSpec spec;
  spec.kernel_path = cli::defaultImagePath("SPACE_KERNEL", "vmlinux");
  spec.rootfs_path = cli::defaultImagePath("SPACE_ROOTFS", "rootfs.ext4");
  std::string accel = "auto";
  double boot_timeout_s = 60;
  double exec_timeout_s = 60;
  bool json = false;
  VmStartOptions options;
  std::vector<std::string> command;

  auto* run = app.add_subcommand("run", "boot a VM, run one shell command in it, print its output, power off");
  run->add_option("--kernel", spec.kernel_path, "guest kernel (ELF vmlinux); env SPACE_KERNEL")->capture_default_str();
  run->add_option("--rootfs", spec.rootfs_path, "root filesystem image (ext4); env SPACE_ROOTFS")
      ->capture_default_str();
  run->add_option("--cpus", spec.vcpus, "vCPUs")->capture_default_str();
  run->add_option("--memory", spec.memory_mib, "guest memory in MiB (min 128)")->capture_default_str();
  std::string qemu = cli::defaultQemuBinary();
  run->add_option("--qemu", qemu, "QEMU binary; env SPACE_QEMU (default: SPACE's own, else the one in PATH)")
      ->capture_default_str();
  run->add_option("--accel", accel, "accelerator: auto (KVM if real hardware KVM, else TCG), kvm, tcg")
      ->capture_default_str();
  run->add_option("--cmdline", spec.extra_cmdline, "extra kernel arguments");
  run->add_option("--boot-timeout", boot_timeout_s, "seconds to wait for the guest to come up")->capture_default_str();
  run->add_option("--timeout", exec_timeout_s, "seconds the command may run")->capture_default_str();
  run->add_option("--run-dir", options.run_root, "parent of per-VM runtime directories")->capture_default_str();
  run->add_flag("--json", json, "print one JSON object: exit_code, stdout, stderr, timings");
  run->add_option("command", command,
                  "command to run in the guest (after --): one argument is a bash command line, several an argv")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (100+) would hide the documented contract: 2 for any usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (auto st = initLogging(log_level, log_json); !st.ok()) {
    std::cerr << "space-vm: " << st.error().message << "\n";
    return 2;
  }
  auto parsed = parseAccelerator(accel);
  if (!parsed.ok()) {
    std::cerr << "space-vm: " << parsed.error().message << "\n";
    return 2;
  }
  // The node's facts as spaced resolves them, so a guest started here boots as its guests do
  // (the same accelerator choice and kernel arguments).
  auto facts = probeNodeFacts(parsed.value(), qemu);
  if (!facts.ok()) {
    std::cerr << "space-vm: " << facts.error().message << "\n";
    return 2;
  }
  spec.accelerator = facts->accelerator.accelerator;
  spec.qemu_binary = facts->qemu_binary;
  const std::string node_args = facts->guestKernelArgs(spec.accelerator);
  if (!node_args.empty()) spec.extra_cmdline = node_args + (spec.extra_cmdline.empty() ? "" : " " + spec.extra_cmdline);
  options.node = &facts.value();
  spec.boot_timeout = std::chrono::milliseconds(static_cast<int64_t>(boot_timeout_s * 1000));

  auto vm = Vm::start(spec, options);
  if (!vm.ok()) {
    std::cerr << "space-vm: cannot start the VM (" << errorCodeName(vm.error().code) << "): " << vm.error().message
              << "\n";
    return vm.error().code == ErrorCode::kInvalidArgument || vm.error().code == ErrorCode::kNotFound ? 2 : 3;
  }
  agentproto::CommandSpec exec_spec;
  if (command.size() == 1) {
    exec_spec.command = command[0];  // a command line as typed, through bash -l -c
  } else {
    exec_spec.argv = command;
  }
  exec_spec.timeout = std::chrono::milliseconds(static_cast<int64_t>(exec_timeout_s * 1000));
  auto result = (*vm)->exec(exec_spec);
  auto down = (*vm)->shutdown(std::chrono::seconds(10));
  if (!down.ok()) std::cerr << "space-vm: warning: " << down.error().message << "\n";
  if (!result.ok()) {
    std::cerr << "space-vm: command failed (" << errorCodeName(result.error().code) << "): " << result.error().message
              << "\n";
    return 3;
  }
  const auto& timing = (*vm)->bootTiming();
  if (json) {
    nlohmann::json out{{"exit_code", result->exit_code},
                       {"stdout", result->stdout_data},
                       {"stderr", result->stderr_data},
                       {"accelerator", acceleratorName((*vm)->accelerator())},
                       {"guest_kernel", (*vm)->guestInfo().kernel},
                       {"pid", result->pid},
                       {"duration_ms", result->duration.count()},
                       {"boot",
                        {{"qmp_ms", timing.to_qmp.count()},
                         {"ready_ms", timing.to_ready.count()},
                         {"guest_uptime_at_init_s", timing.guest_uptime_at_init_s}}}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fwrite(result->stdout_data.data(), 1, result->stdout_data.size(), stdout);
    std::fwrite(result->stderr_data.data(), 1, result->stderr_data.size(), stderr);
  }
  return result->exit_code;
}
