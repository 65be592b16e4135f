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

// The descriptors QEMU gets its monitor's and its agent port's sockets on: listening sockets
// its owner bound at paths.qmp_socket and paths.agent_socket, so QEMU makes no file of its own
// (a jailed one cannot: space-jail --no-new-files) and the paths stay there for the owner, or a
// restarted one, to connect to.
inline constexpr int kQmpFd = 5;
inline constexpr int kAgentFd = 6;

// The largest file a jailed QEMU may write (space-jail --file-size, RLIMIT_FSIZE), from the
// sizes of the guest's disk and memory: the largest file it writes legitimately is its disk's
// overlay (at most the disk's size, plus qcow2's tables: about 1/6500 of it, here allowed
// 1/128) or its memory file (the memory's size); 64 MiB more for headers and its logs. It
// writes only files it was given and makes none (--no-new-files), so this bounds what a QEMU
// that escaped its guest can put on the node's disk without a quota: a few times its own sizes.
uint64_t qemuFileSizeLimit(uint64_t disk_bytes, uint64_t memory_mib);

// Kernel arguments SPACE always passes; spec.extra_cmdline follows them.
std::string kernelCmdline(const VmSpec& spec);

// `accelerator` must be resolved (kKvm or kTcg).
std::vector<std::string> buildQemuArgv(const VmSpec& spec, const VmPaths& paths, Accelerator accelerator);

}  // namespace space::vmm
