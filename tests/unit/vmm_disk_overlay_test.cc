#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/fs.h"
#include "vmm/disk_overlay.h"

namespace space::vmm {
namespace {

uint64_t bigEndian(const std::string& bytes, size_t at, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v = (v << 8) | static_cast<unsigned char>(bytes.at(at + i));
  return v;
}

struct Header {
  uint64_t virtual_size = 0;
  std::string backing;
};

// The fields of a qcow2 header that depend on the base: its virtual size and backing file name.
Header readHeader(const std::string& path) {
  auto bytes = readSmallFile(path, 4 << 20);
  EXPECT_TRUE(bytes.ok()) << path;
  if (!bytes.ok() || bytes->size() < 32 || bytes->compare(0, 4, "QFI\xfb") != 0) return {};
  const uint64_t backing_offset = bigEndian(*bytes, 8, 8);
  const uint64_t backing_size = bigEndian(*bytes, 16, 4);
  return Header{bigEndian(*bytes, 24, 8), bytes->substr(backing_offset, backing_size)};
}

void makeFile(const std::string& path, off_t size) {
  std::filesystem::remove(path);
  { std::ofstream(path, std::ios::binary); }
  ASSERT_EQ(::truncate(path.c_str(), size), 0);
}

TEST(DiskOverlay, TheSecondOverlayOverABaseIsWrittenFromMemoryAndIsTheSame) {
  auto dir = TempDir::create("/tmp", "overlay-test-");
  ASSERT_TRUE(dir.ok());
  const std::string base = dir->path() + "/base.img";
  makeFile(base, 64 << 20);
  const size_t before = diskOverlaysWrittenFromMemory();
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/a.qcow2", dir->path() + "/log").ok());
  EXPECT_EQ(diskOverlaysWrittenFromMemory(), before);  // the first one: qemu-img
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/b.qcow2", dir->path() + "/log").ok());
  EXPECT_EQ(diskOverlaysWrittenFromMemory(), before + 1);
  EXPECT_EQ(readSmallFile(dir->path() + "/a.qcow2", 4 << 20).value(),
            readSmallFile(dir->path() + "/b.qcow2", 4 << 20).value());
  const Header h = readHeader(dir->path() + "/b.qcow2");
  EXPECT_EQ(h.virtual_size, uint64_t{64} << 20);
  EXPECT_EQ(h.backing, base);
}

TEST(DiskOverlay, AChangedBaseGetsANewOverlay) {
  auto dir = TempDir::create("/tmp", "overlay-test-");
  ASSERT_TRUE(dir.ok());
  const std::string base = dir->path() + "/base.img";
  makeFile(base, 64 << 20);
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/a.qcow2", dir->path() + "/log").ok());
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/b.qcow2", dir->path() + "/log").ok());
  // Grown in place (its size and mtime change): overlays over it must say its new size.
  ASSERT_EQ(::truncate(base.c_str(), 128 << 20), 0);
  const size_t before = diskOverlaysWrittenFromMemory();
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/c.qcow2", dir->path() + "/log").ok());
  EXPECT_EQ(diskOverlaysWrittenFromMemory(), before);
  EXPECT_EQ(readHeader(dir->path() + "/c.qcow2").virtual_size, uint64_t{128} << 20);
  // Replaced by another file of the same size: a new inode, so qemu-img again.
  makeFile(base + ".new", 128 << 20);
  std::filesystem::rename(base + ".new", base);
  ASSERT_TRUE(createDiskOverlay(base, "raw", dir->path() + "/d.qcow2", dir->path() + "/log").ok());
  EXPECT_EQ(diskOverlaysWrittenFromMemory(), before);
  // The same base named in another format is another overlay (qemu-img checks it).
  EXPECT_FALSE(createDiskOverlay(base, "qcow2", dir->path() + "/e.qcow2", dir->path() + "/log").ok());
}

TEST(DiskOverlay, AMissingBaseFails) {
  auto dir = TempDir::create("/tmp", "overlay-test-");
  ASSERT_TRUE(dir.ok());
  auto made = createDiskOverlay(dir->path() + "/nothing.img", "raw", dir->path() + "/a.qcow2", dir->path() + "/log");
  EXPECT_FALSE(made.ok());
}

// A layer's header is its sandbox's QEMU's to rewrite: the chain it names (here a FIFO, which
// would block whoever opened it) is never opened by qemu-img, which runs unconfined. The new
// overlay gets the base's size from the base's own header.
TEST(DiskOverlay, ABaseWhoseHeaderNamesAFifoIsNeverOpenedByQemuImg) {
  auto dir = TempDir::create("/tmp", "overlay-test-");
  ASSERT_TRUE(dir.ok());
  const std::string fifo = dir->path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string base = dir->path() + "/layer.qcow2";
  ASSERT_EQ(std::system(("qemu-img create -q -f qcow2 -F raw -b " + fifo + " -u " + base + " 3M").c_str()), 0);
  const auto started = std::chrono::steady_clock::now();
  auto made = createDiskOverlay(base, "qcow2", dir->path() + "/disk.qcow2", dir->path() + "/log");
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
  const Header header = readHeader(dir->path() + "/disk.qcow2");
  EXPECT_EQ(header.virtual_size, uint64_t{3} << 20);
  EXPECT_EQ(header.backing, base);
}

// A layer whose header names an external data file (a QEMU that rewrote its overlay's header)
// stops the chain walk before any QEMU opens it; plain layers and raw bases pass.
TEST(DiskOverlay, AChainWithALayerNamingAnExternalDataFileIsRefused) {
  auto dir = TempDir::create("/tmp", "overlay-test-");
  ASSERT_TRUE(dir.ok());
  const std::string base = dir->path() + "/base.img";
  makeFile(base, 16 << 20);
  const std::string plain = dir->path() + "/plain.qcow2", lying = dir->path() + "/lying.qcow2";
  ASSERT_TRUE(createDiskOverlay(base, "raw", plain, dir->path() + "/log").ok());
  const std::string make = "qemu-img create -q -f qcow2 -o data_file=" + dir->path() + "/data.raw " + lying + " 16M";
  ASSERT_EQ(std::system(make.c_str()), 0);
  auto admitAll = [](const std::string&) { return okStatus(); };
  auto chain = diskChain(plain, admitAll);
  ASSERT_TRUE(chain.ok()) << chain.error().message;
  EXPECT_EQ(chain->size(), 2u);
  auto refused = diskChain(lying, admitAll);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(refused.error().message.find("external data file"), std::string::npos) << refused.error().message;
  // The same bit set by hand in a layer below the top.
  auto bytes = readSmallFile(plain, 4 << 20);
  ASSERT_TRUE(bytes.ok());
  std::string patched = bytes.value();
  patched[72 + 7] = static_cast<char>(patched[72 + 7] | 4);
  { std::ofstream(plain, std::ios::binary | std::ios::trunc) << patched; }
  const std::string top = dir->path() + "/top.qcow2";
  ASSERT_TRUE(createDiskOverlay(plain, "qcow2", top, dir->path() + "/log").ok());
  auto below = diskChain(top, admitAll);
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.error().message.find(plain), std::string::npos) << below.error().message;
}

}  // namespace
}  // namespace space::vmm
