#include "vmm/vm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <linux/magic.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "common/digest.h"
#include "net/addressing.h"
#include "vmm/accelerator.h"
#include "vmm/disk_overlay.h"

namespace space::vmm {

namespace {

using nlohmann::json;
using std::chrono::milliseconds;

milliseconds since(Clock::time_point t) { return std::chrono::duration_cast<milliseconds>(Clock::now() - t); }

void logAcceleratorOnce(const AcceleratorChoice& choice) {
  // Said once per process: every VM on this host makes the same choice for the same reason.
  static std::once_flag once;
  std::call_once(once,
                 [&] { spdlog::info("vmm: accelerator {} ({})", acceleratorName(choice.accelerator), choice.reason); });
}

// A VM's disk starts as disk.qcow2; each freezeDisk() moves it onto a new overlay named
// disk-<n>.qcow2 (n counting up). Names QEMU opened are never renamed or reused, because QEMU
// may reopen an image by its name (e.g. when it re-activates images after a migration).
int diskNumber(const std::string& name) {
  if (name == "disk.qcow2") return 0;
  if (name.rfind("disk-", 0) != 0 || name.size() <= 11 || name.substr(name.size() - 6) != ".qcow2") return -1;
  const std::string digits = name.substr(5, name.size() - 11);
  if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

std::string diskName(int n) { return n == 0 ? "disk.qcow2" : "disk-" + std::to_string(n) + ".qcow2"; }

// The VM's current disk: the highest-numbered one. With `pid` (re-adopting a running QEMU), the
// highest one QEMU has open: a freeze cut short may have made a newer overlay that QEMU never
// switched to, which is removed. If no open disk can be seen (/proc unreadable), nothing is
// removed: deleting a disk in use would lose the sandbox.
std::string currentDisk(const std::string& run_dir, pid_t pid) {
  std::vector<int> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    int n = diskNumber(entry.path().filename().string());
    if (n >= 0) found.push_back(n);
  }
  if (found.empty()) return run_dir + "/disk.qcow2";
  std::sort(found.rbegin(), found.rend());
  if (pid <= 0) return run_dir + "/" + diskName(found.front());
  for (size_t i = 0; i < found.size(); ++i) {
    if (!processHasOpen(pid, run_dir + "/" + diskName(found[i]))) continue;
    for (size_t j = 0; j < i; ++j) std::filesystem::remove(run_dir + "/" + diskName(found[j]), ec);
    return run_dir + "/" + diskName(found[i]);
  }
  spdlog::warn("vmm: cannot see which disk QEMU {} has open; assuming the newest", pid);
  return run_dir + "/" + diskName(found.front());
}

// Every disk name in a run directory (its overlay and the layers below it that were frozen
// there), on stable storage: QEMU never flushes them itself (qemu_command.cc, cache.no-flush).
// Layers already synced cost next to nothing. Never through a link (fsyncPath), and a FIFO
// planted there fails the sync rather than blocking it.
Status syncRunDirDisks(const std::string& run_dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    if (diskNumber(entry.path().filename().string()) < 0) continue;
    SPACE_TRY(fsyncPath(entry.path().string()));
  }
  if (ec) return makeError(ErrorCode::kInternal, "cannot list " + run_dir + ": " + ec.message());
  return okStatus();
}

}  // namespace

Result<std::unique_ptr<Vm>> Vm::start(const VmSpec& spec, const VmStartOptions& options) {
  return launch(spec, options, /*defer_state=*/false);
}

Result<std::unique_ptr<Vm>> Vm::launch(const VmSpec& spec, const VmStartOptions& options, bool defer_state) {
  HostCapacity host;
  if (options.host_capacity) {
    host = *options.host_capacity;
  } else if (options.node) {
    auto available = availableMemoryMib();
    if (!available.ok()) return available.error();
    host = HostCapacity{options.node->max_vcpus, available.value()};
  } else {
    auto probed = probeHostCapacity();
    if (!probed.ok()) return probed.error();
    host = probed.value();
  }
  SPACE_TRY(validateSpec(spec, host));
  auto choice = options.node
                    ? chooseAccelerator(spec.accelerator == Accelerator::kAuto ? options.node->accelerator.accelerator
                                                                               : spec.accelerator,
                                        options.node->kvm)
                    : chooseAccelerator(spec.accelerator, probeKvm());
  if (!choice.ok()) return choice.error();
  logAcceleratorOnce(choice.value());

  std::unique_ptr<Vm> vm(new Vm());
  vm->accelerator_ = choice->accelerator;
  auto booted = vm->boot(spec, options, defer_state);
  if (!booted.ok()) return booted.error();  // ~Vm removes whatever boot() created
  if (options.reuse_run_dir) vm->run_dir_.emplace(TempDir::adopt(options.run_dir));
  return vm;
}

Result<std::unique_ptr<Vm>> Vm::prepare(const VmSpec& spec, const VmStartOptions& options) {
  if (!options.restore_from.empty() || options.reuse_run_dir || options.stay_paused) {
    return makeError(ErrorCode::kInvalidArgument, "prepare() takes its state later, in restore()");
  }
  return launch(spec, options, /*defer_state=*/true);
}

Status Vm::restore(const std::string& state_file, milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  SPACE_TRY(loadPrepared(state_file, deadline));
  return awaitAgent(deadline);
}

Status Vm::loadPrepared(const std::string& state_file, Clock::time_point deadline) {
  if (!waiting_for_state_) return makeError(ErrorCode::kFailedPrecondition, "the VM is not waiting for a state");
  waiting_for_state_ = false;
  restore_started_ = Clock::now();
  auto loaded = loadState(state_file, deadline, /*start=*/true, /*ignore_shared=*/true);
  if (!loaded.ok()) return bootFailure("restore failed: " + loaded.error().message);
  timing_.to_running = since(restore_started_);
  return okStatus();
}

Status Vm::awaitAgent(Clock::time_point deadline) {
  if (restore_started_ == Clock::time_point{}) {
    return makeError(ErrorCode::kFailedPrecondition, "awaitAgent() follows loadPrepared()");
  }
  return waitForAgent(restore_started_, deadline);
}

namespace {

// A VM's cgroup is named after its run directory: the base name to read, and a digest of the
// whole path, since several kinds of VM (template builds, snapshot helpers) all run in a "vm".
std::string cgroupName(const std::string& run_dir) {
  return std::filesystem::path(run_dir).filename().string() + "-" + sha256Hex(run_dir).substr(0, 12);
}

}  // namespace

