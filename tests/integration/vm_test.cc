// Boots real microVMs from the built guest images (QEMU microvm, TCG here, KVM where the host
// has it) and checks the VM layer end to end. Each test also checks that nothing is left
// behind: no QEMU process and no file under its run directory.
#include "vmm/vm.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "jail/cgroup.h"
#include "jail/seccomp_policy.h"
#include "vmm/disk_overlay.h"
#include "vmm/qemu_command.h"

namespace space::vmm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string imagePath(const char* env, const char* name) {
  if (const char* v = getenv(env); v != nullptr && *v != '\0') return v;
  return std::string(SPACE_IMAGES_DIR) + "/" + name;
}

// Processes whose command line mentions `needle` (our run dir): leaked QEMUs.
int processesMentioning(const std::string& needle) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.find(needle) != std::string::npos) ++count;
  }
  return count;
}

class VmTest : public testing::Test {
 protected:
  void SetUp() override {
    spec_.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
    spec_.rootfs_path = imagePath("SPACE_ROOTFS", "rootfs.ext4");
    spec_.qemu_binary = imagePath("SPACE_QEMU", "qemu-system-x86_64");  // SPACE's own, as spaced runs
    ASSERT_TRUE(std::filesystem::exists(spec_.kernel_path)) << "build the images first (make images)";
    ASSERT_TRUE(std::filesystem::exists(spec_.rootfs_path)) << "build the images first (make images)";
    ASSERT_TRUE(std::filesystem::exists(spec_.qemu_binary)) << "build the images first (make images)";
    spec_.boot_timeout = seconds(90);
    spec_.memory_mib = 256;
    spec_.vcpus = 1;
    auto dir = TempDir::create("/tmp", "space-vmtest-");
    ASSERT_TRUE(dir.ok());
    run_root_.emplace(std::move(dir.value()));
    options_.run_root = run_root_->path();
  }

  void TearDown() override {
    if (!run_root_) return;  // SetUp failed before creating it
    EXPECT_EQ(processesMentioning(run_root_->path()), 0) << "a QEMU process leaked";
    EXPECT_TRUE(std::filesystem::is_empty(run_root_->path())) << "files leaked under " << run_root_->path();
  }

  std::unique_ptr<Vm> boot() {
    auto vm = Vm::start(spec_, options_);
    EXPECT_TRUE(vm.ok()) << vm.error().message;
    return vm.ok() ? std::move(vm.value()) : nullptr;
  }

  std::string run(Vm& vm, const std::string& cmd) {
    auto r = vm.exec(cmd, seconds(60));
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return "";
    EXPECT_EQ(r->exit_code, 0) << cmd << "\nstderr: " << r->stderr_data;
    return r->stdout_data;
  }

  VmSpec spec_;
  VmStartOptions options_;
  std::optional<TempDir> run_root_;
};

TEST_F(VmTest, BootsItsOwnKernel) {
  auto vm = boot();
  ASSERT_TRUE(vm);
  utsname host{};
  uname(&host);
  std::string guest_release = run(*vm, "uname -r");
  ASSERT_FALSE(guest_release.empty());
  guest_release.pop_back();  // newline
  EXPECT_NE(guest_release, host.release) << "the guest reports the host's kernel";
  EXPECT_EQ(guest_release, vm->guestInfo().kernel);
  EXPECT_NE(guest_release.find("-space"), std::string::npos) << guest_release;
  EXPECT_EQ(run(*vm, "cat /proc/cmdline").find("console=ttyS0"), 0u);
  EXPECT_EQ(run(*vm, "nproc"), "1\n");
  EXPECT_GT(vm->bootTiming().to_ready.count(), 0);
  EXPECT_TRUE(vm->shutdown(seconds(30)).ok());
  EXPECT_FALSE(vm->processRunning());
}

TEST_F(VmTest, RootfsHasPromisedTools) {
  auto vm = boot();
  ASSERT_TRUE(vm);
  std::string out = run(*vm,
                        "for t in bash python3 python pip git curl wget sudo ps ip tput node npm; do "
                        "command -v $t >/dev/null || echo missing $t; done; "
                        "python --version; python3 -c 'print(6*7)'; node -e 'console.log(6*7)'; "
                        "test -f /etc/ssl/certs/ca-certificates.crt && echo certs; "
                        "id -u user; getent passwd user | cut -d: -f6; "
                        "id -un; sudo -n id -u");
  EXPECT_EQ(out.find("missing"), std::string::npos) << out;
  EXPECT_NE(out.find("Python 3.11"), std::string::npos) << out;
  EXPECT_NE(out.find("42\n42\ncerts\n1000\n/home/user\nuser\n0\n"), std::string::npos) << out;
  auto failing = vm->exec("echo out; echo err >&2; exit 3", seconds(30));
  ASSERT_TRUE(failing.ok());
  EXPECT_EQ(failing->exit_code, 3);
  EXPECT_EQ(failing->stdout_data, "out\n");
  EXPECT_EQ(failing->stderr_data, "err\n");
}

// A guest draining its hardware RNG gets at most the rate limit (64 KiB/s): QEMU reads each byte
// from the host's /dev/urandom on its main loop. Unlimited, this read took megabytes a second.
TEST_F(VmTest, TheGuestsHardwareRngIsRateLimited) {
  auto vm = boot();
  ASSERT_TRUE(vm);
  std::string out = run(*vm,
                        "sudo -n timeout -s INT 3 dd if=/dev/hwrng of=/dev/null bs=1024 iflag=fullblock 2>&1 | "
                        "grep -o '^[0-9]* bytes' | cut -d' ' -f1; true");
  ASSERT_FALSE(out.empty()) << "dd said nothing";
  const long bytes = std::stol(out);
  std::printf("hwrng: %ld bytes in 3 s\n", bytes);
  EXPECT_GT(bytes, 0) << "the device gave nothing";
  // 3 s at 64 KiB/s, the first period's allowance and the guest's own hwrng thread's share.
  EXPECT_LE(bytes, 5 * 65536) << bytes << " bytes in 3 s";
}

TEST_F(VmTest, StopAndContHaltTheGuest) {
  auto vm = boot();
  ASSERT_TRUE(vm);
  ASSERT_EQ(vm->queryStatus().value(), "running");
  ASSERT_TRUE(vm->pause().ok());
  EXPECT_EQ(vm->queryStatus().value(), "paused");
  // While paused the guest cannot answer; once continued, the pending command completes.
  auto pending = std::async(std::launch::async, [&] { return vm->exec("echo resumed", seconds(60)); });
  EXPECT_EQ(pending.wait_for(milliseconds(1500)), std::future_status::timeout);
  ASSERT_TRUE(vm->resume().ok());
  auto result = pending.get();
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result->stdout_data, "resumed\n");
  EXPECT_EQ(vm->queryStatus().value(), "running");
}

