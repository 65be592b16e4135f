#include "sandbox/launcher.h"

#include <filesystem>

namespace space::sandbox {

Result<const Template*> Launcher::findTemplate(const std::string& name) const {
  auto it = config_.templates.find(name);
  if (it == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + name + "\" not found", "template_not_found");
  }
  return &it->second;
}

vmm::VmSpec Launcher::baseSpec(const Template& tpl, uint32_t cpus, uint64_t memory_mb,
                               vmm::Accelerator accelerator) const {
  vmm::VmSpec spec;
  spec.kernel_path = tpl.kernel_path;
  spec.rootfs_path = tpl.rootfs_path;
  spec.vcpus = cpus;
  spec.memory_mib = memory_mb;
  spec.accelerator = accelerator;
  spec.boot_timeout = config_.boot_timeout;
  spec.qemu_binary = facts_.qemu_binary;
  spec.extra_cmdline = facts_.guestKernelArgs(accelerator);
  spec.disk_io = vmm::vmDiskIoLimits(spec, facts_);
  spec.tcg_tb_size_mib = facts_.tcg_tb_size_mib;
  return spec;
}

vmm::VmStartOptions Launcher::baseOptions(const std::string& run_dir) const {
  vmm::VmStartOptions options;
  options.run_dir = run_dir;
  options.node = &facts_;
  return options;
}

Status Launcher::checkFits(const Template& tpl, uint32_t cpus, uint64_t memory_mb) const {
  auto available = vmm::availableMemoryMib();
  if (!available.ok()) return available.error();
  auto fits = vmm::validateSpec(baseSpec(tpl, cpus, memory_mb, accelerator()),
                                vmm::HostCapacity{facts_.max_vcpus, available.value()});
  if (!fits.ok() && fits.error().code == ErrorCode::kResourceExhausted) {
    return makeError(fits.error().code, "not enough free memory on this node: " + fits.error().message,
                     "insufficient_capacity");
  }
  return fits;
}

std::optional<NetworkAttach> Launcher::networkFor(const std::string& run_dir, std::optional<net::Policy> policy) const {
  if (!config_.network) return std::nullopt;
  return NetworkAttach{config_.network, config_.network_root + "/" + std::filesystem::path(run_dir).filename().string(),
                       policy};
}

Result<snapshot::NetnsLease> Launcher::helperNetns() const {
  if (!config_.network) return snapshot::NetnsLease{};
  auto slot = config_.network->takeSlot();
  if (!slot.ok()) return slot.error();
  auto pool = config_.network;
  return snapshot::NetnsLease{
      slot->netns_path, std::shared_ptr<void>(nullptr, [pool, s = slot.value()](void*) { pool->releaseSlot(s); })};
}

Result<Launch> Launcher::fromTemplate(const Template& tpl, uint32_t cpus, uint64_t memory_mb,
                                      const std::string& run_dir, bool default_size) {
  Launch launch;
  launch.spec = baseSpec(tpl, cpus, memory_mb, accelerator());
  launch.options = baseOptions(run_dir);
  launch.network = networkFor(run_dir, config_.default_policy);
  if (!config_.use_snapshots) return launch;
  auto snap = templates_.ensure(templateKey(tpl, cpus, memory_mb), config_.boot_timeout, &facts_, default_size);
  if (!snap.ok() && snap.error().reason == "template_sizes_full") {
    // A size beyond those the template is kept for boots, and keeps nothing on disk.
    launch.how = "booted (no template kept for this size)";
    return launch;
  }
  if (!snap.ok() && snap.error().reason == "template_damaged") {
    // Until eviction has removed it (and the next create builds it again), creates boot.
    launch.how = "booted (its template is damaged on this node)";
    return launch;
  }
  if (!snap.ok()) return snap.error();
  launch.spec.rootfs_path = snap->disk;
  launch.spec.rootfs_format = "qcow2";
  launch.spec.memory_file = snap->memory_file;
  launch.spec.memory_private = true;
  if (!facts_.jailer.empty()) {
    auto sealed = sealed_memory_.get(snap->memory_file);
    if (!sealed.ok()) return makeError(sealed.error().code, "the template's memory: " + sealed.error().message);
    launch.options.sealed_memory = sealed.value();
  }
  launch.state_file = snap->state_file;
  launch.template_in_use = snap->in_use;
  launch.how = "restored";
  return launch;
}