Result<std::unique_ptr<Vm>> Vm::adopt(const VmAdoptSpec& spec) {
  std::unique_ptr<Vm> vm(new Vm());
  vm->accelerator_ = spec.accelerator;
  vm->paths_ = VmPaths::inRunDir(spec.run_dir);
  auto deadline = Clock::now() + spec.timeout;
  auto gone = [&] {
    TempDir::adopt(spec.run_dir).remove();
    if (spec.cgroups.usable()) {
      auto group = jail::VmCgroup::existing(spec.cgroups, cgroupName(spec.run_dir));
      (void)group.remove();  // a QEMU that died while no one watched left it
    }
    return makeError(ErrorCode::kNotFound, "its QEMU process (pid " + std::to_string(spec.pid) + ") is gone");
  };
  // The pidfd first, then the identity check: the pidfd pins one process, so a pid reused in
  // between is caught by the check instead of being signalled later. A stranger is never touched.
  auto process = ChildProcess::adopt(spec.pid);
  if (!process.ok()) return gone();
  // The kernel's start time names the process we spawned (with its pid) for good; its command
  // line is only asked for where no start time was recorded, since a QEMU can rewrite its own.
  auto started = processStartTime(spec.pid);
  auto cmdline = spec.identity.empty() ? processCmdline(spec.pid) : Result<std::string>(std::string());
  if (!started.ok() || started.value() != spec.identity ||
      (spec.identity.empty() && (!cmdline.ok() || cmdline->find(vm->paths_.qmp_socket) == std::string::npos)) ||
      process->tryWait()) {
    process->disown();
    return gone();
  }
  // From here the Vm owns process and files: an early return kills and removes them.
  vm->run_dir_.emplace(TempDir::adopt(spec.run_dir));
  vm->paths_.disk = currentDisk(spec.run_dir, spec.pid);
  vm->process_.emplace(std::move(process.value()));
  if (spec.cgroups.usable()) {
    vm->cgroup_.emplace(jail::VmCgroup::existing(spec.cgroups, cgroupName(spec.run_dir)));
  }
  if (auto uid = processUid(spec.pid); spec.users && uid.ok() && spec.users->contains(uid.value())) {
    auto claimed = spec.users->claim(uid.value());
    if (claimed.ok()) {
      vm->user_ = std::move(claimed.value());
    } else {
      spdlog::warn("vmm: QEMU pid {}: {}", spec.pid, claimed.error().message);
    }
  }
  vm->identity_ = spec.identity;
  vm->memory_mib_ = spec.memory_mib;

  auto qmp = QmpClient::connect(vm->paths_.qmp_socket, deadline, vm->process_->pidfd());
  if (!qmp.ok()) return makeError(qmp.error().code, "cannot re-attach QEMU's monitor: " + qmp.error().message);
  vm->qmp_.emplace(std::move(qmp.value()));
  auto status = vm->queryStatus();
  if (!status.ok()) return makeError(status.error().code, "QEMU's monitor: " + status.error().message);
  // Zero rates lift the limit (QEMU's "no throttling"): an adopted VM has the node's rate now.
  if (auto limited = vm->limitDiskIo(spec.disk_io); !limited.ok()) {
    return makeError(limited.error().code, "cannot set its disk's I/O limit: " + limited.error().message);
  }
  if (status.value() == "paused" || status.value() == "postmigrate" || status.value() == "io-error") {
    // A stopped guest cannot answer the handshake; resume() attaches the agent. (io-error:
    // stopped on a full disk; the owner finds out through diskErrorStop().)
    vm->agent_ = agentproto::AgentClient::disconnected("the VM is stopped");
  } else if (status.value() == "running") {
    agentproto::HandshakeWatch watch{{vm->process_->pidfd()}, [&vm]() -> std::optional<Error> {
                                       if (!vm->processRunning())
                                         return makeError(ErrorCode::kUnavailable, "QEMU exited");
                                       return std::nullopt;
                                     }};
    SPACE_TRY(vm->connectAgent(deadline, watch));
  } else {
    return makeError(ErrorCode::kUnavailable, "the VM is in QEMU state '" + status.value() + "'");
  }
  spdlog::info("vmm: adopted QEMU pid {} in {} ({})", spec.pid, spec.run_dir, status.value());
  return vm;
}

namespace {

// Who may use the file open as `fd`: `uid`/`gid` with mode 0644, or, if it has another name, root
// with mode 0644: a frozen layer (Vm::freezeDisk), which other VMs stand on, which any VM may
// read (as a backing file) and none write, whatever owner and mode a QEMU gave it before.
Status settleFile(int fd, uid_t uid, gid_t gid, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return okStatus();
  const bool layer = st.st_nlink > 1;
  if (::fchown(fd, layer ? 0 : uid, layer ? 0 : gid) != 0 || ::fchmod(fd, 0644) != 0) {
    return makeError(ErrorCode::kInternal, "jail: cannot give " + what + " to uid " + std::to_string(layer ? 0 : uid) +
                                               ": " + strerror(errno));
  }
  return okStatus();
}

// Hands the run directory and the regular files directly in it (disk overlays, the console log,
// a resumed VM's files made by the QEMU before it) to `uid` (the VM's, or root once its QEMU is
// gone), mode 0700 for the directory: its QEMU makes sockets there and writes its disk. Never
// through a link, never opening anything but a regular file; nothing deeper. Each file is judged
// through its descriptor, so a name swapped meanwhile changes nothing but that name's file.
Status giveRunDirTo(const std::string& dir, uid_t uid, gid_t gid) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() || ::fchown(fd.get(), uid, gid) != 0 || ::fchmod(fd.get(), 0700) != 0) {
    return makeError(ErrorCode::kInternal,
                     "jail: cannot give " + dir + " to uid " + std::to_string(uid) + ": " + strerror(errno));
  }
  DIR* listing = ::fdopendir(::dup(fd.get()));
  if (listing == nullptr) return makeError(ErrorCode::kInternal, "jail: cannot list " + dir + ": " + strerror(errno));
  Status result = okStatus();
  while (dirent* entry = ::readdir(listing)) {
    struct stat st {};
    if (::fstatat(fd.get(), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    UniqueFd file(::openat(fd.get(), entry->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!file.valid()) continue;  // gone, or a lease on it: left as it is
    result = settleFile(file.get(), uid, gid, dir + "/" + entry->d_name);
    if (!result.ok()) break;
  }
  ::closedir(listing);
  return result;
}

// Attaches to the tap of the slot at `netns_path` (net/slot.cc made it: persistent, IFF_TAP |
// IFF_NO_PI | IFF_VNET_HDR, named kTapName), for its QEMU to use as a descriptor: so a QEMU
// without capabilities, as a uid of its own, needs no right to attach. On a thread of its own:
// a tap belongs to the namespace of whoever attaches, and setns moves only the calling thread.
// Never uses a tap it made: a slot without its own is an error.
Result<UniqueFd> openSlotTap(const std::string& netns_path) {
  UniqueFd tap;
  std::string failure;
  std::thread opener([&] {
    UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns.valid() || ::setns(ns.get(), CLONE_NEWNET) != 0) {
      failure = "enter " + netns_path + ": " + strerror(errno);
      return;
    }
    if (::if_nametoindex(net::kTapName) == 0) {
      failure = std::string("the slot has no ") + net::kTapName;
      return;
    }
    UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, net::kTapName, IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (!fd.valid() || ::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) {
      failure = std::string("attach to ") + net::kTapName + ": " + strerror(errno);
      return;
    }
    // The slot's own tap is persistent. One that is not was made just now (the slot's vanished
    // after the check: a QEMU holding a tap can turn persistence off) and goes with this
    // descriptor: refused, so the slot is not used as if it were whole.
    ifreq got{};
    if (::ioctl(fd.get(), TUNGETIFF, &got) != 0 || (got.ifr_flags & IFF_PERSIST) == 0) {
      failure = std::string("the slot's ") + net::kTapName + " is not persistent (gone)";
      return;
    }
    tap = std::move(fd);
  });
  opener.join();
  if (!failure.empty()) return makeError(ErrorCode::kUnavailable, "the network slot's tap: " + failure);
  return tap;
}

// The largest disk a guest of this node can have. Every sandbox's disk has the size of one of
// the node's images: templates, overlays and layers are all made over them at that size. Read
// from the images (root's), never from a disk chain's headers, which a QEMU of the sandbox may
// have rewritten to raise its own next bound (review helper-83).
Result<uint64_t> largestNodeDisk(const NodeFacts& node) {
  uint64_t largest = 0;
  for (const auto& image : node.disk_images) {
    auto size = diskVirtualSize(image, "qcow2");
    if (!size.ok() && size.error().code == ErrorCode::kInvalidArgument) size = diskVirtualSize(image, "raw");
    if (size.ok()) largest = std::max(largest, size.value());
  }
  if (largest == 0) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "jail: none of the node's disk images can be read, so a VM's files cannot be bounded");
  }
  return largest;
}