TEST_F(VmTest, KernelPanicIsReportedWithConsoleTail) {
  spec_.extra_cmdline = "init=/nonexistent-init";
  auto vm = Vm::start(spec_, options_);
  ASSERT_FALSE(vm.ok());
  const std::string& msg = vm.error().message;
  EXPECT_EQ(msg.find("kernel panic"), 0u) << msg;
  EXPECT_NE(msg.find("--- guest console (tail) ---"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Kernel panic - not syncing"), std::string::npos) << msg;
}

TEST_F(VmTest, BootHangIsDetectedByTimeout) {
  // init is a shell waiting for console input that never comes: the VM runs but never reports.
  spec_.extra_cmdline = "init=/bin/sh";
  spec_.boot_timeout = seconds(8);
  auto start = Clock::now();
  auto vm = Vm::start(spec_, options_);
  ASSERT_FALSE(vm.ok());
  EXPECT_NE(vm.error().message.find("boot hang"), std::string::npos) << vm.error().message;
  EXPECT_NE(vm.error().message.find("Run /bin/sh as init process"), std::string::npos) << "console tail missing";
  EXPECT_LT(Clock::now() - start, seconds(30));
}

TEST_F(VmTest, QemuRefusingToStartIsReported) {
  spec_.qemu_binary = "/bin/false";
  spec_.boot_timeout = std::chrono::seconds(40);
  auto started = std::chrono::steady_clock::now();
  auto vm = Vm::start(spec_, options_);
  ASSERT_FALSE(vm.ok());
  EXPECT_NE(vm.error().message.find("QEMU exited before its monitor came up"), std::string::npos) << vm.error().message;
  // At its exit, whether it came before spaced's connect (under load) or after.
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  // One that lets go of its monitor's socket early and exits a moment later (a crash early in
  // its start): connected before it let go, spaced sees the connection reset; after, the socket
  // refuses, and the start fails when QEMU exits (its pidfd), not at the boot timeout. Which of
  // the two happens is a race (the second under load: how this test once hung for its timeout).
  auto scripts = TempDir::create(std::filesystem::temp_directory_path().string(), "space-fake-qemu-");
  ASSERT_TRUE(scripts.ok());
  const std::string fake = scripts->path() + "/drops-its-monitor";
  ASSERT_TRUE(writeFileAtomic(fake, "#!/bin/sh\nexec " + std::to_string(kQmpFd) + ">&-\nsleep 2\nexit 1\n", 0755).ok());
  spec_.qemu_binary = fake;
  spec_.boot_timeout = std::chrono::seconds(40);
  for (int round = 0; round < 3; ++round) {
    started = std::chrono::steady_clock::now();
    vm = Vm::start(spec_, options_);
    ASSERT_FALSE(vm.ok());
    const std::string& why = vm.error().message;
    EXPECT_TRUE(why.find("QEMU exited before its monitor came up") != std::string::npos ||
                why.find("cannot reach QEMU's monitor") != std::string::npos)
        << why;
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << why;
  }
}

TEST_F(VmTest, ImpossibleSizesAreRefusedBeforeAnythingStarts) {
  struct Case {
    uint32_t vcpus;
    uint64_t memory_mib;
    const char* expect;
  };
  auto host = probeHostCapacity();
  ASSERT_TRUE(host.ok());
  for (const Case& c : {Case{0, 512, "vcpus = 0"}, Case{host->max_vcpus + 1, 512, "allowed on this host"},
                        Case{1, 64, "memory_mib = 64"}, Case{1, host->available_memory_mib + 1024, "available"}}) {
    spec_.vcpus = c.vcpus;
    spec_.memory_mib = c.memory_mib;
    auto vm = Vm::start(spec_, options_);
    ASSERT_FALSE(vm.ok());
    EXPECT_NE(vm.error().message.find(c.expect), std::string::npos) << vm.error().message;
    EXPECT_TRUE(std::filesystem::is_empty(run_root_->path()));
  }
}

// QEMU's image locks are OFD locks anyone who can open an image may take. A process holding the
// byte that says "no consistent reads by others" on the shared base image (what a compromised
// QEMU could do with its read-only descriptor of a template's image) stops no VM: the images
// below an overlay are opened without image locking.
TEST_F(VmTest, ALockOnASharedImageStopsNoVm) {
  UniqueFd image(::open(spec_.rootfs_path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(image.valid());
  struct flock lock {};
  lock.l_type = F_RDLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = 200;  // QEMU's lock byte for an unshared "consistent read"
  lock.l_len = 1;
  ASSERT_EQ(::fcntl(image.get(), F_OFD_SETLK, &lock), 0) << strerror(errno);
  auto vm = boot();
  ASSERT_TRUE(vm);
  EXPECT_EQ(run(*vm, "echo up"), "up\n");
}

TEST_F(VmTest, GuestWritesStayInItsOverlay) {
  auto base_size = std::filesystem::file_size(spec_.rootfs_path);
  auto before = std::filesystem::last_write_time(spec_.rootfs_path);
  {
    auto vm = boot();
    ASSERT_TRUE(vm);
    run(*vm, "echo data > /home/user/marker && sync");
    auto again = vm->exec("cat /home/user/marker", seconds(30));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->stdout_data, "data\n");
  }
  EXPECT_EQ(std::filesystem::file_size(spec_.rootfs_path), base_size);
  EXPECT_EQ(std::filesystem::last_write_time(spec_.rootfs_path), before);
  auto vm = boot();  // a new VM sees the pristine image
  ASSERT_TRUE(vm);
  auto r = vm->exec("test -e /home/user/marker", seconds(30));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 1);
}

// A guest's disk I/O is held to its node's rate per vCPU (bytes and requests per second, QEMU's
// throttling of the device), from its first request and still after its disk is frozen into a
// layer and moved onto a new overlay. Timed from the host: 8 MiB at 2 MiB/s and 150 requests at
// 50 a second take at least 3.5 s and 3 s, less one request's worth (QEMU lets a request through
// at once while its bucket is below the burst, a tenth of a second's worth, and makes the next
// ones wait); this guest writes either in under half a second unthrottled.
TEST_F(VmTest, AGuestsDiskIoIsHeldToItsRate) {
  spec_.disk_io = DiskIoRate{2 << 20, 50};
  auto vm = boot();
  ASSERT_TRUE(vm);
  auto timed = [&](const std::string& command) {
    const auto start = std::chrono::steady_clock::now();
    run(*vm, command);
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
  };
  const std::string bytes = "dd if=/dev/zero of=/home/user/bytes bs=1M count=8 oflag=direct status=none";
  const std::string requests = "dd if=/dev/zero of=/home/user/requests bs=4k count=150 oflag=direct status=none";
  EXPECT_GE(timed(bytes).count(), 3000);
  EXPECT_GE(timed(requests).count(), 2500);
  ASSERT_TRUE(vm->pause().ok());
  const std::string layer = run_root_->path() + "/layer.qcow2";
  auto frozen = vm->freezeDisk(layer);
  ASSERT_TRUE(frozen.ok()) << frozen.error().message;
  ASSERT_TRUE(vm->resume().ok());
  EXPECT_GE(timed(bytes).count(), 3000);
  // A daemon that restarts with other flags adopts the VM at its rate now (here: none, so
  // the same writes run unthrottled), not at the rate QEMU was given before.
  VmAdoptSpec adopt{vm->paths().run_dir, vm->pid(),        vm->identity(),       vm->accelerator(),
                    seconds(30),         spec_.memory_mib, jail::CgroupLayout{}, nullptr};
  adopt.disk_io = DiskIoRate{};
  vm->detach();
  vm.reset();
  auto adopted = Vm::adopt(adopt);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  vm = std::move(adopted.value());
  EXPECT_LT(timed("rm -f /home/user/bytes; " + bytes).count(), 2000);
  vm.reset();
  std::filesystem::remove(layer);
}

// ---- The jail: every QEMU of spaced starts through space-jail in a cgroup of its own. ----

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The line of /proc/<pid>/cgroup for a v1 controller (or v2's "0::"), path part only.
std::string groupOf(pid_t pid, const std::string& controller) {
  std::istringstream lines(readText("/proc/" + std::to_string(pid) + "/cgroup"));
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    if (controller.empty() ? controllers == ",," : controllers.find("," + controller + ",") != std::string::npos) {
      return line.substr(second + 1);
    }
  }
  return "";
}

class JailTest : public VmTest {
 protected:
  void SetUp() override {
    VmTest::SetUp();
    auto layout = jail::setUpCgroups("vmtest-" + std::to_string(getpid()));
    // This project's hosts (and CI) run as root with cgroups: a jail without them is a defect here.
    ASSERT_TRUE(layout.ok()) << layout.error().message;
    layout_ = layout.value();
    auto facts = probeNodeFacts(Accelerator::kAuto);
    ASSERT_TRUE(facts.ok()) << facts.error().message;
    node_ = facts.value();
    node_.jailer = SPACE_JAIL_BIN;
    node_.cgroups = layout_;
    node_.disk_images = {spec_.rootfs_path, std::filesystem::canonical(spec_.rootfs_path).string()};
    options_.node = &node_;
  }
  void TearDown() override {
    VmTest::TearDown();
    for (const auto& root : layout_.roots) {
      EXPECT_EQ(::rmdir(root.dir.c_str()), 0) << root.dir << ": a VM's group is left in it";
    }
  }
  // The file `name` of the VM group's directory under the root for `controller`.
  std::string groupFile(const std::string& group_dir_name, const std::string& controller, const std::string& name) {
    for (const auto& root : layout_.roots) {
      if (root.controller == controller || layout_.version == jail::CgroupVersion::kV2) {
        return root.dir + "/" + group_dir_name + "/" + name;
      }
    }
    return "";
  }
  // Runs `command` (sh -c) through space-jail in a new group with `limits`; its exit status
  // and output.
  // `view`: space-jail's --view arguments (and more); the jail is then pid 1 of a PID namespace
  // of its own, as QEMU's is.
  std::pair<ExitStatus, std::string> runJailed(const std::string& command, const jail::CgroupLimits& limits,
                                               const std::vector<std::string>& view = {}) {
    static int runs = 0;
    auto group =
        jail::VmCgroup::create(layout_, "jailtest-" + std::to_string(getpid()) + "-" + std::to_string(++runs), limits);
    EXPECT_TRUE(group.ok()) << group.error().message;
    if (!group.ok()) return {ExitStatus{}, ""};
    std::vector<std::string> argv = {SPACE_JAIL_BIN};
    for (const auto& procs : group->procsFiles()) argv.insert(argv.end(), {"--cgroup-procs", procs});
    argv.insert(argv.end(), view.begin(), view.end());
    argv.insert(argv.end(), {"--", "/bin/sh", "-c", command});
    const std::string out = run_root_->path() + "/jailed.out";
    SpawnOptions options{out, "", true};
    options.new_pid_namespace = !view.empty();
    auto child = ChildProcess::spawn(argv, options);
    EXPECT_TRUE(child.ok());
    ExitStatus status;
    if (child.ok()) {
      auto done = child->waitFor(seconds(60));
      EXPECT_TRUE(done.has_value()) << "the jailed command did not end";
      status = done ? *done : child->kill();
    }
    std::string text = readText(out);
    std::filesystem::remove(out);
    // What the command left running (its background children) goes with it.
    for (const auto& procs : group->procsFiles()) {
      std::istringstream pids(readText(procs));
      for (pid_t p; pids >> p;) ::kill(p, SIGKILL);
    }
    EXPECT_TRUE(group->remove().ok());
    return {status, text};
  }

  jail::CgroupLayout layout_;
  NodeFacts node_;
};

TEST_F(JailTest, QemuRunsInAGroupOfItsOwnSizedByItsVmWithoutCoreDumpsOrNewPrivileges) {
  spec_.disk_io = DiskIoRate{64 << 20, 1000};
  auto vm = boot();
  ASSERT_TRUE(vm);
  const pid_t pid = vm->pid();
  EXPECT_EQ(readText("/proc/" + std::to_string(pid) + "/comm"), "qemu-system-x86\n");  // space-jail became QEMU
  const std::string memory_group = groupOf(pid, layout_.version == jail::CgroupVersion::kV1 ? "memory" : "");
  ASSERT_NE(memory_group.find("/space/vmtest-" + std::to_string(getpid()) + "/vm-"), std::string::npos) << memory_group;
  const std::string name = std::filesystem::path(memory_group).filename().string();
  const auto disk = jail::blockDeviceUnder(vm->paths().run_dir);
  ASSERT_TRUE(disk.has_value()) << "this project's machines keep data on a block device";
  const auto limits = vmCgroupLimits(spec_, vm->accelerator(), {*disk});
  const bool v1 = layout_.version == jail::CgroupVersion::kV1;
  // Its disk I/O: four times the guest's rate, reads and writes each, on the disk of its files.
  ASSERT_TRUE(layout_.io) << "this project's machines have a blkio (v1) or io (v2) controller";
  if (v1) {
    for (const char* way : {"read", "write"}) {
      const std::string prefix = std::string("blkio.throttle.") + way;
      EXPECT_NE(readText(groupFile(name, "blkio", prefix + "_bps_device")).find(*disk + " 268435456\n"),
                std::string::npos)
          << way;
      EXPECT_NE(readText(groupFile(name, "blkio", prefix + "_iops_device")).find(*disk + " 4000\n"), std::string::npos)
          << way;
    }
  } else {
    EXPECT_NE(
        readText(groupFile(name, "", "io.max")).find(*disk + " rbps=268435456 wbps=268435456 riops=4000 wiops=4000"),
        std::string::npos);
  }
  EXPECT_EQ(std::stoull(readText(groupFile(name, "memory", v1 ? "memory.limit_in_bytes" : "memory.max"))),
            limits.memory_bytes);
  EXPECT_EQ(std::stoull(readText(groupFile(name, "pids", "pids.max"))), limits.pids);
  if (v1) {
    EXPECT_EQ(std::stoull(readText(groupFile(name, "cpu", "cpu.cfs_quota_us"))), limits.cpu_quota_us);
    // One group of that name in each hierarchy.
    EXPECT_EQ(std::filesystem::path(groupOf(pid, "pids")).filename(), name);
    EXPECT_EQ(std::filesystem::path(groupOf(pid, "cpu")).filename(), name);
  }
  // 256 MiB guest, TCG's 128 MiB translation buffer, 384 + 64 MiB for QEMU; 2 tasks per vCPU over 128.
  EXPECT_EQ(limits.memory_bytes >> 20, vm->accelerator() == Accelerator::kTcg ? 832u : 704u);
  if (vm->accelerator() == Accelerator::kTcg) {  // and QEMU was told that size
    std::string argv = readText("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(argv.begin(), argv.end(), '\0', ' ');
    EXPECT_NE(argv.find(" tcg,thread=multi,tb-size=128 "), std::string::npos) << argv;
  }
  EXPECT_EQ(limits.pids, 130u);
  const std::string proc_limits = readText("/proc/" + std::to_string(pid) + "/limits");
  EXPECT_TRUE(std::regex_search(proc_limits, std::regex(R"(Max core file size +0 +0 )"))) << proc_limits;
  EXPECT_TRUE(std::regex_search(proc_limits, std::regex(R"(Max open files +4096 +4096 )"))) << proc_limits;
  // No file past what its disk or memory needs (the image's size and 256 MiB), and none made:
  // the run directory holds only what spaced made for it (the sockets it listens on included).
  auto image_bytes = diskVirtualSize(spec_.rootfs_path, spec_.rootfs_format);
  ASSERT_TRUE(image_bytes.ok());
  const std::string file_size = std::to_string(qemuFileSizeLimit(image_bytes.value(), spec_.memory_mib));
  EXPECT_TRUE(std::regex_search(proc_limits, std::regex("Max file size +" + file_size + " +" + file_size + " ")))
      << proc_limits;
  std::set<std::string> made;
  for (const auto& e : std::filesystem::directory_iterator(vm->paths().run_dir)) made.insert(e.path().filename());
  EXPECT_EQ(made, (std::set<std::string>{"agent.sock", "console.log", "disk.qcow2", "qemu.log", "qmp.sock"}));
  const std::string status = readText("/proc/" + std::to_string(pid) + "/status");
  EXPECT_NE(status.find("NoNewPrivs:\t1"), std::string::npos);
  // No capability, and none to gain; pid 1 of a PID namespace of its own.
  for (const char* set : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
    EXPECT_NE(status.find(std::string(set) + ":\t0000000000000000"), std::string::npos) << set << "\n" << status;
  }
  EXPECT_NE(status.find("NSpid:\t" + std::to_string(pid) + "\t1\n"), std::string::npos) << status;
  // Its filesystem, seen through its root: the system's programs, its devices, its own files.
  const std::string root = "/proc/" + std::to_string(pid) + "/root";
  std::set<std::string> devices;
  for (const auto& e : std::filesystem::directory_iterator(root + "/dev")) devices.insert(e.path().filename());
  EXPECT_EQ(devices, (std::set<std::string>{"null", "urandom"}));
  EXPECT_TRUE(std::filesystem::exists(root + vm->paths().qmp_socket));
  EXPECT_TRUE(std::filesystem::exists(root + spec_.kernel_path));
  EXPECT_FALSE(std::filesystem::exists(root + "/etc/passwd"));
  EXPECT_FALSE(std::filesystem::exists(root + "/root"));
  EXPECT_FALSE(std::filesystem::exists(root + "/sys/fs/cgroup"));
  EXPECT_EQ(run(*vm, "echo jailed"), "jailed\n");  // and the guest works as ever
  const std::string dir = groupFile(name, "memory", "");
  EXPECT_TRUE(std::filesystem::exists(dir));
  vm.reset();
  EXPECT_FALSE(std::filesystem::exists(dir)) << "the VM's group outlived it";
}

// What the group enforces, shown with a helper in the same jail: the bounds on what a guest can
// make its QEMU do. (An escaped QEMU is root and could leave its group: docs/threat-model.md.)
// Limits that cannot be written fail the creation, which removes only what it made: a group
// that was there (an adopted gateway's) stays as it was.
TEST_F(JailTest, AFailedGroupCreationRemovesWhatItMadeAndLeavesWhatWasThere) {
  jail::CgroupLimits impossible;
  impossible.cpu_quota_us = 1;  // below the kernel's least quota (1 ms)
  const std::string name = "jailtest-" + std::to_string(getpid()) + "-create";
  auto fresh = jail::VmCgroup::create(layout_, name, impossible);
  ASSERT_FALSE(fresh.ok());
  const jail::VmCgroup named = jail::VmCgroup::existing(layout_, name);
  ASSERT_FALSE(named.dirs().empty());
  for (const std::string& dir : named.dirs()) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
  auto there = jail::VmCgroup::create(layout_, name, {});
  ASSERT_TRUE(there.ok()) << there.error().message;
  auto again = jail::VmCgroup::create(layout_, name, impossible);
  ASSERT_FALSE(again.ok());
  for (const std::string& dir : there->dirs()) EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  EXPECT_TRUE(there->remove().ok());
}

// What an escaped QEMU's own disk I/O is held to (QEMU's throttle holds only its guest's):
// direct reads and writes wait their turn. (Buffered writes are held on v2 only: cgroup.h.)
TEST_F(JailTest, AProcessInTheJailIsHeldToItsDiskRate) {
  ASSERT_TRUE(layout_.io) << "this project's machines have a blkio (v1) or io (v2) controller";
  const std::string file = run_root_->path() + "/io";
  ASSERT_TRUE(writeFileAtomic(file, std::string(256 << 10, 'x')).ok());
  auto disk = jail::blockDeviceUnder(file);
  ASSERT_TRUE(disk.has_value());
  // 40 requests of 4 KiB each way: about 2 s each way at either limit; unlimited, milliseconds.
  const std::string script = "t() { date +%s%N; }; s=$(t); dd if=" + file +
                             " of=/dev/null bs=4k count=40 iflag=direct 2>/dev/null || echo read failed; m=$(t); "
                             "dd if=/dev/zero of=" +
                             file +
                             " bs=4k count=40 oflag=direct conv=notrunc 2>/dev/null || echo write failed; e=$(t); "
                             "echo ms $(( (m - s) / 1000000 )) $(( (e - m) / 1000000 ))";
  auto elapsed = [](const std::string& out) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, std::regex("ms ([0-9]+) ([0-9]+)\n"))) << out;
    return m.empty() ? std::pair<long, long>{-1, -1} : std::pair<long, long>{std::stol(m[1]), std::stol(m[2])};
  };
  // Held by requests (20 a second), then by bytes (64 KiB a second: 160 KiB each way).
  for (const auto& limit : {jail::CgroupIoLimit{*disk, 0, 20}, jail::CgroupIoLimit{*disk, 64 << 10, 0}}) {
    jail::CgroupLimits limits;
    limits.io = {limit};
    auto [held, held_out] = runJailed(script, limits);
    EXPECT_EQ(held.exit_code, 0) << held.describe() << held_out;
    EXPECT_EQ(held_out.find("failed"), std::string::npos) << held_out;
    const auto [held_read, held_write] = elapsed(held_out);
    EXPECT_GE(held_read, 1500) << limit.bytes_per_sec << " " << limit.iops << ": " << held_out;
    EXPECT_GE(held_write, 1500) << limit.bytes_per_sec << " " << limit.iops << ": " << held_out;
  }
  // A device the kernel does not throttle (/dev/null's) makes the group without the limit.
  jail::CgroupLimits refused;
  refused.io = {jail::CgroupIoLimit{"1:3", 1 << 20, 100}};
  auto group = jail::VmCgroup::create(layout_, "jailtest-" + std::to_string(getpid()) + "-io", refused);
  ASSERT_TRUE(group.ok()) << group.error().message;
  EXPECT_NE(group->ioLimitError().find("1:3"), std::string::npos) << group->ioLimitError();
  EXPECT_TRUE(group->remove().ok());
  // The same without the limit: what took the time was the limit.
  auto [free, free_out] = runJailed(script, {});
  const auto [free_read, free_write] = elapsed(free_out);
  EXPECT_LT(free_read, 1000) << free_out;
  EXPECT_LT(free_write, 1000) << free_out;
  std::filesystem::remove(file);
}

