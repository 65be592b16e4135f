// Boots real microVMs from the built guest images (QEMU microvm, TCG here, KVM where the host
// has it) and checks the VM layer end to end. Each test also checks that nothing is left
// behind: no QEMU process and no file under its run directory.
#include "vmm/vm.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/utsname.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>

#include "common/fs.h"

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
    ASSERT_TRUE(std::filesystem::exists(spec_.kernel_path)) << "build the images first (make images)";
    ASSERT_TRUE(std::filesystem::exists(spec_.rootfs_path)) << "build the images first (make images)";
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
  auto vm = Vm::start(spec_, options_);
  ASSERT_FALSE(vm.ok());
  EXPECT_NE(vm.error().message.find("QEMU exited before its monitor came up"), std::string::npos) << vm.error().message;
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

}  // namespace
}  // namespace space::vmm