// Whether this kernel can hold a jailed QEMU to the files it was given (space-jail
// --no-new-files, Landlock). Asked once; a kernel without it is logged once.
bool canForbidMakingFiles() {
  static const bool can = [] {
    const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, 1U /* LANDLOCK_CREATE_RULESET_VERSION */);
    if (abi < 0) {
      spdlog::warn(
          "vmm: the kernel has no Landlock (Linux 5.13+, enabled at boot): a jailed QEMU can make files in its run "
          "directory, each within its file-size bound");
    }
    return abi >= 1;
  }();
  return can;
}

// On btrfs an extent stays whole while one block of it is used, so a QEMU that overwrites its
// own files in a pattern pins far more than their sizes (review helper-84: a 16 MiB file held
// 900 MiB): the file-size bound does not bound the disk there. Said once, at the first jailed
// VM on such a filesystem.
void warnIfSizesDoNotBoundTheDisk(const std::string& run_dir) {
  static std::atomic<bool> warned{false};
  struct statfs fs {};
  if (::statfs(run_dir.c_str(), &fs) == 0 && fs.f_type == BTRFS_SUPER_MAGIC && !warned.exchange(true)) {
    spdlog::warn(
        "vmm: VMs' run directories are on btrfs, where a compromised QEMU's overwrites can pin more disk than its "
        "files' size bound (docs/threat-model.md): put the data directory on ext4 or XFS, or give it a qgroup limit");
  }
}

// The disks a VM's QEMU can read or write: those under its run directory, its memory file, its
// disk chain and the rest of its view (its kernel, the system's programs, QEMU), each as its
// group's I/O limits name it. A sealed memory file (/proc/self/fd/N) is memory, on no disk. A
// run directory on no block device the kernel lists (tmpfs, btrfs) is logged once: its QEMU's
// I/O is then held by QEMU's own throttle alone.
std::vector<std::string> vmDiskDevices(const VmSpec& spec, const std::string& run_dir, const NodeFacts& node) {
  std::vector<std::string> paths = {run_dir, spec.rootfs_path, spec.kernel_path, "/usr", node.qemu_binary};
  if (!spec.memory_file.empty() && spec.memory_file.rfind("/proc/", 0) != 0) paths.push_back(spec.memory_file);
  for (const auto& layer : spec.disk_backing) paths.push_back(layer.path);
  std::vector<std::string> devices;
  for (const auto& path : paths) {
    auto device = jail::blockDeviceUnder(path);
    if (!device) {
      static std::atomic<bool> warned{false};
      if (path == run_dir && !warned.exchange(true)) {
        spdlog::warn("vmm: {} is on no block device the kernel lists: VMs' cgroups cannot limit their disk I/O there",
                     run_dir);
      }
      continue;
    }
    if (std::find(devices.begin(), devices.end(), *device) == devices.end()) devices.push_back(*device);
  }
  return devices;
}

}  // namespace

Status Vm::jailArgv(const VmSpec& spec, const NodeFacts& node, std::vector<std::string>& argv) {
  warnIfSizesDoNotBoundTheDisk(paths_.run_dir);
  // What it may put on disk: only the files it is given (it makes none, not even its console's
  // file, made here), each no larger than its disk or memory needs.
  auto disk_bytes = largestNodeDisk(node);
  if (!disk_bytes.ok()) return disk_bytes.error();
  std::vector<std::string> jailed = {node.jailer, "--nofile", "4096", "--file-size",
                                     std::to_string(qemuFileSizeLimit(disk_bytes.value(), spec.memory_mib))};
  if (canForbidMakingFiles()) jailed.push_back("--no-new-files");
  {
    UniqueFd console(
        ::open(paths_.console_log.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
    struct stat st {};
    if (!console.valid() || ::fstat(console.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "jail: " + paths_.console_log + " is not a regular file; refused");
    }
  }
  if (node.vm_users) {
    auto lease = node.vm_users->acquire();
    if (!lease.ok()) return lease.error();
    user_ = std::move(lease.value());
    jailed.insert(jailed.end(), {"--user", std::to_string(user_.uid()) + ":" + std::to_string(user_.gid())});
    // /dev/kvm is root's and the kvm group's (mode 0660 on Debian): the group comes along.
    if (struct stat kvm{}; accelerator_ == Accelerator::kKvm && ::stat("/dev/kvm", &kvm) == 0 && kvm.st_gid != 0) {
      jailed.insert(jailed.end(), {"--group", std::to_string(kvm.st_gid)});
    }
    SPACE_TRY(giveRunDirTo(paths_.run_dir, user_.uid(), user_.gid()));
  }
  if (node.cgroups.usable()) {
    std::vector<std::string> devices;
    if (node.cgroups.io && spec.disk_io.limited()) devices = vmDiskDevices(spec, paths_.run_dir, node);
    auto group =
        jail::VmCgroup::create(node.cgroups, cgroupName(paths_.run_dir), vmCgroupLimits(spec, accelerator_, devices));
    if (!group.ok()) return makeError(ErrorCode::kUnavailable, "jail: " + group.error().message);
    // A disk the kernel does not throttle stops no VM: QEMU's own throttle still holds its guest.
    static std::atomic<bool> io_warned{false};
    if (!group->ioLimitError().empty() && !io_warned.exchange(true)) {
      spdlog::warn("vmm: a VM's cgroup got no disk I/O limit ({}); QEMU's throttle holds its guest's I/O only",
                   group->ioLimitError());
    }
    cgroup_.emplace(std::move(group.value()));
    for (const auto& procs : cgroup_->procsFiles()) jailed.insert(jailed.end(), {"--cgroup-procs", procs});
  }
  SPACE_TRY(addJailView(spec, jailed));
  jailed.push_back("--");
  argv.insert(argv.begin(), jailed.begin(), jailed.end());
  return okStatus();
}

// What this QEMU may see of the host (space-jail --view): its run directory, read-write; its
// kernel and every disk layer below its overlay, read-only; its memory file; the devices it
// opens. Not the state database, other sandboxes' files or layers, nor host processes.
namespace {

// Who may open a file a jailed QEMU is given, when it runs as a uid of its own (QEMU 7.2 opens
// a memory file read-write even to map it privately).
enum class FileUse {
  kOwn,     // this VM's alone (a memory file it writes, an image it owns): its uid, mode 0600
  kShared,  // mapped privately by several VMs at once (a snapshot's memory, by every child of a
            // branch): root and the VMs' group, mode 0660; only a VM whose view holds it sees it
};

// A regular file (not a link) at `path`, made if missing: what a QEMU that writes a memory file
// of its own gets bound, rather than the whole directory it is in.
Status ensureRegularFile(const std::string& path, const VmUsers::Lease& user, FileUse use,
                         std::vector<std::string>& owned) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return makeError(ErrorCode::kFailedPrecondition, "jail: " + path + " is not a regular file; refused");
  }
  if (!user.held()) return okStatus();
  const uid_t owner = use == FileUse::kOwn ? user.uid() : 0;
  if (use == FileUse::kOwn) owned.push_back(path);  // given back when the VM ends
  if (::fchown(fd.get(), owner, user.gid()) != 0 || ::fchmod(fd.get(), use == FileUse::kOwn ? 0600 : 0660) != 0) {
    return makeError(ErrorCode::kInternal, "jail: cannot give " + path + " to uid " + std::to_string(owner) + ", gid " +
                                               std::to_string(user.gid()) + ": " + strerror(errno));
  }
  return okStatus();
}

}  // namespace

