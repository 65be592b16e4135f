#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "common/fs.h"
#include "vmm/sealed_memory.h"

namespace space::vmm {
namespace {

// The copy holds the file's bytes (holes read as zeros), opens read-write through /proc as
// QEMU opens it, maps privately and writably, and refuses every write to itself.
TEST(SealedMemory, ACopyReadsLikeTheFileAndNothingWritesIt) {
  auto dir = TempDir::create(testing::TempDir(), "sealed-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/memory";
  {
    UniqueFd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(f.valid());
    ASSERT_EQ(::ftruncate(f.get(), 8 << 20), 0);  // 8 MiB, sparse
    ASSERT_EQ(::pwrite(f.get(), "start", 5, 0), 5);
    ASSERT_EQ(::pwrite(f.get(), "middle", 6, 4 << 20), 6);
  }
  auto sealed = sealedCopy(path);
  ASSERT_TRUE(sealed.ok()) << sealed.error().message;
  const std::string via = "/proc/self/fd/" + std::to_string(sealed->get());
  UniqueFd reopened(::open(via.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(reopened.valid()) << strerror(errno);
  EXPECT_EQ(::lseek(reopened.get(), 0, SEEK_END), 8 << 20);
  char buf[8] = {};
  ASSERT_EQ(::pread(reopened.get(), buf, 6, 4 << 20), 6);
  EXPECT_EQ(std::string(buf, 6), "middle");
  ASSERT_EQ(::pread(reopened.get(), buf, 4, 1 << 20), 4);
  EXPECT_EQ(std::string(buf, 4), std::string(4, '\0'));
  void* map = ::mmap(nullptr, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE, reopened.get(), 0);
  ASSERT_NE(map, MAP_FAILED);
  std::memcpy(map, "guest", 5);  // the guest's writes stay in its private copy
  ::munmap(map, 8 << 20);
  errno = 0;
  EXPECT_EQ(::pwrite(reopened.get(), "evil!", 5, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(reopened.get(), 0), -1);
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, reopened.get(), 0), MAP_FAILED);
  ASSERT_EQ(::pread(sealed->get(), buf, 5, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "start");
}

TEST(SealedMemory, TheCacheKeepsOneCopyPerFileUntilTheFileChanges) {
  auto dir = TempDir::create(testing::TempDir(), "sealed-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/memory";
  ASSERT_TRUE(writeFileAtomic(path, "one").ok());
  SealedMemoryCache cache;
  auto first = cache.get(path);
  ASSERT_TRUE(first.ok());
  auto again = cache.get(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->get(), again->get());
  ASSERT_TRUE(writeFileAtomic(path, "two!").ok());  // a rebuilt template: a new file
  auto rebuilt = cache.get(path);
  ASSERT_TRUE(rebuilt.ok());
  EXPECT_NE(rebuilt->get(), first->get());
  char buf[4] = {};
  ASSERT_EQ(::pread(rebuilt.value()->get(), buf, 4, 0), 4);
  EXPECT_EQ(std::string(buf, 4), "two!");
  EXPECT_EQ(cache.size(), 1u);
  std::filesystem::remove(path);  // evicted: its copy goes at the next use of any file
  EXPECT_FALSE(cache.get(path).ok());
  EXPECT_EQ(cache.size(), 0u);
  ASSERT_EQ(::symlink("/etc/hostname", (dir->path() + "/link").c_str()), 0);
  EXPECT_FALSE(sealedCopy(dir->path() + "/link").ok());  // never through a link
}

}  // namespace
}  // namespace space::vmm
