// Facts about this node that starting a VM needs and that do not change while spaced runs:
// which accelerator VMs get, how many CPUs the host has, which QEMU binary runs, and the host's
// TSC frequency. They are resolved once, at start, so that no create pays for a /dev/kvm ioctl,
// a PATH walk or a calibration. (The host's free memory is not among them: it changes with every
// VM, so it is read again for each start; see vmm::availableMemoryMib.)
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "jail/cgroup.h"
#include "vmm/accelerator.h"
#include "vmm/vm_spec.h"
#include "vmm/vm_users.h"

namespace space::vmm {

struct NodeFacts {
  AcceleratorChoice accelerator{Accelerator::kTcg, ""};  // for a VM that asks for kAuto
  KvmProbe kvm;             // what chooseAccelerator() needs for a VM that names its accelerator
  uint32_t max_vcpus = 1;   // online CPUs: the most one VM may have
  std::string qemu_binary;  // absolute path
  // The host's TSC frequency in kHz, or 0 where unknown. Under TCG a guest's TSC runs
  // at the host's rate, but the guest's calibration of it against the emulated PIT fails on a
  // busy host; the kernel then falls back to the jiffies clocksource, whose periodic tick never
  // stops and costs an idle guest ~5% of a core (bench/RESULTS.md, idle CPU). Telling the
  // guest the frequency (tsc_early_khz=) skips that calibration.
  uint64_t tsc_khz = 0;
  // How this node confines its VMs (docs/threat-model.md, "Jails"): each QEMU starts through
  // `jailer` (space-jail) in a cgroup of its own under `cgroups` (when usable), limited by its
  // size (vmCgroupLimits). Empty jailer: QEMU starts directly (one-off tools, tests of the VM
  // layer that do not ask for a jail).
  std::string jailer;
  jail::CgroupLayout cgroups;
  // Where a jailed VM's disk layers may be: canonical directories where only spaced makes names
  // (snapshot layers, templates), and the exact image files (as configured, maybe links, and
  // what they resolve to). A layer's name comes from a qcow2 header, which a hostile QEMU can
  // rewrite; a name elsewhere is refused, never opened or put in a jail's view.
  std::vector<std::string> disk_roots;
  std::vector<std::string> disk_images;
  // The uids jailed QEMUs run as, one each (vmm/vm_users.h). Null: uid 0 without capabilities.
  std::shared_ptr<VmUsers> vm_users;
  // How much of the host's disk one vCPU of a sandbox may use (vmDiskIoLimits). Zero: no limit
  // (spaced sets --disk-mib-per-vcpu and --disk-iops-per-vcpu).
  DiskIoRate disk_io_per_vcpu;
  // Under TCG, each VM's translation buffer in MiB (VmSpec::tcg_tb_size_mib; spaced sets
  // --tcg-tb-mib). The node counts it in every VM's share of its memory (tcgBufferMib).
  uint32_t tcg_tb_size_mib = kDefaultTcgTbSizeMib;

  // The kernel arguments every guest of this node gets under `accelerator`, after SPACE's own.
  std::string guestKernelArgs(Accelerator accelerator) const;
};

// Probes the host once. kInvalidArgument if `requested` is kvm and the host has no usable KVM;
// kNotFound if `qemu_binary` is not an executable (a name is looked up in PATH).
Result<NodeFacts> probeNodeFacts(Accelerator requested, const std::string& qemu_binary = "qemu-system-x86_64");

// `binary` if it names a path, else the first executable of that name in PATH.
Result<std::string> findExecutable(const std::string& binary);

// Whether only root (or `trusted_uid`, the daemon's own user) can change what the absolute,
// link-free `path` runs: the file and every directory above it are owned by one of them and
// writable by no one else (a group of gid 0 aside). A world-writable directory passes only with
// its sticky bit set, since the next component must then be a trusted one's. spaced runs the QEMU
// it names for every sandbox: a binary another user could replace would run as root.
// kPermissionDenied, naming the component, otherwise.
Status checkTrustedExecutable(const std::string& path, uid_t trusted_uid);

// The source version of an installed Debian package, from dpkg's status database (its text):
// the version of "Source: name (version)", else the package's own Version. Nullopt when the
// package is not installed.
std::optional<std::string> installedSourceVersion(std::string_view dpkg_status, std::string_view package);

// When `qemu_binary` is SPACE's build (images/build-qemu.sh, a manifest.json beside it) and the
// installed Debian QEMU it was built from has moved on (a security update), what to tell the
// operator; nullopt when they agree or either is unknown.
std::optional<std::string> staleQemuBuild(const std::string& qemu_binary,
                                          const std::string& dpkg_status_file = "/var/lib/dpkg/status");

// staleQemuBuild, asked again while the node runs (a security update installed without a
// restart): dpkg's status file is read again only when it changed (inode, size, mtime), so each
// check() costs one stat. The first stale answer, and the first one after it was fixed, are
// logged. Thread-safe.
class QemuBuildWatch {
 public:
  explicit QemuBuildWatch(std::string qemu_binary, std::string dpkg_status_file = "/var/lib/dpkg/status");
  // What to tell the operator; nullopt while the build agrees with the installed QEMU.
  std::optional<std::string> check();