TEST_F(JailTest, AProcessInTheJailCannotExceedItsMemoryOrTasks) {
  jail::CgroupLimits limits;
  limits.memory_bytes = 64 << 20;
  limits.pids = 16;
  // 128 MB held in a shell variable: killed by the kernel at the group's 64 MiB.
  auto [hog, hog_out] = runJailed("x=$(head -c 128000000 /dev/zero | tr '\\0' a); echo survived ${#x}", limits);
  EXPECT_EQ(hog_out.find("survived"), std::string::npos) << hog_out;
  EXPECT_TRUE(hog.signaled || hog.exit_code != 0) << hog.describe();
  // 40 sleepers: at most 16 tasks, so forks fail.
  auto [forks, forks_out] =
      runJailed("n=0; for i in $(seq 40); do sleep 3 & n=$((n+1)); done; wait; echo started $n", limits);
  EXPECT_TRUE(std::regex_search(forks_out, std::regex("fork|Resource temporarily unavailable|Cannot"))) << forks_out;
  // Within both, the same helper runs fine: the refusals above are the limits, not the jail.
  auto [fine, fine_out] = runJailed("x=$(head -c 8000000 /dev/zero | tr '\\0' a); echo fine ${#x}", limits);
  EXPECT_EQ(fine.exit_code, 0) << fine.describe() << fine_out;
  EXPECT_EQ(fine_out, "fine 8000000\n");
}

