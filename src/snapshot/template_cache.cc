#include "snapshot/template_cache.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/bounded_json.h"
#include "common/digest.h"
#include "common/fs.h"
#include "vmm/vm.h"

namespace space::snapshot {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Size and modification time: a file replaced in place (a user's own image) changes the key.
Result<json> fileIdentity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    // Only a file that is not there is "gone": EMFILE or EIO must not read as a changed image.
    const bool gone = errno == ENOENT || errno == ENOTDIR;
    return makeError(gone ? ErrorCode::kNotFound : ErrorCode::kInternal,
                     "cannot stat " + path + ": " + std::strerror(errno));
  }
  return json{
      {"path", path}, {"size", st.st_size}, {"mtime_ns", st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec}};
}

Result<json> keyJson(const TemplateKey& key) {
  auto kernel = fileIdentity(key.kernel_path);
  if (!kernel.ok()) return kernel.error();
  auto rootfs = fileIdentity(key.rootfs_path);
  if (!rootfs.ok()) return rootfs.error();
  auto qemu_path = vmm::findExecutable(key.qemu_binary);
  if (!qemu_path.ok()) return qemu_path.error();
  auto qemu = fileIdentity(qemu_path.value());
  if (!qemu.ok()) return qemu.error();
  json k{{"format_version", kSnapshotFormatVersion},
         {"template", key.name},
         {"kernel", kernel.value()},
         {"rootfs", rootfs.value()},
         {"qemu", qemu.value()},
         {"vcpus", key.vcpus},
         {"memory_mib", key.memory_mib},
         {"accelerator", vmm::acceleratorName(key.accelerator)},
         // The CPU model the guest saw: what buildQemuArgv gives each accelerator.
         {"cpu_model", key.accelerator == vmm::Accelerator::kKvm ? "host" : "max"},
         {"kernel_args", key.kernel_args}};
  // Only when set, so the names of templates without a NIC stay what they were.
  if (key.nic) k["nic"] = true;
  return k;
}

// A field of a meta.json read without throwing (0 if absent or not a count): a damaged file
// must not take a create or housekeeping down.
uint64_t countField(const json& meta, const char* field) {
  auto it = meta.find(field);
  return it != meta.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

TemplateSnapshot snapshotIn(const std::string& dir, json meta) {
  return TemplateSnapshot{dir, dir + "/memory", dir + "/disk.qcow2", dir + "/state", std::move(meta)};
}

}  // namespace

Result<std::string> TemplateCache::dirName(const TemplateKey& key) {
  const std::string fields = json{key.name,        key.kernel_path, key.rootfs_path,
                                  key.vcpus,       key.memory_mib,  vmm::acceleratorName(key.accelerator),
                                  key.qemu_binary, key.kernel_args, key.nic}
                                 .dump(-1, ' ', false, json::error_handler_t::replace);
  {
    std::lock_guard guard(mu_);
    if (auto it = dir_names_.find(fields); it != dir_names_.end()) return it->second;
  }
  auto k = keyJson(key);
  if (!k.ok()) return k.error();  // not remembered: a missing image may appear later
  std::string name = key.name + "-" + sha256Hex(k->dump()).substr(0, 16);
  std::lock_guard guard(mu_);
  // Keys come from requests (sizes): the memo is bounded, and starts again when full.
  if (dir_names_.size() >= kMaxRememberedKeys) dir_names_.clear();
  dir_names_.emplace(fields, name);
  return name;
}

