// vmm::holdImageBases: which image-cache entries a data dir's templates stand on, kept and
// pinned; what a template's header names outside the cache is not admitted.
#include <gtest/gtest.h>
#include <sys/file.h>

#include <filesystem>
#include <fstream>

#include "common/fs.h"
#include "vmm/disk_overlay.h"
#include "vmm/image_bases.h"

namespace space::vmm {
namespace {

namespace fs = std::filesystem;

void writeFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

// A cache entry as images/lib.sh publishes one: the image and its manifest.
std::string entry(const fs::path& cache, const std::string& name) {
  writeFile(cache / name / "manifest.json", "{}\n");
  std::ofstream(cache / name / "rootfs.ext4").write(std::string(1 << 20, '\0').data(), 1 << 20);
  return (cache / name / "rootfs.ext4").string();
}

// A template's disk: an overlay naming `base`.
void templateOn(const fs::path& data_dir, const std::string& name, const std::string& base) {
  fs::create_directories(data_dir / "templates" / name);
  Status made = createDiskOverlay(base, "raw", (data_dir / "templates" / name / "disk.qcow2").string(),
                                  (data_dir / (name + ".log")).string());
  ASSERT_TRUE(made.ok()) << made.error().message;
}

bool pruneMayRemove(const std::string& image) {
  const std::string manifest = (fs::path(image).parent_path() / "manifest.json").string();
  UniqueFd fd(::open(manifest.c_str(), O_RDONLY | O_CLOEXEC));
  return fd.valid() && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
}

TEST(ImageBases, OlderImagesTemplatesStandOnAreKeptAndPinnedAndNothingElseIsAdmitted) {
  auto dir = TempDir::create("/tmp", "image-bases-");
  ASSERT_TRUE(dir.ok());
  const fs::path root = fs::canonical(dir->path());
  const fs::path cache = root / "cache", data = root / "data";
  const std::string current = entry(cache, "rootfs-new"), older = entry(cache, "rootfs-old");
  const std::string unused = entry(cache, "rootfs-unused");
  writeFile(data / "secret.db", "not an image");
  templateOn(data, "on-new", current);
  templateOn(data, "on-old", older);
  templateOn(data, "on-a-file", (data / "secret.db").string());  // a header may name anything
  // A sandbox made without a template (a size without one) stands on the image directly; an
  // eviction under way (".evict-") keeps nothing.
  const std::string direct = entry(cache, "rootfs-direct"), evicted = entry(cache, "rootfs-evicted");
  fs::create_directories(data / "sandboxes" / "sb_1");
  ASSERT_TRUE(createDiskOverlay(direct, "raw", (data / "sandboxes" / "sb_1" / "disk.qcow2").string(),
                                (data / "sb_1.log").string())
                  .ok());
  templateOn(data, ".evict-gone", evicted);
  // A pin this data dir left on an entry it no longer stands on, and another data dir's.
  const std::string mine = imagePinName(data.string());
  writeFile(cache / "rootfs-unused" / "pins" / mine, data.string() + "\n");
  writeFile(cache / "rootfs-unused" / "pins" / "0000000000000000", "/elsewhere\n");

  {
    auto bases = holdImageBases(data.string(), {current});
    ASSERT_TRUE(bases.ok()) << bases.error().message;
    // Current first; then the rest in the order found (templates before sandboxes).
    EXPECT_EQ(bases->images, (std::vector<std::string>{current, older, direct}));
    EXPECT_EQ(bases->held.size(), 3u);
    EXPECT_TRUE(pruneMayRemove(evicted));
    EXPECT_FALSE(pruneMayRemove(current));
    EXPECT_FALSE(pruneMayRemove(older));
    EXPECT_TRUE(pruneMayRemove(unused));
    for (const std::string& image : {current, older, direct}) {
      auto pin = readSmallFile((fs::path(image).parent_path() / "pins" / mine).string(), 4096);
      ASSERT_TRUE(pin.ok()) << image;
      EXPECT_EQ(pin.value(), data.string() + "\n");
    }
    EXPECT_FALSE(fs::exists(cache / "rootfs-unused" / "pins" / mine));
    EXPECT_TRUE(fs::exists(cache / "rootfs-unused" / "pins" / "0000000000000000"));  // not ours
  }
  EXPECT_TRUE(pruneMayRemove(older));  // held only while the result lives

  // An image of another name, or in another cache directory, is not one of the cache's.
  const std::string elsewhere = entry(root / "other-cache", "rootfs-x");
  templateOn(data, "on-elsewhere", elsewhere);
  auto again = holdImageBases(data.string(), {current});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->images, (std::vector<std::string>{current, older, direct}));

  // Beside a --rootfs of one's own (no manifest: not in a cache), nothing is an image.
  const fs::path own = root / "own" / "rootfs.ext4";
  fs::create_directories(own.parent_path());
  std::ofstream(own) << "x";
  auto beside_own = holdImageBases(data.string(), {own.string()});
  ASSERT_TRUE(beside_own.ok());
  EXPECT_EQ(beside_own->images, (std::vector<std::string>{own.string()}));
}

}  // namespace
}  // namespace space::vmm
