// Control groups for VMs. Each QEMU runs in a group of its own whose limits come from its
// sandbox's size (memory, tasks, CPU time, and disk I/O where the host offers it): they bound
// what a guest can make its QEMU do to the host and the other sandboxes, and what a QEMU that
// escaped its guest can do (its view holds no cgroup filesystem, and it runs as a uid of its own
// without capabilities: it cannot leave or change its group; docs/threat-model.md).
// The groups live under a "space" group beside spaced's own (on v2 under systemd, spaced's unit
// needs Delegate=yes). Both layouts are supported: v1 (a hierarchy per controller, as on hybrid
// hosts) and v2 (the unified hierarchy).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace space::jail {

enum class CgroupVersion { kNone, kV1, kV2 };
const char* cgroupVersionName(CgroupVersion v);

// One hierarchy's directory under which VMs' groups are made.
struct CgroupRoot {
  std::string controller;  // v1: "memory", "pids", "cpu" or "blkio"; v2: "" (all in one)
  std::string dir;         // e.g. /sys/fs/cgroup/memory/<spaced's group>/space
};

struct CgroupLayout {
  CgroupVersion version = CgroupVersion::kNone;
  std::vector<CgroupRoot> roots;
  // v2 only: spaced's own group, and the leaf spaced moves into so that its own group may
  // hand controllers down (a v2 group with processes cannot). Empty when spaced is in the root.
  std::string v2_own_dir;
  std::string v2_daemon_leaf;
  std::string why_none;  // kNone: what is missing
  // Whether groups can be given disk I/O limits: v1, a blkio hierarchy (a root of its own);
  // v2, the io controller handed down; and a kernel that throttles (CONFIG_BLK_DEV_THROTTLING,
  // without which the controller has no limit files: setUpCgroups looks). Optional: a host
  // without it still jails its VMs.
  bool io = false;
  bool usable() const { return version != CgroupVersion::kNone; }
};

// Where VMs' groups go, from the text of /proc/self/mountinfo, /proc/self/cgroup and, for a
// v2 hierarchy, its cgroup.controllers. v1 is used where memory, pids and cpu are all mounted
// as v1 hierarchies; else v2 where its hierarchy offers all three; else none (why_none says).
// blkio (v1) or io (v2) is used where there too.
CgroupLayout planCgroupLayout(std::string_view mountinfo, std::string_view self_cgroup,
                              std::string_view v2_controllers);

// Plans the layout of this host and makes it ready: the roots (each planned root's group
// `instance`, so that two daemons on one host never sweep each other's groups) exist and, on
// v2, spaced sits in a leaf and the controllers are handed down. kUnavailable (with the
// reason) if this host has no usable layout or it cannot be written (not root, a read-only
// cgroupfs); kInvalidArgument for a bad instance name.
Result<CgroupLayout> setUpCgroups(const std::string& instance);

// A limit on one block device's I/O, for reads and for writes each. 0: none.
struct CgroupIoLimit {
  std::string device;  // "MAJOR:MINOR" of a whole disk (blockDeviceUnder)
  uint64_t bytes_per_sec = 0;
  uint64_t iops = 0;
};

struct CgroupLimits {
  uint64_t memory_bytes = 0;  // 0: none
  uint32_t pids = 0;          // 0: none
  uint64_t cpu_quota_us = 0;  // per period; 0: none
  uint64_t cpu_period_us = 100000;
  // Written only where the layout has `io`. On v1 the kernel holds reads and direct writes to
  // them; buffered writes are written back by its flusher threads, in no group (writeback is
  // charged to the writer's group on v2 only).
  std::vector<CgroupIoLimit> io;
};

// The whole disk ("MAJOR:MINOR") that holds `path`'s filesystem, as a group's I/O limits name
// it: the kernel takes limits on disks, not partitions, so a partition's disk is named. None
// for a filesystem on no block device the kernel lists in `sysfs`/dev/block (tmpfs, overlayfs,
// NFS, and btrfs, whose files report a device number of its own).
std::optional<std::string> blockDeviceUnder(const std::string& path, const std::string& sysfs = "/sys");

// The same layout one level down: each root's group `name` (made if missing; on v2 it hands
// the controllers on). Holds the groups of confined processes other than VMs (the network
// gateways), apart from the VMs' own, so that recovery's search for processes no VM owns never
// reaches them: a nested group's own cgroup.procs is empty. removeEmptyVmGroups removes the
// group once it is empty: its owner calls this again before it makes a group there.
Result<CgroupLayout> nestedLayout(const CgroupLayout& layout, const std::string& name);
// The nested group of the network gateways' groups (net::NetworkPool::useCgroups).
inline constexpr const char* kGatewayGroups = "gateways";

// A VM's group (or a gateway's, under a nestedLayout): the same name under every root.
class VmCgroup {
 public:
  // Makes the group (an existing one of the name, left by a VM that ended while spaced was
  // down, is taken over) and writes the limits. On failure, what it made is removed again; a
  // group that was there stays. Disk I/O limits the kernel refuses (a device it does not
  // throttle) fail nothing: the group is made without them, and ioLimitError() says why.
  static Result<VmCgroup> create(const CgroupLayout& layout, const std::string& name, const CgroupLimits& limits);
  // The group of a VM started earlier (re-adoption after a restart): nothing is written.
  static VmCgroup existing(const CgroupLayout& layout, const std::string& name);

  VmCgroup() = default;
  const std::vector<std::string>& dirs() const { return dirs_; }
  const std::string& ioLimitError() const { return io_error_; }
  // The files a process writes its pid to, to join the group (one per hierarchy).
  std::vector<std::string> procsFiles() const;
  // The processes in the group, in any of its hierarchies (none when it does not exist).
  std::vector<pid_t> processes() const;
  // Whether `pid` is in the group in every hierarchy (false for a group of no hierarchy).
  bool holds(pid_t pid) const;
  // The memory limit written to the group (memory.max on v2, memory.limit_in_bytes on v1);
  // nullopt where there is none or it cannot be read. Only spaced writes it: a jailed process
  // has no cgroup filesystem in its view.
  std::optional<uint64_t> memoryLimitBytes() const;
  // Removes the group. Its processes must have exited: a group still in use stays (kUnavailable).
  Status remove();
  // Forgets the group without removing it (it stays for a later owner).
  void release() { dirs_.clear(); }

 private:
  std::vector<std::string> dirs_;
  std::string io_error_;
};

// The processes a group directory's cgroup.procs lists (none if it cannot be read). On v2 a
// process outside the reader's PID namespace is listed as 0.
std::vector<pid_t> processesInGroupDir(const std::string& dir);

// Removes every empty group under the roots: those of VMs that ended while spaced was down.
// Groups still holding a process stay. How many went.
int removeEmptyVmGroups(const CgroupLayout& layout);

// A valid group name: what a run directory's base name looks like (no '/', not "." or "..").
bool validGroupName(std::string_view name);

}  // namespace space::jail
