#include "vmm/accelerator.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/fs.h"

namespace space::vmm {
namespace {

TEST(ChooseAccelerator, AutoPicksHardwareKvm) {
  auto c = chooseAccelerator(Accelerator::kAuto, KvmProbe{true, false, true});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->accelerator, Accelerator::kKvm);
}

TEST(ChooseAccelerator, AutoRefusesPvmAndFallsBackToTcg) {
  auto c = chooseAccelerator(Accelerator::kAuto, KvmProbe{true, true, false});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->accelerator, Accelerator::kTcg);
  EXPECT_NE(c->reason.find("kvm_pvm"), std::string::npos);
}

TEST(ChooseAccelerator, AutoWithoutDevKvmIsTcg) {
  auto c = chooseAccelerator(Accelerator::kAuto, KvmProbe{false, false, false});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->accelerator, Accelerator::kTcg);
}

TEST(ChooseAccelerator, ExplicitKvmWithoutHardwareIsAnError) {
  auto c = chooseAccelerator(Accelerator::kKvm, KvmProbe{true, true, false});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("kvm_pvm"), std::string::npos);
}

TEST(ChooseAccelerator, ExplicitTcgAlwaysWorks) {
  auto c = chooseAccelerator(Accelerator::kTcg, KvmProbe{true, false, true});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->accelerator, Accelerator::kTcg);
}

TEST(ProbeKvm, ReadsModulesFromSysRoot) {
  auto dir = TempDir::create(testing::TempDir(), "sys-");
  ASSERT_TRUE(dir.ok());
  std::filesystem::create_directories(dir->path() + "/module/kvm_pvm");
  auto p = probeKvm("/nonexistent/kvm", dir->path());
  EXPECT_FALSE(p.dev_kvm_usable);
  EXPECT_TRUE(p.pvm_module);
  EXPECT_FALSE(p.hw_module);
  std::filesystem::create_directories(dir->path() + "/module/kvm_amd");
  EXPECT_TRUE(probeKvm("/nonexistent/kvm", dir->path()).hw_module);
}

}  // namespace
}  // namespace space::vmm