Result<std::vector<DiskLayer>> Vm::layersBelow(const NodeFacts* node) const {
  // The names come from qcow2 headers, which a QEMU of this run directory (or of the sandbox a
  // layer was frozen from) could have rewritten. For a jailed VM each is judged before anything
  // opens it: a file directly in the run directory, one of the node's images exactly, or a
  // path without links in the node's own disk directories (layers, templates), where only
  // spaced makes names. Anything else (the state database, another sandbox's files, a device)
  // is refused. An unjailed VM (tools, tests of this layer) opens what its headers name.
  const bool jailed = node != nullptr && !node->jailer.empty();
  auto admit = [&](const std::string& layer) -> Status {
    if (!jailed) return okStatus();
    if (std::filesystem::path(layer).parent_path() == paths_.run_dir && isNodeDiskPath(layer, {paths_.run_dir}, {})) {
      return okStatus();
    }
    if (isNodeDiskName(layer, node->disk_roots, node->disk_images)) return okStatus();
    return makeError(ErrorCode::kFailedPrecondition,
                     "jail: disk layer " + layer + " is outside the node's disk directories; refused");
  };
  auto chain = diskChain(paths_.disk, admit);
  if (!chain.ok()) return makeError(chain.error().code, "the disk's layers: " + chain.error().message);
  std::vector<DiskLayer> layers;
  for (size_t i = 1; i < chain->size(); ++i) {
    // Every image with one below it is a qcow2; the last is one too if it has a qcow2 header.
    const bool last = i + 1 == chain->size();
    layers.push_back({(*chain)[i], last && !qcow2BackingFile((*chain)[i]).ok() ? "raw" : "qcow2"});
  }
  return layers;
}

Result<size_t> Vm::diskChainLength(const NodeFacts* node) const {
  auto below = layersBelow(node);
  if (!below.ok()) return below.error();
  return below->size() + 1;
}

Status Vm::addJailView(const VmSpec& spec, std::vector<std::string>& jailed) {
  auto add = [&jailed](const char* access, const std::string& path) { jailed.insert(jailed.end(), {access, path}); };
  jailed.push_back("--view");
  add("--rw", paths_.run_dir);
  add("--ro", spec.kernel_path);
  // A QEMU outside /usr (SPACE's own build, in the image cache) is the one file that may run.
  if (spec.qemu_binary.find('/') != std::string::npos) add("--exec", spec.qemu_binary);
  if (spec.disk_mode == DiskMode::kOverlay) {
    // The images below its overlay, each judged by Vm::layersBelow: those outside the run
    // directory (covered by it) are bound read-only.
    for (const auto& layer : spec.disk_backing) {
      if (std::filesystem::path(layer.path).parent_path() != paths_.run_dir) add("--ro", layer.path);
    }
  } else {
    SPACE_TRY(
        ensureRegularFile(spec.rootfs_path, user_, FileUse::kOwn, owned_files_));  // kDirect: the VM owns the image
    add("--rw", spec.rootfs_path);
  }
  if (!spec.memory_file.empty() && spec.memory_file != "/proc/self/fd/" + std::to_string(kSealedMemoryFd)) {
    // The file alone, never its directory, and never a link (space-jail refuses one too).
    // Read-write even when mapped privately: QEMU 7.2 opens a memory-backend file read-write
    // whatever the mapping. A tenant's own snapshot, or a memory file a VM writes; templates,
    // shared by all tenants, come sealed instead (docs/threat-model.md).
    SPACE_TRY(ensureRegularFile(spec.memory_file, user_, spec.memory_private ? FileUse::kShared : FileUse::kOwn,
                                owned_files_));
    add("--rw", spec.memory_file);
  }
  add("--dev", "/dev/null");
  add("--dev", "/dev/urandom");
  if (accelerator_ == Accelerator::kKvm) add("--dev", "/dev/kvm");
  if (spec.netns_path.empty()) {
    jailed.push_back("--new-network");  // no slot: an empty network namespace, not the host's
  }
  jailed.push_back("--no-caps");
  return okStatus();
}

namespace {

// `path` back to root, if it is still a regular file of `uid`'s with no other name.
void takeBack(const std::string& path, uid_t uid) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.valid() && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == uid &&
      (::fchown(fd.get(), 0, 0) != 0 || ::fchmod(fd.get(), 0600) != 0)) {
    spdlog::warn("vmm: cannot give {} back to root: {}", path, strerror(errno));
  }
}

}  // namespace

void Vm::releaseJail(bool qemu_gone, bool run_dir_stays) {
  removeCgroup();
  if (!user_.held()) return;
  if (!qemu_gone) {
    user_.keep();  // a QEMU that would not die keeps its uid: never handed to another VM
    return;
  }
  // What it owned goes back to root before its uid goes to another VM (of any tenant): a run
  // directory that stays (a suspended guest's, a template's disk about to be kept) and the files
  // outside it that it wrote.
  if (run_dir_stays && !paths_.run_dir.empty()) {
    if (auto taken = giveRunDirTo(paths_.run_dir, 0, 0); !taken.ok()) spdlog::warn("vmm: {}", taken.error().message);
  }
  for (const auto& path : owned_files_) takeBack(path, user_.uid());
  owned_files_.clear();
  user_ = VmUsers::Lease();  // nothing runs as that uid any more: free for another VM
}

void Vm::removeCgroup() {
  if (!cgroup_) return;
  if (auto removed = cgroup_->remove(); !removed.ok()) spdlog::warn("vmm: {}", removed.error().message);
  cgroup_.reset();
}

