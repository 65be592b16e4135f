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
  fs::directory_iterator it(fs::path(data_dir) / "templates", ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    auto below = qcow2BackingFile((it->path() / "disk.qcow2").string());
    if (!below.ok() || below->empty() || seen.count(*below)) continue;
    if (!isCachedImageLike(*below, current)) {
      spdlog::warn("images: template {} stands on {}, which is not an image of the cache; not admitted",
                   it->path().filename().string(), *below);
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
    if (UniqueFd held = holdImageCacheEntry(image); held.valid()) out.held.push_back(std::move(held));
    pin(entry, name, data_dir);
    entries.insert(entry);
    caches.insert(entry.parent_path());
  }
  // This data dir's pins on entries it stands on no more (their templates were evicted).
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