Result<TemplateSnapshot> TemplateCache::ensure(const TemplateKey& key, std::chrono::milliseconds boot_timeout,
                                               const vmm::NodeFacts* node, bool always) {
  auto name = dirName(key);
  if (!name.ok()) return name.error();
  auto made_disk = std::make_shared<bool>(false);
  auto use = beginUse(name.value(), made_disk);  // before the look: an eviction cannot remove what this finds
  const std::string dir = root_ + "/" + name.value();
  auto used = [&](Result<TemplateSnapshot> snap) {
    if (!snap.ok()) return snap;
    snap->in_use = use;
    std::lock_guard guard(mu_);
    last_used_[name.value()] = Clock::now();
    *made_disk = true;  // only a use that returns a snapshot makes a disk over it (see evictUnused)
    return snap;
  };
  std::shared_ptr<std::mutex> lock;
  {
    std::lock_guard guard(mu_);
    auto& slot = locks_[name.value()];
    if (!slot) slot = std::make_shared<std::mutex>();
    lock = slot;
  }
  std::lock_guard build_lock(*lock);
  // Published snapshots are complete (rename is the last step), so existing means usable.
  auto meta = readSmallFile(dir + "/meta.json", 1 << 20);
  if (meta.ok()) {
    auto bounded = parseJsonBounded(meta.value());
    json parsed = bounded.ok() ? std::move(bounded.value()) : json();
    if (parsed.is_object() && countField(parsed, "format_version") == static_cast<uint64_t>(kSnapshotFormatVersion)) {
      return used(snapshotIn(dir, std::move(parsed)));
    }
  } else if (meta.error().code != ErrorCode::kNotFound) {
    return makeError(ErrorCode::kUnavailable, "template " + key.name + ": " + meta.error().message);  // EMFILE, EIO
  }
  std::error_code ec;
  if (meta.ok() || fs::exists(dir, ec) || ec) {
    // Not replaced in place: overlays and snapshot layers name this disk by its path, and a
    // rebuild there would put other bytes under them. The format version is part of the key,
    // so only damage (or a hand) gets here.
    spdlog::warn("templates: {} has a damaged or missing meta.json; not used, removed once nothing stands on it", dir);
    return makeError(ErrorCode::kUnavailable, "template " + key.name + " is damaged on this node (" + dir + ")",
                     "template_damaged");
  }
  auto place = claimBuild(key, always);
  if (!place.ok()) return place.error();
  return used(build(key, dir, boot_timeout, node));
}

std::shared_ptr<void> TemplateCache::beginUse(const std::string& dir, std::shared_ptr<bool> made_disk) {
  std::lock_guard guard(mu_);
  ++uses_[dir].now;
  return std::shared_ptr<void>(nullptr, [this, dir, made_disk = std::move(made_disk)](void*) {
    std::lock_guard guard(mu_);
    auto it = uses_.find(dir);
    if (it == uses_.end()) return;
    if (it->second.now > 0) --it->second.now;
    // Numbered when it ends: a round whose mark is older may have listed before its disk was
    // made, so it keeps the directory (see evictUnused).
    if (*made_disk) it->second.last_ended = ++uses_ended_;
  });
}

uint64_t TemplateCache::evictionMark() {
  std::lock_guard guard(mu_);
  return uses_ended_;
}

std::string TemplateCache::evictionReason(const std::string& dir, const EvictionRules& rules, Clock::time_point now) {
  auto text = readSmallFile(root_ + "/" + dir + "/meta.json", 1 << 20);
  if (!text.ok() && text.error().code != ErrorCode::kNotFound) {
    spdlog::warn("templates: {} kept this round: {}", dir, text.error().message);
    return "";  // EMFILE, EIO: unknown, not damaged
  }
  if (!text.ok()) return "no meta.json";
  auto bounded = parseJsonBounded(text.value());
  if (!bounded.ok() || !bounded->is_object()) return "damaged meta.json";
  const json& meta = bounded.value();
  auto it = meta.find("template");
  const std::string name = it != meta.end() && it->is_string() ? it->get<std::string>() : "";
  const uint64_t vcpus = countField(meta, "vcpus");
  const uint64_t memory_mib = countField(meta, "memory_mib");
  if (vcpus == 0 || vcpus > UINT32_MAX || memory_mib == 0) return "damaged meta.json";
  const std::string size = std::to_string(vcpus) + "x" + std::to_string(memory_mib);
  auto key = rules.current_key ? rules.current_key(name, static_cast<uint32_t>(vcpus), memory_mib) : std::nullopt;
  if (!key) return "template \"" + name + "\" is no longer configured";
  auto current = dirName(*key);
  if (!current.ok() && current.error().code != ErrorCode::kNotFound) {
    spdlog::warn("templates: {} kept this round: {}", dir, current.error().message);
    return "";  // unknown, not gone: a transient error must not cost a rebuild
  }
  if (!current.ok()) return "its recipe's files are gone (" + current.error().message + ")";
  if (current.value() != dir) return "stale: a create of " + size + " now uses " + current.value();
  if (rules.pinned_sizes.count(size)) return "";
  if (!allowed_sizes_.empty())
    return allowed_sizes_.count(size) ? "" : "size " + size + " is not among --template-sizes";
  if (rules.idle.count() == 0) return "";
  std::lock_guard guard(mu_);
  auto [seen, first] = last_used_.emplace(dir, now);  // first seen now: a restart does not age it
  if (now - seen->second < rules.idle) return "";
  return "size " + size + " not used for " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - seen->second).count()) + " s";
}

