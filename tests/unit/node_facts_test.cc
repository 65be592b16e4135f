// Node facts: the TSC frequency TCG guests are told, and how it stays the same across starts
// (it is part of the template key) without hiding a real change.
#include "vmm/node_facts.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/fs.h"

namespace space::vmm {
namespace {

TEST(NodeFacts, TscIsMeasuredToWithinAFewPpm) {
#if defined(__x86_64__)
  const uint64_t a = measureTscKhz(50);
  const uint64_t b = measureTscKhz(50);
  ASSERT_GT(a, 100000u) << "a TSC slower than 100 MHz";
  const uint64_t diff = a > b ? a - b : b - a;
  EXPECT_LT(diff * 1000000 / a, 200u) << a << " vs " << b << " kHz";  // ppm, on a busy machine
#else
  GTEST_SKIP() << "no TSC on this architecture";
#endif
}

TEST(NodeFacts, TheRememberedTscFigureIsKeptWithin100PpmAndReplacedBeyond) {
  auto dir = TempDir::create("/tmp", "space-node-facts-");
  ASSERT_TRUE(dir.ok());
  const std::string file = dir->path() + "/node-tsc.json";
  EXPECT_EQ(rememberedTscKhz(file, 0), 0u);
  EXPECT_EQ(rememberedTscKhz(file, 2100000), 2100000u);  // first start: measured, remembered
  EXPECT_EQ(rememberedTscKhz(file, 2100150), 2100000u);  // 71 ppm off: the same key as before
  EXPECT_EQ(rememberedTscKhz(file, 2099800), 2100000u);
  EXPECT_EQ(rememberedTscKhz(file, 2101000), 2101000u);  // 476 ppm: another host or a real change
  EXPECT_EQ(rememberedTscKhz(file, 2101000), 2101000u);
  std::ofstream(file) << "{not json";
  EXPECT_EQ(rememberedTscKhz(file, 2100000), 2100000u);  // a damaged file is replaced
  EXPECT_EQ(rememberedTscKhz(file, 2100100), 2100000u);
}

TEST(NodeFacts, GuestKernelArgsOnlyUnderTcg) {
  NodeFacts facts;
  facts.tsc_khz = 2100123;
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kTcg), "tsc_early_khz=2100123");
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kKvm), "");  // kvm-clock
  facts.tsc_khz = 0;
  EXPECT_EQ(facts.guestKernelArgs(Accelerator::kTcg), "");
}

TEST(NodeFacts, OnlyAQemuNoOtherUserCanReplaceIsTrusted) {
  auto dir = TempDir::create("/tmp", "space-trusted-qemu-");  // 0700, ours, under sticky /tmp
  ASSERT_TRUE(dir.ok());
  const std::string bin = dir->path() + "/bin";
  std::filesystem::create_directory(bin);
  ::chmod(bin.c_str(), 0755);
  const std::string qemu = bin + "/qemu";
  std::ofstream(qemu) << "#!/bin/sh\n";
  ::chmod(qemu.c_str(), 0755);
  const uid_t me = geteuid();
  EXPECT_TRUE(checkTrustedExecutable(qemu, me).ok()) << checkTrustedExecutable(qemu, me).error().message;
  EXPECT_TRUE(checkTrustedExecutable(std::filesystem::canonical("/usr/bin/env").string(), me).ok());  // the system's
  // The file writable by others, or a directory above it: refused, and the message names it.
  ::chmod(qemu.c_str(), 0757);
  auto file = checkTrustedExecutable(qemu, me);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(file.error().message.find(qemu + " is writable by every user"), std::string::npos) << file.error().message;
  ::chmod(qemu.c_str(), 0755);
  ::chmod(bin.c_str(), 0777);  // no sticky bit: anyone could rename another file in
  auto parent = checkTrustedExecutable(qemu, me);
  ASSERT_FALSE(parent.ok());
  EXPECT_NE(parent.error().message.find(bin + " is writable by every user"), std::string::npos)
      << parent.error().message;
  ::chmod(bin.c_str(), 01777);  // sticky: only the owner of a name may replace it
  EXPECT_TRUE(checkTrustedExecutable(qemu, me).ok());
  ::chmod(bin.c_str(), 0755);
  // Another owner (when this test may give files away): refused.
  if (me == 0) {
    ASSERT_EQ(::chown(qemu.c_str(), 4242, 4242), 0);
    auto owner = checkTrustedExecutable(qemu, me);
    ASSERT_FALSE(owner.ok());
    EXPECT_NE(owner.error().message.find("belongs to uid 4242"), std::string::npos) << owner.error().message;
    ASSERT_EQ(::chown(qemu.c_str(), 0, 0), 0);
  }
  // Links are resolved before: a link, a directory or a relative path is not a QEMU to trust.
  std::filesystem::create_symlink(qemu, bin + "/link");
  EXPECT_FALSE(checkTrustedExecutable(bin + "/link", me).ok());
  EXPECT_FALSE(checkTrustedExecutable(bin, me).ok());
  auto relative = checkTrustedExecutable("bin/qemu", me);
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.error().code, ErrorCode::kInvalidArgument);
}

