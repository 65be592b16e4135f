// Where VMs' cgroups go on each kind of host (pure: from /proc text), and the limits a VM gets.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

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
}

TEST(CgroupLayout, V2InTheRootGroupNeedsNoLeaf) {
  const char* mountinfo = "35 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
  CgroupLayout layout = planCgroupLayout(mountinfo, "0::/\n", "cpu memory pids\n");
  ASSERT_EQ(layout.version, CgroupVersion::kV2);
  EXPECT_EQ(layout.roots[0].dir, "/sys/fs/cgroup/space");
  EXPECT_TRUE(layout.v2_own_dir.empty());
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

TEST(VmCgroupLimits, MemoryCountsQemuAndTheTranslationBufferTasksAndCpuFollowVcpus) {
  vmm::VmSpec spec;
  spec.memory_mib = 512;
  spec.vcpus = 2;
  auto tcg = vmm::vmCgroupLimits(spec, vmm::Accelerator::kTcg);
  EXPECT_EQ(tcg.memory_bytes, uint64_t{512 + 1024 + 384 + 2 * 64} << 20);  // QEMU's default 1 GiB buffer
  EXPECT_EQ(tcg.pids, 132u);
  EXPECT_EQ(tcg.cpu_quota_us, 300000u);
  EXPECT_EQ(tcg.cpu_period_us, 100000u);
  spec.tcg_tb_size_mib = 128;
  EXPECT_EQ(vmm::vmCgroupLimits(spec, vmm::Accelerator::kTcg).memory_bytes, uint64_t{512 + 128 + 384 + 128} << 20);
  EXPECT_EQ(vmm::vmCgroupLimits(spec, vmm::Accelerator::kKvm).memory_bytes, uint64_t{512 + 384 + 128} << 20);
}

}  // namespace
}  // namespace space::jail