Status Vm::boot(const VmSpec& spec, const VmStartOptions& options, bool defer_state) {
  if (options.reuse_run_dir) {
    paths_ = VmPaths::inRunDir(options.run_dir);
    paths_.disk = currentDisk(options.run_dir, -1);
    if (!std::filesystem::exists(paths_.disk)) {
      return makeError(ErrorCode::kNotFound, "no disk to resume from in " + options.run_dir);
    }
  } else {
    auto dir = options.run_dir.empty() ? TempDir::create(options.run_root, "vm-") : TempDir::createAt(options.run_dir);
    if (!dir.ok()) return dir.error();
    run_dir_.emplace(std::move(dir.value()));
    paths_ = VmPaths::inRunDir(run_dir_->path());
  }
  const std::string qemu_log = paths_.run_dir + "/qemu.log";
  memory_mib_ = spec.memory_mib;

  if (spec.disk_mode == DiskMode::kOverlay && !options.reuse_run_dir) {
    SPACE_TRY(createDiskOverlay(spec.rootfs_path, spec.rootfs_format, paths_.disk, qemu_log));
  }

  VmSpec effective = spec;
  if (!options.restore_from.empty() || defer_state) effective.incoming = true;
  if (options.stay_paused) {
    if (options.restore_from.empty()) return makeError(ErrorCode::kInvalidArgument, "stay_paused needs restore_from");
    effective.start_paused = true;
  }
  if (options.sealed_memory) {
    if (!spec.memory_private) return makeError(ErrorCode::kInvalidArgument, "sealed memory is mapped privately only");
    effective.memory_file = "/proc/self/fd/" + std::to_string(kSealedMemoryFd);
  }
  if (spec.disk_mode == DiskMode::kOverlay) {
    auto below = layersBelow(options.node);
    if (!below.ok()) return below.error();
    effective.disk_backing = std::move(below.value());
  }
  auto argv = buildQemuArgv(effective, paths_, accelerator_);
  if (options.node != nullptr && !options.node->jailer.empty()) SPACE_TRY(jailArgv(effective, *options.node, argv));
  auto spawned_at = Clock::now();
  auto deadline = spawned_at + spec.boot_timeout;
  SpawnOptions spawn_options{qemu_log, "", true};
  spawn_options.netns_path = spec.netns_path;
  if (options.sealed_memory) spawn_options.pass_fds.push_back({options.sealed_memory->get(), kSealedMemoryFd});
  UniqueFd tap;
  if (!spec.netns_path.empty()) {
    auto opened = openSlotTap(spec.netns_path);
    if (!opened.ok()) return opened.error();
    tap = std::move(opened.value());
    spawn_options.pass_fds.push_back({tap.get(), kTapFd});
  }
  // The monitor's and the agent port's sockets: bound here, listened on by QEMU (ours close once
  // it has them, so a QEMU that exits resets what waits to be accepted).
  auto qmp_listener = listenUnix(paths_.qmp_socket, 4);
  if (!qmp_listener.ok()) return qmp_listener.error();
  auto agent_listener = listenUnix(paths_.agent_socket, 4);
  if (!agent_listener.ok()) return agent_listener.error();
  spawn_options.pass_fds.push_back({qmp_listener->get(), kQmpFd});
  spawn_options.pass_fds.push_back({agent_listener->get(), kAgentFd});
  // Jailed: pid 1 of a PID namespace of its own (space-jail --view), so it sees no other process.
  spawn_options.new_pid_namespace = options.node != nullptr && !options.node->jailer.empty();
  auto child = ChildProcess::spawn(argv, spawn_options);
  qmp_listener->reset();
  agent_listener->reset();
  if (!child.ok()) return child.error();
  process_.emplace(std::move(child.value()));
  if (auto started = processStartTime(process_->pid()); started.ok()) identity_ = started.value();
  spdlog::debug("vmm: started qemu pid {} in {}", process_->pid(), paths_.run_dir);

  // QMP: the connection waits in the socket's queue until QEMU serves it. A QEMU that exits
  // first (bad arguments) closes the listening socket, which resets it at once; one that exits
  // before we connect leaves it refusing, which its pidfd tells apart from a slow start.
  auto qmp = QmpClient::connect(paths_.qmp_socket, deadline, process_->pidfd());
  if (!qmp.ok()) {
    if (process_->waitFor(milliseconds(1000))) return bootFailure("QEMU exited before its monitor came up");
    return bootFailure("cannot reach QEMU's monitor: " + qmp.error().message);
  }
  qmp_.emplace(std::move(qmp.value()));
  timing_.to_qmp = since(spawned_at);
  if (spec.disk_io.limited()) {
    if (auto limited = limitDiskIo(spec.disk_io); !limited.ok()) {
      return bootFailure("cannot limit the disk's I/O: " + limited.error().message);
    }
  }
  if (defer_state) {  // prepare(): the state comes with restore()
    waiting_for_state_ = true;
    agent_ = agentproto::AgentClient::disconnected("the VM waits for its state");
    return okStatus();
  }
  if (!options.restore_from.empty()) {
    auto loaded =
        loadState(options.restore_from, deadline, /*start=*/!options.stay_paused, options.restore_ignore_shared);
    if (!loaded.ok()) return bootFailure("restore failed: " + loaded.error().message);
    timing_.to_running = since(spawned_at);
    if (options.stay_paused) {
      agent_ = agentproto::AgentClient::disconnected("the restored VM was left paused");
      return okStatus();
    }
  }
  return waitForAgent(spawned_at, deadline);
}

std::optional<Error> Vm::checkAlive() {
  auto open = qmp_->pump();
  while (qmp_->hasEvents()) {
    QmpEvent ev = qmp_->popEvent();
    if (ev.name == "SHUTDOWN" || ev.name == "GUEST_PANICKED" || ev.name == "RESET") {
      // Let QEMU finish exiting so the console holds everything the guest printed.
      process_->waitFor(milliseconds(2000));
      return bootFailure("guest stopped during boot (QMP " + ev.name + " " + ev.data.dump() + ")");
    }
  }
  if (!open.ok() || !open.value()) return bootFailure("QEMU closed its monitor during boot");
  if (auto status = process_->tryWait()) return bootFailure("QEMU " + status->describe() + " during boot");
  return std::nullopt;
}

Status Vm::connectAgent(Clock::time_point deadline, const agentproto::HandshakeWatch& watch) {
  auto fd = connectUnix(paths_.agent_socket, deadline, process_ ? process_->pidfd() : -1);
  if (!fd.ok()) return makeError(fd.error().code, "cannot reach the agent port: " + fd.error().message);
  // If this fails, both descriptors close and QEMU sees the connection end, as it must: it
  // serves the port's next connection only then.
  UniqueFd second(::fcntl(fd->get(), F_DUPFD_CLOEXEC, 0));
  if (!second.valid()) return makeError(ErrorCode::kInternal, std::string("dup: ") + strerror(errno));
  auto agent = agentproto::AgentClient::connect(std::move(fd.value()), deadline, watch);
  if (!agent.ok()) {
    // What the watch reported (a boot failure, with the guest's console) is complete as it is.
    if (agent.error().message.find("--- guest console") != std::string::npos) return agent.error();
    return makeError(agent.error().code, "agent handshake failed: " + agent.error().message);
  }
  agent_ = std::move(agent.value());
  agent_connection_ = std::move(second);
  return okStatus();
}

void Vm::disconnectAgent(const std::string& reason) {
  if (agent_connection_.valid()) ::shutdown(agent_connection_.get(), SHUT_RDWR);
  agent_connection_.reset();
  agent_ = agentproto::AgentClient::disconnected(reason);
}

Status Vm::waitForAgent(Clock::time_point spawned_at, Clock::time_point deadline) {
  agentproto::HandshakeWatch watch{{qmp_->fd(), process_->pidfd()}, [this] { return checkAlive(); }};
  if (auto connected = connectAgent(deadline, watch); !connected.ok()) {
    if (connected.error().code == ErrorCode::kDeadlineExceeded) {
      return bootFailure("guest did not come up within " +
                         std::to_string(std::chrono::duration_cast<milliseconds>(deadline - spawned_at).count()) +
                         " ms (boot hang)");
    }
    // A failure from checkAlive() already carries the console; others get it added.
    if (connected.error().message.find("--- guest console") != std::string::npos) return connected.error();
    return bootFailure(connected.error().message);
  }
  timing_.to_ready = since(spawned_at);
  timing_.guest_uptime_at_init_s = agent_->info().uptime_s;
  spdlog::info(
      "vmm: guest {} ready in {} ms (qmp {} ms, running {} ms, agent {} at {:.2f} s guest uptime, kernel {}, {})",
      process_->pid(), timing_.to_ready.count(), timing_.to_qmp.count(), timing_.to_running.count(),
      agent_->info().version, agent_->info().uptime_s, agent_->info().kernel, acceleratorName(accelerator_));
  return okStatus();
}

Status Vm::reconnectAgent(milliseconds timeout) {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  // QEMU serves one connection on the port at a time: the old one must go first, even while
  // a lease still holds its client. Until a new one works, agent() is a disconnected client
  // whose calls fail cleanly.
  disconnectAgent("reconnecting");
  // A guest that stops meanwhile (QEMU stopped it: a full disk) will not answer: no need to
  // wait for the deadline to know.
  agentproto::HandshakeWatch watch{{qmp_->fd(), process_->pidfd()}, [this]() -> std::optional<Error> {
                                     if (!processRunning()) return makeError(ErrorCode::kUnavailable, "QEMU exited");
                                     if (stopReported()) {
                                       return makeError(ErrorCode::kUnavailable, "the guest was stopped by QEMU");
                                     }
                                     return std::nullopt;
                                   }};
  // The guest learns that the host came back from a control message on the port, and can
  // miss it when connections came and went while it was stopped (seen after a resume that
  // stopped again on a full disk: the agent then waits for a host that is there). A new
  // connection says it again, so an unanswered handshake is retried on one, waiting longer
  // each time so that a slow guest is not interrupted for ever.
  const auto deadline = Clock::now() + timeout;
  milliseconds window{2000};
  while (true) {
    auto connected = connectAgent(std::min(deadline, Clock::now() + window), watch);
    if (connected.ok()) return okStatus();
    if (connected.error().code != ErrorCode::kDeadlineExceeded || Clock::now() >= deadline) {
      agent_ = agentproto::AgentClient::disconnected("reconnect failed: " + connected.error().message);
      return connected.error();
    }
    spdlog::debug("vmm: guest {}: no answer on the agent port in {} ms; connecting again", process_->pid(),
                  window.count());
    window *= 2;
  }
}

