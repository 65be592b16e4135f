// Builds the QEMU `microvm` command line for a VM. Pure: no files are touched, so the exact
// argv is unit-tested. The device set is fixed and minimal (virtio-mmio only): root disk,
// serial console to a file, one virtio-serial port for the guest agent, virtio-rng.
#pragma once

#include <string>
#include <vector>

#include "vmm/vm_spec.h"

namespace space::vmm {

// Files of one running VM, all inside its run directory.
struct VmPaths {
  std::string run_dir;
  std::string qmp_socket;
  std::string agent_socket;
  std::string console_log;
  std::string disk;  // what QEMU opens as the root disk (overlay or the image itself)
  std::string pid_file;
  static VmPaths inRunDir(const std::string& run_dir);
};

// The virtio-serial port name the guest agent listens on (/dev/virtio-ports/<name>).
inline constexpr const char* kAgentPortName = "space.agent";

// What the guest's virtio-rng may deliver: this many bytes per period.
inline constexpr int kRngBytesPerPeriod = 65536;
inline constexpr int kRngPeriodMs = 1000;

// The descriptor QEMU gets its network slot's tap on (a VM with spec.netns_path): its owner
// opens the tap in the slot and passes it, so QEMU needs neither /dev/net/tun nor a right to
// attach.
inline constexpr int kTapFd = 4;

// Kernel arguments SPACE always passes; spec.extra_cmdline follows them.
std::string kernelCmdline(const VmSpec& spec);

// `accelerator` must be resolved (kKvm or kTcg).
std::vector<std::string> buildQemuArgv(const VmSpec& spec, const VmPaths& paths, Accelerator accelerator);

}  // namespace space::vmm
