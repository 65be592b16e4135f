// VM snapshots: a booted guest's device state saved next to its shared memory file and disk,
// restored into new QEMU processes (private copy-on-write RAM, qcow2 overlay over the frozen
// disk). Real VMs, TCG here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/fs.h"
#include "snapshot/layers.h"
#include "snapshot/sandbox_snapshot.h"
#include "vmm/vm.h"

namespace space::vmm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string imagePath(const char* name) { return std::string(SPACE_IMAGES_DIR) + "/" + name; }

class SnapshotTest : public testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-snap-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
  }
  std::optional<TempDir> dir_;
};

TEST_F(SnapshotTest, RestoredClonesResumeTheSavedGuestAndDivergeCopyOnWrite) {
  const std::string snap = dir_->path() + "/snap";
  std::filesystem::create_directories(snap);
  VmSpec spec;
  spec.kernel_path = imagePath("vmlinux");
  spec.qemu_binary = imagePath("qemu-system-x86_64");
  spec.rootfs_path = imagePath("rootfs.ext4");
  spec.vcpus = 1;
  spec.memory_mib = 256;
  spec.memory_file = snap + "/memory";
  VmStartOptions options;
  options.run_dir = dir_->path() + "/origin";
  {
    auto origin = Vm::start(spec, options);
    ASSERT_TRUE(origin.ok()) << origin.error().message;
    auto setup = (*origin)->exec(
        "echo before > /home/user/shared.txt; setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do sleep 0.05; done' "
        ">/dev/null 2>&1 & sleep 0.2; cat /tmp/ticker.pid");
    ASSERT_TRUE(setup.ok()) << setup.error().message;
    auto saved = (*origin)->saveState(snap + "/state", seconds(30));
    ASSERT_TRUE(saved.ok()) << saved.error().message;
    auto status = (*origin)->queryStatus();
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status.value(), "postmigrate");
    (*origin)->quit();
    std::filesystem::rename(options.run_dir + "/disk.qcow2", snap + "/disk.qcow2");
  }
  EXPECT_FALSE(std::filesystem::exists(options.run_dir));
  ASSERT_TRUE(std::filesystem::exists(snap + "/state"));
  EXPECT_LT(std::filesystem::file_size(snap + "/state"), 1u << 20) << "RAM was streamed, not shared";
  auto memory_before = std::filesystem::last_write_time(snap + "/memory");

  VmSpec clone_spec = spec;
  clone_spec.rootfs_path = snap + "/disk.qcow2";
  clone_spec.rootfs_format = "qcow2";
  clone_spec.memory_private = true;
  std::vector<std::unique_ptr<Vm>> clones;
  for (int i = 0; i < 2; ++i) {
    VmStartOptions clone_options;
    clone_options.run_dir = dir_->path() + "/clone" + std::to_string(i);
    clone_options.restore_from = snap + "/state";
    auto clone = Vm::start(clone_spec, clone_options);
    ASSERT_TRUE(clone.ok()) << clone.error().message;
    EXPECT_GT(clone.value()->bootTiming().to_running.count(), 0);
    clones.push_back(std::move(clone.value()));
  }
  for (int i = 0; i < 2; ++i) {
    auto r = clones[i]->exec("kill -0 $(cat /tmp/ticker.pid) && cat /home/user/shared.txt && echo clone" +
                             std::to_string(i) + " > /home/user/own.txt && sync");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->exit_code, 0) << r->stderr_data;
    EXPECT_EQ(r->stdout_data, "before\n");
  }
  // Each clone sees only its own write; the snapshot's files did not change.
  for (int i = 0; i < 2; ++i) {
    auto r = clones[i]->exec("cat /home/user/own.txt");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->stdout_data, "clone" + std::to_string(i) + "\n");
  }
  EXPECT_EQ(std::filesystem::last_write_time(snap + "/memory"), memory_before);
  clones.clear();
  EXPECT_FALSE(std::filesystem::exists(dir_->path() + "/clone0"));
}