snapshot::TemplateKey Launcher::templateKey(const Template& tpl, uint32_t cpus, uint64_t memory_mb) const {
  snapshot::TemplateKey key{tpl.name,  tpl.kernel_path, tpl.rootfs_path,    cpus,
                            memory_mb, accelerator(),   facts_.qemu_binary, facts_.guestKernelArgs(accelerator())};
  key.nic = config_.network != nullptr;
  return key;
}

Launch Launcher::fromSnapshot(const Template& tpl, const snapshot::SnapshotFiles& files, uint32_t cpus,
                              uint64_t memory_mb, const std::string& run_dir) const {
  Launch launch;
  launch.spec = baseSpec(tpl, cpus, memory_mb, accelerator());
  launch.spec.rootfs_path = files.disk;
  launch.spec.rootfs_format = "qcow2";
  launch.spec.memory_file = files.memory_file;
  launch.spec.memory_private = true;
  launch.options = baseOptions(run_dir);
  // A snapshot taken with a NIC keeps its policy.json next to its state; one taken before this
  // node had networking has neither, and restores without a NIC (its saved devices have none).
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(files.state_file).parent_path() / net::kPolicyFile, ec)) {
    launch.network = networkFor(run_dir, config_.default_policy);
  }
  launch.state_file = files.state_file;
  launch.how = "branched";
  return launch;
}

Launch Launcher::fromSuspended(const Template& tpl, const store::SandboxRecord& rec,
                               const std::string& state_file) const {
  Launch launch;
  launch.spec = baseSpec(tpl, rec.cpus, rec.memory_mb, recordedAccelerator(rec));
  launch.spec.rootfs_path = rec.run_dir + "/disk.qcow2";  // named for validation; the Vm opens the newest disk
  launch.options = baseOptions(rec.run_dir);
  launch.options.reuse_run_dir = true;
  // Its own policy, kept in its files; a sandbox suspended before this node had networking has
  // none, and its saved devices no NIC: it resumes without one.
  std::error_code ec;
  if (config_.network && std::filesystem::exists(config_.network_root + "/" + rec.id, ec)) {
    launch.network = networkFor(rec.run_dir, std::nullopt);
  }
  // The guest must not run (and write to its disk) while the saved state could still be
  // loaded again: the owner records the resume, removes the state, and only then continues it.
  launch.options.stay_paused = true;
  launch.state_file = state_file;
  launch.how = "resumed";
  return launch;
}

vmm::Accelerator Launcher::recordedAccelerator(const store::SandboxRecord& rec) const {
  auto recorded = vmm::parseAccelerator(rec.accelerator);
  return recorded.ok() ? recorded.value() : accelerator();
}

vmm::VmAdoptSpec Launcher::adoption(const store::SandboxRecord& rec) const {
  return vmm::VmAdoptSpec{rec.run_dir,
                          static_cast<pid_t>(rec.vm_pid),
                          rec.vm_identity,
                          recordedAccelerator(rec),
                          std::chrono::seconds(10),
                          rec.memory_mb,
                          facts_.cgroups,
                          facts_.vm_users,
                          vmm::vmDiskIoLimits(rec.cpus, facts_)};
}

vmm::VmSpec Launcher::snapshotHelperSpec(const Template& tpl, uint32_t cpus, uint64_t memory_mb,
                                         vmm::Accelerator accelerator) const {
  return baseSpec(tpl, cpus, memory_mb, accelerator);
}

}  // namespace space::sandbox