// The view QEMU gets, shown with a helper in the same jail (what an escaped QEMU starts with):
// its own files, nothing of another sandbox or of the state database, no base image it can
// write, no other process, no capability.
TEST_F(JailTest, AProcessInTheJailSeesOnlyItsOwnFilesNoOtherProcessAndHoldsNoCapability) {
  const std::string dir = run_root_->path();
  std::filesystem::create_directories(dir + "/own");
  std::filesystem::create_directories(dir + "/other");
  ASSERT_TRUE(writeFileAtomic(dir + "/other/secret", "tenant B's file\n").ok());
  ASSERT_TRUE(writeFileAtomic(dir + "/state.db", "every tenant's rows\n").ok());
  ASSERT_TRUE(writeFileAtomic(dir + "/base.img", "base image\n").ok());
  const std::string script =
      "cat " + dir + "/other/secret; cat " + dir + "/state.db; echo listing: $(ls " + dir + "); echo overwritten > " +
      dir + "/base.img; echo base: $(cat " + dir + "/base.img); echo mine > " + dir + "/own/f && echo own: $(cat " +
      dir + "/own/f); echo processes: $(ls /proc | grep -c '^[0-9]'); kill -0 " + std::to_string(getpid()) +
      "; grep -E '^Cap(Eff|Bnd)' /proc/self/status; echo etc: $(ls /etc); " +
      "echo '|/bin/true' > /proc/sys/kernel/core_pattern; touch /dev/null; mount -t tmpfs x " + dir + "/own";
  jail::CgroupLimits limits;
  limits.memory_bytes = 64 << 20;
  limits.pids = 16;
  auto [status, out] = runJailed(
      script, limits, {"--view", "--rw", dir + "/own", "--ro", dir + "/base.img", "--dev", "/dev/null", "--no-caps"});
  std::filesystem::remove_all(dir + "/own");
  std::filesystem::remove_all(dir + "/other");
  std::filesystem::remove(dir + "/state.db");
  std::filesystem::remove(dir + "/base.img");
  EXPECT_NE(out.find(dir + "/other/secret: No such file or directory"), std::string::npos) << out;
  EXPECT_NE(out.find(dir + "/state.db: No such file or directory"), std::string::npos) << out;
  EXPECT_NE(out.find("listing: base.img own\n"), std::string::npos) << out;
  EXPECT_NE(out.find("Read-only file system"), std::string::npos) << out;
  EXPECT_NE(out.find("base: base image\n"), std::string::npos) << out;
  EXPECT_NE(out.find("own: mine\n"), std::string::npos) << out;
  // The shell, and the ls and grep of the pipeline (and its subshell): nothing of the host.
  EXPECT_TRUE(std::regex_search(out, std::regex("processes: [1-4]\n"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("kill: .*No such process"))) << out;
  EXPECT_NE(out.find("CapEff:\t0000000000000000"), std::string::npos) << out;
  EXPECT_NE(out.find("CapBnd:\t0000000000000000"), std::string::npos) << out;
  EXPECT_NE(out.find("etc: ld.so.cache\n"), std::string::npos) << out;
  // No kernel setting to write (/proc holds processes only), no host device node to change.
  EXPECT_TRUE(std::regex_search(out, std::regex("core_pattern: (Directory nonexistent|No such file)"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("touch: .*/dev/null.*Read-only file system"))) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("mount: .*(permission denied|must be superuser)"))) << out;
  EXPECT_NE(status.exit_code, 0) << status.describe();  // mount failed, last
}

