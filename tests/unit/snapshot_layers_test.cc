// Disk layers: reading backing-file names from qcow2 headers (real images made by qemu-img,
// and hand-made hostile ones) and sweeping the layers nothing stands on.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/fs.h"
#include "common/process.h"
#include "snapshot/layers.h"
#include "snapshot/template_cache.h"

namespace space::snapshot {
namespace {

// Every name is followable here: these tests are about the walk itself.
bool any(const std::string&) { return true; }

class LayersTest : public testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-layers-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    std::filesystem::create_directories(layers());
  }
  std::string layers() const { return dir_->path() + "/layers"; }
  // qemu-img create, optionally over `backing` (qcow2).
  std::string image(const std::string& path, const std::string& backing = "") {
    std::vector<std::string> argv{"qemu-img", "create", "-q", "-f", "qcow2"};
    if (!backing.empty()) argv.insert(argv.end(), {"-F", "qcow2", "-b", backing});
    argv.insert(argv.end(), {path, "64M"});
    auto p = ChildProcess::spawn(argv, SpawnOptions{dir_->path() + "/qemu-img.log", "", true});
    EXPECT_TRUE(p.ok());
    auto status = p->waitFor(std::chrono::seconds(30));
    EXPECT_TRUE(status && status->exit_code == 0);
    return path;
  }
  // A qcow2 header naming `name` at `offset`, `size` bytes long (as written, even if a lie).
  std::string craft(const std::string& path, const std::string& name, uint64_t offset, uint32_t size) {
    std::string header(std::max<uint64_t>(offset + name.size(), 72), '\0');
    memcpy(header.data(), "QFI\xfb\0\0\0\3", 8);
    for (int i = 0; i < 8; ++i) header[8 + i] = static_cast<char>(offset >> (56 - 8 * i));
    for (int i = 0; i < 4; ++i) header[16 + i] = static_cast<char>(size >> (24 - 8 * i));
    header.replace(offset, name.size(), name);
    std::ofstream(path, std::ios::binary) << header;
    return path;
  }
  std::optional<TempDir> dir_;
};

TEST_F(LayersTest, ReadsTheBackingFileQemuWrote) {
  auto base = image(layers() + "/base.qcow2");
  auto top = image(dir_->path() + "/top.qcow2", base);
  auto none = qcow2BackingFile(base);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(none.value(), "");
  auto named = qcow2BackingFile(top);
  ASSERT_TRUE(named.ok()) << named.error().message;
  EXPECT_EQ(named.value(), base);
}

