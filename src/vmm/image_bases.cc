#include "vmm/image_bases.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <system_error>

#include "common/digest.h"
#include "common/fs.h"
#include "vmm/disk_overlay.h"

namespace space::vmm {

namespace fs = std::filesystem;

namespace {

// `name` as an image of the cache that holds one of `current`: absolute, no link on the way, a
// regular file named like that image, directly in an entry (a directory with a manifest) of the
// same cache directory.
bool isCachedImageLike(const std::string& name, const std::vector<std::string>& current) {
  if (name.empty() || name[0] != '/') return false;
  std::error_code ec;
  if (fs::canonical(name, ec).string() != name || ec) return false;
  struct stat st {};
  if (::lstat(name.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const fs::path path(name);
  if (!fs::is_regular_file(path.parent_path() / "manifest.json", ec)) return false;
  for (const auto& image : current) {
    const fs::path known(image);
    // Only beside a current image that is itself in the cache: a --rootfs of one's own names
    // no cache, and its neighbours are nobody's images.
    if (!fs::is_regular_file(known.parent_path() / "manifest.json", ec)) continue;
    if (path.filename() == known.filename() && path.parent_path().parent_path() == known.parent_path().parent_path()) {
      return true;
    }
  }
  return false;
}

void pin(const fs::path& entry, const std::string& name, const std::string& data_dir) {
  std::error_code ec;
  fs::create_directories(entry / "pins", ec);
  const fs::path file = entry / "pins" / name;
  if (auto now = readSmallFile(file.string(), 4096); now.ok() && now.value() == data_dir + "\n") return;
  Status written = okStatus();
  if (ec) {
    written = makeError(ErrorCode::kInternal, ec.message());
  } else {
    written = writeFileAtomic(file.string(), data_dir + "\n", 0644);
  }
  if (!written.ok()) {
    spdlog::warn("images: cannot pin {} for {}: {} (a `make images` may prune it while spaced is stopped)",
                 entry.string(), data_dir, written.error().message);
  }
}

}  // namespace

std::string imagePinName(const std::string& data_dir) { return sha256Hex(data_dir).substr(0, 16); }

Result<ImageBases> holdImageBases(const std::string& data_dir_in, const std::vector<std::string>& current) {
  std::error_code ec;
  const std::string data_dir = fs::weakly_canonical(data_dir_in, ec).string();
  if (ec) return makeError(ErrorCode::kInternal, "data dir " + data_dir_in + ": " + ec.message());
  ImageBases out;
  std::set<std::string> seen;
  for (const auto& image : current) {
    if (seen.insert(image).second) out.images.push_back(image);
  }
  // The disks that may name an image outside the data dir: templates' (their own, and their
  // builders'), and those of sandboxes and snapshots made without a template (sizes without
  // one, --no-snapshots), whose disks stand on the image directly.
  bool complete = true;  // every disk was read: only then may pins of this data dir go
  std::vector<fs::path> disks;
  auto listDisks = [&](const fs::path& dir, bool nested) {
    std::error_code list_ec;
    fs::directory_iterator it(dir, list_ec), end;
    if (list_ec) {
      if (list_ec != std::errc::no_such_file_or_directory) complete = false;
      return;
    }
    for (; !list_ec && it != end; it.increment(list_ec)) {
      const std::string file = it->path().filename().string();
      if (file.empty() || file[0] == '.') continue;  // an eviction or build under way, or aside
      if (!nested) {
        if (it->path().extension() == ".qcow2") disks.push_back(it->path());
        continue;
      }
      std::error_code inner_ec;
      fs::directory_iterator inner(it->path(), inner_ec);
      for (; !inner_ec && inner != end; inner.increment(inner_ec)) {
        if (inner->path().extension() == ".qcow2") disks.push_back(inner->path());
      }
      if (inner_ec && inner_ec != std::errc::not_a_directory) complete = false;
    }
    if (list_ec) complete = false;
  };
  listDisks(fs::path(data_dir) / "templates", true);
  listDisks(fs::path(data_dir) / "sandboxes", true);
  listDisks(fs::path(data_dir) / "layers", false);
  for (const auto& disk : disks) {
    auto below = qcow2BackingFile(disk.string());
    if (!below.ok()) {
      // Gone meanwhile, or raw: nothing below it. Anything else leaves what it stands on unknown.
      if (below.error().code != ErrorCode::kNotFound && below.error().code != ErrorCode::kInvalidArgument) {
        complete = false;
      }
      continue;
    }
    if (below->empty() || seen.count(*below) || below->rfind(data_dir + "/", 0) == 0) continue;
    if (!isCachedImageLike(*below, current)) {
      spdlog::warn("images: {} stands on {}, which is not an image of the cache; not admitted", disk.string(), *below);
      continue;
    }
    seen.insert(*below);
    out.images.push_back(*below);
    spdlog::info("images: saved sandboxes stand on {} (kept while spaced runs, pinned while it is stopped)", *below);
  }
  const std::string name = imagePinName(data_dir);
  std::set<fs::path> entries, caches;
  for (const auto& image : out.images) {
    const fs::path entry = fs::path(image).parent_path();
    if (!fs::is_regular_file(entry / "manifest.json", ec)) continue;  // not in the cache (a test's own file)
    UniqueFd held = holdImageCacheEntry(image);
    if (!held.valid()) {
      spdlog::error("images: {} is gone from the cache (pruned as spaced started?): what stands on it cannot start",
                    image);
      continue;
    }
    out.held.push_back(std::move(held));
    pin(entry, name, data_dir);
    entries.insert(entry);
    caches.insert(entry.parent_path());
  }
  // This data dir's pins on entries it stands on no more (their templates were evicted); kept
  // when a disk could not be read, which might have stood on one.
  if (!complete) {
    spdlog::warn("images: some disks of {} could not be read; its pins on older images are kept", data_dir);
    return out;
  }
  fs::directory_iterator end;
  for (const auto& cache : caches) {
    fs::directory_iterator entry_it(cache, ec);
    for (; !ec && entry_it != end; entry_it.increment(ec)) {
      if (entries.count(entry_it->path())) continue;
      std::error_code remove_ec;
      if (fs::remove(entry_it->path() / "pins" / name, remove_ec)) {
        spdlog::info("images: {} is no longer pinned for {}", entry_it->path().string(), data_dir);
      }
    }
  }
  return out;
}

}  // namespace space::vmm
