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
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

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
};

struct TemplateSnapshot {
  std::string dir;
  std::string memory_file;  // restore with memory_private: clones map it copy-on-write
  std::string disk;         // qcow2; clones get an overlay over it
  std::string state_file;
  nlohmann::json meta;
};

class TemplateCache {
 public:
  explicit TemplateCache(std::string root) : root_(std::move(root)) {}
  // The snapshot for `key`, built first if missing (a cold boot: seconds). Concurrent callers
  // for one key wait for one build. `node`: the node's facts, so the build probes nothing.
  Result<TemplateSnapshot> ensure(const TemplateKey& key, std::chrono::milliseconds boot_timeout,
                                  const vmm::NodeFacts* node = nullptr);
  // The directory name a key maps to: computed from the files' identities (stat, a PATH walk for
  // QEMU, SHA-256) on the first call for that key and remembered after, so a create never pays for
  // it again. Images replaced in place while spaced runs are therefore seen at its next start;
  // the image cache never does that (a new recipe is a new path).
  Result<std::string> dirName(const TemplateKey& key);

 private:
  Result<TemplateSnapshot> build(const TemplateKey& key, const std::string& final_dir,
                                 std::chrono::milliseconds boot_timeout, const vmm::NodeFacts* node);
  std::string root_;
  std::mutex mu_;  // guards locks_ and dir_names_
  std::map<std::string, std::shared_ptr<std::mutex>> locks_;
  std::map<std::string, std::string> dir_names_;  // memo of dirName, by the key's fields
};

}  // namespace space::snapshot
