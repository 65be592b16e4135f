#include "vmm/qemu_command.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace space::vmm {
namespace {

bool hasPair(const std::vector<std::string>& argv, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag && argv[i + 1] == value) return true;
  }
  return false;
}

bool has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

VmSpec spec() {
  VmSpec s;
  s.kernel_path = "/img/vmlinux";
  s.rootfs_path = "/img/rootfs.ext4";
  s.vcpus = 3;
  s.memory_mib = 768;
  return s;
}

TEST(QemuCommand, MicrovmWithoutDefaults) {
  auto argv = buildQemuArgv(spec(), VmPaths::inRunDir("/run/v"), Accelerator::kTcg);
  EXPECT_EQ(argv[0], "qemu-system-x86_64");
  EXPECT_TRUE(hasPair(argv, "-machine", "microvm,acpi=off,x-option-roms=off,isa-serial=on,rtc=on,memory-backend=mem"));
  EXPECT_TRUE(has(argv, "-nodefaults"));
  EXPECT_TRUE(has(argv, "-no-user-config"));
  EXPECT_TRUE(has(argv, "-no-reboot"));
  EXPECT_TRUE(hasPair(argv, "-smp", "3"));
  EXPECT_TRUE(hasPair(argv, "-m", "768M"));
  EXPECT_TRUE(hasPair(argv, "-object", "memory-backend-ram,id=mem,size=768M"));
  EXPECT_TRUE(hasPair(argv, "-kernel", "/img/vmlinux"));
  // The monitor and the agent port listen on sockets their owner bound (kQmpFd, kAgentFd).
  EXPECT_TRUE(hasPair(argv, "-chardev", "socket,id=qmp,fd=5,server=on,wait=off"));
  EXPECT_TRUE(hasPair(argv, "-mon", "chardev=qmp,mode=control"));
  EXPECT_TRUE(hasPair(argv, "-chardev", "socket,id=agent,fd=6,server=on,wait=off"));
  EXPECT_FALSE(has(argv, "-qmp"));
  EXPECT_FALSE(has(argv, "-pidfile"));  // QEMU makes no file
  EXPECT_TRUE(hasPair(argv, "-device", "virtio-rng-device,rng=rng,max-bytes=65536,period=1000"));
  EXPECT_TRUE(hasPair(argv, "-device", "virtserialport,chardev=agent,name=space.agent"));
  EXPECT_TRUE(hasPair(argv, "-chardev", "file,id=console,path=/run/v/console.log,append=on"));
}

TEST(QemuCommand, TcgAndKvm) {
  auto tcg = buildQemuArgv(spec(), VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(hasPair(tcg, "-accel", "tcg,thread=multi,tb-size=128"));  // SPACE's bound, not QEMU's 1 GiB
  EXPECT_TRUE(hasPair(tcg, "-cpu", "max"));
  auto kvm = buildQemuArgv(spec(), VmPaths::inRunDir("/r"), Accelerator::kKvm);
  EXPECT_TRUE(hasPair(kvm, "-accel", "kvm"));
  EXPECT_TRUE(hasPair(kvm, "-cpu", "host"));
}

TEST(QemuCommand, TcgTranslationBufferSize) {
  auto s = spec();
  s.tcg_tb_size_mib = 96;
  auto tcg = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(hasPair(tcg, "-accel", "tcg,thread=multi,tb-size=96"));
  // KVM runs guest code natively: there is no translation buffer to size.
  auto kvm = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kKvm);
  EXPECT_TRUE(hasPair(kvm, "-accel", "kvm"));
  s.tcg_tb_size_mib = 0;  // QEMU's own default
  tcg = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(hasPair(tcg, "-accel", "tcg,thread=multi"));
}

TEST(QemuCommand, OverlayDiskByDefaultDirectOnRequest) {
  auto s = spec();
  auto argv = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(
      hasPair(argv, "-blockdev",
              "driver=file,node-name=rootfile,filename=/r/disk.qcow2,aio=threads,cache.direct=off,cache.no-flush=on"));
  EXPECT_TRUE(hasPair(argv, "-blockdev", "driver=qcow2,node-name=root,file=rootfile"));
  // A full host disk stops the guest (the owner sees it) rather than failing its writes.
  EXPECT_TRUE(hasPair(argv, "-device", "virtio-blk-device,drive=root,werror=enospc,rerror=report"));
  // The images below the overlay: nodes of their own, bottom first, read-only, no image locks.
  s.disk_backing = {{"/data/layers/l1.qcow2", "qcow2"}, {"/images/rootfs.ext4", "raw"}};
  argv = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  std::vector<nlohmann::json> nodes;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-blockdev" && argv[i + 1].front() == '{') nodes.push_back(nlohmann::json::parse(argv[i + 1]));
  }
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0]["node-name"], "backing-1");
  EXPECT_EQ(nodes[0]["driver"], "raw");
  EXPECT_FALSE(nodes[0].contains("backing"));
  EXPECT_EQ(nodes[1]["node-name"], "backing-0");
  EXPECT_EQ(nodes[1]["driver"], "qcow2");
  EXPECT_EQ(nodes[1]["backing"], "backing-1");
  for (const auto& node : nodes) {
    EXPECT_EQ(node["read-only"], true) << node;
    EXPECT_EQ(node["file"]["locking"], "off") << node;
    EXPECT_EQ(node["file"]["read-only"], true) << node;
  }
  EXPECT_EQ(nodes[1]["file"]["filename"], "/data/layers/l1.qcow2");
  EXPECT_TRUE(hasPair(argv, "-blockdev", "driver=qcow2,node-name=root,file=rootfile,backing=backing-0"));
  // A qcow2 at the bottom has no backing at all (not the one its header might name).
  s.disk_backing = {{"/data/layers/l1.qcow2", "qcow2"}};
  argv = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-blockdev" && argv[i + 1].front() == '{') {
      EXPECT_TRUE(nlohmann::json::parse(argv[i + 1])["backing"].is_null()) << argv[i + 1];
    }
  }
  // A layer name that is not UTF-8 (a hostile header's) makes an argument, never an exception.
  s.disk_backing = {{"/r/\xff.qcow2", "qcow2"}};
  EXPECT_NO_THROW(argv = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg));
  s.disk_backing.clear();
  s.disk_mode = DiskMode::kDirect;
  argv = buildQemuArgv(s, VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(hasPair(argv, "-blockdev", "driver=raw,node-name=root,file=rootfile"));
}

TEST(QemuCommand, SeccompSandboxOn) {
  auto argv = buildQemuArgv(spec(), VmPaths::inRunDir("/r"), Accelerator::kTcg);
  EXPECT_TRUE(hasPair(argv, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"));
}

TEST(QemuCommand, ExtraCmdlineComesLast) {
  auto s = spec();
  s.extra_cmdline = "init=/bin/true";
  std::string cmdline = kernelCmdline(s);
  EXPECT_EQ(cmdline.find("console=ttyS0"), 0u);
  EXPECT_GT(cmdline.rfind("init=/bin/true"), cmdline.find("init=/sbin/space-agent"));
  EXPECT_NE(cmdline.find("panic=-1"), std::string::npos);
}

}  // namespace
}  // namespace space::vmm