// A jailed QEMU can write its run directory, so what it plants there must never lead spaced
// (unconfined) to the host's files: links are not followed when spaced reads, trims or writes
// there, and a disk layer named outside the node's disk directories never enters a view.
TEST_F(JailTest, WhatAHostileQemuPlantsInItsRunDirectoryLeadsNowhere) {
  auto vm = boot();
  ASSERT_TRUE(vm);
  const std::string run_dir = vm->paths().run_dir;
  const std::string host_file = run_root_->path() + "/host-file";
  ASSERT_TRUE(writeFileAtomic(host_file, std::string(200, 'h')).ok());
  // The console log replaced by a link: neither read (it would reach a tenant) nor truncated.
  std::filesystem::rename(vm->paths().console_log, run_dir + "/console.real");
  ASSERT_EQ(::symlink(host_file.c_str(), vm->paths().console_log.c_str()), 0);
  EXPECT_EQ(vm->consoleTail(4096).find("hhh"), std::string::npos);
  vm->trimConsole(10, 5);
  // A link where a suspend writes its state: replaced, not written through.
  ASSERT_EQ(::symlink(host_file.c_str(), (run_dir + "/suspended.state.tmp").c_str()), 0);
  ASSERT_TRUE(vm->pause().ok());
  auto saved = vm->saveState(run_dir + "/suspended.state", seconds(60));
  EXPECT_TRUE(saved.ok()) << saved.error().message;
  struct stat st {};
  ASSERT_EQ(::lstat((run_dir + "/suspended.state").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(readText(host_file), std::string(200, 'h'));
  vm.reset();

  // A layer whose name (from a qcow2 header QEMU can rewrite) is outside the disk directories.
  VmSpec hostile = spec_;
  hostile.rootfs_path = host_file;
  auto refused = Vm::start(hostile, options_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("outside the node's disk directories"), std::string::npos)
      << refused.error().message;
  std::filesystem::remove(host_file);
}

// A writable path that is a link would let whoever planted it choose what becomes writable.
TEST_F(JailTest, AWritablePathThatIsALinkIsRefused) {
  const std::string dir = run_root_->path();
  ASSERT_EQ(::symlink("/etc", (dir + "/memory").c_str()), 0);
  jail::CgroupLimits limits;
  auto [status, out] = runJailed("echo ran", limits, {"--view", "--rw", dir + "/memory", "--no-caps"});
  std::filesystem::remove(dir + "/memory");
  EXPECT_EQ(status.exit_code, 125) << status.describe();
  EXPECT_NE(out.find("is a symbolic link; refused"), std::string::npos) << out;
  EXPECT_EQ(out.find("ran"), std::string::npos) << out;
}

// The view runs the system's programs and an --exec file (SPACE's QEMU lives outside /usr),
// directly or through a link, and nothing else: a --ro file stays data, and a directory is
// never made executable whole.
TEST_F(JailTest, OnlyAnExecFileRunsAmongTheFilesGivenToTheView) {
  const std::string dir = run_root_->path();
  for (const char* name : {"/prog", "/data"}) {
    std::filesystem::copy_file("/bin/true", dir + name);
    std::filesystem::permissions(dir + name, std::filesystem::perms(0755));
  }
  ASSERT_EQ(::symlink((dir + "/prog").c_str(), (dir + "/link").c_str()), 0);
  jail::CgroupLimits limits;
  // Uid 0 without capabilities could still write its own file: the mount must refuse it.
  auto [status, out] =
      runJailed(dir + "/prog && echo prog ran; " + dir + "/data; echo data: $?; echo x > " + dir + "/prog", limits,
                {"--view", "--exec", dir + "/prog", "--ro", dir + "/data", "--no-caps"});
  EXPECT_NE(status.exit_code, 0) << status.describe() << out;  // the write, last
  EXPECT_NE(out.find(dir + "/prog: Read-only file system"), std::string::npos) << out;
  EXPECT_NE(out.find("prog ran\n"), std::string::npos) << out;
  EXPECT_NE(out.find("data: 126\n"), std::string::npos) << out;  // found, not executable
  std::tie(status, out) =
      runJailed(dir + "/link && echo link ran", limits, {"--view", "--exec", dir + "/link", "--no-caps"});
  EXPECT_EQ(status.exit_code, 0) << status.describe() << out;
  EXPECT_NE(out.find("link ran\n"), std::string::npos) << out;
  std::tie(status, out) = runJailed("echo ran", limits, {"--view", "--exec", dir, "--no-caps"});
  EXPECT_EQ(status.exit_code, 125) << status.describe();
  EXPECT_NE(out.find("is not a regular file; refused"), std::string::npos) << out;
  EXPECT_EQ(out.find("ran\n"), std::string::npos) << out;
  // One path given twice with different accesses (directly, or as what a link resolves to): no
  // view, rather than one access chosen by the order of the arguments. Twice the same is fine.
  for (const auto& options :
       std::vector<std::vector<std::string>>{{"--view", "--rw", dir + "/data", "--ro", dir + "/data", "--no-caps"},
                                             {"--view", "--exec", dir + "/prog", "--rw", dir + "/prog", "--no-caps"},
                                             {"--view", "--ro", dir + "/link", "--rw", dir + "/prog", "--no-caps"}}) {
    std::tie(status, out) = runJailed("echo ran", limits, options);
    EXPECT_EQ(status.exit_code, 125) << status.describe() << out;
    EXPECT_NE(out.find("is named with two different accesses; refused"), std::string::npos) << out;
    EXPECT_EQ(out.find("ran\n"), std::string::npos) << out;
  }
  std::tie(status, out) =
      runJailed("echo ran", limits, {"--view", "--ro", dir + "/data", "--ro", dir + "/data", "--no-caps"});
  EXPECT_EQ(status.exit_code, 0) << status.describe() << out;
  for (const char* name : {"/prog", "/data", "/link"}) std::filesystem::remove(dir + name);
}

// space-jail with `options`, in front of `echo ran` (spawned plainly, not as pid 1 of a PID
// namespace): it must exit 125 before running it, saying `why`.
void expectJailRefuses(const std::string& dir, const std::vector<std::string>& options, const std::string& why) {
  const std::string out = dir + "/jail.out";
  std::vector<std::string> argv = {SPACE_JAIL_BIN};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"--", "/bin/echo", "ran"});
  auto child = ChildProcess::spawn(argv, SpawnOptions{out, "", true});
  ASSERT_TRUE(child.ok());
  auto done = child->waitFor(seconds(10));
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->exit_code, 125);
  const std::string text = readText(out);
  EXPECT_EQ(text.find("ran"), std::string::npos) << text;
  EXPECT_NE(text.find(why), std::string::npos) << text;
  std::filesystem::remove(out);
}