std::vector<std::string> TemplateCache::evictUnused(const std::set<std::string>& reachable, const EvictionRules& rules,
                                                    Clock::time_point now, uint64_t mark) {
  // By identity, not by name: a backing name spelled another way must still keep its file.
  std::set<std::pair<dev_t, ino_t>> stood_on;
  for (const auto& file : reachable) {
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) stood_on.emplace(st.st_dev, st.st_ino);
  }
  // Used now, or a use that made a disk ended after the mark: the listing, which began after the
  // mark, may have missed that disk. (A use that ended before the mark had its disk made before
  // the listing began.)
  auto inUse = [&](const std::string& dir) {
    auto it = uses_.find(dir);
    return it != uses_.end() && (it->second.now > 0 || it->second.last_ended > mark);
  };
  std::vector<std::pair<std::string, std::string>> doomed;  // directory, why
  std::error_code ec;
  // increment(ec): a listing cut short evicts less, and never throws on a housekeeping thread.
  fs::directory_iterator it(root_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string dir = entry.path().filename().string();
    if (dir.rfind(".build-", 0) == 0) continue;  // a build under way, or recovery's to remove
    if (dir.rfind(".evict-", 0) == 0) {
      doomed.emplace_back(dir, "");  // an eviction cut short
      continue;
    }
    {
      std::lock_guard guard(mu_);
      if (inUse(dir)) continue;
    }
    struct stat disk {};
    if (::stat((entry.path() / "disk.qcow2").c_str(), &disk) == 0 && stood_on.count({disk.st_dev, disk.st_ino})) {
      continue;
    }
    // (.broken-: moved aside by daemons before this one, which rebuilt in place.)
    std::string why =
        dir.find(".broken-") != std::string::npos ? "moved aside as broken" : evictionReason(dir, rules, now);
    if (!why.empty()) doomed.emplace_back(dir, std::move(why));
  }
  std::vector<std::string> removed;
  std::vector<std::string> to_remove;
  for (const auto& [dir, why] : doomed) {
    if (why.empty()) {
      to_remove.push_back(root_ + "/" + dir);
      continue;
    }
    const std::string aside = root_ + "/.evict-" + dir;
    {
      // Checked again and renamed under one lock: a create that finds the directory after this
      // has begun its use before the rename, and one that begins after finds nothing there.
      std::lock_guard guard(mu_);
      if (inUse(dir)) continue;
      fs::rename(root_ + "/" + dir, aside, ec);
      if (ec) {
        spdlog::warn("templates: cannot evict {}/{}: {}", root_, dir, ec.message());
        continue;
      }
      last_used_.erase(dir);
      locks_.erase(dir);
    }
    spdlog::info("templates: evicting {} ({}; nothing stands on it)", dir, why);
    removed.push_back(dir);
    to_remove.push_back(aside);
  }
  if (!removed.empty()) (void)fsyncPath(root_);
  {
    // Idle uses older than this mark can no longer keep anything: a later mark is newer still.
    std::lock_guard guard(mu_);
    std::erase_if(uses_, [&](const auto& use) { return use.second.now == 0 && use.second.last_ended <= mark; });
    // Build locks of directories nobody uses (sizes that were refused, too): made again on need.
    std::erase_if(locks_, [&](const auto& lock) { return !uses_.count(lock.first) && lock.second.use_count() == 1; });
  }
  // Renamed: no create can find these any more, and none waits for their removal.
  for (const auto& gone : to_remove) {
    fs::remove_all(gone, ec);
    if (ec) spdlog::warn("templates: cannot remove {}: {}", gone, ec.message());
  }
  return removed;
}

Result<std::shared_ptr<void>> TemplateCache::claimBuild(const TemplateKey& key, bool always) {
  auto name = dirName(key);
  if (!name.ok()) return name.error();
  const std::string size = std::to_string(key.vcpus) + "x" + std::to_string(key.memory_mib);
  if (!always && !allowed_sizes_.empty() && !allowed_sizes_.count(size)) {
    return makeError(ErrorCode::kResourceExhausted,
                     "template " + key.name + " is not kept for size " + size + " (not among --template-sizes)",
                     "template_sizes_full");
  }
  std::lock_guard guard(mu_);
  if (max_sizes_ > 0 && !always) {
    // Built ones and ones being built, under one lock: concurrent creates of new sizes cannot
    // all pass, and a build that fails or is never made gives its place back.
    size_t taken = building_.size();
    for (const auto& size : builtSizes(key.name)) taken += size.second != name.value();
    if (taken >= max_sizes_) {
      return makeError(ErrorCode::kResourceExhausted,
                       "template " + key.name + " is kept for " + std::to_string(taken) +
                           " sizes already, this node's most (--max-template-sizes)",
                       "template_sizes_full");
    }
  }
  building_.insert(name.value());
  return std::shared_ptr<void>(nullptr, [this, n = name.value()](void*) {
    std::lock_guard guard(mu_);
    building_.erase(n);
  });
}

