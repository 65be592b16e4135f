// SandboxManager, snapshots and branches: taking, listing and deleting snapshots, branching children, and collecting
// disk layers.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include "common/fault.h"
#include "common/process.h"
#include "sandbox/manager_internal.h"
#include "snapshot/layers.h"
#include "snapshot/sandbox_snapshot.h"

namespace space::sandbox {

using std::chrono::milliseconds;
using namespace internal;

// --- snapshots and branching -----------------------------------------------------------------

Result<store::SnapshotRecord> SandboxManager::snapshot(const SnapshotRequest& request) {
  auto live = findLive(request.tenant, request.sandbox_id);
  if (!live.ok()) {
    auto rec = getOwned(request.tenant, request.sandbox_id);
    if (!rec.ok()) return rec.error();
    return makeError(ErrorCode::kFailedPrecondition,
                     "sandbox is " + rec->state + "; only a running or paused sandbox can be snapshotted",
                     "invalid_state");
  }
  auto& sandbox = *live.value();
  std::unique_lock control(sandbox.control);
  auto rec = store_.getSandbox(sandbox.id);
  if (!rec.ok()) return rec.error();
  if (sandbox.finished || !sandbox.runtime ||
      (sandbox.state != SandboxState::kRunning && sandbox.state != SandboxState::kPaused)) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "sandbox is " + rec->state + "; only a running or paused sandbox can be snapshotted",
                     "invalid_state");
  }
  auto tpl = launcher_->findTemplate(rec->template_name);
  if (!tpl.ok()) return tpl.error();
  // Its disk one layer deeper must still start (its own next start, and its children's).
  auto depth = sandbox.vm().diskChainLength(&launcher_->facts());
  if (!depth.ok()) {
    return makeError(ErrorCode::kUnavailable,
                     "cannot snapshot sandbox " + sandbox.id + ": its disk's layers: " + depth.error().message);
  }
  if (depth.value() + 1 > config_.max_disk_layers) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "sandbox " + sandbox.id + "'s disk stands on " + std::to_string(depth.value() - 1) +
                         " layers; a snapshot would make it deeper than this node's --max-disk-layers (" +
                         std::to_string(config_.max_disk_layers) + "). Its existing snapshots still restore.",
                     "disk_layers");
  }
  // The tenant's snapshot quota, counting the ones being taken now (each holds a place until
  // it is recorded or has failed). A snapshot's size is known only once taken: the bytes quota
  // refuses new ones once reached (those being taken count at their guest's memory), so the
  // last may go over it by what it holds beyond that.
  // Estimated at its memory and its disk as it is now (the layer it freezes holds what the guest
  // wrote since the last one), so that several taken at once cannot all pass under the quota.
  struct stat overlay {};
  const uint64_t disk_bytes =
      ::stat(sandbox.vm().paths().disk.c_str(), &overlay) == 0 ? static_cast<uint64_t>(overlay.st_blocks) * 512 : 0;
  auto pending = claimSnapshotPlace(request.tenant, (rec->memory_mb << 20) + disk_bytes);
  if (!pending.ok()) return pending.error();
  // The helper QEMU of step 2 maps a memory file of the guest's size and fills it: room for it
  // is reserved before anything is frozen, so a refusal changes nothing.
  // The helper runs under its sandbox's accelerator, with the node's translation buffer.
  const uint64_t helper_qemu_mb = vmm::qemuShareMib(sandbox.vm().accelerator(), launcher_->facts().tcg_tb_size_mib);
  auto helper_room = reserveSnapshotHelper(request.tenant, sandbox.id, rec->memory_mb, helper_qemu_mb);
  if (!helper_room.ok()) return helper_room.error();
  store::SnapshotRecord snap;
  snap.id = newSnapshotId();
  snap.tenant = request.tenant;
  snap.name = request.name;
  snap.sandbox_id = sandbox.id;
  snap.template_name = rec->template_name;
  snap.cpus = rec->cpus;
  snap.memory_mb = rec->memory_mb;
  snap.accelerator = vmm::acceleratorName(sandbox.vm().accelerator());
  snap.dir = snapshotDir(snap.id);
  snap.metadata = request.metadata;

  snapshot::TakeSnapshotRequest take;
  take.id = snap.id;
  take.snapshots_dir = config_.data_dir + "/snapshots";
  take.layers_dir = config_.data_dir + "/layers";
  take.vm_spec = launcher_->snapshotHelperSpec(*tpl.value(), rec->cpus, rec->memory_mb, sandbox.vm().accelerator());
  // The helper restores the guest's devices, its NIC included: it needs a slot of its own
  // (never the sandbox's), held until the snapshot is taken.
  Result<snapshot::NetnsLease> helper_netns = snapshot::NetnsLease{};
  if (sandbox.runtime->network() != nullptr) helper_netns = launcher_->helperNetns();
  if (!helper_netns.ok()) return helper_netns.error();
  take.vm_spec.netns_path = helper_netns->path;
  take.node = &launcher_->facts();
  take.timeout = std::chrono::minutes(5);
  // Step 1 holds the sandbox (it is stopped) and, shared, the layers lock: the new layer is
  // named by no disk until the sandbox's new overlay names it, so no sweep may run meanwhile.
  // (Nothing else waits for it: deleting snapshots does not take it, and sweeps only try.)
  std::shared_lock layers(layers_mu_);
  auto capture = snapshot::captureSnapshot(sandbox.vm(), sandbox.state == SandboxState::kRunning, take);
  layers.unlock();
  if (!capture.ok()) {
    layers_dirty_ = true;
    const bool usable = sandbox.vm().processRunning() &&
                        (sandbox.state == SandboxState::kRunning ? sandbox.runtime->resume().ok()
                                                                 : sandbox.vm().reactivateStopped().ok());
    if (!usable) {
      (void)finish(
          live.value(), SandboxState::kFailed,
          "its VM stopped or could not be continued while being snapshotted: " + firstLine(capture.error().message));
      return makeError(ErrorCode::kUnavailable, "sandbox " + sandbox.id + " failed while being snapshotted",
                       "sandbox_failed");
    }
    return makeError(capture.error().code, "cannot snapshot sandbox " + sandbox.id + ": " +
                                               firstLine(capture.error().message) + " (the sandbox is unchanged)");
  }
  faultPoint("snapshot.captured");
  // Step 2 needs neither: the sandbox serves calls again while the helper works. (Its layer is
  // kept by the build directory's name, see collectLayers, even if the sandbox goes meanwhile.)
  // Its children inherit its policy (a branch may be given a stricter one).
  // Its policy.json also says the saved guest has a NIC: only such a snapshot restores into a
  // VM with one (see Launcher::fromSnapshot).
  std::optional<net::Policy> policy;
  if (auto* network = sandbox.runtime->network(); network != nullptr) {
    auto current = net::NetworkPool::readPolicy(net::NetworkPool::gatewayDir(network->stateDir()));
    policy = current.ok() && current.value() ? *current.value() : launcher_->defaultPolicy();
  }
  control.unlock();
  faultPoint("snapshot.sandbox_released");
  auto files = snapshot::finishSnapshot(std::move(capture.value()), take);
  if (!files.ok()) {
    layers_dirty_ = true;
    return makeError(files.error().code, "cannot snapshot sandbox " + sandbox.id + ": " +
                                             firstLine(files.error().message) + " (the sandbox is unchanged)");
  }
  if (policy) {
    if (auto kept = net::NetworkPool::writePolicy(snap.dir, *policy); !kept.ok()) {
      std::error_code ec;
      std::filesystem::remove_all(snap.dir, ec);
      layers_dirty_ = true;
      return makeError(kept.error().code, "cannot snapshot sandbox " + sandbox.id + ": its network policy: " +
                                              kept.error().message + " (the sandbox is unchanged)");
    }
  }
  snap.disk = files->disk;
  snap.size_bytes = files->size_bytes;
  snap.created_at_ms = nowMs();
  faultPoint("snapshot.published");
  if (auto inserted = store_.insertSnapshot(snap); !inserted.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(snap.dir, ec);
    layers_dirty_ = true;
    return inserted.error();
  }
  faultPoint("snapshot.recorded");
  spdlog::info("sandbox {}: snapshot {} taken ({} MiB)", sandbox.id, snap.id, snap.size_bytes >> 20);
  return snap;
}