TEST(NodeFacts, ABuildOfAnOlderQemuSourceThanTheInstalledOneIsSaidToBeStale) {
  const std::string status =
      "Package: qemu-utils\nStatus: install ok installed\nVersion: 1:7.2+dfsg-7+deb12u18\n\n"
      "Package: qemu-system-x86\nStatus: install ok installed\nSource: qemu (1:7.2+dfsg-7+deb12u20)\n"
      "Version: 1:7.2+dfsg-7+deb12u20+b1\n\n"
      "Package: gone\nStatus: deinstall ok config-files\nVersion: 1.0\n\n"
      "Package: plain\nStatus: install ok installed\nSource: plain\nVersion: 2.1-3\n";
  EXPECT_EQ(installedSourceVersion(status, "qemu-system-x86"), "1:7.2+dfsg-7+deb12u20");
  EXPECT_EQ(installedSourceVersion(status, "plain"), "2.1-3");  // no version in Source: its own
  EXPECT_EQ(installedSourceVersion(status, "gone"), std::nullopt);
  EXPECT_EQ(installedSourceVersion(status, "qemu-system"), std::nullopt);  // names match whole
  EXPECT_EQ(installedSourceVersion("", "qemu-system-x86"), std::nullopt);

  auto dir = TempDir::create("/tmp", "space-stale-qemu-");
  ASSERT_TRUE(dir.ok());
  const std::string qemu = dir->path() + "/qemu-system-x86_64", dpkg = dir->path() + "/status";
  std::ofstream(dpkg) << status;
  EXPECT_EQ(staleQemuBuild(qemu, dpkg), std::nullopt);  // no manifest: not SPACE's build
  std::ofstream(dir->path() + "/manifest.json") << R"({"kind":"qemu","source_version":"1:7.2+dfsg-7+deb12u18"})";
  auto stale = staleQemuBuild(qemu, dpkg);
  ASSERT_TRUE(stale.has_value());
  EXPECT_NE(stale->find("built from qemu 1:7.2+dfsg-7+deb12u18, but the installed qemu-system-x86 is "
                        "1:7.2+dfsg-7+deb12u20"),
            std::string::npos)
      << *stale;
  EXPECT_NE(stale->find("make images"), std::string::npos);
  std::ofstream(dir->path() + "/manifest.json") << R"({"kind":"qemu","source_version":"1:7.2+dfsg-7+deb12u20"})";
  EXPECT_EQ(staleQemuBuild(qemu, dpkg), std::nullopt);
}

TEST(NodeFacts, AQemuBuildWatchSeesASecurityUpdateInstalledWhileTheNodeRuns) {
  auto dir = TempDir::create("/tmp", "space-qemu-watch-");
  ASSERT_TRUE(dir.ok());
  const std::string qemu = dir->path() + "/qemu-system-x86_64", dpkg = dir->path() + "/status";
  auto installed = [&](const std::string& version) {
    std::ofstream(dpkg) << "Package: qemu-system-x86\nStatus: install ok installed\nSource: qemu (" << version
                        << ")\nVersion: " << version << "\n";
  };
  std::ofstream(dir->path() + "/manifest.json") << R"({"kind":"qemu","source_version":"1:7.2+dfsg-7+deb12u18"})";
  installed("1:7.2+dfsg-7+deb12u18");
  QemuBuildWatch watch(qemu, dpkg);
  EXPECT_EQ(watch.check(), std::nullopt);
  EXPECT_EQ(watch.check(), std::nullopt);
  // apt installs an update: the status file changes (here its size; dpkg also renames it over).
  installed("1:7.2+dfsg-7+deb12u200");
  auto stale = watch.check();
  ASSERT_TRUE(stale.has_value());
  EXPECT_NE(stale->find("the installed qemu-system-x86 is 1:7.2+dfsg-7+deb12u200"), std::string::npos) << *stale;
  EXPECT_TRUE(watch.check().has_value());  // still stale, from what it saw
  // make images rebuilt from the new source and the node restarted: a new watch agrees again.
  std::ofstream(dir->path() + "/manifest.json") << R"({"kind":"qemu","source_version":"1:7.2+dfsg-7+deb12u200"})";
  EXPECT_EQ(QemuBuildWatch(qemu, dpkg).check(), std::nullopt);
  // And the update rolled back (the status file changes again): the running watch agrees too.
  installed("1:7.2+dfsg-7+deb12u18");
  std::ofstream(dir->path() + "/manifest.json") << R"({"kind":"qemu","source_version":"1:7.2+dfsg-7+deb12u18"})";
  EXPECT_EQ(watch.check(), std::nullopt);
}

}  // namespace
}  // namespace space::vmm