// A snapshot of a running guest whose RAM is private (every sandbox restored from a template):
// the sandbox keeps running on a new overlay, children restored from the snapshot see its
// memory and files, and nobody sees anyone else's later writes.
TEST_F(SnapshotTest, ASnapshotOfARunningGuestBranchesIntoIndependentChildren) {
  const std::string snaps = dir_->path() + "/snapshots";
  const std::string layers = dir_->path() + "/layers";
  std::filesystem::create_directories(snaps);
  std::filesystem::create_directories(layers);
  VmSpec spec;
  spec.kernel_path = imagePath("vmlinux");
  spec.qemu_binary = imagePath("qemu-system-x86_64");
  spec.rootfs_path = imagePath("rootfs.ext4");
  spec.vcpus = 1;
  spec.memory_mib = 256;
  VmStartOptions options;
  options.run_dir = dir_->path() + "/parent";
  auto parent = Vm::start(spec, options);
  ASSERT_TRUE(parent.ok()) << parent.error().message;
  auto setup = (*parent)->exec(
      "echo before > /home/user/shared.txt; setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do sleep 0.05; done' "
      ">/dev/null 2>&1 & sleep 0.2; cat /tmp/ticker.pid");
  ASSERT_TRUE(setup.ok()) << setup.error().message;
  const std::string ticker = setup->stdout_data;

  snapshot::TakeSnapshotRequest req;
  req.id = "snap_test";
  req.snapshots_dir = snaps;
  req.layers_dir = layers;
  req.vm_spec = spec;
  req.vm_spec.accelerator = (*parent)->accelerator();
  auto snap = snapshot::takeSnapshot(**parent, /*was_running=*/true, req);
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  EXPECT_FALSE(std::filesystem::exists(snaps + "/.build-snap_test"));
  EXPECT_LT(std::filesystem::file_size(snap->state_file), 1u << 20) << "RAM must be in the memory file";
  // The parent runs on, on a new overlay over the frozen layer.
  auto status = (*parent)->queryStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status.value(), "running");
  auto backing = snapshot::qcow2BackingFile((*parent)->paths().disk);
  ASSERT_TRUE(backing.ok()) << backing.error().message;
  EXPECT_EQ(backing.value(), snap->disk);
  auto after = (*parent)->exec("echo parent-after > /home/user/shared.txt && sync && cat /tmp/ticker.pid");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_EQ(after->stdout_data, ticker);

  VmSpec child_spec = spec;
  child_spec.rootfs_path = snap->disk;
  child_spec.rootfs_format = "qcow2";
  child_spec.memory_file = snap->memory_file;
  child_spec.memory_private = true;
  std::vector<std::unique_ptr<Vm>> children;
  for (int i = 0; i < 2; ++i) {
    VmStartOptions child_options;
    child_options.run_dir = dir_->path() + "/child" + std::to_string(i);
    child_options.restore_from = snap->state_file;
    auto child = Vm::start(child_spec, child_options);
    ASSERT_TRUE(child.ok()) << child.error().message;
    children.push_back(std::move(child.value()));
  }
  for (int i = 0; i < 2; ++i) {
    auto r = children[i]->exec("kill -0 $(cat /tmp/ticker.pid) && cat /tmp/ticker.pid /home/user/shared.txt && echo " +
                               std::to_string(i) + " > /home/user/shared.txt && sync");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->exit_code, 0) << r->stderr_data;
    EXPECT_EQ(r->stdout_data, ticker + "before\n");
  }
  for (int i = 0; i < 2; ++i) {
    auto r = children[i]->exec("cat /home/user/shared.txt");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->stdout_data, std::to_string(i) + "\n");
  }
  auto mine = (*parent)->exec("cat /home/user/shared.txt");
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->stdout_data, "parent-after\n");

  // Every layer is reachable from the disks standing on it; none from nothing.
  std::vector<std::string> roots{(*parent)->paths().disk};
  for (auto& c : children) roots.push_back(c->paths().disk);
  auto reached = snapshot::reachableLayers(roots, [](const std::string&) { return true; });
  ASSERT_TRUE(reached.has_value());
  auto keep = *reached;
  EXPECT_TRUE(keep.count(snap->disk));
  EXPECT_EQ(snapshot::sweepLayers(layers, keep), 0);
  EXPECT_EQ(snapshot::sweepLayers(layers, {}), 1);  // nothing standing on it: it goes
}

TEST_F(SnapshotTest, ACorruptStateFileFailsTheRestoreCleanly) {
  const std::string snap = dir_->path() + "/snap";
  std::filesystem::create_directories(snap);
  {
    std::ofstream(snap + "/state") << "not a migration stream";
    std::ofstream memory(snap + "/memory");
  }
  std::filesystem::resize_file(snap + "/memory", 256u << 20);
  VmSpec spec;
  spec.kernel_path = imagePath("vmlinux");
  spec.qemu_binary = imagePath("qemu-system-x86_64");
  spec.rootfs_path = imagePath("rootfs.ext4");
  spec.vcpus = 1;
  spec.memory_mib = 256;
  spec.memory_file = snap + "/memory";
  spec.memory_private = true;
  spec.boot_timeout = seconds(20);
  VmStartOptions options;
  options.run_dir = dir_->path() + "/clone";
  options.restore_from = snap + "/state";
  auto clone = Vm::start(spec, options);
  ASSERT_FALSE(clone.ok());
  EXPECT_NE(clone.error().message.find("restore failed"), std::string::npos) << clone.error().message;
  EXPECT_FALSE(std::filesystem::exists(options.run_dir));
}

}  // namespace
}  // namespace space::vmm