Result<std::shared_ptr<void>> SandboxManager::claimSnapshotPlace(const std::string& tenant, uint64_t estimate_bytes) {
  auto tenant_quota = quotaOf(tenant);
  if (!tenant_quota.ok()) return tenant_quota.error();
  const TenantQuota& quota = tenant_quota.value();
  if (!quota.max_snapshots && !quota.max_snapshot_bytes) return std::shared_ptr<void>();
  // One lock over reading the usage, checking and counting the new one in: a snapshot recorded
  // (and its place released) between a read and the check cannot make the read stale.
  auto claims_lock = quotaClaimsLock(tenant);
  std::lock_guard claims(*claims_lock);
  auto usage = store_.snapshotUsage(tenant);
  if (!usage.ok()) return usage.error();
  uint64_t stranded = 0;
  if (quota.max_snapshot_bytes) {
    auto bytes = strandedLayerBytes(tenant);
    if (!bytes.ok()) return bytes.error();
    stranded = bytes.value();
    usage->bytes += stranded;
  }
  std::lock_guard lock(mu_);
  auto it = snapshots_pending_.find(tenant);
  const PendingSnapshots taking = it == snapshots_pending_.end() ? PendingSnapshots{} : it->second;
  if (quota.max_snapshots && usage->count + taking.count >= quota.max_snapshots) {
    return makeError(ErrorCode::kResourceExhausted,
                     "tenant " + tenant + " is at its quota of " + std::to_string(quota.max_snapshots) +
                         " snapshots (" + std::to_string(usage->count + taking.count) +
                         " kept or being taken); delete one first",
                     "tenant_quota");
  }
  // Those being taken count at an estimate of their size (the guest's memory and disk), so that
  // many taken at once cannot all pass under the quota.
  if (quota.max_snapshot_bytes && usage->bytes + taking.bytes >= quota.max_snapshot_bytes) {
    return makeError(ErrorCode::kResourceExhausted,
                     "tenant " + tenant + " is at its quota of " + std::to_string(quota.max_snapshot_bytes >> 20) +
                         " MiB of snapshots (" + std::to_string((usage->bytes + taking.bytes) >> 20) +
                         " MiB kept or being taken" +
                         (stranded ? ", of which " + std::to_string(stranded >> 20) +
                                         " MiB are disk layers of deleted snapshots that its sandboxes or "
                                         "snapshots still stand on"
                                   : std::string()) +
                         "); delete one first",
                     "tenant_quota");
  }
  PendingSnapshots& mine = snapshots_pending_[tenant];
  ++mine.count;
  mine.bytes += estimate_bytes;
  return std::shared_ptr<void>(nullptr, [this, tenant, estimate_bytes](void*) {
    auto claims_lock = quotaClaimsLock(tenant);
    std::lock_guard claims_released(*claims_lock);  // its record is in the store by now
    std::lock_guard lock(mu_);
    auto found = snapshots_pending_.find(tenant);
    if (found == snapshots_pending_.end()) return;
    --found->second.count;
    found->second.bytes -= estimate_bytes;
    if (found->second.count == 0) snapshots_pending_.erase(found);
  });
}

