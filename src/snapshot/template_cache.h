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
#include <set>
#include <string>
#include <vector>

#include "common/result.h"
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
  // A build beyond max_sizes (see claimBuild) is refused, unless `always`.
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

 private:
  Result<TemplateSnapshot> build(const TemplateKey& key, const std::string& final_dir,
                                 std::chrono::milliseconds boot_timeout, const vmm::NodeFacts* node);
  // The sizes ("<vcpus>x<MiB>") and directory names of the published snapshots of `name`.
  std::vector<std::pair<std::string, std::string>> builtSizes(const std::string& name);
  static constexpr size_t kMaxRememberedKeys = 4096;
  std::string root_;
  size_t max_sizes_ = 0;
  std::set<std::string> allowed_sizes_;
  std::mutex mu_;  // guards locks_ and dir_names_
  std::map<std::string, std::shared_ptr<std::mutex>> locks_;
  std::map<std::string, std::string> dir_names_;  // memo of dirName, by the key's fields
  std::set<std::string> building_;                // directory names being built now
  NetnsSource netns_source_;
};

}  // namespace space::snapshot