std::vector<std::pair<std::string, std::string>> TemplateCache::builtSizes(const std::string& name) {
  std::vector<std::pair<std::string, std::string>> sizes;
  std::error_code ec;
  fs::directory_iterator it(root_, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string dir = entry.path().filename().string();
    // <name>-<16 hex digits>: published ones only (not .build-, not .broken-).
    if (dir.size() != name.size() + 17 || dir.rfind(name + "-", 0) != 0) continue;
    auto meta = readSmallFile(entry.path().string() + "/meta.json", 1 << 20);
    if (!meta.ok()) continue;
    auto parsed = parseJsonBounded(meta.value());
    if (!parsed.ok() || !parsed->is_object()) continue;
    sizes.emplace_back(
        std::to_string(countField(*parsed, "vcpus")) + "x" + std::to_string(countField(*parsed, "memory_mib")), dir);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

Result<TemplateSnapshot> TemplateCache::build(const TemplateKey& key, const std::string& final_dir,
                                              std::chrono::milliseconds boot_timeout, const vmm::NodeFacts* node) {
  auto started = Clock::now();
  auto meta = keyJson(key);
  if (!meta.ok()) return meta.error();
  auto tmp = TempDir::create(root_, ".build-");
  if (!tmp.ok()) return tmp.error();
  const std::string dir = tmp->path();

  vmm::VmSpec spec;
  spec.kernel_path = key.kernel_path;
  spec.rootfs_path = key.rootfs_path;
  spec.vcpus = key.vcpus;
  spec.memory_mib = key.memory_mib;
  spec.accelerator = key.accelerator;
  spec.boot_timeout = boot_timeout;
  spec.qemu_binary = key.qemu_binary;
  spec.extra_cmdline = key.kernel_args;
  spec.memory_file = dir + "/memory";  // shared: the guest's RAM lands in the snapshot directly
  if (node) spec.tcg_tb_size_mib = node->tcg_tb_size_mib;
  // No disk I/O limit (spec.disk_io): a template's guest runs the operator's image and SPACE's
  // own start-up, no tenant's code, and its boot reads the image at the disk's speed.
  vmm::VmStartOptions options;
  options.run_dir = dir + "/vm";
  options.node = node;
  NetnsLease netns;
  if (key.nic) {
    if (!netns_source_) return makeError(ErrorCode::kInternal, "template " + key.name + ": no slot for its NIC");
    auto lease = netns_source_();
    if (!lease.ok()) return makeError(lease.error().code, "template " + key.name + ": " + lease.error().message);
    netns = std::move(lease.value());
    spec.netns_path = netns.path;
  }
  {
    auto vm = vmm::Vm::start(spec, options);
    if (!vm.ok()) return makeError(vm.error().code, "template " + key.name + ": boot failed: " + vm.error().message);
    SPACE_TRY((*vm)->saveState(dir + "/state", std::chrono::seconds(60)));
    (*vm)->quit();
    std::error_code ec;
    fs::rename(options.run_dir + "/disk.qcow2", dir + "/disk.qcow2", ec);
    if (ec) return makeError(ErrorCode::kInternal, "keep the template's disk: " + ec.message());
  }  // the VM's run directory goes with it
  for (const char* file : {"/memory", "/disk.qcow2", "/state"}) SPACE_TRY(fsyncPath(dir + file));
  (*meta)["created_at_ms"] =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  SPACE_TRY(writeFileAtomic(dir + "/meta.json", meta->dump(2) + "\n", 0600));
  std::error_code ec;
  fs::rename(dir, final_dir, ec);
  if (ec) return makeError(ErrorCode::kInternal, "publish " + final_dir + ": " + ec.message());
  tmp->release();
  SPACE_TRY(fsyncPath(root_));
  spdlog::info("templates: built {} in {} ms", final_dir,
               std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count());
  return snapshotIn(final_dir, std::move(meta.value()));
}

}  // namespace space::snapshot