Result<std::shared_ptr<void>> SandboxManager::reserveSnapshotHelper(const std::string& tenant,
                                                                    const std::string& sandbox_id, uint64_t memory_mb,
                                                                    uint64_t qemu_mb) {
  // Made before anything is counted (it copies the tenant's name, which may throw); once the
  // counts are in, only the guard's own making can throw, and then it runs the deleter.
  const uint64_t host_mb = memory_mb + qemu_mb;  // the node's count; the tenant's is its guest's
  auto give_back = [this, tenant, memory_mb, host_mb](void*) {
    std::lock_guard lock(mu_);
    helper_memory_mb_ -= host_mb;
    auto found = tenant_helper_memory_mb_.find(tenant);
    if (found == tenant_helper_memory_mb_.end()) return;
    found->second -= memory_mb;
    if (found->second == 0) tenant_helper_memory_mb_.erase(found);
  };
  size_t revoked = 0;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return makeError(ErrorCode::kUnavailable, "spaced is shutting down", "shutting_down");
    // A tenant's helpers hold at most what its sandboxes hold (each snapshot one helper of its
    // sandbox's size): a snapshot of each at once, but a tenant cannot take many snapshots of
    // one sandbox at once to hold the node's memory. Its first always fits: the sandbox being
    // snapshotted counts in its usage.
    auto mine = tenant_helper_memory_mb_.find(tenant);
    const uint64_t tenant_helpers = mine == tenant_helper_memory_mb_.end() ? 0 : mine->second;
    auto usage = tenant_usage_.find(tenant);
    const uint64_t tenant_sandboxes = usage == tenant_usage_.end() ? 0 : usage->second.memory_mb;
    if (tenant_helpers > 0 && tenant_helpers + memory_mb > tenant_sandboxes) {
      return makeError(ErrorCode::kResourceExhausted,
                       "tenant " + tenant + "'s snapshots being taken hold " + std::to_string(tenant_helpers) +
                           " MB in helper VMs, and this one needs " + std::to_string(memory_mb) +
                           " MB more: at most what its running sandboxes hold (" + std::to_string(tenant_sandboxes) +
                           " MB) at once; retry once one is done",
                       "tenant_quota");
    }
    const uint64_t held = memoryHeldLocked();
    if (held + host_mb > config_.max_total_memory_mb) {
      return makeError(ErrorCode::kResourceExhausted,
                       "not enough memory on this node for the helper VM that makes sandbox " + sandbox_id +
                           "'s snapshot (" + std::to_string(memory_mb) + " MB, like the sandbox" + ", and " +
                           std::to_string(qemu_mb) + " MB for its QEMU" + "): " +
                           std::to_string(config_.max_total_memory_mb > held ? config_.max_total_memory_mb - held : 0) +
                           " of " + std::to_string(config_.max_total_memory_mb) + " MB free",
                       "insufficient_capacity");
    }
    tenant_helper_memory_mb_[tenant] += memory_mb;  // may throw: before the node's count
    helper_memory_mb_ += host_mb;
    revoked = takeBackPoolCapacityLocked();
  }
  std::shared_ptr<void> guard(nullptr, std::move(give_back));
  if (revoked > 0) {
    spdlog::info("sandbox {}: {} guest(s) of the pool give their capacity to its snapshot's helper", sandbox_id,
                 revoked);
    if (pool_) pool_->prune();
  }
  return guard;
}

