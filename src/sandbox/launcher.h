// Launcher: the one place that turns what a sandbox starts from (a template, a tenant's
// snapshot, a suspended sandbox, a warm pool entry, a VM left by an earlier daemon) into a VM
// spec and start options. Every VM of the sandbox layer is started from what it returns, so a
// change to how VMs start (kernel arguments, a network slot, a jail) is made here once.
//
// It resolves nothing on the request path: the node's facts (accelerator, CPUs, QEMU binary,
// TSC) come resolved, and template keys are remembered by the template cache.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "sandbox/runtime.h"
#include "snapshot/sandbox_snapshot.h"
#include "snapshot/template_cache.h"
#include "store/state_store.h"
#include "vmm/node_facts.h"

namespace space::sandbox {

// What a sandbox boots from: a kernel and a root filesystem image (restored from the template
// snapshot made of them on first use).
struct Template {
  std::string name;
  std::string kernel_path;
  std::string rootfs_path;
};

class Launcher {
 public:
  struct Config {
    std::map<std::string, Template> templates;
    std::chrono::milliseconds boot_timeout{60000};
    bool use_snapshots = true;  // off: every new sandbox is a cold boot
    // Networking (null: VMs have no NIC). Every VM then has one, in a slot of this pool, and
    // templates are built with it.
    std::shared_ptr<net::NetworkPool> network;
    std::string network_root;  // <data-dir>/network: a directory per sandbox
    net::Policy default_policy;
  };
  Launcher(Config config, vmm::NodeFacts facts, snapshot::TemplateCache& templates)
      : config_(std::move(config)), facts_(std::move(facts)), templates_(templates) {}

  const vmm::NodeFacts& facts() const { return facts_; }
  // The accelerator new VMs of this node run under (never kAuto).
  vmm::Accelerator accelerator() const { return facts_.accelerator.accelerator; }
  // The accelerator a sandbox's VM ran under, as its record names it (a resumed or adopted VM
  // runs under it again); the node's for a record that names none (a new sandbox's).
  vmm::Accelerator recordedAccelerator(const store::SandboxRecord& rec) const;
  // kNotFound (template_not_found) for an unknown name.
  Result<const Template*> findTemplate(const std::string& name) const;

  // Whether the host could start such a VM now (CPUs, free memory, readable images): checked
  // before anything is recorded, so a request it can never satisfy leaves no trace.
  Status checkFits(const Template& tpl, uint32_t cpus, uint64_t memory_mb) const;
  // A new sandbox of `tpl` in `run_dir`: a restore of the template's snapshot (built first if
  // missing: a cold boot, seconds), or a cold boot when snapshots are off or the template is
  // kept for its most sizes already (--max-template-sizes; `default_size` is always kept).
  Result<Launch> fromTemplate(const Template& tpl, uint32_t cpus, uint64_t memory_mb, const std::string& run_dir,
                              bool default_size = true);
  // A new sandbox restored from a tenant snapshot's files (taken under this node's accelerator).
  Launch fromSnapshot(const Template& tpl, const snapshot::SnapshotFiles& files, uint32_t cpus, uint64_t memory_mb,
                      const std::string& run_dir) const;
  // A suspended sandbox, restored stopped into a new QEMU over its own run directory (its disk
  // is the newest disk there), from its saved state.
  Launch fromSuspended(const Template& tpl, const store::SandboxRecord& rec, const std::string& state_file) const;
  // What identifies the VM an earlier daemon recorded for `rec`.
  vmm::VmAdoptSpec adoption(const store::SandboxRecord& rec) const;
  // The network a sandbox's VM gets (nullopt without networking): `policy`, with its files in
  // <network_root>/<sandbox id>, where the id is the run directory's name.
  std::optional<NetworkAttach> networkFor(const std::string& run_dir, std::optional<net::Policy> policy) const;
  // A slot for a VM that never runs user code (a snapshot's helper); an empty lease without
  // networking.
  Result<snapshot::NetnsLease> helperNetns() const;
  bool networked() const { return config_.network != nullptr; }
  const net::Policy& defaultPolicy() const { return config_.default_policy; }
  // How a snapshot's helper VM is started: as the sandbox's own VM was.
  vmm::VmSpec snapshotHelperSpec(const Template& tpl, uint32_t cpus, uint64_t memory_mb,
                                 vmm::Accelerator accelerator) const;
  // The key of the template snapshot a create of this size uses on this node now.
  snapshot::TemplateKey templateKey(const Template& tpl, uint32_t cpus, uint64_t memory_mb) const;

 private:
  vmm::VmSpec baseSpec(const Template& tpl, uint32_t cpus, uint64_t memory_mb, vmm::Accelerator accelerator) const;
  vmm::VmStartOptions baseOptions(const std::string& run_dir) const;

  const Config config_;
  const vmm::NodeFacts facts_;
  snapshot::TemplateCache& templates_;
  // Jailed VMs restore from sealed copies of the templates' memory files: every tenant's
  // sandboxes start from a template, so no QEMU may be able to write one.
  vmm::SealedMemoryCache sealed_memory_;
};

}  // namespace space::sandbox
