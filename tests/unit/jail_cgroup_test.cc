// Where VMs' cgroups go on each kind of host (pure: from /proc text), and the limits a VM gets.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "common/fs.h"
#include "jail/cgroup.h"
#include "vmm/node_facts.h"

namespace space::jail {
namespace {

// A hybrid host like this project's build machines: v1 hierarchies per controller (cpu and
// cpuacct apart), a v2 hierarchy with no controllers, spaced in a memory group of its own.
constexpr const char* kHybridMountinfo =
    "25 30 0:23 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755\n"
    "26 25 0:24 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu\n"
    "27 25 0:25 / /sys/fs/cgroup/cpuacct rw,relatime shared:11 - cgroup cgroup rw,cpuacct\n"
    "28 25 0:26 / /sys/fs/cgroup/cpuset rw,relatime shared:12 - cgroup cgroup rw,cpuset\n"
    "29 25 0:27 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory\n"
    "31 25 0:29 / /sys/fs/cgroup/pids rw,relatime shared:15 - cgroup cgroup rw,pids\n"
    "33 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:17 - cgroup2 cgroup2 rw\n";
constexpr const char* kHybridSelf = "8:pids:/\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";

TEST(CgroupLayout, HybridHostUsesV1HierarchiesUnderSpacedsOwnGroups) {
  CgroupLayout layout = planCgroupLayout(kHybridMountinfo, kHybridSelf, "hugetlb\n");
  ASSERT_EQ(layout.version, CgroupVersion::kV1) << layout.why_none;
  ASSERT_EQ(layout.roots.size(), 3u);
  EXPECT_EQ(layout.roots[0].controller, "memory");
  EXPECT_EQ(layout.roots[0].dir, "/sys/fs/cgroup/memory/process_api/abc/space");
  EXPECT_EQ(layout.roots[1].dir, "/sys/fs/cgroup/pids/space");
  EXPECT_EQ(layout.roots[2].controller, "cpu");
  EXPECT_EQ(layout.roots[2].dir, "/sys/fs/cgroup/cpu/space");  // not cpuacct's hierarchy
  EXPECT_FALSE(layout.io);  // no blkio hierarchy: jailed all the same, without disk limits
}

TEST(CgroupLayout, AV1BlkioHierarchyGivesGroupsDiskLimits) {
  const std::string mountinfo =
      std::string(kHybridMountinfo) + "37 25 0:34 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n";
  CgroupLayout layout = planCgroupLayout(mountinfo, std::string(kHybridSelf) + "7:blkio:/svc\n", "");
  ASSERT_EQ(layout.version, CgroupVersion::kV1) << layout.why_none;
  EXPECT_TRUE(layout.io);
  ASSERT_EQ(layout.roots.size(), 4u);
  EXPECT_EQ(layout.roots[3].controller, "blkio");
  EXPECT_EQ(layout.roots[3].dir, "/sys/fs/cgroup/blkio/svc/space");
  // blkio alone is not enough for v1: memory, pids and cpu are what a jail needs.
  CgroupLayout without_memory =
      planCgroupLayout("37 25 0:34 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio\n", "7:blkio:/\n", "");
  EXPECT_FALSE(without_memory.usable());
}

TEST(CgroupLayout, CoMountedCpuAndCpuacctAreFound) {
  const std::string mountinfo =
      std::string(kHybridMountinfo) + "40 25 0:40 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
  std::string info = mountinfo;
  info.erase(info.find("26 25"), info.find("27 25") - info.find("26 25"));  // no cpu alone
  CgroupLayout layout = planCgroupLayout(info, "8:pids:/\n4:memory:/\n1:cpu,cpuacct:/svc\n0::/\n", "");
  ASSERT_EQ(layout.version, CgroupVersion::kV1) << layout.why_none;
  EXPECT_EQ(layout.roots[2].dir, "/sys/fs/cgroup/cpu,cpuacct/svc/space");
}

TEST(CgroupLayout, UnifiedHostUsesV2WithSpacedMovedIntoALeaf) {
  const char* mountinfo = "35 30 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
  CgroupLayout layout =
      planCgroupLayout(mountinfo, "0::/system.slice/spaced.service\n", "cpuset cpu io memory hugetlb pids rdma\n");
  ASSERT_EQ(layout.version, CgroupVersion::kV2) << layout.why_none;
  ASSERT_EQ(layout.roots.size(), 1u);
  EXPECT_EQ(layout.roots[0].dir, "/sys/fs/cgroup/system.slice/spaced.service/space");
  EXPECT_EQ(layout.v2_own_dir, "/sys/fs/cgroup/system.slice/spaced.service");
  EXPECT_EQ(layout.v2_daemon_leaf, "/sys/fs/cgroup/system.slice/spaced.service/spaced");
  EXPECT_TRUE(layout.io);  // offered, so handed down and written
}

TEST(CgroupLayout, V2InTheRootGroupNeedsNoLeaf) {
  const char* mountinfo = "35 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CgroupLayout layout = planCgroupLayout(mountinfo, "0::/\n", "cpu memory pids\n");
  ASSERT_EQ(layout.version, CgroupVersion::kV2);
  EXPECT_EQ(layout.roots[0].dir, "/sys/fs/cgroup/space");
  EXPECT_TRUE(layout.v2_own_dir.empty());
  EXPECT_FALSE(layout.io);  // not offered
}

TEST(CgroupLayout, AContainersMountRootIsTakenOffItsPath) {
  // A cgroup namespace's view: the hierarchy is mounted from /docker/x, and /proc/self/cgroup
  // shows paths under it.
  const char* mountinfo = "35 30 0:30 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CgroupLayout layout = planCgroupLayout(mountinfo, "0::/docker/x/app\n", "cpu memory pids\n");
  ASSERT_EQ(layout.version, CgroupVersion::kV2);
  EXPECT_EQ(layout.roots[0].dir, "/sys/fs/cgroup/app/space");
}

TEST(CgroupLayout, MissingControllersSayWhat) {
  const char* mountinfo = "35 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CgroupLayout layout = planCgroupLayout(mountinfo, "0::/\n", "cpu io\n");
  EXPECT_FALSE(layout.usable());
  EXPECT_NE(layout.why_none.find("memory, pids"), std::string::npos) << layout.why_none;
  CgroupLayout none = planCgroupLayout("", "", "");
  EXPECT_FALSE(none.usable());
  EXPECT_NE(none.why_none.find("no cgroup v2 hierarchy"), std::string::npos) << none.why_none;
  // Garbage is no layout, never a crash.
  EXPECT_FALSE(planCgroupLayout("- - -\n1 2 3\n\n", "::::\n:\n", "\n").usable());
}

TEST(CgroupLayout, GroupNamesCannotLeaveTheirRoot) {
  EXPECT_TRUE(validGroupName("vm-abc-0123456789ab"));
  for (const char* bad : {"", ".", "..", "a/b", "../x", "a\nb"}) EXPECT_FALSE(validGroupName(bad)) << bad;
  CgroupLayout layout;
  layout.version = CgroupVersion::kV2;
  layout.roots.push_back({"", "/nonexistent/space"});
  auto made = VmCgroup::create(layout, "../escape", {});
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(VmCgroup::existing(layout, "..").dirs().empty());
}

TEST(CgroupLayout, ANestedLayoutIsEachRootsSubgroupMadeIfMissing) {
  CgroupLayout none;
  none.why_none = "no cgroup v2 hierarchy";
  auto refused = nestedLayout(none, "gateways");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(refused.error().message.find("no cgroup v2 hierarchy"), std::string::npos);

  char base[] = "/tmp/nested-layout-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  CgroupLayout v1;
  v1.version = CgroupVersion::kV1;
  for (const char* controller : {"memory", "pids", "cpu"}) {
    const std::string dir = std::string(base) + "/" + controller;
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    v1.roots.push_back({controller, dir});
  }
  for (const char* bad : {"..", "a/b", ""}) {
    auto made = nestedLayout(v1, bad);
    ASSERT_FALSE(made.ok()) << bad;
    EXPECT_EQ(made.error().code, ErrorCode::kInvalidArgument);
  }
  for (int twice = 0; twice < 2; ++twice) {  // an existing subgroup is taken as it is
    auto nested = nestedLayout(v1, "gateways");
    ASSERT_TRUE(nested.ok()) << nested.error().message;
    ASSERT_EQ(nested->roots.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(nested->roots[i].controller, v1.roots[i].controller);
      EXPECT_EQ(nested->roots[i].dir, v1.roots[i].dir + "/gateways");
      EXPECT_TRUE(std::filesystem::is_directory(nested->roots[i].dir));
    }
  }
  std::filesystem::remove_all(base);
}

// The limits a group is given are written in each version's words: v2's io.max line, v1's one
// rule per file and direction. (The kernel's holding a process to them: JailTest.)
TEST(CgroupLayout, DiskLimitsAreWrittenForEachDeviceInTheVersionsOwnFiles) {
  char base[] = "/tmp/io-limits-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  auto readText = [](const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Group directories made beforehand with the files a cgroupfs would have (an existing group
  // is taken over, its limits written).
  CgroupLimits limits;
  limits.io = {CgroupIoLimit{"254:0", 128 << 20, 2000}};
  CgroupLayout v2;
  v2.version = CgroupVersion::kV2;
  v2.io = true;
  v2.roots.push_back({"", std::string(base) + "/v2"});
  std::filesystem::create_directories(std::string(base) + "/v2/vm");
  std::ofstream(std::string(base) + "/v2/vm/io.max").close();
  auto made = VmCgroup::create(v2, "vm", limits);
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_EQ(readText(std::string(base) + "/v2/vm/io.max"), "254:0 rbps=134217728 wbps=134217728 riops=2000 wiops=2000");
  limits.io = {CgroupIoLimit{"8:16", 0, 500}};                 // no byte rate: "max"
  std::ofstream(std::string(base) + "/v2/vm/io.max").close();  // a cgroupfs file takes each write whole
  ASSERT_TRUE(VmCgroup::create(v2, "vm", limits).ok());
  EXPECT_EQ(readText(std::string(base) + "/v2/vm/io.max"), "8:16 rbps=max wbps=max riops=500 wiops=500");

  CgroupLayout v1;
  v1.version = CgroupVersion::kV1;
  v1.io = true;
  const char* files[] = {"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device",
                         "blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"};
  for (const char* controller : {"memory", "blkio"}) {
    const std::string dir = std::string(base) + "/" + controller;
    std::filesystem::create_directories(dir + "/vm");
    if (std::string(controller) == "blkio")
      for (const char* f : files) std::ofstream(dir + "/vm/" + f).close();
    v1.roots.push_back({controller, dir});
  }
  limits.io = {CgroupIoLimit{"254:0", 1 << 20, 40}};
  made = VmCgroup::create(v1, "vm", limits);
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_EQ(readText(std::string(base) + "/blkio/vm/" + files[0]), "254:0 1048576");
  EXPECT_EQ(readText(std::string(base) + "/blkio/vm/" + files[1]), "254:0 1048576");
  EXPECT_EQ(readText(std::string(base) + "/blkio/vm/" + files[2]), "254:0 40");
  EXPECT_EQ(readText(std::string(base) + "/blkio/vm/" + files[3]), "254:0 40");
  EXPECT_TRUE(made->ioLimitError().empty()) << made->ioLimitError();
  // Only the blkio hierarchy's group gets them; a layout without io writes none.
  EXPECT_FALSE(std::filesystem::exists(std::string(base) + "/memory/vm/" + files[0]));
  // Limits that cannot be written make the group all the same, and say why.
  std::filesystem::create_directories(std::string(base) + "/blkio/other");
  auto unlimited = VmCgroup::create(v1, "other", limits);
  ASSERT_TRUE(unlimited.ok()) << unlimited.error().message;
  EXPECT_NE(unlimited->ioLimitError().find("blkio.throttle.read_bps_device"), std::string::npos)
      << unlimited->ioLimitError();
  EXPECT_TRUE(std::filesystem::is_directory(std::string(base) + "/memory/other"));
  v2.io = false;
  limits.io = {CgroupIoLimit{"1:1", 1, 1}};
  ASSERT_TRUE(VmCgroup::create(v2, "vm", limits).ok());
  EXPECT_EQ(readText(std::string(base) + "/v2/vm/io.max"), "8:16 rbps=max wbps=max riops=500 wiops=500");
  std::filesystem::remove_all(base);
}

// Limits name a whole disk: the kernel refuses them on a partition.
TEST(CgroupLayout, DiskLimitsNameTheWholeDiskUnderAPath) {
  char base[] = "/tmp/block-device-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(base, &st), 0);
  const std::string device = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  const std::string sys = std::string(base) + "/sys";
  // Not listed: no block device (tmpfs, btrfs), no limit.
  std::filesystem::create_directories(sys + "/dev/block");
  EXPECT_FALSE(blockDeviceUnder(base, sys).has_value());
  EXPECT_FALSE(blockDeviceUnder(std::string(base) + "/missing", sys).has_value());
  // A whole disk names itself.
  std::filesystem::create_directories(sys + "/devices/disk");
  std::ofstream(sys + "/devices/disk/dev") << "254:7\n";
  std::filesystem::create_directory_symlink("../../devices/disk", sys + "/dev/block/" + device);
  EXPECT_EQ(blockDeviceUnder(base, sys), device);
  // A partition names the disk it is in, whose directory holds its own.
  std::filesystem::remove(sys + "/dev/block/" + device);
  std::filesystem::create_directories(sys + "/devices/disk/part1");
  std::ofstream(sys + "/devices/disk/part1/partition") << "1\n";
  std::filesystem::create_directory_symlink("../../devices/disk/part1", sys + "/dev/block/" + device);
  EXPECT_EQ(blockDeviceUnder(base, sys), "254:7");
  std::ofstream(sys + "/devices/disk/dev") << "garbage\n";
  EXPECT_FALSE(blockDeviceUnder(base, sys).has_value());
  std::filesystem::remove_all(base);
}

TEST(VmCgroupLimits, MemoryCountsQemuAndTheTranslationBufferTasksAndCpuFollowVcpus) {
  vmm::VmSpec spec;
  spec.memory_mib = 512;
  spec.vcpus = 2;
  auto tcg = vmm::vmCgroupLimits(spec, vmm::Accelerator::kTcg);
  EXPECT_EQ(tcg.memory_bytes, uint64_t{512 + 128 + 384 + 2 * 64} << 20);  // the default 128 MiB buffer
  EXPECT_EQ(tcg.pids, 132u);
  EXPECT_EQ(tcg.cpu_quota_us, 300000u);
  EXPECT_EQ(tcg.cpu_period_us, 100000u);
  spec.tcg_tb_size_mib = 0;  // QEMU's own default, 1 GiB
  EXPECT_EQ(vmm::vmCgroupLimits(spec, vmm::Accelerator::kTcg).memory_bytes, uint64_t{512 + 1024 + 384 + 128} << 20);
  EXPECT_EQ(vmm::vmCgroupLimits(spec, vmm::Accelerator::kKvm).memory_bytes, uint64_t{512 + 384 + 128} << 20);
}

TEST(VmCgroupLimits, TheTranslationBufferIsTcgsAloneAndZeroMeansQemusDefault) {
  EXPECT_EQ(vmm::tcgBufferMib(vmm::Accelerator::kTcg, 128), 128u);
  EXPECT_EQ(vmm::tcgBufferMib(vmm::Accelerator::kTcg, 0), 1024u);
  EXPECT_EQ(vmm::tcgBufferMib(vmm::Accelerator::kKvm, 128), 0u);
  EXPECT_EQ(vmm::VmSpec{}.tcg_tb_size_mib, 128u);
  EXPECT_EQ(vmm::NodeFacts{}.tcg_tb_size_mib, 128u);
}

// A VM's share of its node's memory beyond its guest's: QEMU's own memory under either
// accelerator, and the translation buffer under TCG; always within its cgroup's limit.
TEST(VmCgroupLimits, AQemusShareIsItsOwnMemoryAndUnderTcgItsBuffer) {
  EXPECT_EQ(vmm::qemuShareMib(vmm::Accelerator::kTcg, 128), vmm::kQemuOwnMemoryMib + 128);
  EXPECT_EQ(vmm::qemuShareMib(vmm::Accelerator::kTcg, 0), vmm::kQemuOwnMemoryMib + 1024);
  EXPECT_EQ(vmm::qemuShareMib(vmm::Accelerator::kKvm, 128), vmm::kQemuOwnMemoryMib);
  EXPECT_GT(vmm::kQemuOwnMemoryMib, 0u);
  vmm::VmSpec spec;
  spec.memory_mib = 256;
  spec.vcpus = 1;
  for (auto accel : {vmm::Accelerator::kTcg, vmm::Accelerator::kKvm}) {
    EXPECT_LE((spec.memory_mib + vmm::qemuShareMib(accel, spec.tcg_tb_size_mib)) << 20,
              vmm::vmCgroupLimits(spec, accel).memory_bytes);
  }
}

TEST(VmCgroupLimits, ARunningQemusBufferIsReadFromItsCommandLine) {
  using namespace std::string_literals;
  auto of = [](const std::string& cmdline) { return vmm::tcgBufferMibOfCommandLine(cmdline); };
  EXPECT_EQ(of("qemu\0-machine\0microvm\0-accel\0tcg,thread=multi,tb-size=128\0-m\0256M\0"s), 128u);
  EXPECT_EQ(of("qemu\0-accel\0tcg,thread=multi\0-m\0256M\0"s), 1024u);  // QEMU's own default
  EXPECT_EQ(of("qemu\0-accel\0tcg,tb-size=64"s), 64u);                  // no final NUL
  EXPECT_EQ(of("qemu\0-accel\0kvm\0-cpu\0host\0"s), 0u);
  EXPECT_EQ(of("qemu\0-m\0tcg,tb-size=8\0"s), 0u);  // not the -accel's
  EXPECT_EQ(of(""), 0u);
  EXPECT_EQ(of("qemu\0-accel\0"s), 0u);  // nothing after -accel
  // A QEMU that rewrote its own: unreadable or absurd sizes are taken as the default.
  EXPECT_EQ(of("q\0-accel\0tcg,tb-size=x\0"s), 1024u);
  EXPECT_EQ(of("q\0-accel\0tcg,tb-size=99999999999999999999999\0"s), 1024u);
  EXPECT_EQ(of("q\0-accel\0tcg,tb-size=0\0"s), 1024u);
}

TEST(VmCgroupLimits, AnAdoptedQemusBufferIsCountedWithinBoundsWhateverItsCommandLineClaims) {
  using namespace std::string_literals;
  auto counted = [](const std::string& accel, uint64_t floor, uint64_t most) {
    return vmm::adoptedTcgBufferMib("qemu\0-accel\0"s + accel + "\0-m\0256M\0"s, floor, most);
  };
  EXPECT_EQ(counted("tcg,thread=multi", 128, 1024), 1024u);                 // an earlier spaced's QEMU
  EXPECT_EQ(counted("tcg,thread=multi,tb-size=128", 64, 1024), 128u);       // started before a lower setting
  EXPECT_EQ(counted("tcg,thread=multi,tb-size=16", 128, 1024), 128u);       // never below a new VM's
  EXPECT_EQ(counted("tcg,thread=multi,tb-size=900000", 128, 1024), 1024u);  // a rewritten claim: at most `most`
  EXPECT_EQ(counted("tcg,thread=multi", 128, 128), 128u);                   // more than its cgroup left room for
  EXPECT_EQ(counted("tcg,thread=multi", 128, 0), 128u);                     // a `most` below the floor: the floor
  EXPECT_EQ(counted("kvm", 128, 1024), 128u);                               // a claim of none: the floor
  // What a group's limit left room for is what vmCgroupLimits gave it.
  vmm::VmSpec spec;
  spec.memory_mib = 256;
  spec.vcpus = 2;
  for (uint32_t tb : {0u, 64u, 128u}) {
    spec.tcg_tb_size_mib = tb;
    EXPECT_EQ(vmm::tcgBufferMibWithin(vmm::vmCgroupLimits(spec, vmm::Accelerator::kTcg).memory_bytes, 256, 2),
              vmm::tcgBufferMib(vmm::Accelerator::kTcg, tb));
  }
  EXPECT_EQ(vmm::tcgBufferMibWithin(uint64_t{100} << 20, 256, 2), 0u);
}

TEST(CgroupLayout, AGroupsMemoryLimitIsReadFromItsVersionsFile) {
  auto dir = TempDir::create(std::filesystem::temp_directory_path().string(), "space-cgroup-limit-");
  ASSERT_TRUE(dir.ok());
  CgroupLayout v1;
  v1.version = CgroupVersion::kV1;
  v1.roots = {{"memory", dir->path() + "/memory"}, {"pids", dir->path() + "/pids"}};
  const VmCgroup group = VmCgroup::existing(v1, "vm-limit");
  EXPECT_FALSE(group.memoryLimitBytes().has_value());  // no group
  std::filesystem::create_directories(dir->path() + "/memory/vm-limit");
  std::filesystem::create_directories(dir->path() + "/pids/vm-limit");
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/pids/vm-limit/pids.max", "130\n").ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/memory/vm-limit/memory.limit_in_bytes", "872415232\n").ok());
  EXPECT_EQ(group.memoryLimitBytes(), std::optional<uint64_t>(872415232));
  CgroupLayout v2;
  v2.version = CgroupVersion::kV2;
  v2.roots = {{"", dir->path() + "/unified"}};
  const VmCgroup unified = VmCgroup::existing(v2, "vm-limit");
  std::filesystem::create_directories(dir->path() + "/unified/vm-limit");
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/unified/vm-limit/memory.max", "max\n").ok());
  EXPECT_FALSE(unified.memoryLimitBytes().has_value());  // none written
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/unified/vm-limit/memory.max", "536870912\n").ok());
  EXPECT_EQ(unified.memoryLimitBytes(), std::optional<uint64_t>(536870912));
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/unified/vm-limit/memory.max", "5368x\n").ok());
  EXPECT_FALSE(unified.memoryLimitBytes().has_value());
}

TEST(VmCgroupLimits, QemusDiskIoIsFourTimesItsGuestsOnEachDiskItUses) {
  vmm::VmSpec spec;
  spec.vcpus = 2;
  EXPECT_TRUE(vmm::vmCgroupLimits(spec, vmm::Accelerator::kKvm, {"254:0"}).io.empty());  // the guest is unlimited
  spec.disk_io = vmm::DiskIoRate{128 << 20, 2000};
  EXPECT_TRUE(vmm::vmCgroupLimits(spec, vmm::Accelerator::kKvm).io.empty());  // no disk known
  auto limits = vmm::vmCgroupLimits(spec, vmm::Accelerator::kKvm, {"254:0", "8:0"});
  ASSERT_EQ(limits.io.size(), 2u);
  EXPECT_EQ(limits.io[0].device, "254:0");
  EXPECT_EQ(limits.io[1].device, "8:0");
  for (const auto& io : limits.io) {
    EXPECT_EQ(io.bytes_per_sec, uint64_t{512} << 20);
    EXPECT_EQ(io.iops, 8000u);
  }
}

}  // namespace
}  // namespace space::jail
