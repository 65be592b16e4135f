#include "vmm/vm_spec.h"

#include <gtest/gtest.h>

namespace space::vmm {
namespace {

VmSpec validSpec() {
  VmSpec s;
  s.kernel_path = "/proc/self/exe";  // any readable file: validation checks access only
  s.rootfs_path = "/proc/self/exe";
  return s;
}

HostCapacity host() { return HostCapacity{4, 8192}; }

TEST(ValidateSpec, AcceptsDefaults) { EXPECT_TRUE(validateSpec(validSpec(), host()).ok()); }

TEST(ValidateSpec, RefusesZeroVcpus) {
  auto s = validSpec();
  s.vcpus = 0;
  auto st = validateSpec(s, host());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find("vcpus = 0"), std::string::npos);
}

TEST(ValidateSpec, RefusesMoreVcpusThanAllowed) {
  auto s = validSpec();
  s.vcpus = 5;
  auto st = validateSpec(s, host());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("vcpus = 5"), std::string::npos);
  EXPECT_NE(st.error().message.find("4 allowed"), std::string::npos);
}

TEST(ValidateSpec, RefusesTooLittleMemory) {
  auto s = validSpec();
  s.memory_mib = 127;
  auto st = validateSpec(s, host());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("memory_mib = 127"), std::string::npos);
  EXPECT_NE(st.error().message.find("minimum of 128"), std::string::npos);
  s.memory_mib = 128;
  EXPECT_TRUE(validateSpec(s, host()).ok());
}

TEST(ValidateSpec, RefusesMoreMemoryThanHostHas) {
  auto s = validSpec();
  s.memory_mib = 8193;
  auto st = validateSpec(s, host());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(st.error().reason, "insufficient_capacity");
  // The host's free memory reflects other tenants' VMs: the message does not say how much.
  EXPECT_EQ(st.error().message.find("8192"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("more than the host has available"), std::string::npos);
}

TEST(ValidateSpec, RefusesMissingImages) {
  auto s = validSpec();
  s.kernel_path = "/nonexistent/vmlinux";
  auto st = validateSpec(s, host());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kNotFound);
}

TEST(ValidateSpec, RefusesNewlineInCmdline) {
  auto s = validSpec();
  s.extra_cmdline = "a\nb";
  EXPECT_FALSE(validateSpec(s, host()).ok());
}

TEST(MemAvailable, ParsesMeminfo) {
  auto mib = parseMemAvailableMib("MemTotal:       24000000 kB\nMemFree: 100 kB\nMemAvailable:   2097152 kB\n");
  ASSERT_TRUE(mib.ok());
  EXPECT_EQ(mib.value(), 2048u);
  EXPECT_FALSE(parseMemAvailableMib("garbage").ok());
}

TEST(MemAvailable, ProbesRealHost) {
  auto h = probeHostCapacity();
  ASSERT_TRUE(h.ok());
  EXPECT_GE(h->max_vcpus, 1u);
  EXPECT_GT(h->available_memory_mib, 0u);
}

TEST(Accelerator, ParsesNames) {
  EXPECT_EQ(parseAccelerator("kvm").value(), Accelerator::kKvm);
  EXPECT_EQ(parseAccelerator("tcg").value(), Accelerator::kTcg);
  EXPECT_EQ(parseAccelerator("auto").value(), Accelerator::kAuto);
  EXPECT_FALSE(parseAccelerator("hvf").ok());
}

}  // namespace
}  // namespace space::vmm
