// Template snapshots: a base VM booted once, agent ready, and saved (device state + its shared
// memory file + its disk), so sandboxes are restored from it in milliseconds instead of booted.
// One snapshot per (template, vCPUs, memory, accelerator, CPU model, QEMU binary, images):
// the key is a hash of all of them, so a changed recipe or host gets a new snapshot and one
// taken under another accelerator is never restored. Built on first use, in a temporary
// directory published by rename (a crash leaves no half snapshot), kept under
// <data-dir>/templates/.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"  // Clock
#include "vmm/node_facts.h"
#include "vmm/vm_spec.h"

namespace space::snapshot {

inline constexpr int kSnapshotFormatVersion = 1;

struct TemplateKey {
  std::string name;
  std::string kernel_path;  // canonical paths: the image cache names them by recipe hash
  std::string rootfs_path;
  uint32_t vcpus = 0;
  uint64_t memory_mib = 0;
  vmm::Accelerator accelerator = vmm::Accelerator::kTcg;  // resolved
  std::string qemu_binary = "qemu-system-x86_64";
  // Kernel arguments the template is booted with (the node's, e.g. tsc_early_khz under TCG):
  // its clones inherit what the booted kernel made of them.
  std::string kernel_args;
  // Booted with a NIC in a slot (net/slot.h): its clones must be restored into one too.
  bool nic = false;
};

// A network namespace lent for one VM (a template boot, a snapshot's helper): its path, and
// what gives it back once the lease is dropped.
struct NetnsLease {
  std::string path;
  std::shared_ptr<void> release;
};
using NetnsSource = std::function<Result<NetnsLease>()>;

struct TemplateSnapshot {
  std::string dir;
  std::string memory_file;  // restore with memory_private: clones map it copy-on-write
  std::string disk;         // qcow2; clones get an overlay over it
  std::string state_file;
  nlohmann::json meta;
  // Keeps evictUnused away from this directory until dropped: hold it until the VM's overlay
  // stands on `disk` (from then on the overlay's backing name keeps the snapshot).
  std::shared_ptr<void> in_use;
};

// What evictUnused keeps besides what disks stand on.
struct EvictionRules {
  // The key a create of (template, vCPUs, MiB) would use now; nullopt if the template is gone.
  // A snapshot whose directory is not that key's (an image, QEMU, kernel arguments or the
  // accelerator changed) can never be restored again.
  std::function<std::optional<TemplateKey>(const std::string& name, uint32_t vcpus, uint64_t memory_mib)> current_key;
  std::set<std::string> pinned_sizes;  // "<vcpus>x<MiB>" never evicted for idleness: the default size
  // A first-come size (no --template-sizes) not ensured for this long goes; 0: never.
  std::chrono::seconds idle{0};
};

class TemplateCache {
 public:
  // `max_sizes`: how many snapshots (sizes, in practice) one template may have; a build beyond
  // it is refused, so a loop of creates over sizes cannot fill the disk with permanent
  // templates (the caller boots such sizes instead). 0: no limit.
  // `allowed_sizes` ("<vcpus>x<MiB>"; empty: any): the only sizes a snapshot is built for, so
  // that tenants cannot take the max_sizes places with sizes nobody else uses.
  explicit TemplateCache(std::string root, size_t max_sizes = 0, std::set<std::string> allowed_sizes = {})
      : root_(std::move(root)), max_sizes_(max_sizes), allowed_sizes_(std::move(allowed_sizes)) {}
  // The snapshot for `key`, built first if missing (a cold boot: seconds). Concurrent callers
  // for one key wait for one build. `node`: the node's facts, so the build probes nothing.
  // A build beyond max_sizes (see claimBuild) is refused, unless `always`. A published directory
  // whose meta.json is damaged is neither used nor rebuilt in place, since disks made over its
  // disk would then stand on other bytes: refused (reason template_damaged) until evictUnused has
  // removed it once nothing stands on it; the next ensure() builds it again.
  Result<TemplateSnapshot> ensure(const TemplateKey& key, std::chrono::milliseconds boot_timeout,
                                  const vmm::NodeFacts* node = nullptr, bool always = false);
  // The directory name a key maps to: computed from the files' identities (stat, a PATH walk for
  // QEMU, SHA-256) on the first call for that key and remembered after, so a create never pays for
  // it again. Images replaced in place while spaced runs are therefore seen at its next start;
  // the image cache never does that (a new recipe is a new path).
  Result<std::string> dirName(const TemplateKey& key);
  // A place to build the snapshot for `key`, held until the returned guard is gone: refused
  // (kResourceExhausted, template_sizes_full) when the template's built snapshots and those
  // being built reach max_sizes, or the key's size is not among allowed_sizes, unless `always`. Public for its tests;
  // ensure() takes one.
  Result<std::shared_ptr<void>> claimBuild(const TemplateKey& key, bool always = false);
  // Where builds of keys with a NIC get their slot; set once, before the first ensure().
  void setNetnsSource(NetnsSource source) { netns_source_ = std::move(source); }