// --view without a PID namespace of its own would show host processes: refused.
TEST_F(JailTest, AViewOutsideAPidNamespaceOfItsOwnStartsNothing) {
  expectJailRefuses(run_root_->path(), {"--view"}, "--view needs a PID namespace of its own");
}

TEST_F(JailTest, AJailThatCannotJoinItsGroupStartsNothing) {
  expectJailRefuses(run_root_->path(), {"--cgroup-procs", run_root_->path() + "/missing/cgroup.procs"},
                    "space-jail: cannot open");
}

// The uid of a QEMU's own (vmm/vm_users.h), shown with a helper in the same jail: a file of
// root's is closed to it even where its view holds one, its own directory is open to it, and
// it holds no capability to change back.
TEST_F(JailTest, AProcessAsAVmUidOwnsOnlyWhatItIsGiven) {
  const std::string dir = run_root_->path();
  std::filesystem::create_directories(dir + "/own");
  ASSERT_EQ(::chown((dir + "/own").c_str(), 1700000005, 1700000000), 0);
  ASSERT_TRUE(writeFileAtomic(dir + "/roots", "root's alone\n", 0600).ok());
  const std::string script = "echo ids: $(id -u) $(id -g) $(id -G); cat " + dir + "/roots; echo mine > " + dir +
                             "/own/f && echo own: $(cat " + dir +
                             "/own/f); grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status";
  jail::CgroupLimits limits;
  limits.memory_bytes = 64 << 20;
  limits.pids = 16;
  auto [status, out] = runJailed(
      script, limits,
      {"--view", "--rw", dir + "/own", "--ro", dir + "/roots", "--no-caps", "--user", "1700000005:1700000000"});
  std::filesystem::remove_all(dir + "/own");
  std::filesystem::remove(dir + "/roots");
  EXPECT_NE(out.find("ids: 1700000005 1700000000 1700000000\n"), std::string::npos) << out;  // no other group
  EXPECT_TRUE(std::regex_search(out, std::regex("roots: Permission denied"))) << out;
  EXPECT_EQ(out.find("root's alone"), std::string::npos) << out;
  EXPECT_NE(out.find("own: mine\n"), std::string::npos) << out;
  for (const char* set : {"CapPrm", "CapEff", "CapBnd"}) {
    EXPECT_NE(out.find(std::string(set) + ":\t0000000000000000"), std::string::npos) << set << "\n" << out;
  }
  // A uid of 0 (or none) is refused before anything runs.
  expectJailRefuses(dir, {"--user", "0:0"}, "--user wants UID:GID");
  expectJailRefuses(dir, {"--group", "5"}, "--group needs --user");
}

// The jail's own seccomp filter, shown with a helper as a VM's uid in the same jail: the key
// calls (a uid's keyring would outlive its QEMU and pass to the next VM of the uid), new
// namespaces, mounts and leases are refused, while what QEMU does need (threads: clone3 is
// answered ENOSYS and the C library falls back to clone; fork; record locks) still works. The
// same probe outside the jail shows that each refused call is one the uid could otherwise make.
TEST_F(JailTest, KeyringsNamespacesMountsAndLeasesAreClosedToAJailedProcess) {
  const std::string dir = run_root_->path();
  std::filesystem::create_directories(dir + "/own");
  ASSERT_EQ(::chown((dir + "/own").c_str(), 1700000100, 1700000000), 0);
  const std::string probe = dir + "/probe.py";
  const std::string probe_text = R"PY(import ctypes, errno, fcntl, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
def report(name, r):
    print(name + ": " + ("ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")), flush=True)
USER_KEYRING = ctypes.c_int(-4)
report("add_key", libc.syscall(248, b"user", b"probe", b"secret", 6, USER_KEYRING))
report("keyctl", libc.syscall(250, 0, USER_KEYRING, 0))
report("unshare", libc.syscall(272, 0x10000000))
r = libc.syscall(56, 0x40000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWNET | SIGCHLD)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
report("clone_newnet", r)
report("clone3", libc.syscall(435, None, 0))
report("mount", libc.syscall(165, b"none", sys.argv[1].encode(), b"tmpfs", 0, None))
path = sys.argv[1] + "/leased"
open(path, "w").close()
with open(path) as f:
    try:
        fcntl.fcntl(f, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        print("lease: ok")
    except OSError as e:
        print("lease: " + errno.errorcode[e.errno])
    # The same command with bits above its 32 (the kernel reads an unsigned int).
    r = libc.syscall(72, f.fileno(), ctypes.c_long((1 << 32) | 1024), 0)  # fcntl(fd, F_SETLEASE, F_RDLCK)
    report("lease_high_bits", r)
    if r >= 0:
        fcntl.fcntl(f, fcntl.F_SETLEASE, fcntl.F_UNLCK)
report("io_uring_setup", libc.syscall(425, 4, ctypes.create_string_buffer(120)))
with open(path, "w") as f:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("record lock: ok")
t = threading.Thread(target=lambda: print("thread: ok", flush=True))
t.start()
t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork: " + str(os.waitpid(pid, 0)[1] >> 8))
)PY";
  ASSERT_TRUE(writeFileAtomic(probe, probe_text).ok());
  jail::CgroupLimits limits;
  limits.memory_bytes = 128 << 20;
  limits.pids = 16;
  auto [status, out] =
      runJailed("/usr/bin/python3 " + probe + " " + dir + "/own", limits,
                {"--view", "--rw", dir + "/own", "--ro", probe, "--no-caps", "--user", "1700000100:1700000000"});
  EXPECT_EQ(status.exit_code, 0) << status.describe() << "\n" << out;
  for (const char* refused :
       {"add_key: EPERM", "keyctl: EPERM", "unshare: EPERM", "clone_newnet: EPERM", "clone3: ENOSYS", "mount: EPERM",
        "lease: EPERM", "lease_high_bits: EPERM", "io_uring_setup: ENOSYS"}) {
    EXPECT_NE(out.find(std::string(refused) + "\n"), std::string::npos) << refused << "\n" << out;
  }
  for (const char* works : {"record lock: ok", "thread: ok", "fork: 7"}) {
    EXPECT_NE(out.find(std::string(works) + "\n"), std::string::npos) << works << "\n" << out;
  }
  // The control: the same uid without the jail's filter holds a keyring and may make a user
  // namespace and take a lease (setpriv is util-linux's). The key it adds stays in that uid's
  // keyring, a uid outside every range the tests give VMs. The probe comes as an argument, and
  // the run root (0700) is opened to the uid for the while.
  std::filesystem::remove(dir + "/own/leased");
  ASSERT_EQ(::chmod(dir.c_str(), 0711), 0);
  const std::string control_out = dir + "/control.out";
  auto control = ChildProcess::spawn({"/usr/bin/setpriv", "--reuid=1700000100", "--regid=1700000000", "--clear-groups",
                                      "--", "/usr/bin/python3", "-c", probe_text, dir + "/own"},
                                     SpawnOptions{control_out, "", true});
  ASSERT_TRUE(control.ok());
  auto control_status = control->waitFor(seconds(30));
  ::chmod(dir.c_str(), 0700);
  ASSERT_TRUE(control_status.has_value());
  const std::string unconfined = readText(control_out);
  for (const char* allowed :
       {"add_key: ok", "keyctl: ok", "unshare: ok", "lease: ok", "lease_high_bits: ok", "io_uring_setup: ok"}) {
    EXPECT_NE(unconfined.find(std::string(allowed) + "\n"), std::string::npos) << allowed << "\n" << unconfined;
  }
  std::filesystem::remove_all(dir + "/own");
  std::filesystem::remove(probe);
  std::filesystem::remove(control_out);
}