TEST_F(LayersTest, RefusesWhatIsNotAPlausibleQcow2Header) {
  std::ofstream(dir_->path() + "/raw") << "just bytes, no header";
  EXPECT_EQ(qcow2BackingFile(dir_->path() + "/raw").error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(qcow2BackingFile(dir_->path() + "/missing").error().code, ErrorCode::kNotFound);
  auto huge = craft(dir_->path() + "/huge", "/x", 72, 1u << 30);
  EXPECT_EQ(qcow2BackingFile(huge).error().code, ErrorCode::kInvalidArgument);
  auto far = craft(dir_->path() + "/far", "/x", 72, 2);
  std::filesystem::resize_file(far, 72);  // the name lies past the end of the file
  EXPECT_EQ(qcow2BackingFile(far).error().code, ErrorCode::kInvalidArgument);
  auto relative = craft(dir_->path() + "/rel", "below.qcow2", 72, 11);
  EXPECT_EQ(qcow2BackingFile(relative).value(), dir_->path() + "/below.qcow2");
}

TEST_F(LayersTest, SweepKeepsEveryLayerSomeDiskStandsOnAndNothingElse) {
  auto l1 = image(layers() + "/l1.qcow2");
  auto l2 = image(layers() + "/l2.qcow2", l1);
  auto l3 = image(layers() + "/l3.qcow2", l2);
  auto orphan = image(layers() + "/orphan.qcow2", l1);
  auto disk = image(dir_->path() + "/disk.qcow2", l3);
  auto reached = reachableLayers({disk, dir_->path() + "/gone.qcow2"}, any);
  ASSERT_TRUE(reached.has_value());
  auto keep = *reached;
  EXPECT_TRUE(keep.count(l1) && keep.count(l2) && keep.count(l3));
  EXPECT_FALSE(keep.count(orphan));
  EXPECT_EQ(sweepLayers(layers(), keep), 1);
  EXPECT_FALSE(std::filesystem::exists(orphan));
  EXPECT_TRUE(std::filesystem::exists(l1));
  // Once the disk is gone, the whole chain goes.
  std::filesystem::remove(disk);
  EXPECT_EQ(sweepLayers(layers(), *reachableLayers({disk}, any)), 3);
}

TEST_F(LayersTest, ACycleOfBackingNamesEndsTheWalk) {
  auto a = craft(layers() + "/a", layers() + "/b", 72, static_cast<uint32_t>((layers() + "/b").size()));
  auto b = craft(layers() + "/b", layers() + "/a", 72, static_cast<uint32_t>((layers() + "/a").size()));
  auto keep = reachableLayers({a}, any);
  ASSERT_TRUE(keep.has_value());
  EXPECT_EQ(keep->size(), 2u);
}

TEST_F(LayersTest, AnUnreadableLayerSweepsNothing) {
  // A name that cannot be looked at (ENOTDIR): neither "gone" nor "not qcow2".
  ASSERT_TRUE(writeFileAtomic(layers() + "/blocker", "x").ok());
  const std::string below = layers() + "/blocker/l1.qcow2";
  auto disk = craft(dir_->path() + "/disk.qcow2", below, 72, static_cast<uint32_t>(below.size()));
  EXPECT_FALSE(reachableLayers({disk}, any).has_value());
}

// A name that is not one of the node's disks ends its chain unopened, so a planted header
// cannot make the walk read a host file (a FIFO, /proc/kmsg) or fail it (ENOTDIR).
TEST_F(LayersTest, OnlyTheNodesOwnDisksAreFollowed) {
  auto l1 = image(layers() + "/l1.qcow2");
  for (const std::string& name : {std::string("/etc/passwd/x"), std::string("/proc/kmsg"), l1}) {
    auto disk = craft(dir_->path() + "/disk.qcow2", name, 72, static_cast<uint32_t>(name.size()));
    auto keep = reachableLayers({disk}, [&](const std::string& n) { return vmm::isNodeDiskPath(n, {layers()}, {}); });
    ASSERT_TRUE(keep.has_value()) << name;
    EXPECT_EQ(keep->count(name), name == l1 ? 1u : 0u) << name;
  }
  EXPECT_FALSE(vmm::isNodeDiskPath(layers() + "/../state.db", {layers()}, {}));
  EXPECT_FALSE(vmm::isNodeDiskPath(layers(), {layers()}, {}));
}

// A name in a header is QEMU's to write: a FIFO, a device, a directory or a link there ends the
// chain without being opened (nothing blocks, no device is opened) and is not followed.
TEST_F(LayersTest, ANameThatIsNotARegularFileEndsTheChainUnopened) {
  const std::string fifo = layers() + "/fifo.qcow2";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto l1 = image(layers() + "/l1.qcow2");
  const std::string link = layers() + "/link.qcow2";
  ASSERT_EQ(::symlink(l1.c_str(), link.c_str()), 0);
  for (const std::string& name : {fifo, std::string("/dev/null"), layers(), link}) {
    auto disk = craft(dir_->path() + "/disk.qcow2", name, 72, static_cast<uint32_t>(name.size()));
    auto keep = reachableLayers({disk}, any);
    ASSERT_TRUE(keep.has_value()) << name;
    EXPECT_EQ(keep->count(l1), 0u) << name;  // the link is not followed
    EXPECT_EQ(qcow2BackingFile(name).error().code, ErrorCode::kInvalidArgument) << name;
  }
}

// The template key is computed (stat, PATH walk, SHA-256) once per key and process, not on
// every create; a fresh cache (spaced's next start) sees files that changed meanwhile.
TEST(TemplateCache, KeyIsComputedOncePerKeyAndProcess) {
  auto dir = TempDir::create("/tmp", "space-template-key-");
  ASSERT_TRUE(dir.ok());
  const std::string kernel = dir->path() + "/vmlinux";
  const std::string rootfs = dir->path() + "/rootfs.ext4";
  std::ofstream(kernel) << "kernel";
  std::ofstream(rootfs) << "rootfs";
  TemplateKey key{.name = "base",
                  .kernel_path = kernel,
                  .rootfs_path = rootfs,
                  .vcpus = 1,
                  .memory_mib = 256,
                  .accelerator = vmm::Accelerator::kTcg,
                  .qemu_binary = "true"};  // any program in PATH
  TemplateCache cache(dir->path());
  auto first = cache.dirName(key);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_TRUE(first->starts_with("base-"));

  std::ofstream(rootfs) << "a rebuilt rootfs of another size";
  auto again = cache.dirName(key);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);  // remembered: no stat on the request path
  auto restarted = TemplateCache(dir->path()).dirName(key);
  ASSERT_TRUE(restarted.ok());
  EXPECT_NE(*restarted, *first);  // a new process keys the changed image anew

  key.memory_mib = 512;
  EXPECT_NE(cache.dirName(key).value(), *first);  // another size is another key
  key.kernel_path = dir->path() + "/missing";
  EXPECT_FALSE(cache.dirName(key).ok());
}

}  // namespace
}  // namespace space::snapshot
