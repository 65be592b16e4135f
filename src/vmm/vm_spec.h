// What a microVM is made of (VmSpec), what the host can give (HostCapacity), and the check
// between them. Validation happens before anything is started, so a refused spec leaves no trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::vmm {

enum class Accelerator { kAuto, kKvm, kTcg };
const char* acceleratorName(Accelerator a);
Result<Accelerator> parseAccelerator(const std::string& name);

// How the guest's root disk is attached.
enum class DiskMode {
  kOverlay,  // a private qcow2 overlay over the read-only base image (the default)
  kDirect,   // the image itself, writable: only for images the VM owns
};

// A rate of guest disk I/O: bytes and requests per second, reads and writes together. 0: none.
struct DiskIoRate {
  uint64_t bytes_per_sec = 0;
  uint64_t iops = 0;
  bool limited() const { return bytes_per_sec != 0 || iops != 0; }
};

// Under TCG, the translation buffer a VM's QEMU gets unless told otherwise (VmSpec and a node's
// --tcg-tb-mib), in MiB.
inline constexpr uint32_t kDefaultTcgTbSizeMib = 128;
// QEMU's own translation buffer size on 64-bit hosts, used when a spec leaves it at 0.
inline constexpr uint32_t kQemuDefaultTcgTbSizeMib = 1024;

// A disk image below a VM's overlay, as QEMU is given it.
struct DiskLayer {
  std::string path;
  std::string format;  // "qcow2" or "raw"
};

struct VmSpec {
  std::string kernel_path;            // uncompressed ELF vmlinux with a PVH note
  std::string rootfs_path;            // ext4 image (or, for a restored VM, the snapshot's qcow2 disk)
  std::string rootfs_format = "raw";  // "raw" or "qcow2": the overlay's backing format
  DiskMode disk_mode = DiskMode::kOverlay;
  uint32_t vcpus = 2;
  uint64_t memory_mib = 512;
  Accelerator accelerator = Accelerator::kAuto;
  // Guest RAM in a file (memory-backend-file) instead of anonymous memory. Shared: the file is
  // the RAM (a snapshot then needs only device state). Private: a copy-on-write mapping of the
  // file, which stays unchanged (a restored clone).
  std::string memory_file;
  bool memory_private = false;
  // Start with `-incoming defer`: the guest comes from a snapshot (Vm::restore), not a boot.
  bool incoming = false;
  // Start with the vCPUs stopped (-S): with `incoming`, the restored guest never runs until
  // told to (a snapshot being re-saved must not execute and diverge from its disk).
  bool start_paused = false;
  // The sandbox's slot (net/slot.h): QEMU starts inside this network namespace and the guest
  // gets a virtio-net NIC on the slot's tap. Empty: no NIC at all. A snapshot taken with a NIC
  // restores only into a VM with one (the device list is part of the saved state).
  std::string netns_path;
  // Appended after SPACE's own kernel arguments (later ones win, e.g. init=).
  std::string extra_cmdline;
  std::chrono::milliseconds boot_timeout{60000};
  std::string qemu_binary = "qemu-system-x86_64";
  // TCG only: the size of QEMU's translation buffer in MiB (`-accel tcg,tb-size=`); 0 leaves
  // QEMU's own default (1 GiB here). The buffer is never given back and is emptied only when
  // full, so a guest that keeps running new code grows it to the whole size; 128 MiB cost no
  // measurable latency (bench/RESULTS.md, "QEMU's memory") where 1 GiB lets one guest's QEMU
  // hold eight times that. Not in the migration stream: any size restores any snapshot.
  uint32_t tcg_tb_size_mib = kDefaultTcgTbSizeMib;
  // QEMU holds the guest's disk to this rate from its first request (Vm::limitDiskIo; not saved
  // state, so set at every start). Sandboxes get their node's rate per vCPU (vmDiskIoLimits).
  DiskIoRate disk_io;
  // kOverlay: the images below the overlay, top first, given to QEMU as block nodes of their own
  // with image locking off (qemu_command.cc). Filled by Vm at start from the overlay's headers;
  // empty: QEMU follows the headers itself.
  std::vector<DiskLayer> disk_backing;
};

struct HostCapacity {
  uint32_t max_vcpus = 0;             // most vCPUs one VM may have
  uint64_t available_memory_mib = 0;  // MemAvailable now
};

inline constexpr uint64_t kMinMemoryMib = 128;

// Reads the host's CPU count and available memory.
Result<HostCapacity> probeHostCapacity();
// Parses /proc/meminfo text for MemAvailable (exposed for tests).
Result<uint64_t> parseMemAvailableMib(const std::string& meminfo);

// Refuses impossible specs with a message naming the value and the reason.
Status validateSpec(const VmSpec& spec, const HostCapacity& host);

}  // namespace space::vmm