// What a QEMU that escaped its guest can put on the node's disk, which has no quota for its run
// directory: with --no-new-files it makes, removes, renames and links no file (of any kind,
// a socket included), and with --file-size it writes no file past the bound, with the write
// failing rather than the process ending. Shown with a helper as a VM uid in the same jail; the
// same helper in the jail without the two options does each of those things.
TEST_F(JailTest, AJailedProcessMakesNoFileAndWritesNoFilePastItsBound) {
  const std::string dir = run_root_->path();
  const std::string own = dir + "/own";
  const std::string probe = dir + "/probe.py";
  ASSERT_TRUE(writeFileAtomic(probe, R"PY(import ctypes, errno, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
def attempt(name, f):
    try:
        f()
        print(name + ": ok", flush=True)
    except OSError as e:
        # EOPNOTSUPP by its one name (python may call it ENOTSUP, its alias here).
        text = "EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else errno.errorcode.get(e.errno, "?")
        print(name + ": " + text, flush=True)
def bind():
    s = socket.socket(socket.AF_UNIX)
    s.bind(d + "/sock")
def write_at(offset):
    fd = os.open(d + "/given", os.O_WRONLY)
    try:
        os.pwrite(fd, b"x", offset)
    finally:
        os.close(fd)
attempt("create", lambda: os.close(os.open(d + "/new", os.O_WRONLY | os.O_CREAT, 0o600)))
attempt("mkdir", lambda: os.mkdir(d + "/newdir"))
attempt("mkfifo", lambda: os.mkfifo(d + "/fifo"))
attempt("symlink", lambda: os.symlink("given", d + "/link"))
attempt("hardlink", lambda: os.link(d + "/given", d + "/second"))
attempt("rename", lambda: os.rename(d + "/given2", d + "/renamed"))
attempt("unlink", lambda: os.unlink(d + "/given3"))
attempt("bind", bind)
attempt("reopen", lambda: os.close(os.open(d + "/given", os.O_WRONLY | os.O_CREAT)))
attempt("write_last", lambda: write_at((1 << 20) - 1))
attempt("write_past", lambda: write_at(1 << 20))
attempt("truncate_past", lambda: os.truncate(d + "/given", 2 << 20))
attempt("tmpfile", lambda: os.close(os.open(d, os.O_TMPFILE | os.O_RDWR, 0o600)))
def checked(r, what):
    if r < 0:
        raise OSError(ctypes.get_errno(), what)
    return r
def fallocate(mode, length):
    fd = os.open(d + "/given", os.O_WRONLY)
    try:
        checked(libc.fallocate(fd, mode, ctypes.c_long(0), ctypes.c_long(length)), "fallocate")
    finally:
        os.close(fd)
attempt("fallocate_keep_size", lambda: fallocate(1, 8 << 20))
attempt("fallocate_zero_keep_size", lambda: fallocate(0x10 | 1, 8 << 20))
attempt("fallocate_punch", lambda: fallocate(2 | 1, 4096))
attempt("fallocate_within", lambda: fallocate(0, 4096))
attempt("insert_range", lambda: fallocate(0x20, 4096))
attempt("setxattr", lambda: os.setxattr(d + "/given", "user.probe", b"x" * 100))
def ioctl_on(path, request, arg):
    fd = os.open(path, os.O_RDONLY)
    try:
        return fcntl.ioctl(fd, request, arg)
    finally:
        os.close(fd)
attempt("extent_hint", lambda: ioctl_on(d + "/given", 0x401c5820, ioctl_on(d + "/given", 0x801c581f, bytes(28))))
attempt("btrfs_subvolume", lambda: ioctl_on(d, 0x5000940e, bytearray(b"sub".ljust(4096, b"\0"))))
def reserve():
    fd = os.open(d + "/given", os.O_WRONLY)
    try:
        fcntl.ioctl(fd, int(sys.argv[2]), struct.pack("hhqqiI4i", 0, 0, 0, 8 << 20, 0, 0, 0, 0, 0, 0))
    finally:
        os.close(fd)
attempt("reserve_ioctl", reserve)
def openat2():
    how = struct.pack("QQQ", os.O_RDONLY, 0, 0)
    os.close(checked(libc.syscall(437, -100, (d + "/given").encode(), how, len(how)), "openat2"))
attempt("openat2", openat2)
def copy_range():
    fd = os.open(d + "/given", os.O_RDWR)
    try:
        os.copy_file_range(fd, fd, 4096, 0, 8192)
    finally:
        os.close(fd)
attempt("copy_file_range", copy_range)
)PY")
                  .ok());
  // The shell reports the signal the jail set to be ignored (python ignores SIGXFSZ by itself).
  const std::string script =
      "grep SigIgn /proc/self/status; grep 'Max file size' /proc/self/limits; /usr/bin/python3 " + probe + " " + own +
      " " + std::to_string(jail::kReserveSpaceIoctl) + "; echo ended";
  jail::CgroupLimits limits;
  limits.memory_bytes = 128 << 20;
  limits.pids = 16;
  auto run = [&](std::vector<std::string> options) {
    std::filesystem::remove_all(own);
    std::filesystem::create_directories(own);
    for (const char* name : {"given", "given2", "given3"}) EXPECT_TRUE(writeFileAtomic(own + "/" + name, "").ok());
    for (const char* name : {"", "/given", "/given2", "/given3"}) {
      EXPECT_EQ(::chown((own + name).c_str(), 1700000101, 1700000000), 0);
    }
    std::vector<std::string> view = {"--view", "--rw",      own,      "--ro",
                                     probe,    "--no-caps", "--user", "1700000101:1700000000"};
    view.insert(view.end(), options.begin(), options.end());
    return runJailed(script, limits, view);
  };
  auto [status, out] = run({"--no-new-files", "--file-size", "1048576"});
  EXPECT_EQ(status.exit_code, 0) << status.describe() << "\n" << out;
  for (const char* refused : {"create: EACCES",
                              "mkdir: EACCES",
                              "mkfifo: EACCES",
                              "symlink: EACCES",
                              "hardlink: EACCES",
                              "rename: EACCES",
                              "unlink: EACCES",
                              "bind: EACCES",
                              "write_past: EFBIG",
                              "truncate_past: EFBIG",
                              "tmpfile: EOPNOTSUPP",
                              "fallocate_keep_size: EOPNOTSUPP",
                              "fallocate_zero_keep_size: EOPNOTSUPP",
                              "reserve_ioctl: EOPNOTSUPP",
                              "openat2: ENOSYS",
                              "copy_file_range: ENOSYS",
                              "insert_range: EOPNOTSUPP",
                              "setxattr: EOPNOTSUPP",
                              "extent_hint: EOPNOTSUPP",
                              "btrfs_subvolume: EOPNOTSUPP",
                              "reopen: ok",
                              "write_last: ok",
                              "fallocate_punch: ok",
                              "fallocate_within: ok",
                              "ended"}) {
    EXPECT_NE(out.find(std::string(refused) + "\n"), std::string::npos) << refused << "\n" << out;
  }
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(Max file size\s+1048576\s+1048576\s+bytes)"))) << out;
  std::smatch ignored;
  ASSERT_TRUE(std::regex_search(out, ignored, std::regex(R"(SigIgn:\s+([0-9a-f]+))"))) << out;
  EXPECT_NE(std::stoull(ignored[1].str(), nullptr, 16) & (1ULL << (SIGXFSZ - 1)), 0u) << out;
  EXPECT_EQ(std::filesystem::file_size(own + "/given"), 1u << 20);
  for (const char* name : {"new", "newdir", "fifo", "link", "second", "renamed", "sock"}) {
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(own + "/" + name))) << name;
  }
  EXPECT_TRUE(std::filesystem::exists(own + "/given3"));

  // The control: the same jail without the two options lets the uid do all of it.
  auto [control_status, control] = run({});
  EXPECT_EQ(control_status.exit_code, 0) << control_status.describe() << "\n" << control;
  for (const char* allowed :
       {"create: ok", "mkdir: ok", "mkfifo: ok", "symlink: ok", "hardlink: ok", "rename: ok", "unlink: ok", "bind: ok",
        "write_past: ok", "truncate_past: ok", "tmpfile: ok", "fallocate_keep_size: ok", "fallocate_zero_keep_size: ok",
        "reserve_ioctl: ok", "openat2: ok", "copy_file_range: ok", "btrfs_subvolume: ENOTTY"}) {
    EXPECT_NE(control.find(std::string(allowed) + "\n"), std::string::npos) << allowed << "\n" << control;
  }
  // These three depend on the filesystem: ext4 (Debian's /tmp) has each.
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir.c_str(), &fs), 0);
  if (fs.f_type == EXT4_SUPER_MAGIC) {
    for (const char* allowed : {"insert_range: ok", "setxattr: ok", "extent_hint: ok"}) {
      EXPECT_NE(control.find(std::string(allowed) + "\n"), std::string::npos) << allowed << "\n" << control;
    }
  }
  // Its bound is checked before anything runs.
  for (const char* bad : {"4096", "-1", "+2097152", " 2097152", "2097152x", "1125899906842625", "99999999999999999999"})
    expectJailRefuses(dir, {"--file-size", bad}, "--file-size wants");
  for (const char* bad : {"63", "-64", "1048577", "4096 "}) expectJailRefuses(dir, {"--nofile", bad}, "--nofile wants");
  std::filesystem::remove_all(own);
  std::filesystem::remove(probe);
}