 private:
  const std::string qemu_binary_;
  const std::string dpkg_status_file_;
  std::mutex mu_;
  bool checked_ = false;
  struct FileState {
    uint64_t inode = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileState&) const = default;
  } seen_;
  std::optional<std::string> stale_;
};

// Measures the TSC against CLOCK_MONOTONIC_RAW over `window_ms`, in kHz (within ~10 ppm over
// 100 ms). 0 on hosts without a TSC. A guest keeps the figure it is given for its whole life, so
// its clock drifts by the figure's error: it is measured, not rounded.
uint64_t measureTscKhz(int window_ms = 100);

// The figure to use from now on: the one remembered in `file` if `measured` agrees with it
// within 100 ppm (so the template key, which names it, is the same at every start), else
// `measured`, which is then remembered (crash-safe write). `measured` 0: 0.
uint64_t rememberedTscKhz(const std::string& file, uint64_t measured);

// What a QEMU holds of the host's memory beyond its guest's and its translation buffer: its heap,
// TCG's bookkeeping of what it translated, and a share of its program and libraries. Measured
// under TCG (bench/RESULTS.md, 2026-12-07, "QEMU's own memory"): 13 MiB private when idle, 27
// after busy use, plus 9 MiB of files shared by every QEMU of the node. A node counts it in each
// VM's share of its memory, as it counts the buffer (qemuShareMib); the cgroup's limit allows far
// more (vmCgroupLimits).
inline constexpr uint64_t kQemuOwnMemoryMib = 32;
// What a new VM holds of its node's memory beyond its guest's: QEMU's own memory and, under TCG,
// its translation buffer (tcgBufferMib).
uint64_t qemuShareMib(Accelerator accelerator, uint32_t tb_size_mib);

// What a VM's translation buffer may grow to, in MiB: under TCG `tb_size_mib` (0: QEMU's own
// default, 1 GiB), under KVM nothing (there is no translation). A node counts it in each VM's
// share of its memory (sandbox/manager.h), beside the guest's.
uint64_t tcgBufferMib(Accelerator accelerator, uint32_t tb_size_mib);
// The same for a running QEMU, from its command line as /proc/<pid>/cmdline gives it (arguments
// NUL-separated): an `-accel tcg...` without `tb-size=` has QEMU's default; no TCG, nothing. A
// QEMU may have rewritten its own, so a caller takes it as a claim to check against a floor.
uint64_t tcgBufferMibOfCommandLine(std::string_view cmdline);
// What a node counts for an adopted TCG QEMU's buffer: what its command line says, within
// [floor_mib (a new VM's), most_mib]: a QEMU that rewrote its command line must not make the
// node look full to others. `most_mib`: tcgBufferMibWithin its cgroup's memory limit where it
// has one, else QEMU's default or the node's setting, whichever is larger.
uint64_t adoptedTcgBufferMib(std::string_view cmdline, uint64_t floor_mib, uint64_t most_mib);
// The translation buffer a VM's cgroup memory limit (vmCgroupLimits) left room for, in MiB: the
// limit less the guest's memory and QEMU's own allowance (0 if it leaves none).
uint64_t tcgBufferMibWithin(uint64_t memory_limit_bytes, uint64_t memory_mib, uint32_t vcpus);

// A VM's cgroup limits: its memory plus QEMU's own (384 MiB and 64 MiB per vCPU; under TCG also
// the translation buffer, tcgBufferMib), a bound on its tasks, and
// CPU time for its vCPUs and one more thread (QEMU's main loop and I/O), and on each of
// `io_devices` (the disks its files are on) four times its guest's disk rate (VmSpec::disk_io),
// for reads and for writes each: room for QEMU's own I/O for what its guest may do (a guest's
// write to a cluster not yet in its overlay is a read, a write and a table update on the host;
// a restored memory file is read in), and a bound on a QEMU that escaped its guest, which QEMU's
// own throttle no longer holds (on v1 reads and direct writes only: cgroup.h).
jail::CgroupLimits vmCgroupLimits(const VmSpec& spec, Accelerator accelerator,
                                  const std::vector<std::string>& io_devices = {});

// A sandbox's disk limits (VmSpec::disk_io): the node's rate per vCPU times its vCPUs. QEMU
// enforces them on the guest's disk device, where a guest's requests wait their turn whatever
// the host's cgroup version or the disk under the data directory (a v1 cgroup's I/O controller
// would not see QEMU's buffered writes). The VM's cgroup holds QEMU itself to a multiple of
// them (vmCgroupLimits).
DiskIoRate vmDiskIoLimits(uint32_t vcpus, const NodeFacts& node);
inline DiskIoRate vmDiskIoLimits(const VmSpec& spec, const NodeFacts& node) { return vmDiskIoLimits(spec.vcpus, node); }

// MemAvailable from /proc/meminfo, now.
Result<uint64_t> availableMemoryMib();

}  // namespace space::vmm
