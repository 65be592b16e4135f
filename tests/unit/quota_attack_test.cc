// Attack tests for the per-tenant bounds added with the quotas: the template size bound
// (TemplateCache::claimBuild) and the request rate (TenantGate). None boots a VM.
//
// Each test states the property the bound promises; a failure is the defect it names.
#include <gtest/gtest.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <string>

#include "api/tenant_gate.h"
#include "common/fs.h"
#include "snapshot/template_cache.h"

namespace space {
namespace {

using snapshot::TemplateCache;
using snapshot::TemplateKey;

class TemplateAdmitAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-quota-attack-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    kernel_ = dir_->path() + "/vmlinux";
    rootfs_ = dir_->path() + "/rootfs.ext4";
    std::ofstream(kernel_) << "kernel";
    std::ofstream(rootfs_) << "rootfs";
    root_ = dir_->path() + "/templates";
    std::filesystem::create_directory(root_);
  }
  TemplateKey key(uint32_t vcpus, uint64_t memory_mib) const {
    return TemplateKey{.name = "base",
                       .kernel_path = kernel_,
                       .rootfs_path = rootfs_,
                       .vcpus = vcpus,
                       .memory_mib = memory_mib,
                       .accelerator = vmm::Accelerator::kTcg,
                       .qemu_binary = "true"};  // any program in PATH
  }
  // What a finished build leaves: <root>/<dirName>/meta.json.
  void publish(TemplateCache& cache, const TemplateKey& k) {
    auto name = cache.dirName(k);
    ASSERT_TRUE(name.ok()) << name.error().message;
    std::filesystem::create_directory(root_ + "/" + *name);
    std::ofstream(root_ + "/" + *name + "/meta.json")
        << R"({"format_version": 1, "vcpus": )" << k.vcpus << R"(, "memory_mib": )" << k.memory_mib << "}";
  }
  std::optional<TempDir> dir_;
  std::string kernel_, rootfs_, root_;
};

// Sizes being built count against the bound as much as built ones: concurrent creates of new
// sizes cannot all pass (a first version counted only published templates).
TEST_F(TemplateAdmitAttack, SizesBeingBuiltCountAgainstTheBound) {
  TemplateCache cache(root_, 2);
  std::vector<std::shared_ptr<void>> held;
  int admitted = 0;
  for (uint64_t mib = 200; mib < 220; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    if (place.ok()) {
      ++admitted;
      held.push_back(place.value());
    } else {
      EXPECT_EQ(place.error().reason, "template_sizes_full");
    }
  }
  EXPECT_EQ(admitted, 2) << "a bound of 2 sizes let " << admitted << " builds start";
  EXPECT_TRUE(cache.claimBuild(key(1, 999), /*always=*/true).ok()) << "the default size is always built";
}

// With an operator's list of sizes, only those (and the default size) get a kept template: a
// tenant cycling through other sizes takes no place, and a listed size still finds one.
TEST_F(TemplateAdmitAttack, OnlyTheOperatorsSizesAreKept) {
  TemplateCache cache(root_, 2, {"1x512", "2x1024"});
  for (uint64_t mib = 200; mib < 240; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    ASSERT_FALSE(place.ok()) << mib;
    EXPECT_EQ(place.error().reason, "template_sizes_full");
    EXPECT_NE(place.error().message.find("not among --template-sizes"), std::string::npos) << place.error().message;
  }
  auto listed = cache.claimBuild(key(1, 512));
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  EXPECT_TRUE(cache.claimBuild(key(2, 1024)).ok());
  EXPECT_TRUE(cache.claimBuild(key(1, 300), /*always=*/true).ok()) << "the default size is always built";
}

// A build that never happened (its create refused, its boot failed) gives its place back, and
// nothing is remembered: once published templates reach the bound, every new size is refused.
TEST_F(TemplateAdmitAttack, AnAbandonedBuildLeavesNoPlaceBehind) {
  TemplateCache cache(root_, 2);
  for (uint64_t mib = 300; mib < 350; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    ASSERT_TRUE(place.ok()) << mib;  // claimed and dropped at once: never built
  }
  publish(cache, key(2, 1024));
  publish(cache, key(2, 2048));
  int still = 0;
  for (uint64_t mib = 300; mib < 350; ++mib) still += cache.claimBuild(key(1, mib)).ok();
  EXPECT_EQ(still, 0) << still << " sizes beyond the bound of 2 could still be built";
  // A published size needs no place: rebuilding it (a broken meta.json) is not a new size.
  EXPECT_TRUE(cache.claimBuild(key(2, 1024)).ok());
}

// Retry-After comes from a double cast to int: a rate below ~5e-10/s (which --tenant-requests-per-s
// accepts: Range(0, 1e6)) overflows it (undefined behaviour; INT_MIN on x86, shown as 1 s).
TEST(TenantGateAttack, RetryAfterNeverOverflows) {
  api::TenantGate gate(api::TenantGate::Limits{64, 1e-12, 0});
  auto first = gate.enter("t");
  ASSERT_TRUE(first.admitted());
  auto second = gate.enter("t");
  ASSERT_FALSE(second.admitted());
  EXPECT_EQ(second.refusal(), api::TenantGate::Refusal::kRateLimited);
  EXPECT_GE(second.retryAfterS(), 1);
}

// What holds: a refusal by rate spends no token and takes no running place, and one tenant's
// bucket does not drain another's.
TEST(TenantGateAttack, RefusalsSpendNothingAndBucketsArePerTenant) {
  api::TenantGate gate(api::TenantGate::Limits{64, 1, 2});
  std::vector<api::TenantGate::Ticket> held;
  held.push_back(gate.enter("a"));
  held.push_back(gate.enter("a"));
  ASSERT_TRUE(held[0].admitted() && held[1].admitted());
  for (int i = 0; i < 100; ++i) {
    auto refused = gate.enter("a");
    ASSERT_FALSE(refused.admitted());
    EXPECT_GE(refused.retryAfterS(), 1);
  }
  EXPECT_EQ(gate.inFlight("a"), 2u);
  EXPECT_TRUE(gate.enter("b").admitted());
  EXPECT_EQ(gate.inFlight("b"), 0u);
}

}  // namespace
}  // namespace space