Error Vm::bootFailure(const std::string& what) {
  if (process_ && !process_->tryWait()) process_->kill();
  std::string console = consoleTail(4096);
  std::string message = what;
  if (auto at = console.find("Kernel panic"); at != std::string::npos) {
    message = "kernel panic: " + console.substr(at, console.find('\n', at) - at) + " (" + what + ")";
  }
  auto qemu_log = readFileTail(paths_.run_dir + "/qemu.log", 2048);
  // The jail refused to start QEMU (exit 125): that is the headline, not QEMU's monitor.
  if (process_ && process_->exitStatus() && !process_->exitStatus()->signaled &&
      process_->exitStatus()->exit_code == 125 && qemu_log.ok()) {
    if (auto at = qemu_log->find("space-jail: "); at != std::string::npos) {
      message = "the VM's jail failed: " + qemu_log->substr(at + 12, qemu_log->find('\n', at) - at - 12);
    }
  }
  message += "\n--- guest console (tail) ---\n" + console;
  if (qemu_log.ok() && !qemu_log->empty()) message += "\n--- qemu log (tail) ---\n" + qemu_log.value();
  spdlog::warn("vmm: boot failed: {}", what);
  return makeError(ErrorCode::kUnavailable, message);
}

std::string Vm::consoleTail(size_t max_bytes) const {
  if (paths_.console_log.empty()) return {};
  auto tail = readFileTail(paths_.console_log, max_bytes);
  return tail.ok() ? tail.value() : std::string();
}

void Vm::trimConsole(size_t max_bytes, size_t keep_bytes) {
  struct stat st {};
  if (paths_.console_log.empty() || ::lstat(paths_.console_log.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  if (static_cast<size_t>(st.st_size) <= max_bytes) return;
  auto tail = readFileTail(paths_.console_log, keep_bytes);
  if (!tail.ok()) return;
  // QEMU appends (O_APPEND): after the truncation its next write lands after our copy of the
  // tail, at worst between truncate and our write (a few bytes out of order, nothing lost).
  // Not through a link: the run directory is QEMU's to write, and QEMU may be hostile.
  UniqueFd fd(::open(paths_.console_log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  // One name only: a frozen layer's run-directory name renamed here must not be cut.
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
      ::ftruncate(fd.get(), 0) != 0) {
    return;
  }
  const std::string note = "\n[space: console trimmed to its last " + std::to_string(keep_bytes) + " bytes]\n";
  (void)!::write(fd.get(), note.data(), note.size());
  (void)!::write(fd.get(), tail->data(), tail->size());
}

bool Vm::processRunning() { return process_ && !process_->tryWait(); }

Status Vm::pause() {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  auto r = qmp_->execute("stop");
  if (!r.ok()) return r.error();
  return okStatus();
}

Status Vm::resume() {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  // Stops reported until now (our own pause, a full disk) are answered by this cont; one
  // reported after it is news.
  (void)stopReported();
  stop_reported_ = false;
  auto r = qmp_->execute("cont");
  if (!r.ok()) return r.error();
  if (!agent_ || !agent_->alive()) return reconnectAgent(milliseconds(10000));
  return okStatus();
}

Result<std::string> Vm::queryStatus() {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  auto r = qmp_->execute("query-status");
  if (!r.ok()) return r.error();
  if (!r->is_object() || !r->contains("status") || !(*r)["status"].is_string()) {
    return makeError(ErrorCode::kUnavailable, "QMP query-status: unexpected reply");
  }
  return (*r)["status"].get<std::string>();
}

bool Vm::stopReported() {
  if (!qmp_ || !processRunning()) return stop_reported_;
  (void)qmp_->pump();  // a closed or broken monitor shows as the process ending
  while (qmp_->hasEvents()) {
    QmpEvent ev = qmp_->popEvent();
    if (ev.name == "STOP") stop_reported_ = true;
    if (ev.name != "BLOCK_IO_ERROR" || !ev.data.is_object()) continue;
    // QEMU's words, from strerror; bounded anyway (QEMU runs guest code).
    if (auto reason = ev.data.find("reason"); reason != ev.data.end() && reason->is_string()) {
      disk_error_ = reason->get<std::string>().substr(0, 200);
    }
    if (auto action = ev.data.find("action"); action != ev.data.end() && *action == "stop") stop_reported_ = true;
  }
  return stop_reported_;
}

Result<std::optional<std::string>> Vm::diskErrorStop() {
  auto status = queryStatus();
  if (!status.ok()) return status.error();  // still reported: asked again later
  stop_reported_ = false;
  if (status.value() != "io-error") return std::optional<std::string>();
  (void)stopReported();  // the BLOCK_IO_ERROR that came with the reply, if not read before
  stop_reported_ = false;
  if (!disk_error_.empty()) return std::optional<std::string>(disk_error_);
  // No event seen (e.g. it stopped before this Vm adopted it): the drive's own status says.
  auto blocks = qmp_->execute("query-block");
  if (blocks.ok() && blocks->is_array()) {
    for (const auto& b : *blocks) {
      if (b.is_object() && b.contains("io-status") && b["io-status"] == "nospace") {
        return std::optional<std::string>("No space left on device");
      }
    }
  }
  return std::optional<std::string>("I/O error");
}

Result<agentproto::CommandResult> Vm::exec(const agentproto::CommandSpec& spec) {
  if (!processRunning() || !agent_) return makeError(ErrorCode::kUnavailable, "VM is not running");
  return agentproto::runCommand(*agent_, spec);
}

Result<agentproto::CommandResult> Vm::exec(const std::string& command, milliseconds timeout) {
  agentproto::CommandSpec spec;
  spec.command = command;
  spec.timeout = timeout;
  return exec(spec);
}

Status Vm::shutdown(milliseconds timeout) {
  if (!processRunning()) return okStatus();
  auto asked = agent_ ? agent_->call("/agent.Agent/Shutdown", nlohmann::json::object(),
                                     agentproto::CallOptions{milliseconds(5000), ""})
                      : Result<nlohmann::json>(makeError(ErrorCode::kUnavailable, "no agent"));
  if (asked.ok() && process_->waitFor(timeout)) {
    spdlog::info("vmm: guest {} powered off", process_->pid());
    return okStatus();
  }
  if (qmp_) (void)qmp_->execute("quit", nullptr, milliseconds(1000));
  if (!process_->waitFor(milliseconds(2000))) process_->kill();
  return makeError(ErrorCode::kDeadlineExceeded,
                   "guest did not power off within " + std::to_string(timeout.count()) + " ms; QEMU was stopped");
}

namespace {

// The name the save stream's descriptor has in QEMU's monitor (getfd), for `migrate fd:`.
constexpr const char* kSaveFdName = "space-save";
// And the one a saved state is loaded through (`migrate-incoming fd:`).
constexpr const char* kLoadFdName = "space-load";

json ignoreSharedCapability(bool on) {
  // x-ignore-shared: RAM in a shared memory-backend file is not streamed (the file is the RAM).
  // Both ends must agree: it changes the stream's format.
  return json{{"capabilities", json::array({json{{"capability", "x-ignore-shared"}, {"state", on}}})}};
}

// Polls query-migrate until the migration ends; its error if it failed.
Status waitMigration(QmpClient& qmp, Clock::time_point deadline) {
  while (true) {
    auto info = qmp.execute("query-migrate", nullptr, std::chrono::milliseconds(pollTimeoutMs(deadline) + 1));
    if (!info.ok()) return info.error();
    std::string status = info->value("status", "");
    if (status == "completed") return okStatus();
    if (status == "failed" || status == "cancelled") {
      return makeError(ErrorCode::kInternal,
                       "migration " + status + ": " + info->value("error-desc", "no reason given"));
    }
    if (Clock::now() >= deadline) return makeError(ErrorCode::kDeadlineExceeded, "migration still " + status);
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// Starts `command` (migrate, migrate-incoming) on a stream QEMU holds as `fd_name` (getfd): one
// end of a socket pair, the other returned. No path: nothing in the run directory (QEMU's to
// rename things in) is made, connected to or given to QEMU's uid, and a jailed QEMU makes no
// socket file (space-jail --no-new-files). Ours is non-blocking, so reads and writes keep their
// deadlines; closing it ends the stream.
Result<UniqueFd> migrateOverSocketPair(QmpClient& qmp, const char* command, const char* fd_name) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) != 0) {
    return makeError(ErrorCode::kInternal, std::string("socketpair: ") + strerror(errno));
  }
  UniqueFd ours(pair[0]);
  {
    UniqueFd theirs(pair[1]);  // ours closed once QEMU has it: its close then ends the stream
    SPACE_TRY(qmp.executeWithFd("getfd", json{{"fdname", fd_name}}, theirs.get()));
  }
  if (auto started = qmp.execute(command, json{{"uri", std::string("fd:") + fd_name}}); !started.ok()) {
    (void)qmp.execute("closefd", json{{"fdname", fd_name}});
    return started.error();
  }
  return ours;
}

}  // namespace

Status Vm::saveState(const std::string& state_file, milliseconds timeout, bool ignore_shared) {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  auto deadline = Clock::now() + timeout;
  SPACE_TRY(qmp_->execute("migrate-set-capabilities", ignoreSharedCapability(ignore_shared)));
  SPACE_TRY(qmp_->execute("stop"));
  // QEMU may not exec (its seccomp sandbox), so the stream comes to us over a socket.
  auto stream = migrateOverSocketPair(*qmp_, "migrate", kSaveFdName);
  if (!stream.ok()) return stream.error();
  UniqueFd conn = std::move(stream.value());
  const std::string tmp = state_file + ".tmp";
  // A new file, never through a link: a suspend writes into the run directory, which QEMU can
  // write (and a hostile one could plant a link there to a host file for us to overwrite).
  ::unlink(tmp.c_str());
  UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out.valid()) return makeError(ErrorCode::kInternal, "create " + tmp + ": " + strerror(errno));
  auto fail = [&](Error e) {
    ::unlink(tmp.c_str());
    (void)qmp_->execute("migrate_cancel");
    return e;
  };
  // RAM (when not in a shared file) plus device state, which is kilobytes; unknown size: 64 GiB.
  const uint64_t max_bytes = memory_mib_ ? (memory_mib_ + 64) << 20 : uint64_t{64} << 30;
  uint64_t total = 0;
  char buf[65536];
  while (true) {
    pollfd in{conn.get(), POLLIN, 0};
    if (::poll(&in, 1, pollTimeoutMs(deadline)) <= 0)
      return fail(makeError(ErrorCode::kDeadlineExceeded, "saving state timed out"));
    ssize_t n = ::read(conn.get(), buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fail(makeError(ErrorCode::kInternal, std::string("read state: ") + strerror(errno)));
    }
    total += static_cast<uint64_t>(n);
    if (total > max_bytes) {
      return fail(makeError(ErrorCode::kResourceExhausted,
                            "QEMU's state stream exceeds " + std::to_string(max_bytes) + " bytes; refused"));
    }
    // A short write is not an error yet: the next one says why (ENOSPC when the disk is full).
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(out.get(), buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        int err = w < 0 ? errno : EIO;
        return fail(makeError(err == ENOSPC || err == EDQUOT ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                              "write " + tmp + ": " + strerror(err)));
      }
      done += w;
    }
  }
  auto migrated = waitMigration(*qmp_, deadline);
  if (!migrated.ok()) return fail(migrated.error());
  // The disk before the state that stands on it: a state on stable storage whose disk is not
  // would restore a guest onto writes it never made (and a failed sync must leave no state).
  if (auto synced = syncRunDirDisks(paths_.run_dir); !synced.ok()) return fail(synced.error());
  if (::fsync(out.get()) != 0) return fail(makeError(ErrorCode::kInternal, "fsync " + tmp + ": " + strerror(errno)));
  out.reset();
  if (::rename(tmp.c_str(), state_file.c_str()) != 0) {
    return fail(makeError(ErrorCode::kInternal, "rename " + tmp + ": " + strerror(errno)));
  }
  return okStatus();
}