// Each QEMU as a uid of its own from the node's range, its run directory and disk its own; the
// uid goes back when the VM ends and is claimed again by whoever adopts a running one.
TEST_F(JailTest, EachQemuRunsAsAUidOfItsOwnThatGoesBackWhenItEnds) {
  auto users = VmUsers::create(1700000000, 8);
  ASSERT_TRUE(users.ok());
  node_.vm_users = users.value();
  auto a = boot();
  auto b = boot();
  ASSERT_TRUE(a && b);
  auto ids = [](const Vm& vm) {
    const std::string status = readText("/proc/" + std::to_string(vm.pid()) + "/status");
    std::smatch m;
    EXPECT_TRUE(std::regex_search(status, m, std::regex("Uid:\t(\\d+)\t\\1\t\\1\t\\1\nGid:\t(\\d+)\t\\2\t\\2\t\\2\n")))
        << status;
    EXPECT_TRUE(std::regex_search(status, std::regex("Groups:\\s*\n"))) << status;  // none
    return m.size() == 3 ? std::make_pair(std::stoul(m[1]), std::stoul(m[2])) : std::make_pair(0ul, 0ul);
  };
  const auto [uid_a, gid_a] = ids(*a);
  const auto [uid_b, gid_b] = ids(*b);
  EXPECT_NE(uid_a, uid_b);
  EXPECT_TRUE(users.value()->contains(uid_a) && users.value()->contains(uid_b)) << uid_a << " " << uid_b;
  EXPECT_EQ(gid_a, 1700000000u);
  EXPECT_EQ(gid_b, 1700000000u);
  struct stat st {};
  ASSERT_EQ(::stat(a->paths().run_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, uid_a);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat(a->paths().disk.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, uid_a);
  EXPECT_EQ(run(*a, "echo works"), "works\n");
  // A frozen layer, which other VMs may stand on, is root's; the new overlay above it is the VM's.
  ASSERT_TRUE(a->pause().ok());
  const std::string layer = run_root_->path() + "/layer.qcow2";
  auto frozen = a->freezeDisk(layer);
  ASSERT_TRUE(frozen.ok()) << frozen.error().message;
  ASSERT_EQ(::stat(layer.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ASSERT_EQ(::stat(a->paths().disk.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, uid_a);
  ASSERT_TRUE(a->resume().ok());
  EXPECT_EQ(run(*a, "echo still"), "still\n");
  // Saving its state: QEMU connects to a socket spaced made, given to its uid.
  ASSERT_TRUE(a->pause().ok());
  auto saved = a->saveState(a->paths().run_dir + "/suspended.state", seconds(60));
  EXPECT_TRUE(saved.ok()) << saved.error().message;
  EXPECT_EQ(users.value()->held(), 2u);
  // Once its QEMU is gone, a run directory that stays (a suspended guest's) is root's again,
  // before the uid can go to another VM; the layer's second name there stays root's too.
  const std::string a_dir = a->paths().run_dir;
  a->quit();
  EXPECT_EQ(users.value()->held(), 1u);
  for (const auto& entry : std::filesystem::directory_iterator(a_dir)) {
    ASSERT_EQ(::lstat(entry.path().c_str(), &st), 0);
    if (S_ISREG(st.st_mode)) {
      EXPECT_EQ(st.st_uid, 0u) << entry.path();
    }
  }
  ASSERT_EQ(::stat(a_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  a.reset();
  std::filesystem::remove(layer);
  EXPECT_EQ(users.value()->held(), 1u);

  // A daemon that restarts (a range of its own, as a new process has) claims b's uid again.
  const std::string run_dir = b->paths().run_dir;
  const VmAdoptSpec adopt{run_dir,     b->pid(),         b->identity(), b->accelerator(),
                          seconds(30), spec_.memory_mib, layout_,       nullptr};
  b->detach();
  EXPECT_EQ(users.value()->held(), 1u);  // left running unwatched: never handed out again here
  auto restarted = VmUsers::create(1700000000, 8);
  ASSERT_TRUE(restarted.ok());
  EXPECT_EQ(restarted.value()->killStrangers("/another/data/dir"), 0u);  // not this daemon's to stop
  VmAdoptSpec with_users = adopt;
  with_users.users = restarted.value();
  auto adopted = Vm::adopt(with_users);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  EXPECT_EQ(restarted.value()->held(), 1u);
  EXPECT_EQ(restarted.value()->killStrangers(run_root_->path()), 0u);  // held: adopted
  EXPECT_FALSE(restarted.value()->claim(static_cast<uid_t>(uid_b)).ok());
  EXPECT_EQ(run(*adopted.value(), "echo adopted"), "adopted\n");
  adopted.value().reset();
  EXPECT_EQ(restarted.value()->held(), 0u);

  // A QEMU of this data directory that no one adopted (it could not be recognised) is stopped
  // before its uid goes to a new VM.
  auto stray = boot();
  ASSERT_TRUE(stray);
  const pid_t stray_pid = stray->pid();
  const VmAdoptSpec stray_adopt{stray->paths().run_dir,
                                stray_pid,
                                stray->identity(),
                                stray->accelerator(),
                                seconds(30),
                                spec_.memory_mib,
                                layout_,
                                nullptr};
  stray->detach();
  auto after_restart = VmUsers::create(1700000000, 8);
  ASSERT_TRUE(after_restart.ok());
  EXPECT_EQ(after_restart.value()->killStrangers(run_root_->path()), 1u);
  // This test spawned it: reaped here (a daemon's recovery is not its parent).
  bool reaped = false;
  for (int i = 0; i < 250 && !reaped; ++i) {
    reaped = ::waitpid(stray_pid, nullptr, WNOHANG) == stray_pid;
    if (!reaped) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(reaped) << "the stray QEMU was not stopped";
  // Gone (its files and group are cleaned up by adopting what is left, as recovery does).
  auto cleanup = Vm::adopt(stray_adopt);
  EXPECT_FALSE(cleanup.ok());
}

}  // namespace
}  // namespace space::vmm