std::function<bool(const std::string&)> SandboxManager::nodeDisk() const {
  return [facts = &launcher_->facts()](const std::string& name) {
    return vmm::isNodeDiskPath(name, facts->disk_roots, facts->disk_images);
  };
}

Result<uint64_t> SandboxManager::strandedLayerBytes(const std::string& tenant) {
  // Its own rows only: chains never cross tenants (a child stands on its own tenant's snapshot).
  auto snapshots = store_.allSnapshots(tenant);
  if (!snapshots.ok()) return snapshots.error();
  // Layers a recorded snapshot holds (their bytes count already), by identity: a backing name
  // spelled another way is still the same file.
  std::set<std::pair<dev_t, ino_t>> owned;
  for (const auto& snap : snapshots.value()) {
    struct stat st {};
    if (::stat(snap.disk.c_str(), &st) == 0) owned.emplace(st.st_dev, st.st_ino);
  }
  auto sandboxes = store_.sandboxesInStates({"creating", "running", "paused", "suspended"}, tenant);
  if (!sandboxes.ok()) return sandboxes.error();
  // What its sandboxes and its snapshots stand on: a snapshot's disk names the layer frozen
  // before it, which outlives that snapshot's deletion (snapshot, snapshot, delete the first
  // and the sandbox: only the second's record counts, the first's layer hangs under it).
  std::vector<std::string> roots;
  for (const auto& snap : snapshots.value()) roots.push_back(snap.disk);
  for (const auto& sb : sandboxes.value()) {
    if (sb.run_dir.empty()) continue;
    std::error_code ec;
    std::filesystem::directory_iterator it(sb.run_dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".qcow2") roots.push_back(it->path().string());
    }
    // A disk missed would be layers uncounted: fail closed (a sandbox deleted meanwhile is not).
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return makeError(ErrorCode::kUnavailable, "cannot list " + sb.run_dir + ": " + ec.message() + "; try again");
    }
  }
  auto reachable = snapshot::reachableLayers(roots, nodeDisk());
  if (!reachable) return makeError(ErrorCode::kUnavailable, "a disk's backing chain could not be read; try again");
  const std::string layers_dir = config_.data_dir + "/layers/";
  uint64_t bytes = 0;
  for (const auto& file : *reachable) {
    struct stat st {};
    if (file.rfind(layers_dir, 0) != 0 || ::stat(file.c_str(), &st) != 0 || owned.count({st.st_dev, st.st_ino})) {
      continue;
    }
    bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return bytes;
}