  // Eviction. Templates take hundreds of MB each, and every new image, QEMU upgrade or size
  // leaves one behind. One goes when no disk stands on it any more and it is stale (never
  // restorable again), of a size the operator does not keep, or, for first-come sizes, unused
  // for rules.idle. The caller takes evictionMark() first, then lists what stands on templates
  // (reachableLayers from every disk), then calls evictUnused with both, one round at a time. A
  // directory is kept if a create is using it (between ensure() and its overlay on disk) or
  // finished using it after the mark: such a create's overlay may be missing from the listing. Uses are counted per
  // directory, so creates never wait for an eviction and creates of other templates, however
  // many, never hold one off.
  uint64_t evictionMark();
  // `reachable`: files some disk stands on. Returns the directory names removed (each renamed to
  // .evict-<name> first, so a crash never leaves a half snapshot that looks published; leftovers
  // of that go too).
  std::vector<std::string> evictUnused(const std::set<std::string>& reachable, const EvictionRules& rules,
                                       Clock::time_point now, uint64_t mark);

 private:
  Result<TemplateSnapshot> build(const TemplateKey& key, const std::string& final_dir,
                                 std::chrono::milliseconds boot_timeout, const vmm::NodeFacts* node);
  // The sizes ("<vcpus>x<MiB>") and directory names of the published snapshots of `name`.
  std::vector<std::pair<std::string, std::string>> builtSizes(const std::string& name);
  // Why the published `dir` may go once nothing stands on it ("" if it stays).
  std::string evictionReason(const std::string& dir, const EvictionRules& rules, Clock::time_point now);
  // Counts a use of `dir` until the returned handle goes; `made_disk`, set by then if the use
  // returned a snapshot, says whether its end is numbered (see uses_).
  std::shared_ptr<void> beginUse(const std::string& dir, std::shared_ptr<bool> made_disk);
  static constexpr size_t kMaxRememberedKeys = 4096;
  std::string root_;
  size_t max_sizes_ = 0;
  std::set<std::string> allowed_sizes_;
  std::mutex mu_;  // guards everything below
  std::map<std::string, std::shared_ptr<std::mutex>> locks_;
  std::map<std::string, std::string> dir_names_;        // memo of dirName, by the key's fields
  std::set<std::string> building_;                      // directory names being built now
  std::map<std::string, Clock::time_point> last_used_;  // by directory name: last ensure, or first seen
  // Uses (ensure() until its TemplateSnapshot's in_use goes) by directory name: how many now,
  // and the number (from uses_ended_) of the last that returned a snapshot, given when it ended,
  // compared with an eviction's mark. Entries are dropped once idle and older than a round's
  // mark; rounds do not overlap (the caller runs one at a time), so no older mark needs them.
  struct Use {
    uint32_t now = 0;
    uint64_t last_ended = 0;
  };
  std::map<std::string, Use> uses_;
  uint64_t uses_ended_ = 0;
  NetnsSource netns_source_;
};

}  // namespace space::snapshot