Status Vm::loadState(const std::string& state_file, Clock::time_point deadline, bool start, bool ignore_shared) {
  UniqueFd in(::open(state_file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!in.valid()) return makeError(ErrorCode::kNotFound, "open " + state_file + ": " + strerror(errno));
  SPACE_TRY(qmp_->execute("migrate-set-capabilities", ignoreSharedCapability(ignore_shared)));
  {
    // As a save goes; writeAll keeps the deadline while QEMU reads slowly.
    auto stream = migrateOverSocketPair(*qmp_, "migrate-incoming", kLoadFdName);
    if (!stream.ok()) return stream.error();
    UniqueFd fd = std::move(stream.value());
    // Streamed: a suspended guest's state holds its RAM (up to the VM's memory size).
    std::string chunk(1 << 20, '\0');
    while (true) {
      ssize_t n = ::read(in.get(), chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return makeError(ErrorCode::kInternal, "read " + state_file + ": " + strerror(errno));
      if (n == 0) break;
      SPACE_TRY(writeAll(fd.get(), chunk.substr(0, static_cast<size_t>(n)), deadline));
    }
  }  // closing ends the stream
  SPACE_TRY(waitMigration(*qmp_, deadline));
  // QEMU starts the guest by itself after an incoming migration unless told not to; a guest
  // left paused is started here.
  while (true) {
    auto status = queryStatus();
    if (!status.ok()) return status.error();
    if (status.value() == "running") break;
    if (status.value() == "paused" || status.value() == "postmigrate" || status.value() == "prelaunch") {
      if (start) SPACE_TRY(qmp_->execute("cont"));
      break;
    }
    if (Clock::now() >= deadline) return makeError(ErrorCode::kDeadlineExceeded, "guest still " + status.value());
    std::this_thread::sleep_for(milliseconds(1));
  }
  return okStatus();
}

Status Vm::limitDiskIo(const DiskIoRate& rate) {
  // The guest's disk device, by the QOM path QEMU reports for it (the device has no id).
  auto blocks = qmp_->execute("query-block");
  if (!blocks.ok()) return blocks.error();
  std::string device;
  for (const auto& b : *blocks) {
    if (b.is_object() && b.contains("inserted") && b.contains("qdev") && b["qdev"].is_string()) {
      device = b["qdev"].get<std::string>();
      break;
    }
  }
  if (device.empty()) return makeError(ErrorCode::kInternal, "QEMU reports no disk device");
  // Reads and writes together ("total"; QEMU wants the split ones named too, as 0). QEMU allows
  // bursts of a tenth of a second's worth above the rate.
  SPACE_TRY(qmp_->execute("block_set_io_throttle", json{{"id", device},
                                                        {"bps", rate.bytes_per_sec},
                                                        {"bps_rd", 0},
                                                        {"bps_wr", 0},
                                                        {"iops", rate.iops},
                                                        {"iops_rd", 0},
                                                        {"iops_wr", 0}}));
  return okStatus();
}

Status Vm::freezeDisk(const std::string& layer_path) {
  if (!processRunning()) return makeError(ErrorCode::kUnavailable, "VM is not running");
  auto status = queryStatus();
  if (!status.ok()) return status.error();
  if (status.value() == "running") return makeError(ErrorCode::kFailedPrecondition, "freezeDisk needs a stopped VM");
  // The guest's disk as QEMU sees it now: its top node (a previous freeze moved it) and size.
  auto blocks = qmp_->execute("query-block");
  if (!blocks.ok()) return blocks.error();
  std::string top_node;
  uint64_t virtual_size = 0;
  for (const auto& b : *blocks) {
    if (!b.is_object() || !b.contains("inserted")) continue;
    const auto& inserted = b["inserted"];
    top_node = inserted.value("node-name", "");
    if (inserted.contains("image")) virtual_size = inserted["image"].value("virtual-size", uint64_t{0});
    break;
  }
  if (top_node.empty() || virtual_size == 0) return makeError(ErrorCode::kInternal, "QEMU reports no root disk");

  // 1. The current overlay becomes the layer: a second name for the same file, no copy. (link
  // does not follow a symbolic link; one there, QEMU's doing, is refused just below.)
  if (::link(paths_.disk.c_str(), layer_path.c_str()) != 0) {
    return makeError(errno == ENOSPC ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                     "link " + paths_.disk + " -> " + layer_path + ": " + strerror(errno));
  }
  if (struct stat st{}; ::lstat(layer_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    ::unlink(layer_path.c_str());
    return makeError(ErrorCode::kInternal, paths_.disk + " is not a regular file; not frozen");
  }
  const std::string next =
      paths_.run_dir + "/" + diskName(diskNumber(std::filesystem::path(paths_.disk).filename().string()) + 1);
  auto undo = [&](Error e) {
    ::unlink(next.c_str());
    ::unlink(layer_path.c_str());
    return e;
  };
  // 2. A new, empty overlay naming the layer as its backing file. -u: the layer is still
  // QEMU's open, writable image, so qemu-img must not open it (it would fail on QEMU's lock).
  // qemu-img (unconfined) writes the file we created, through its descriptor: a name in the run
  // directory, QEMU's to write, could be made a link to a host file before qemu-img opens it.
  {
    ::unlink(next.c_str());
    UniqueFd created(::open(next.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!created.valid()) return undo(makeError(ErrorCode::kInternal, "create " + next + ": " + strerror(errno)));
    // QEMU writes it next; once frozen in turn, VMs of other uids read it (0644, whatever the umask).
    if (::fchmod(created.get(), 0644) != 0 ||
        (user_.held() && ::fchown(created.get(), user_.uid(), user_.gid()) != 0)) {
      return undo(makeError(ErrorCode::kInternal, "chown " + next + ": " + strerror(errno)));
    }
    const std::string log = paths_.run_dir + "/qemu.log";
    SpawnOptions spawn_options{log, "", true};
    spawn_options.pass_fds = {{created.get(), 3}};
    auto img = ChildProcess::spawn({"qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", layer_path, "-u",
                                    "/proc/self/fd/3", std::to_string(virtual_size)},
                                   spawn_options);
    if (!img.ok()) return undo(img.error());
    auto exited = img->waitFor(std::chrono::seconds(30));
    if (!exited || exited->signaled || exited->exit_code != 0) {
      if (!exited) img->kill();
      auto tail = readFileTail(log, 1024);
      return undo(makeError(ErrorCode::kInternal,
                            "qemu-img create (new overlay) failed: " + (tail.ok() ? tail.value() : std::string())));
    }
  }
  // 3. QEMU switches the guest's disk onto it; the old top node becomes its read-only backing.
  // Named after the disk's number: unique within this QEMU, whichever daemon made it.
  const std::string node = "root-" + std::filesystem::path(next).stem().string();
  json add{{"driver", "qcow2"},
           {"node-name", node},
           {"file", json{{"driver", "file"},
                         {"filename", next},
                         {"aio", "threads"},
                         {"cache", json{{"direct", false}, {"no-flush", true}}}}},  // as qemu_command.cc's
           {"backing", nullptr}};
  if (auto added = qmp_->execute("blockdev-add", add); !added.ok()) return undo(added.error());
  if (auto switched = qmp_->execute("blockdev-snapshot", json{{"node", top_node}, {"overlay", node}}); !switched.ok()) {
    (void)qmp_->execute("blockdev-del", json{{"node-name", node}});
    return undo(switched.error());
  }
  // The old name stays: QEMU may reopen that image by it. It is a second name of the layer.
  // Root's from now on (only once frozen, so a failed freeze leaves the disk the VM's): no later
  // QEMU of this run directory (a resumed one, as a new uid) may write what other VMs stand on.
  // This one reopened it read-only above; one that kept a descriptor is in docs/threat-model.md.
  // (layer_path is in the node's own layers directory: no QEMU renames anything there.)
  // Its mode too: a QEMU may have made its disk writable by anyone before the freeze.
  // And on stable storage now (QEMU flushes it only to the page cache): a suspend or snapshot
  // that fails before syncing it itself must not leave it behind a durable state. A failure is
  // said here; the snapshot's own sync of the layer then fails the snapshot.
  if (UniqueFd layer(::open(layer_path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      !layer.valid() || !settleFile(layer.get(), 0, 0, layer_path).ok()) {
    spdlog::warn("vmm: cannot give the frozen layer {} to root: {}", layer_path, strerror(errno));
  } else if (::fsync(layer.get()) != 0) {
    spdlog::warn("vmm: cannot sync the frozen layer {}: {}", layer_path, strerror(errno));
  }
  paths_.disk = next;
  return okStatus();
}

Status Vm::reactivateStopped() {
  auto status = queryStatus();
  if (!status.ok()) return status.error();
  if (status.value() != "postmigrate") return okStatus();
  SPACE_TRY(qmp_->execute("cont"));
  SPACE_TRY(qmp_->execute("stop"));
  return okStatus();
}

void Vm::quit() {
  if (processRunning()) {
    if (qmp_) (void)qmp_->execute("quit", nullptr, milliseconds(1000));
    if (!process_->waitFor(milliseconds(5000))) process_->kill();
  }
  releaseJail(!processRunning(), /*run_dir_stays=*/true);  // a resume starts a new QEMU, group and uid
  disconnectAgent("the VM was stopped");
}

void Vm::detach() {
  agent_.reset();
  agent_connection_.reset();  // closed, not shut down: a lease still using the agent keeps working
  qmp_.reset();
  if (process_) process_->disown();
  process_.reset();
  if (cgroup_) cgroup_->release();  // QEMU runs on in it
  cgroup_.reset();
  user_.keep();  // and as its uid: held until this daemon ends, never handed to another VM
  if (run_dir_) run_dir_->release();
  run_dir_.reset();
}

void Vm::destroy() {
  if (processRunning()) {
    if (qmp_) (void)qmp_->execute("quit", nullptr, milliseconds(1000));
    if (!process_->waitFor(milliseconds(2000))) process_->kill();
  }
  const bool qemu_gone = !processRunning();
  agent_.reset();
  agent_connection_.reset();
  qmp_.reset();
  process_.reset();
  // A run directory this Vm does not own (a resume that failed) stays, and goes back to root.
  const bool run_dir_stays = !run_dir_.has_value();
  run_dir_.reset();  // removes sockets, console log, overlay: files of its uid, gone before the uid
  releaseJail(qemu_gone, run_dir_stays);  // QEMU is reaped (or, adopted, killed): its group is empty
}

Vm::~Vm() { destroy(); }

}  // namespace space::vmm