Result<store::SnapshotRecord> SandboxManager::getSnapshot(const std::string& tenant, const std::string& snapshot_id) {
  auto snap = store_.getSnapshot(snapshot_id);
  if (!snap.ok()) {
    if (snap.error().code == ErrorCode::kNotFound) return snapshotNotFound(snapshot_id);
    return snap.error();
  }
  if (snap->tenant != tenant) return snapshotNotFound(snapshot_id);
  return snap;
}

Result<store::SnapshotPage> SandboxManager::listSnapshots(const store::SnapshotFilter& filter) {
  return store_.listSnapshots(filter);
}

Result<std::shared_ptr<void>> SandboxManager::openSnapshotFiles(const std::string& id) {
  {
    std::lock_guard use(snapshot_use_mu_);
    if (snapshots_deleting_.count(id)) return snapshotNotFound(id);
    ++snapshot_openers_[id];
  }
  return std::shared_ptr<void>(nullptr, [this, id](void*) {
    {
      std::lock_guard use(snapshot_use_mu_);
      if (--snapshot_openers_[id] == 0) snapshot_openers_.erase(id);
    }
    snapshot_unused_.notify_all();
  });
}

Status SandboxManager::deleteSnapshot(const std::string& tenant, const std::string& snapshot_id) {
  auto snap = getSnapshot(tenant, snapshot_id);
  if (!snap.ok()) return snap.error();
  {
    // No child is opening these files while they go, and none starts from them from now on.
    // The wait is for QEMU to open them (children's guests are not waited for), and only for
    // this snapshot's children.
    std::unique_lock use(snapshot_use_mu_);
    snapshot_unused_.wait(use, [&] { return !snapshots_deleting_.count(snapshot_id); });  // a concurrent delete
    snapshots_deleting_.insert(snapshot_id);
    snapshot_unused_.wait(use, [&] { return !snapshot_openers_.count(snapshot_id); });
  }
  auto deleted = [&]() -> Status {
    auto still = getSnapshot(tenant, snapshot_id);  // a concurrent delete may have won
    if (!still.ok()) return still.error();
    // The record first: a crash then leaves an unrecorded directory, which recovery removes,
    // rather than a record naming files that are gone.
    SPACE_TRY(store_.deleteSnapshot(snapshot_id));
    std::error_code ec;
    std::filesystem::remove_all(snap->dir, ec);
    if (ec) spdlog::warn("snapshot {}: remove {}: {}", snapshot_id, snap->dir, ec.message());
    return okStatus();
  }();
  {
    std::lock_guard use(snapshot_use_mu_);
    snapshots_deleting_.erase(snapshot_id);
  }
  snapshot_unused_.notify_all();
  if (!deleted.ok()) return deleted.error();
  // Its layer goes too, unless disks still stand on it. Not waited for: if a snapshot is being
  // taken or a child started, the housekeeping thread sweeps it within a round or so.
  collectLayers(/*wait=*/false);
  spdlog::info("snapshot {}: deleted", snapshot_id);
  return okStatus();
}

Result<std::vector<store::SandboxRecord>> SandboxManager::branch(const CreateRequest& request, uint32_t count) {
  if (count < 1 || count > config_.max_branch) {
    return makeError(ErrorCode::kInvalidArgument,
                     "count = " + std::to_string(count) + ": must be within 1.." + std::to_string(config_.max_branch));
  }
  auto snap = getSnapshot(request.tenant, request.snapshot_id);
  if (!snap.ok()) return snap.error();
  // All or none, so a branch that cannot fit is refused before any child starts (each child
  // still reserves its own place before its VM starts: others may take room meanwhile).
  auto tenant_quota = quotaOf(request.tenant);
  if (!tenant_quota.ok()) return tenant_quota.error();
  {
    std::lock_guard lock(mu_);
    const TenantQuota& quota = tenant_quota.value();
    const auto usage = tenant_usage_.find(request.tenant);
    const TenantUsage used = usage == tenant_usage_.end() ? TenantUsage{} : usage->second;
    const uint64_t vcpus = uint64_t{count} * snap->cpus;
    const uint64_t memory_mb = uint64_t{count} * snap->memory_mb;  // the tenant's count
    const uint64_t node_mb = uint64_t{count} * nodeShareMb(snap->memory_mb);
    auto refuse = [&](const std::string& what, const char* reason) {
      return makeError(ErrorCode::kResourceExhausted,
                       "branch of " + request.snapshot_id + " into " + std::to_string(count) +
                           " sandboxes does not fit: " + what + " (none started)",
                       reason);
    };
    // The tenant's quota first, as for a create; and the node's count of sandboxes is other
    // tenants' business: the refusal names only the limit.
    if ((quota.max_sandboxes && used.sandboxes + count > quota.max_sandboxes) ||
        (quota.max_vcpus && used.vcpus + vcpus > quota.max_vcpus) ||
        (quota.max_memory_mb && used.memory_mb + memory_mb > quota.max_memory_mb)) {
      return refuse("tenant " + request.tenant + " would exceed its quota", "tenant_quota");
    }
    if (live_.size() + count > config_.max_sandboxes) {
      return refuse("this node runs at most " + std::to_string(config_.max_sandboxes) + " sandboxes",
                    "too_many_sandboxes");
    }
    if (reserved_vcpus_ + vcpus > config_.max_total_vcpus ||
        memoryHeldLocked() + node_mb > config_.max_total_memory_mb) {
      return refuse("not enough vCPU or memory capacity free on this node", "insufficient_capacity");
    }
  }
  auto started = Clock::now();
  // Under TCG and at a QEMU start a child is CPU-bound (it waits on little but its own QEMU), so
  // more children at once than cores only share them: one per core by default.
  const uint32_t per_node = config_.branch_workers ? config_.branch_workers : launcher_->facts().max_vcpus;
  const uint32_t workers = std::clamp<uint32_t>(per_node, 1, count);
  std::vector<Result<store::SandboxRecord>> made(count, makeError(ErrorCode::kCanceled, "not started"));
  std::atomic<uint32_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (uint32_t i = next++; i < count && !failed; i = next++) {
      // On a thread of its own, nothing above would catch what create() lets out (it has
      // undone its own part): the child fails, and the branch undoes the others.
      try {
        made[i] = create(request);
      } catch (const std::exception& e) {
        made[i] = makeError(ErrorCode::kInternal, std::string("a child failed: ") + e.what());
      }
      if (!made[i].ok()) failed = true;
    }
  };
  std::vector<std::thread> threads;
  std::optional<Error> no_thread;
  for (uint32_t w = 0; w < workers; ++w) {
    auto thread = startThread("branch.worker", work);
    if (!thread.ok()) {
      // All or none: the workers started stop after their current child, which is deleted below.
      no_thread = thread.error();
      failed = true;
      break;
    }
    threads.push_back(std::move(thread.value()));
  }
  for (auto& t : threads) t.join();
  std::vector<store::SandboxRecord> children;
  std::optional<Error> first_error = no_thread;
  for (auto& r : made) {
    if (r.ok()) {
      children.push_back(r.value());
    } else if (!first_error && r.error().code != ErrorCode::kCanceled) {
      first_error = r.error();
    }
  }
  if (first_error) {
    // Removed as they were started: in parallel (a delete waits for its QEMU to exit).
    std::atomic<size_t> next_removal{0};
    auto removeSome = [&] {
      for (size_t i = next_removal++; i < children.size(); i = next_removal++)
        (void)remove(request.tenant, children[i].id);
    };
    std::vector<std::thread> removers;
    for (uint32_t w = 1; w < workers && w < children.size(); ++w) {
      auto thread = startThread("branch.undo", removeSome);
      if (!thread.ok()) break;  // this thread removes what the others do not
      removers.push_back(std::move(thread.value()));
    }
    removeSome();
    for (auto& t : removers) t.join();
    return makeError(first_error->code,
                     "branch of " + request.snapshot_id + " failed (" + std::to_string(children.size()) + " of " +
                         std::to_string(count) + " started, now deleted): " + first_error->message,
                     first_error->reason);
  }
  spdlog::info("snapshot {}: branched into {} sandboxes in {} ms ({} at a time)", request.snapshot_id, count,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(), workers);
  return children;
}

void SandboxManager::collectLayers(bool wait) {
  // One round at a time, from the templates' mark to their eviction (see evictUnused).
  std::unique_lock round(collect_mu_, std::defer_lock);
  std::unique_lock layers(layers_mu_, std::defer_lock);
  if (wait) {
    round.lock();
    layers.lock();
  } else if (!round.try_lock() || !layers.try_lock()) {
    layers_dirty_ = true;  // busy starting VMs, taking a snapshot or collecting: next round
    return;
  }
  // Before the listing: templates that creates began to use after it are kept this round (their
  // overlays may be missing from the listing); see TemplateCache::evictUnused.
  const uint64_t mark = templates_->evictionMark();
  std::vector<std::string> roots;
  // The listing must be complete: a disk it missed (EMFILE, EIO) would have its layers unlinked.
  // Only a directory that is gone (a sandbox deleted meanwhile) is no error.
  auto list = [](const std::string& dir, const std::function<void(const std::filesystem::path&)>& each) -> Status {
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec), end;
    for (; !ec && it != end; it.increment(ec)) each(it->path());
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return makeError(ErrorCode::kInternal, "cannot list " + dir + ": " + ec.message());
    }
    return okStatus();
  };
  std::vector<std::filesystem::path> sandbox_dirs;
  // Every sandbox directory's disk (running, paused, suspended, or being created).
  // (A stray plain file there holds no disk: skipped, or it would stop every round.)
  Status listed = list(config_.data_dir + "/sandboxes", [&](const auto& p) {
    std::error_code type_ec;
    if (std::filesystem::symlink_status(p, type_ec).type() != std::filesystem::file_type::regular) {
      sandbox_dirs.push_back(p);
    }
  });
  for (const auto& sandbox : sandbox_dirs) {
    if (!listed.ok()) break;
    listed = list(sandbox.string(), [&](const auto& file) {
      if (file.extension() == ".qcow2") roots.push_back(file.string());
    });
  }
  // Every snapshot directory keeps its layer (<id>.qcow2): one being built (its helper's overlay
  // stands on it), one published but not yet recorded, one whose deletion is under way.
  if (listed.ok()) {
    listed = list(config_.data_dir + "/snapshots", [&](const auto& dir) {
      std::string id = dir.filename().string();
      if (id.rfind(".build-", 0) == 0) id = id.substr(7);
      if (!id.empty() && id[0] != '.') roots.push_back(config_.data_dir + "/layers/" + id + ".qcow2");
    });
  }
  if (!listed.ok()) {
    spdlog::warn("layers: not collected: {}", listed.error().message);  // again within a minute
    return;
  }
  auto snapshots = store_.allSnapshots();
  if (!snapshots.ok()) {
    spdlog::warn("layers: not collected: {}", snapshots.error().message);
    return;
  }
  for (const auto& snap : snapshots.value()) roots.push_back(snap.disk);
  auto keep = snapshot::reachableLayers(roots, nodeDisk());
  if (!keep) {
    spdlog::warn("layers: not collected: a disk's backing chain could not be read");
    return;
  }
  auto unreachable = snapshot::unreachableLayers(config_.data_dir + "/layers", *keep);
  // Decided: nothing can come to stand on these any more (new disks stand on recorded
  // snapshots' layers, on their own sandbox's chain, or on new layers), so snapshots and
  // children need not wait for the unlinks, nor for the templates' eviction.
  layers.unlock();
  if (const int removed = snapshot::removeLayers(unreachable); removed > 0) {
    spdlog::info("layers: removed {} disk layers nothing stands on", removed);
  }
  snapshot::EvictionRules rules;
  rules.current_key = [this](const std::string& name, uint32_t vcpus,
                             uint64_t memory_mib) -> std::optional<snapshot::TemplateKey> {
    auto tpl = launcher_->findTemplate(name);
    if (!tpl.ok()) return std::nullopt;
    return launcher_->templateKey(*tpl.value(), vcpus, memory_mib);
  };
  rules.pinned_sizes = {std::to_string(config_.default_cpus) + "x" + std::to_string(config_.default_memory_mb)};
  rules.idle = config_.template_idle;
  templates_->evictUnused(*keep, rules, Clock::now(), mark);
  spdlog::debug("layers: collected ({} disks stand on {} files)", roots.size(), keep->size());
}

}  // namespace space::sandbox
