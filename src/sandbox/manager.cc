#include "sandbox/manager.h"

#include <dirent.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <system_error>

#include "agentproto/base64.h"
#include "common/fault.h"
#include "common/fs.h"
#include "common/process.h"
#include "snapshot/layers.h"
#include "snapshot/sandbox_snapshot.h"
#include "vmm/accelerator.h"
#include "vmm/vm_spec.h"

namespace space::sandbox {

using std::chrono::milliseconds;

struct SandboxManager::Live {
  std::mutex control;  // serialises lifecycle operations (and QMP use) on this sandbox
  std::string id;
  std::string tenant;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;
  std::atomic<int64_t> expires_at_ms{0};
  int64_t timeout_s = 0;
  int64_t idle_suspend_s = 0;
  std::string on_timeout = "delete";
  std::atomic<int64_t> last_active_ms{0};
  std::atomic<int> active_calls{0};  // leases alive: exec streams, file transfers
  // Guarded by `control`.
  SandboxState state = SandboxState::kCreating;
  std::unique_ptr<vmm::Vm> vm;
  bool finished = false;  // ended (deleted/failed) and out of live_
  // Paused because QEMU stopped the guest on a disk error: what QEMU said (else empty).
  // Written under the manager's `mu_` too, so that get() reads it without waiting for `control`.
  std::string disk_error;
};

int64_t nowMs() {
  return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {

std::string newId(const char* prefix) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[20];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  std::string id = prefix;
  // 36 does not divide 256; the bias (at most 1/256 per character) does not matter for ids,
  // which need to be unique and unguessable, not uniform.
  for (unsigned char b : bytes) id += kAlphabet[b % 36];
  return id;
}

}  // namespace

std::string newSandboxId() { return newId("sb_"); }
std::string newSnapshotId() { return newId("snap_"); }

namespace {

constexpr const char* kSuspendedState = "/suspended.state";
constexpr size_t kConsoleMaxBytes = 8 << 20;
constexpr size_t kConsoleKeepBytes = 1 << 20;

// Sandbox ids have '_', which hostnames may not.
std::string hostnameFor(const std::string& id) {
  std::string name = id;
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

std::string freshEntropy() {
  unsigned char bytes[64];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  return agentproto::base64Encode(std::string(reinterpret_cast<char*>(bytes), sizeof bytes));
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

Error notFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "sandbox " + id + " not found", "sandbox_not_found");
}

Error snapshotNotFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "snapshot " + id + " not found", "snapshot_not_found");
}

constexpr const char* kTimeoutSuspendReason = "timeout: suspended (on_timeout is suspend)";

// What a sandbox whose guest QEMU stopped on a disk error says, as its state_reason and to calls.
std::string diskStopReason(const std::string& error) {
  return "disk error: the VM was stopped because it could not write to the node's disk (" + error +
         "); free space on the node, then resume it";
}

Error diskStopped(const std::string& id, const std::string& error) {
  return makeError(ErrorCode::kResourceExhausted, "sandbox " + id + " is paused: " + diskStopReason(error));
}

// The last non-empty line of the console: usually what the guest said before it died.
std::string lastConsoleLine(const vmm::Vm& vm) {
  std::string tail = vm.consoleTail(2048);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  auto at = tail.find_last_of('\n');
  std::string line = at == std::string::npos ? tail : tail.substr(at + 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

Result<uint64_t> hostMemoryMb() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib / 1024;
  }
  return makeError(ErrorCode::kInternal, "MemTotal missing from /proc/meminfo");
}

}  // namespace

std::string SandboxManager::sandboxDir(const std::string& id) const { return config_.data_dir + "/sandboxes/" + id; }

std::string SandboxManager::snapshotDir(const std::string& snapshot_id) const {
  return config_.data_dir + "/snapshots/" + snapshot_id;
}

std::shared_ptr<SandboxManager::Live> SandboxManager::liveFromRecord(const store::SandboxRecord& rec) const {
  auto live = std::make_shared<Live>();
  live->id = rec.id;
  live->tenant = rec.tenant;
  live->cpus = rec.cpus;
  live->memory_mb = rec.memory_mb;
  live->expires_at_ms = rec.expires_at_ms;
  live->timeout_s = rec.timeout_s;
  live->idle_suspend_s = rec.idle_suspend_s;
  live->on_timeout = rec.on_timeout.empty() ? "delete" : rec.on_timeout;
  live->last_active_ms = nowMs();
  return live;
}

Result<std::unique_ptr<SandboxManager>> SandboxManager::start(ManagerConfig config, store::StateStore& store) {
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir + "/sandboxes", ec);
  if (ec) return makeError(ErrorCode::kInternal, "create " + config.data_dir + "/sandboxes: " + ec.message());
  // Absolute and canonical: QEMU's command line names these paths, and the orphan sweep
  // recognises our QEMU processes by them.
  config.data_dir = std::filesystem::canonical(config.data_dir).string();
  if (config.default_timeout_s < 1 || config.default_timeout_s > config.max_timeout_s) {
    return makeError(ErrorCode::kInvalidArgument, "the default timeout (" + std::to_string(config.default_timeout_s) +
                                                      " s) must be within 1..max timeout (" +
                                                      std::to_string(config.max_timeout_s) + " s)");
  }
  auto capacity = vmm::probeHostCapacity();
  if (!capacity.ok()) return capacity.error();
  if (config.max_total_vcpus == 0) config.max_total_vcpus = 4 * capacity->max_vcpus;
  if (config.max_total_memory_mb == 0) {
    auto total = hostMemoryMb();
    if (!total.ok()) return total.error();
    config.max_total_memory_mb = total.value() * 8 / 10;
  }
  for (const char* sub : {"/templates", "/snapshots", "/layers"}) {
    std::filesystem::create_directories(config.data_dir + sub, ec);
    if (ec) return makeError(ErrorCode::kInternal, "create " + config.data_dir + sub + ": " + ec.message());
  }
  if (config.idle_suspend_s < 0 || config.idle_suspend_s > config.max_idle_suspend_s) {
    return makeError(ErrorCode::kInvalidArgument, "the idle suspend time (" + std::to_string(config.idle_suspend_s) +
                                                      " s) must be within 0..." +
                                                      std::to_string(config.max_idle_suspend_s) + " s");
  }
  std::unique_ptr<SandboxManager> manager(new SandboxManager(std::move(config), store));
  manager->templates_ = std::make_unique<snapshot::TemplateCache>(manager->config_.data_dir + "/templates");
  SPACE_TRY(manager->recover());
  // From here a failure returns through ~SandboxManager, which stops whatever was started.
  auto actions = ActionPool::start(manager->config_.housekeeping_workers);
  if (!actions.ok()) return actions.error();
  manager->actions_ = std::move(actions.value());
  auto housekeeper = startThread("housekeeping.thread", [m = manager.get()] { m->housekeeping(); });
  if (!housekeeper.ok()) return housekeeper.error();
  manager->housekeeper_ = std::move(housekeeper.value());
  if (manager->config_.use_snapshots && manager->config_.warm_pool_size > 0 &&
      manager->config_.templates.count("base")) {
    auto pool = WarmPool::start(manager->config_.warm_pool_size, [m = manager.get()] { return m->makeWarmVm(); });
    if (!pool.ok()) return pool.error();
    manager->pool_ = std::move(pool.value());
  }
  return manager;
}

SandboxManager::~SandboxManager() { shutdown(ShutdownMode::kKeepRunning); }

Result<WarmVm> SandboxManager::makeWarmVm() {
  const Template& tpl = config_.templates.at("base");
  auto accel = vmm::chooseAccelerator(config_.accelerator, vmm::probeKvm());
  if (!accel.ok()) return accel.error();
  snapshot::TemplateKey key{
      tpl.name, tpl.kernel_path, tpl.rootfs_path, config_.default_cpus, config_.default_memory_mb, accel->accelerator};
  auto snap = templates_->ensure(key, config_.boot_timeout);
  if (!snap.ok()) return snap.error();
  vmm::VmSpec spec;
  spec.kernel_path = tpl.kernel_path;
  spec.rootfs_path = snap->disk;
  spec.rootfs_format = "qcow2";
  spec.memory_file = snap->memory_file;
  spec.memory_private = true;
  spec.vcpus = config_.default_cpus;
  spec.memory_mib = config_.default_memory_mb;
  spec.accelerator = accel->accelerator;
  spec.boot_timeout = config_.boot_timeout;
  WarmVm warm;
  warm.sandbox_id = newSandboxId();
  warm.snapshot_dir = snap->dir;
  warm.state_file = snap->state_file;
  vmm::VmStartOptions options;
  options.run_dir = sandboxDir(warm.sandbox_id);
  auto vm = vmm::Vm::prepare(spec, options);
  if (!vm.ok()) return vm.error();
  warm.vm = std::move(vm.value());
  return warm;
}

// --- start-up recovery ---------------------------------------------------------------------

Status SandboxManager::recover() {
  auto rows = store_.sandboxesInStates({"creating", "running", "paused"});
  if (!rows.ok()) return rows.error();
  int adopted = 0, failed = 0;
  std::set<std::string> suspended_ids;
  if (auto suspended = store_.sandboxesInStates({"suspended"}); suspended.ok()) {
    for (const auto& s : suspended.value()) suspended_ids.insert(s.id);
  }
  // Adoptions run in parallel: each may wait up to its timeout for a guest that does not
  // answer, and the API is not served until recovery is done.
  std::vector<std::future<Result<std::unique_ptr<vmm::Vm>>>> adoptions(rows->size());
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& row = rows.value()[i];
    if (row.state == "creating" || row.vm_pid <= 0 || row.run_dir.empty()) continue;
    if (std::filesystem::exists(row.run_dir + kSuspendedState)) continue;  // a suspend cut short
    auto accel = vmm::parseAccelerator(row.accelerator);
    vmm::VmAdoptSpec spec{row.run_dir,
                          static_cast<pid_t>(row.vm_pid),
                          row.vm_identity,
                          accel.ok() ? accel.value() : vmm::Accelerator::kTcg,
                          std::chrono::seconds(10),
                          row.memory_mb};
    try {
      adoptions[i] = std::async(std::launch::async, [spec] { return vmm::Vm::adopt(spec); });
    } catch (const std::system_error&) {
      // No thread to spare: adopt this one in turn (slower, but recovery still completes).
      adoptions[i] = std::async(std::launch::deferred, [spec] { return vmm::Vm::adopt(spec); });
    }
  }
  for (size_t i = 0; i < rows->size(); ++i) {
    auto& row = rows.value()[i];
    std::string reason;
    std::unique_ptr<vmm::Vm> vm;
    std::optional<std::string> disk_error;
    if (row.state != "creating" && !row.run_dir.empty() && std::filesystem::exists(row.run_dir + kSuspendedState)) {
      // The guest was saved but the suspension not recorded: finish it. Its QEMU, if still
      // there, is stopped by the orphan sweep below.
      row.state = stateName(SandboxState::kSuspended);
      row.state_reason.clear();
      row.vm_pid = 0;
      SPACE_TRY(store_.updateSandbox(row));
      suspended_ids.insert(row.id);
      spdlog::info("sandbox {}: suspended (recorded at restart)", row.id);
      continue;
    }
    if (row.state == "creating") {
      reason = "spaced restarted while the sandbox was being created";
    } else if (!adoptions[i].valid()) {
      reason = "no VM was recorded for it";
    } else {
      auto found = adoptions[i].get();
      std::error_code ec;
      std::filesystem::remove(row.run_dir + kSuspendedState + ".tmp", ec);  // a suspend cut short
      if (found.ok()) {
        // Stopped on a full disk, before or while spaced was down: kept paused, saying why
        // (continuing it would only stop it again while there is no room).
        if (auto stopped = found.value()->diskErrorStop(); stopped.ok()) disk_error = stopped.value();
      }
      if (found.ok() && row.state == "running" && !disk_error) {
        // Recorded running but stopped: a suspend or pause was cut short before it was
        // recorded. Continue the guest, as the record says.
        auto status = found.value()->queryStatus();
        if (status.ok() && status.value() != "running") {
          if (auto resumed = found.value()->resume(); !resumed.ok()) {
            found = makeError(resumed.error().code, "cannot continue it: " + resumed.error().message);
          }
        }
      }
      if (found.ok()) {
        vm = std::move(found.value());
      } else {
        reason = "its VM was lost while spaced was down: " + firstLine(found.error().message);
      }
    }
    if (vm) {
      auto live = liveFromRecord(row);
      live->state = row.state == "paused" || disk_error ? SandboxState::kPaused : SandboxState::kRunning;
      live->vm = std::move(vm);
      if (disk_error) {
        live->disk_error = *disk_error;
        row.state = stateName(SandboxState::kPaused);
        row.state_reason = diskStopReason(*disk_error);
        if (auto saved = store_.updateSandbox(row); !saved.ok()) {
          spdlog::error("sandbox {}: cannot record its disk error: {}", row.id, saved.error().message);
        }
      }
      reserved_vcpus_ += row.cpus;
      reserved_memory_mb_ += row.memory_mb;
      live_[row.id] = std::move(live);
      ++adopted;
      continue;
    }
    row.state = stateName(SandboxState::kFailed);
    row.state_reason = reason;
    row.vm_pid = 0;
    SPACE_TRY(store_.updateSandbox(row));
    spdlog::warn("sandbox {}: failed: {}", row.id, reason);
    ++failed;
  }

  // Orphans: QEMU processes under our sandboxes directory that no live sandbox owns (e.g. one
  // that was booting when the previous daemon died), then directories nobody owns.
  const std::string prefix = config_.data_dir + "/sandboxes/";
  const std::string build_prefix = config_.data_dir + "/templates/.build-";           // a template build cut short
  const std::string snapshot_build_prefix = config_.data_dir + "/snapshots/.build-";  // a snapshot cut short
  std::set<pid_t> owned;
  for (auto& [id, live] : live_) owned.insert(live->vm->pid());
  int killed = 0;
  if (DIR* proc = opendir("/proc")) {
    while (dirent* entry = readdir(proc)) {
      char* end = nullptr;
      long pid = strtol(entry->d_name, &end, 10);
      if (*end != '\0' || pid <= 0 || pid == getpid() || owned.count(static_cast<pid_t>(pid))) continue;
      // Pidfd first, then the check, then the signal through the pidfd: a pid reused meanwhile
      // fails the check and is left alone.
      auto orphan = ChildProcess::adopt(static_cast<pid_t>(pid));
      if (!orphan.ok()) continue;
      auto cmdline = processCmdline(static_cast<pid_t>(pid));
      if (!cmdline.ok() || cmdline->find("qemu-system") == std::string::npos ||
          (cmdline->find(prefix) == std::string::npos && cmdline->find(build_prefix) == std::string::npos &&
           cmdline->find(snapshot_build_prefix) == std::string::npos)) {
        orphan->disown();
        continue;
      }
      orphan->kill();
      ++killed;
    }
    closedir(proc);
  }
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(prefix, ec)) {
    if (live_.count(entry.path().filename().string()) || suspended_ids.count(entry.path().filename().string()))
      continue;
    std::filesystem::remove_all(entry.path(), ec);
    ++removed;
  }
  for (const auto& entry : std::filesystem::directory_iterator(config_.data_dir + "/templates", ec)) {
    if (entry.path().filename().string().rfind(".build-", 0) == 0) {
      std::filesystem::remove_all(entry.path(), ec);
      ++removed;
    }
  }
  // Snapshots: directories the store does not know (cut short, or published but not recorded).
  std::set<std::string> recorded_snapshots;
  auto snapshots = store_.allSnapshots();
  if (!snapshots.ok()) return snapshots.error();
  for (const auto& snap : snapshots.value()) recorded_snapshots.insert(snap.id);
  for (const auto& entry : std::filesystem::directory_iterator(config_.data_dir + "/snapshots", ec)) {
    if (recorded_snapshots.count(entry.path().filename().string())) continue;
    std::filesystem::remove_all(entry.path(), ec);
    ++removed;
  }
  collectLayers(/*wait=*/true);
  spdlog::info("sandboxes: recovered: {} re-adopted, {} failed, {} orphaned QEMU killed, {} stale dirs removed",
               adopted, failed, killed, removed);
  return okStatus();
}

// --- node limits ---------------------------------------------------------------------------

Status SandboxManager::reserve(const std::shared_ptr<Live>& live) {
  std::lock_guard lock(mu_);
  if (stopping_) return makeError(ErrorCode::kUnavailable, "spaced is shutting down", "shutting_down");
  if (live_.count(live->id)) {
    return makeError(ErrorCode::kUnavailable, "sandbox " + live->id + " is changing state; retry");
  }
  if (live_.size() >= config_.max_sandboxes) {
    return makeError(ErrorCode::kResourceExhausted,
                     "this node already runs its maximum of " + std::to_string(config_.max_sandboxes) + " sandboxes",
                     "too_many_sandboxes");
  }
  if (reserved_vcpus_ + live->cpus > config_.max_total_vcpus) {
    return makeError(ErrorCode::kResourceExhausted,
                     "not enough vCPU capacity: " + std::to_string(live->cpus) + " requested, " +
                         std::to_string(config_.max_total_vcpus - reserved_vcpus_) + " of " +
                         std::to_string(config_.max_total_vcpus) + " free on this node",
                     "insufficient_capacity");
  }
  if (reserved_memory_mb_ + live->memory_mb > config_.max_total_memory_mb) {
    return makeError(ErrorCode::kResourceExhausted,
                     "not enough memory: " + std::to_string(live->memory_mb) + " MB requested, " +
                         std::to_string(config_.max_total_memory_mb - reserved_memory_mb_) + " of " +
                         std::to_string(config_.max_total_memory_mb) + " MB free on this node",
                     "insufficient_capacity");
  }
  reserved_vcpus_ += live->cpus;
  reserved_memory_mb_ += live->memory_mb;
  live_[live->id] = live;
  return okStatus();
}

void SandboxManager::unreserve(const Live& live) {
  std::lock_guard lock(mu_);
  live_.erase(live.id);
  reserved_vcpus_ -= live.cpus;
  reserved_memory_mb_ -= live.memory_mb;
}

// --- create / get / list ---------------------------------------------------------------------

Result<store::SandboxRecord> SandboxManager::create(const CreateRequest& request) {
  // What it restores: a snapshot of the caller's (which names its template and size), or a template.
  std::optional<store::SnapshotRecord> from_snapshot;
  std::string template_name = request.template_name;
  uint32_t cpus = request.cpus ? request.cpus : config_.default_cpus;
  uint64_t memory_mb = request.memory_mb ? request.memory_mb : config_.default_memory_mb;
  if (!request.snapshot_id.empty()) {
    auto snap = getSnapshot(request.tenant, request.snapshot_id);
    if (!snap.ok()) return snap.error();
    if ((request.cpus && request.cpus != snap->cpus) || (request.memory_mb && request.memory_mb != snap->memory_mb)) {
      return makeError(ErrorCode::kInvalidArgument, "snapshot " + snap->id + " has " + std::to_string(snap->cpus) +
                                                        " vCPUs and " + std::to_string(snap->memory_mb) +
                                                        " MB; a sandbox restored from it has the same");
    }
    template_name = snap->template_name;
    cpus = snap->cpus;
    memory_mb = snap->memory_mb;
    from_snapshot = std::move(snap.value());
  }
  auto tpl = config_.templates.find(template_name);
  if (tpl == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + template_name + "\" not found", "template_not_found");
  }
  const int64_t timeout_s = request.timeout_s >= 0 ? request.timeout_s : config_.default_timeout_s;
  const int64_t idle_suspend_s = request.idle_suspend_s >= 0 ? request.idle_suspend_s : config_.idle_suspend_s;
  const std::string on_timeout = request.on_timeout.empty() ? "delete" : request.on_timeout;
  if (memory_mb < vmm::kMinMemoryMib || memory_mb > config_.max_memory_mb) {
    return makeError(ErrorCode::kInvalidArgument, "memory_mb = " + std::to_string(memory_mb) + ": must be within " +
                                                      std::to_string(vmm::kMinMemoryMib) + ".." +
                                                      std::to_string(config_.max_memory_mb));
  }
  if (timeout_s < 1 || timeout_s > config_.max_timeout_s) {
    return makeError(ErrorCode::kInvalidArgument, "timeout_s = " + std::to_string(timeout_s) + ": must be within 1.." +
                                                      std::to_string(config_.max_timeout_s));
  }
  if (idle_suspend_s > config_.max_idle_suspend_s) {
    return makeError(ErrorCode::kInvalidArgument, "idle_suspend_s = " + std::to_string(idle_suspend_s) +
                                                      ": must be within 0.." +
                                                      std::to_string(config_.max_idle_suspend_s) + " (0: never)");
  }
  if (on_timeout != "delete" && on_timeout != "suspend") {
    return makeError(ErrorCode::kInvalidArgument, "on_timeout = \"" + on_timeout + "\": must be delete or suspend");
  }

  // Checked before anything is recorded: a request the host can never satisfy leaves no trace.
  auto host = vmm::probeHostCapacity();
  if (!host.ok()) return host.error();
  {
    vmm::VmSpec probe;
    probe.kernel_path = tpl->second.kernel_path;
    probe.rootfs_path = tpl->second.rootfs_path;
    probe.vcpus = cpus;
    probe.memory_mib = memory_mb;
    if (auto fits = vmm::validateSpec(probe, host.value()); !fits.ok()) {
      const Error& e = fits.error();
      if (e.code == ErrorCode::kResourceExhausted) {
        return makeError(e.code, "not enough free memory on this node: " + e.message, "insufficient_capacity");
      }
      return e;
    }
  }

  std::optional<vmm::AcceleratorChoice> accel;
  if (from_snapshot || config_.use_snapshots) {
    auto chosen = vmm::chooseAccelerator(config_.accelerator, vmm::probeKvm());
    if (!chosen.ok()) return chosen.error();
    // A guest saved under one accelerator (and its CPU model) is never restored under another.
    if (from_snapshot && from_snapshot->accelerator != vmm::acceleratorName(chosen->accelerator)) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "snapshot " + from_snapshot->id + " was taken under " + from_snapshot->accelerator +
                           "; this node runs " + vmm::acceleratorName(chosen->accelerator),
                       "snapshot_incompatible");
    }
    accel = chosen.value();
  }
  // A VM started ahead of need, if one fits: the request then only loads the guest's state.
  std::optional<WarmVm> warm;
  if (pool_ && !from_snapshot && template_name == "base" && cpus == config_.default_cpus &&
      memory_mb == config_.default_memory_mb) {
    warm = pool_->take();
  }
  store::SandboxRecord rec;
  rec.id = warm ? warm->sandbox_id : newSandboxId();
  rec.tenant = request.tenant;
  rec.state = stateName(SandboxState::kCreating);
  rec.template_name = template_name;
  rec.cpus = cpus;
  rec.memory_mb = memory_mb;
  rec.created_at_ms = nowMs();
  rec.expires_at_ms = rec.created_at_ms + timeout_s * 1000;
  rec.timeout_s = timeout_s;
  rec.idle_suspend_s = idle_suspend_s;
  rec.on_timeout = on_timeout;
  rec.source_snapshot = request.snapshot_id;
  rec.metadata = request.metadata;
  rec.env = request.env;
  rec.run_dir = sandboxDir(rec.id);
  auto live = liveFromRecord(rec);
  std::unique_lock control(live->control);  // held through boot: other requests on it wait
  if (auto reserved = reserve(live); !reserved.ok()) {
    if (warm) pool_->put(std::move(*warm));
    return reserved.error();
  }
  auto release = [&] {
    unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kFailed;
  };
  if (auto inserted = store_.insertSandbox(rec); !inserted.ok()) {
    release();
    return inserted.error();
  }
  faultPoint("create.inserted");

  auto fail = [&](const Error& e) -> Error {
    live->vm.reset();  // kills QEMU and removes its files, if any
    rec.state = stateName(SandboxState::kFailed);
    rec.state_reason = firstLine(e.message);
    rec.vm_pid = 0;
    if (auto saved = store_.updateSandbox(rec); !saved.ok()) {
      spdlog::error("sandbox {}: cannot record failure: {}", rec.id, saved.error().message);
    }
    release();
    spdlog::warn("sandbox {}: create failed: {}", rec.id, e.message);
    const bool client_error = e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kFailedPrecondition ||
                              e.reason == "snapshot_not_found";
    return makeError(client_error ? e.code : ErrorCode::kUnavailable,
                     "sandbox " + rec.id + " failed to start: " + firstLine(e.message),
                     client_error ? e.reason : "sandbox_start_failed");
  };

  vmm::VmSpec spec;
  spec.kernel_path = tpl->second.kernel_path;
  spec.rootfs_path = tpl->second.rootfs_path;
  spec.vcpus = cpus;
  spec.memory_mib = memory_mb;
  spec.accelerator = config_.accelerator;
  spec.boot_timeout = config_.boot_timeout;
  vmm::VmStartOptions options;
  options.run_dir = rec.run_dir;
  options.host_capacity = host.value();  // probed above: once per create
  auto started = Clock::now();
  const auto deadline = started + config_.boot_timeout;
  const char* how = "booted in";
  bool up = false;  // the agent answered
  if (accel) {
    spec.accelerator = accel->accelerator;
    spec.rootfs_format = "qcow2";
    spec.memory_private = true;
    if (from_snapshot) {
      how = "branched in";
      // The snapshot's files must stay while QEMU opens them and the state loads, and no
      // longer: a guest slow to answer must not hold up the snapshot's deletion.
      auto opening = openSnapshotFiles(from_snapshot->id);
      if (!opening.ok()) return fail(opening.error());
      std::string state_file;
      {
        std::shared_lock layers(layers_mu_);  // the child's overlay is made over the snapshot's layer
        // Deleted since it was looked up? Then its files are gone.
        if (auto still = store_.getSnapshot(from_snapshot->id); !still.ok()) {
          return fail(snapshotNotFound(from_snapshot->id));
        }
        auto files = snapshot::snapshotFilesIn(snapshotDir(from_snapshot->id), from_snapshot->disk);
        spec.rootfs_path = files.disk;
        spec.memory_file = files.memory_file;
        state_file = files.state_file;
        auto vm = vmm::Vm::prepare(spec, options);
        if (!vm.ok()) return fail(vm.error());
        live->vm = std::move(vm.value());
      }
      if (auto loaded = live->vm->loadPrepared(state_file, deadline); !loaded.ok()) return fail(loaded.error());
      opening.value().reset();  // QEMU holds what it needs of the files now
      faultPoint("create.state_loaded");
      if (auto answered = live->vm->awaitAgent(deadline); !answered.ok()) return fail(answered.error());
      up = true;
    } else {
      snapshot::TemplateKey key{tpl->second.name, tpl->second.kernel_path, tpl->second.rootfs_path, cpus,
                                memory_mb,        accel->accelerator,      spec.qemu_binary};
      auto snap = templates_->ensure(key, config_.boot_timeout);
      if (!snap.ok()) return fail(snap.error());
      spec.rootfs_path = snap->disk;
      spec.memory_file = snap->memory_file;
      options.restore_from = snap->state_file;
      how = "restored in";
      if (warm && warm->snapshot_dir == snap->dir) {
        live->vm = std::move(warm->vm);
        how = "restored (warm) in";
      }
      warm.reset();  // a VM waiting for a snapshot since rebuilt is dropped
    }
  }
  if (!live->vm) {
    auto vm = vmm::Vm::start(spec, options);
    if (!vm.ok()) return fail(vm.error());
    live->vm = std::move(vm.value());
  } else if (!up) {  // from the warm pool: it loads the state now
    if (auto restored = live->vm->restore(options.restore_from, config_.boot_timeout); !restored.ok()) {
      return fail(restored.error());
    }
  }
  // Its own identity before anyone sees it running: a restored clone still has the template's
  // hostname, a clock stopped at the snapshot and the template's random state.
  nlohmann::json configure{{"hostname", hostnameFor(rec.id)}, {"timeMs", nowMs()}, {"entropy", freshEntropy()}};
  if (!request.env.empty()) {
    nlohmann::json vars = nlohmann::json::object();
    for (const auto& [k, v] : request.env) vars[k] = v;
    configure["envVars"] = vars;
  }
  auto configured = live->vm->agent().call("/agent.Agent/Configure", configure);
  if (!configured.ok()) return fail(configured.error());
  if (faultFails("create.configured"))
    return fail(makeError(ErrorCode::kInternal, "injected failure (SPACE_FAULT_FAIL)"));
  faultPoint("create.configured");
  rec.state = stateName(SandboxState::kRunning);
  rec.vm_pid = live->vm->pid();
  rec.vm_identity = live->vm->identity();
  rec.accelerator = vmm::acceleratorName(live->vm->accelerator());
  if (auto saved = store_.updateSandbox(rec); !saved.ok()) return fail(saved.error());
  faultPoint("create.recorded");
  live->state = SandboxState::kRunning;
  live->last_active_ms = nowMs();
  spdlog::info("sandbox {}: running (tenant {}, {} vCPU, {} MB, {} {} ms, expires in {} s)", rec.id, rec.tenant, cpus,
               memory_mb, how, std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(), timeout_s);
  return store_.getSandbox(rec.id);
}

Result<store::SandboxRecord> SandboxManager::getOwned(const std::string& tenant, const std::string& id) {
  auto rec = store_.getSandbox(id);
  if (!rec.ok()) {
    if (rec.error().code == ErrorCode::kNotFound) return notFound(id);
    return rec.error();
  }
  // Another tenant's sandbox does not exist for this caller.
  if (rec->tenant != tenant) return notFound(id);
  return rec;
}

Result<store::SandboxRecord> SandboxManager::get(const std::string& tenant, const std::string& id) {
  auto rec = getOwned(tenant, id);
  if (!rec.ok() || rec->state != stateName(SandboxState::kRunning)) return rec;
  // Recorded running, but stopped on a full disk that also refused the record's update.
  std::lock_guard lock(mu_);
  if (auto it = live_.find(id); it != live_.end() && !it->second->disk_error.empty()) {
    rec->state = stateName(SandboxState::kPaused);
    rec->state_reason = diskStopReason(it->second->disk_error);
  }
  return rec;
}

Result<store::SandboxPage> SandboxManager::list(const store::ListFilter& filter) {
  return store_.listSandboxes(filter);
}

Result<std::shared_ptr<SandboxManager::Live>> SandboxManager::findLive(const std::string& tenant,
                                                                       const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end() || it->second->tenant != tenant) return notFound(id);
  it->second->last_active_ms = nowMs();  // any call on a sandbox is activity (idle suspend)
  return it->second;
}

// --- ending sandboxes ------------------------------------------------------------------------

Status SandboxManager::finish(const std::shared_ptr<Live>& live, SandboxState to, const std::string& reason) {
  SPACE_TRY(checkTransition(live->state, to, to == SandboxState::kDeleted ? "delete" : "fail"));
  auto rec = store_.getSandbox(live->id);
  if (!rec.ok()) return rec.error();
  live->vm.reset();  // the work first (QEMU gone, files removed), then the record
  layers_dirty_ = true;
  faultPoint(to == SandboxState::kDeleted ? "delete.vm_removed" : "fail.vm_removed");
  rec->state = stateName(to);
  rec->state_reason = reason;
  rec->vm_pid = 0;
  auto saved = store_.updateSandbox(rec.value());
  live->state = to;
  live->finished = true;
  unreserve(*live);
  if (to == SandboxState::kFailed) {
    spdlog::warn("sandbox {}: failed: {}", live->id, reason);
  } else {
    spdlog::info("sandbox {}: {} ({})", live->id, stateName(to), reason);
  }
  return saved;
}

Status SandboxManager::remove(const std::string& tenant, const std::string& id) {
  auto live = findLive(tenant, id);
  if (live.ok()) {
    std::lock_guard control(live.value()->control);
    // It may have ended while we waited for the lock (timeout, failure): then fall through.
    if (!live.value()->finished) return finish(live.value(), SandboxState::kDeleted, "deleted by request");
  }
  auto rec = getOwned(tenant, id);
  if (!rec.ok()) return rec.error();
  auto from = parseState(rec->state);
  if (!from.ok()) return from.error();
  SPACE_TRY(checkTransition(from.value(), SandboxState::kDeleted, "delete"));
  if (from.value() == SandboxState::kSuspended) {
    std::error_code ec;
    std::filesystem::remove_all(rec->run_dir, ec);  // the files first, then the record
    layers_dirty_ = true;
  }
  rec->state = stateName(SandboxState::kDeleted);
  // Keep why it had failed: a deleted record is still read for its history.
  rec->state_reason = rec->state_reason.empty() ? "deleted by request"
                                                : "deleted by request (was " + std::string(stateName(from.value())) +
                                                      ": " + rec->state_reason + ")";
  SPACE_TRY(store_.updateSandbox(rec.value()));
  spdlog::info("sandbox {}: deleted (was {})", id, stateName(from.value()));
  return okStatus();
}

Result<store::SandboxRecord> SandboxManager::pause(const std::string& tenant, const std::string& id) {
  return changeRunState(tenant, id, SandboxState::kPaused);
}

Result<store::SandboxRecord> SandboxManager::resume(const std::string& tenant, const std::string& id) {
  if (!findLive(tenant, id).ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    if (rec->state == stateName(SandboxState::kSuspended)) return resumeSuspended(rec.value());
  }
  return changeRunState(tenant, id, SandboxState::kRunning);
}

Result<store::SandboxRecord> SandboxManager::suspend(const std::string& tenant, const std::string& id) {
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    if (rec->state == stateName(SandboxState::kSuspended)) return rec;  // already: idempotent
    auto from = parseState(rec->state);
    if (!from.ok()) return from.error();
    SPACE_TRY(checkTransition(from.value(), SandboxState::kSuspended, "suspend"));
    return makeError(ErrorCode::kUnavailable, "sandbox " + id + " is between states; retry");
  }
  std::lock_guard control(live.value()->control);
  return suspendLocked(live.value(), SuspendCause::kRequest);
}

Result<store::SandboxRecord> SandboxManager::suspendLocked(const std::shared_ptr<Live>& live, SuspendCause cause) {
  auto& sandbox = *live;
  const std::string& id = sandbox.id;
  auto rec = store_.getSandbox(id);
  if (!rec.ok()) return rec.error();
  if (sandbox.finished) {
    if (rec->state == stateName(SandboxState::kSuspended)) return rec;
    return makeError(ErrorCode::kFailedPrecondition, "sandbox is " + rec->state + "; cannot suspend", "invalid_state");
  }
  SPACE_TRY(checkTransition(sandbox.state, SandboxState::kSuspended, "suspend"));
  const bool was_running = sandbox.state == SandboxState::kRunning;
  auto started = Clock::now();
  // saveState writes a temp file and renames it when complete: a failure (disk full) leaves no
  // partial state, and the guest is continued as it was.
  auto saved = sandbox.vm->saveState(rec->run_dir + kSuspendedState, std::chrono::minutes(5));
  if (!saved.ok()) {
    (void)(was_running ? sandbox.vm->resume() : sandbox.vm->reactivateStopped());
    if (!sandbox.vm->processRunning()) {
      (void)finish(live, SandboxState::kFailed, "its VM stopped while suspending");
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " failed while suspending", "sandbox_failed");
    }
    return makeError(saved.error().code, "cannot suspend sandbox " + id + ": " + saved.error().message +
                                             (was_running ? " (it keeps running)" : " (it stays paused)"));
  }
  faultPoint("suspend.saved");
  sandbox.vm->quit();
  sandbox.vm->detach();  // keep the run dir: it holds the disk and the saved state
  sandbox.vm.reset();
  rec->state = stateName(SandboxState::kSuspended);
  rec->vm_pid = 0;
  rec->vm_identity.clear();
  switch (cause) {
    case SuspendCause::kRequest: rec->state_reason.clear(); break;
    case SuspendCause::kIdle:
      rec->state_reason = "idle: no activity for " + std::to_string(sandbox.idle_suspend_s) + " s";
      break;
    case SuspendCause::kTimeout:
      // Kept for the retention period; resuming re-arms its timeout.
      rec->state_reason = kTimeoutSuspendReason;
      rec->expires_at_ms = nowMs() + std::chrono::duration_cast<milliseconds>(config_.suspended_retention).count();
      break;
  }
  auto recorded = store_.updateSandbox(rec.value());
  faultPoint("suspend.recorded");
  sandbox.state = SandboxState::kSuspended;
  sandbox.finished = true;
  unreserve(sandbox);
  if (!recorded.ok()) return recorded.error();  // recovery finds the saved state and records it
  spdlog::info("sandbox {}: suspended in {} ms{}", id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(),
               rec->state_reason.empty() ? "" : " (" + rec->state_reason + ")");
  return store_.getSandbox(id);
}

Result<store::SandboxRecord> SandboxManager::resumeSuspended(const store::SandboxRecord& suspended) {
  auto tpl = config_.templates.find(suspended.template_name);
  if (tpl == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + suspended.template_name + "\" not found",
                     "template_not_found");
  }
  store::SandboxRecord rec = suspended;
  // Suspended by its timeout: the time it spent suspended does not count; the timeout starts again.
  const bool rearm = suspended.state_reason == kTimeoutSuspendReason;
  if (rearm) rec.expires_at_ms = nowMs() + std::max<int64_t>(suspended.timeout_s, 1) * 1000;
  auto live = liveFromRecord(rec);
  std::unique_lock control(live->control);
  SPACE_TRY(reserve(live));
  auto unreserve = [&] {
    this->unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kSuspended;
  };
  vmm::VmSpec spec;
  spec.kernel_path = tpl->second.kernel_path;
  spec.rootfs_path = suspended.run_dir + "/disk.qcow2";  // named for validation; the Vm opens the newest disk
  spec.vcpus = suspended.cpus;
  spec.memory_mib = suspended.memory_mb;
  auto accel = vmm::parseAccelerator(suspended.accelerator);
  spec.accelerator = accel.ok() ? accel.value() : config_.accelerator;
  spec.boot_timeout = config_.boot_timeout;
  vmm::VmStartOptions options;
  options.run_dir = suspended.run_dir;
  options.reuse_run_dir = true;
  options.restore_from = suspended.run_dir + kSuspendedState;
  // The guest must not run (and write to its disk) while the saved state could still be loaded
  // again: it is restored stopped, the resume recorded, the state file removed, and only then
  // continued. A crash at any step leaves either a suspended sandbox whose disk matches its
  // saved RAM, or a running one (recovery continues a stopped guest recorded as running).
  options.stay_paused = true;
  auto started = Clock::now();
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) {
    unreserve();
    // The saved state and disk are untouched: the sandbox stays suspended and can be retried.
    return makeError(vm.error().code == ErrorCode::kInvalidArgument ? vm.error().code : ErrorCode::kUnavailable,
                     "cannot resume sandbox " + suspended.id + ": " + firstLine(vm.error().message));
  }
  live->vm = std::move(vm.value());
  faultPoint("resume.restored");
  rec.state = stateName(SandboxState::kRunning);
  rec.state_reason.clear();
  rec.vm_pid = live->vm->pid();
  rec.vm_identity = live->vm->identity();
  rec.accelerator = vmm::acceleratorName(live->vm->accelerator());
  if (auto saved = store_.updateSandbox(rec); !saved.ok()) {
    live->vm->quit();
    live->vm->detach();  // keep the suspended files: the record still says suspended
    live->vm.reset();
    unreserve();
    return saved.error();
  }
  faultPoint("resume.recorded");
  std::error_code ec;
  std::filesystem::remove(suspended.run_dir + kSuspendedState, ec);
  if (ec) {
    // The guest has not run and its state is still there: put the record back, and the sandbox
    // stays suspended as it was.
    live->vm->quit();
    live->vm->detach();
    live->vm.reset();
    unreserve();
    if (auto back = store_.updateSandbox(suspended); !back.ok()) return back.error();
    return makeError(ErrorCode::kInternal,
                     "cannot resume sandbox " + suspended.id + ": cannot remove its saved state: " + ec.message());
  }
  if (auto synced = fsyncPath(suspended.run_dir); !synced.ok()) {
    // The state is gone either way now; a crash before the directory reaches the disk could
    // bring it back, which is the window this order closes everywhere else. Say so and go on.
    spdlog::warn("sandbox {}: resumed, but the removal of its saved state may not be durable: {}", suspended.id,
                 synced.error().message);
  }
  faultPoint("resume.state_removed");
  // From here the saved state is gone: the guest must continue, or it is lost.
  if (auto resumed = live->vm->resume(); !resumed.ok()) {
    auto status = live->vm->queryStatus();
    if (status.ok() && status.value() == "running") {
      // It continued; only its agent was slow to answer (a loaded host under TCG). Give it the
      // boot timeout; if it still does not answer, the sandbox runs on and calls fail as
      // unavailable until it does, which is better than losing the guest.
      if (auto agent = live->vm->reconnectAgent(config_.boot_timeout); !agent.ok()) {
        spdlog::warn("sandbox {}: resumed, but its agent does not answer yet: {}", suspended.id, agent.error().message);
      }
    } else {
      live->state = SandboxState::kRunning;
      (void)finish(live, SandboxState::kFailed, "its VM did not continue after the resume: " + resumed.error().message);
      return makeError(ErrorCode::kUnavailable,
                       "sandbox " + suspended.id + " failed while resuming: " + resumed.error().message,
                       "sandbox_failed");
    }
  }
  // The clock stood still while suspended.
  auto configured = live->vm->agent().call("/agent.Agent/Configure",
                                           nlohmann::json{{"timeMs", nowMs()}, {"entropy", freshEntropy()}});
  if (!configured.ok())
    spdlog::warn("sandbox {}: resumed, but its clock was not set: {}", suspended.id, configured.error().message);
  live->state = SandboxState::kRunning;
  spdlog::info("sandbox {}: resumed from suspension in {} ms", suspended.id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
  return store_.getSandbox(suspended.id);
}

void SandboxManager::expireSuspended(int64_t now_ms) {
  auto rows = store_.sandboxesInStates({"suspended"});
  if (!rows.ok()) return;
  for (const auto& row : rows.value()) {
    if (row.expires_at_ms > now_ms || actions_->busy(row.id)) continue;
    // Removing its files (its saved RAM and disk) takes a while: not on the housekeeping thread.
    (void)actions_->submit(
        {row.id, row.tenant, ActionPool::Kind::kQuick, [this, row, now_ms] { expireOneSuspended(row, now_ms); }});
  }
}

void SandboxManager::expireOneSuspended(const store::SandboxRecord& row, int64_t now_ms) {
  // Claimed in live_ (as already ended) while its files and record change, so a resume
  // cannot start from them meanwhile (its reserve() is refused: "changing state; retry").
  auto claim = liveFromRecord(row);
  claim->state = SandboxState::kDeleted;
  claim->finished = true;
  {
    std::lock_guard lock(mu_);
    if (!live_.emplace(row.id, claim).second) return;  // being resumed
  }
  auto rec = store_.getSandbox(row.id);  // as it is now that nobody else can change it
  if (rec.ok() && rec->state == stateName(SandboxState::kSuspended) && rec->expires_at_ms <= now_ms) {
    if (rec->on_timeout == "suspend" && rec->state_reason != kTimeoutSuspendReason) {
      // Suspended already (by request or idleness) when its timeout came: kept, as if the
      // timeout had suspended it.
      rec->state_reason = kTimeoutSuspendReason;
      rec->expires_at_ms = now_ms + std::chrono::duration_cast<milliseconds>(config_.suspended_retention).count();
      if (store_.updateSandbox(rec.value()).ok()) spdlog::info("sandbox {}: timed out while suspended; kept", rec->id);
    } else {
      std::error_code ec;
      std::filesystem::remove_all(rec->run_dir, ec);
      layers_dirty_ = true;
      rec->state_reason = rec->state_reason == kTimeoutSuspendReason
                              ? "retention: kept suspended after its timeout for " +
                                    std::to_string(config_.suspended_retention.count()) + " s, never resumed"
                              : "timeout: its timeout_s expired (while suspended)";
      rec->state = stateName(SandboxState::kDeleted);
      if (store_.updateSandbox(rec.value()).ok()) spdlog::info("sandbox {}: deleted ({})", rec->id, rec->state_reason);
    }
  }
  std::lock_guard lock(mu_);
  live_.erase(row.id);
}

Result<store::SandboxRecord> SandboxManager::changeRunState(const std::string& tenant, const std::string& id,
                                                            SandboxState to) {
  const char* operation = to == SandboxState::kPaused ? "pause" : "resume";
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    auto from = parseState(rec->state);
    if (!from.ok()) return from.error();
    SPACE_TRY(checkTransition(from.value(), to, operation));
    return makeError(ErrorCode::kUnavailable, "sandbox " + id + " is between states; retry");
  }
  auto& sandbox = *live.value();
  std::unique_lock control(sandbox.control);
  if (sandbox.finished) {
    if (sandbox.state == SandboxState::kSuspended && to == SandboxState::kRunning) {
      control.unlock();  // suspended (e.g. idle) since the lookup: resume it from disk
      return resume(tenant, id);
    }
    auto rec = store_.getSandbox(id);
    if (!rec.ok()) return rec.error();
    return makeError(ErrorCode::kFailedPrecondition, "sandbox is " + rec->state + "; cannot " + operation,
                     "invalid_state");
  }
  // resume of a running sandbox (or pause of a paused one) is a no-op, not an error: the
  // caller's intent already holds, and retries after a lost response stay harmless.
  if (sandbox.state == to) return store_.getSandbox(id);
  SPACE_TRY(checkTransition(sandbox.state, to, operation));
  auto done = to == SandboxState::kPaused ? sandbox.vm->pause() : sandbox.vm->resume();
  if (!done.ok()) {
    if (!sandbox.vm->processRunning()) {
      auto exit = sandbox.vm->exitStatus();
      std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
      (void)finish(live.value(), SandboxState::kFailed, reason);
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " failed: " + reason, "sandbox_failed");
    }
    // Continued, and QEMU stopped it again at once: its disk is still full.
    if (to == SandboxState::kRunning) {
      if (auto stopped = sandbox.vm->diskErrorStop(); stopped.ok() && stopped.value()) {
        markDiskStopped(sandbox, **stopped);
        return makeError(ErrorCode::kResourceExhausted,
                         "cannot resume sandbox " + id + ": " + diskStopReason(**stopped));
      }
    }
    return makeError(done.error().code,
                     std::string("cannot ") + operation + " sandbox " + id + ": " + done.error().message);
  }
  auto rec = store_.getSandbox(id);
  Status recorded = rec.ok() ? okStatus() : Status(rec.error());
  if (rec.ok()) {
    rec->state = stateName(to);
    rec->state_reason.clear();
    recorded = store_.updateSandbox(rec.value());
  }
  if (!recorded.ok()) {
    // Not recorded (e.g. the database's disk is full): undone, so the VM is as the record and
    // this object say, and the call can be retried.
    (void)(to == SandboxState::kPaused ? sandbox.vm->resume() : sandbox.vm->pause());
    return recorded.error();
  }
  sandbox.state = to;
  if (!sandbox.disk_error.empty()) {
    std::lock_guard lock(mu_);
    sandbox.disk_error.clear();
  }
  spdlog::info("sandbox {}: {}", id, stateName(to));
  return store_.getSandbox(id);
}

Result<store::SandboxRecord> SandboxManager::setTimeout(const std::string& tenant, const std::string& id,
                                                        int64_t timeout_s) {
  if (timeout_s < 1 || timeout_s > config_.max_timeout_s) {
    return makeError(ErrorCode::kInvalidArgument, "timeout_s = " + std::to_string(timeout_s) + ": must be within 1.." +
                                                      std::to_string(config_.max_timeout_s));
  }
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    return makeError(ErrorCode::kFailedPrecondition, "sandbox is " + rec->state + "; cannot set its timeout",
                     "invalid_state");
  }
  std::lock_guard control(live.value()->control);
  auto rec = store_.getSandbox(id);
  if (!rec.ok()) return rec.error();
  if (live.value()->finished) {
    return makeError(ErrorCode::kFailedPrecondition, "sandbox is " + rec->state + "; cannot set its timeout",
                     "invalid_state");
  }
  rec->expires_at_ms = nowMs() + timeout_s * 1000;
  rec->timeout_s = timeout_s;
  SPACE_TRY(store_.updateSandbox(rec.value()));
  live.value()->expires_at_ms = rec->expires_at_ms;
  live.value()->timeout_s = timeout_s;
  return store_.getSandbox(id);
}

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
  if (sandbox.finished || !sandbox.vm ||
      (sandbox.state != SandboxState::kRunning && sandbox.state != SandboxState::kPaused)) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "sandbox is " + rec->state + "; only a running or paused sandbox can be snapshotted",
                     "invalid_state");
  }
  auto tpl = config_.templates.find(rec->template_name);
  if (tpl == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + rec->template_name + "\" not found", "template_not_found");
  }
  store::SnapshotRecord snap;
  snap.id = newSnapshotId();
  snap.tenant = request.tenant;
  snap.name = request.name;
  snap.sandbox_id = sandbox.id;
  snap.template_name = rec->template_name;
  snap.cpus = rec->cpus;
  snap.memory_mb = rec->memory_mb;
  snap.accelerator = vmm::acceleratorName(sandbox.vm->accelerator());
  snap.dir = snapshotDir(snap.id);
  snap.metadata = request.metadata;

  snapshot::TakeSnapshotRequest take;
  take.id = snap.id;
  take.snapshots_dir = config_.data_dir + "/snapshots";
  take.layers_dir = config_.data_dir + "/layers";
  take.kernel_path = tpl->second.kernel_path;
  take.vcpus = rec->cpus;
  take.memory_mib = rec->memory_mb;
  take.accelerator = sandbox.vm->accelerator();
  take.timeout = std::chrono::minutes(5);
  // Step 1 holds the sandbox (it is stopped) and, shared, the layers lock: the new layer is
  // named by no disk until the sandbox's new overlay names it, so no sweep may run meanwhile.
  // (Nothing else waits for it: deleting snapshots does not take it, and sweeps only try.)
  std::shared_lock layers(layers_mu_);
  auto capture = snapshot::captureSnapshot(*sandbox.vm, sandbox.state == SandboxState::kRunning, take);
  layers.unlock();
  if (!capture.ok()) {
    layers_dirty_ = true;
    const bool usable =
        sandbox.vm->processRunning() &&
        (sandbox.state == SandboxState::kRunning ? sandbox.vm->resume().ok() : sandbox.vm->reactivateStopped().ok());
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
  control.unlock();
  auto files = snapshot::finishSnapshot(std::move(capture.value()), take);
  if (!files.ok()) {
    layers_dirty_ = true;
    return makeError(files.error().code, "cannot snapshot sandbox " + sandbox.id + ": " +
                                             firstLine(files.error().message) + " (the sandbox is unchanged)");
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
  if (auto snap = getSnapshot(request.tenant, request.snapshot_id); !snap.ok()) return snap.error();
  auto started = Clock::now();
  // A few at a time: each start is mostly waiting on its own QEMU, but all share the host's cores.
  const uint32_t workers = std::min<uint32_t>(count, 4);
  std::vector<Result<store::SandboxRecord>> made(count, makeError(ErrorCode::kCanceled, "not started"));
  std::atomic<uint32_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  std::optional<Error> no_thread;
  for (uint32_t w = 0; w < workers; ++w) {
    auto thread = startThread("branch.worker", [&] {
      for (uint32_t i = next++; i < count && !failed; i = next++) {
        made[i] = create(request);
        if (!made[i].ok()) failed = true;
      }
    });
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
    for (const auto& child : children) (void)remove(request.tenant, child.id);
    return makeError(first_error->code,
                     "branch of " + request.snapshot_id + " failed (" + std::to_string(children.size()) + " of " +
                         std::to_string(count) + " started, now deleted): " + first_error->message,
                     first_error->reason);
  }
  spdlog::info("snapshot {}: branched into {} sandboxes in {} ms", request.snapshot_id, count,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
  return children;
}

void SandboxManager::collectLayers(bool wait) {
  std::unique_lock layers(layers_mu_, std::defer_lock);
  if (wait) {
    layers.lock();
  } else if (!layers.try_lock()) {
    layers_dirty_ = true;  // busy starting VMs or taking a snapshot: next round
    return;
  }
  std::vector<std::string> roots;
  std::error_code ec;
  // Every sandbox directory's disk (running, paused, suspended, or being created).
  for (const auto& sandbox : std::filesystem::directory_iterator(config_.data_dir + "/sandboxes", ec)) {
    std::error_code inner;
    for (const auto& file : std::filesystem::directory_iterator(sandbox.path(), inner)) {
      if (file.path().extension() == ".qcow2") roots.push_back(file.path().string());
    }
  }
  // Snapshots being built keep their layer (and its helper's overlay stands on it).
  for (const auto& build : std::filesystem::directory_iterator(config_.data_dir + "/snapshots", ec)) {
    const std::string name = build.path().filename().string();
    if (name.rfind(".build-", 0) == 0) roots.push_back(config_.data_dir + "/layers/" + name.substr(7) + ".qcow2");
  }
  auto snapshots = store_.allSnapshots();
  if (!snapshots.ok()) {
    spdlog::warn("layers: not collected: {}", snapshots.error().message);
    return;
  }
  for (const auto& snap : snapshots.value()) roots.push_back(snap.disk);
  auto keep = snapshot::reachableLayers(roots);
  if (!keep) {
    spdlog::warn("layers: not collected: a disk's backing chain could not be read");
    return;
  }
  int removed = snapshot::sweepLayers(config_.data_dir + "/layers", *keep);
  if (removed > 0) spdlog::info("layers: removed {} disk layers nothing stands on", removed);
}

// --- agent access ----------------------------------------------------------------------------

Result<AgentLease> SandboxManager::agent(const std::string& tenant, const std::string& id, std::string_view operation) {
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    auto state = parseState(rec->state);
    if (!state.ok()) return state.error();
    if (state.value() == SandboxState::kSuspended) {
      auto resumed = resumeSuspended(rec.value());
      if (!resumed.ok()) return resumed.error();
      auto lease = agent(tenant, id, operation);
      if (lease.ok()) lease->resumed = true;
      return lease;
    }
    auto needed = requireState(state.value(), SandboxState::kRunning, operation);
    if (!needed.ok()) return needed.error();
    return makeError(ErrorCode::kUnavailable, "sandbox " + id + " is between states; retry");
  }
  std::unique_lock control(live.value()->control);
  if (live.value()->finished && live.value()->state == SandboxState::kSuspended) {
    control.unlock();  // suspended (e.g. idle) since the lookup: resume it like any suspended one
    return agent(tenant, id, operation);
  }
  if (live.value()->state == SandboxState::kPaused && !live.value()->disk_error.empty()) {
    return diskStopped(id, live.value()->disk_error);
  }
  SPACE_TRY(requireState(live.value()->state, SandboxState::kRunning, operation));
  ++live.value()->active_calls;
  std::shared_ptr<void> activity(nullptr, [sandbox = live.value()](void*) {
    sandbox->last_active_ms = nowMs();
    --sandbox->active_calls;
  });
  return AgentLease{id, live.value()->vm->sharedAgent(), false, std::move(activity)};
}

Error SandboxManager::agentFailed(const AgentLease& lease, const Error& error) {
  if (error.code != ErrorCode::kUnavailable) return error;
  std::shared_ptr<Live> live;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(lease.sandbox_id);
    if (it != live_.end()) live = it->second;
  }
  if (!live) return makeError(ErrorCode::kUnavailable, "sandbox " + lease.sandbox_id + " ended: " + error.message);
  std::lock_guard control(live->control);
  // Cut off because the guest stopped on a full disk (markDiskStopped ended the connection).
  if (!live->finished && live->state == SandboxState::kPaused && !live->disk_error.empty()) {
    return diskStopped(lease.sandbox_id, live->disk_error);
  }
  if (live->finished || !live->vm || live->vm->processRunning()) return error;
  auto exit = live->vm->exitStatus();
  std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
  if (auto line = lastConsoleLine(*live->vm); !line.empty()) reason += "; console: " + line;
  (void)finish(live, SandboxState::kFailed, reason);
  return makeError(ErrorCode::kUnavailable, "sandbox " + lease.sandbox_id + " failed: " + reason, "sandbox_failed");
}

Result<std::string> SandboxManager::consoleLog(const std::string& tenant, const std::string& id, size_t max_bytes) {
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    return makeError(ErrorCode::kFailedPrecondition, "sandbox is " + rec->state + "; its console is gone",
                     "invalid_state");
  }
  std::lock_guard control(live.value()->control);
  if (live.value()->finished || !live.value()->vm) {
    return makeError(ErrorCode::kFailedPrecondition,
                     std::string("sandbox is ") + stateName(live.value()->state) + "; its console is gone",
                     "invalid_state");
  }
  return live.value()->vm->consoleTail(max_bytes);
}

ManagerStats SandboxManager::stats() {
  ManagerStats s;
  if (auto counts = store_.countByState(); counts.ok()) s.by_state = counts.value();
  std::lock_guard lock(mu_);
  s.reserved_vcpus = reserved_vcpus_;
  s.reserved_memory_mb = reserved_memory_mb_;
  s.max_total_vcpus = config_.max_total_vcpus;
  s.max_total_memory_mb = config_.max_total_memory_mb;
  if (pool_) {
    s.warm_pool_ready = pool_->size();
    s.warm_pool_target = config_.warm_pool_size;
  }
  return s;
}

// --- background work -------------------------------------------------------------------------

SandboxManager::Due SandboxManager::dueFor(Live& live, int64_t now_ms) {
  if (live.finished || live.state == SandboxState::kCreating) return Due::kNothing;
  if (now_ms >= live.expires_at_ms) return Due::kTimeout;
  const bool idle = live.idle_suspend_s > 0 && live.active_calls == 0 &&
                    now_ms - live.last_active_ms >= live.idle_suspend_s * 1000 &&
                    (live.state == SandboxState::kRunning || live.state == SandboxState::kPaused);
  if (idle) return Due::kIdle;
  if (!live.vm) return Due::kNothing;
  if (!live.vm->processRunning()) return Due::kVmExited;
  if (live.state == SandboxState::kRunning && live.vm->stopReported()) return Due::kStopReported;
  return Due::kNothing;
}

void SandboxManager::checkOne(const std::shared_ptr<Live>& live, int64_t now_ms) {
  if (actions_->busy(live->id)) return;  // its last action is still under way
  Due due = Due::kNothing;
  {
    // A sandbox busy with a lifecycle operation (booting, a request) is checked next round.
    std::unique_lock control(live->control, std::try_to_lock);
    if (!control.owns_lock()) return;
    due = dueFor(*live, now_ms);
    if (due == Due::kNothing && live->vm) live->vm->trimConsole(kConsoleMaxBytes, kConsoleKeepBytes);
  }
  if (due == Due::kNothing) return;
  // Suspending streams the guest's RAM to disk (seconds to minutes); the rest ends a VM or asks
  // QEMU one question.
  const bool slow = due == Due::kIdle || (due == Due::kTimeout && live->on_timeout == "suspend");
  (void)actions_->submit({live->id, live->tenant, slow ? ActionPool::Kind::kSlow : ActionPool::Kind::kQuick,
                          [this, live, due] { act(live, due); }});
}

void SandboxManager::act(const std::shared_ptr<Live>& live, Due due) {
  // Not waited for: a worker must not sit behind a request that holds the sandbox (a snapshot,
  // a resume); the next round decides again.
  std::unique_lock control(live->control, std::try_to_lock);
  const int64_t now_ms = nowMs();
  if (!control.owns_lock() || dueFor(*live, now_ms) != due) return;  // changed meanwhile
  switch (due) {
    case Due::kNothing: return;
    case Due::kTimeout:
      if (live->on_timeout != "suspend") {
        (void)finish(live, SandboxState::kDeleted, "timeout: its timeout_s expired");
        return;
      }
      if (auto suspended = suspendLocked(live, SuspendCause::kTimeout); !suspended.ok() && !live->finished) {
        // Kept running rather than lost (e.g. the disk is full); tried again shortly.
        spdlog::warn("sandbox {}: its timeout could not suspend it (retrying in 30 s): {}", live->id,
                     suspended.error().message);
        live->expires_at_ms = nowMs() + 30000;
      }
      return;
    case Due::kIdle:
      if (auto suspended = suspendLocked(live, SuspendCause::kIdle); !suspended.ok() && !live->finished) {
        spdlog::warn("sandbox {}: idle, but could not be suspended: {}", live->id, suspended.error().message);
        live->last_active_ms = nowMs();  // tried again after another idle period
      }
      return;
    case Due::kVmExited: {
      auto exit = live->vm->exitStatus();
      std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
      if (auto line = lastConsoleLine(*live->vm); !line.empty()) reason += "; console: " + line;
      (void)finish(live, SandboxState::kFailed, reason);
      return;
    }
    case Due::kStopReported:
      // Usually our own pause or save; what matters is a guest QEMU stopped by itself.
      if (auto stopped = live->vm->diskErrorStop(); stopped.ok() && stopped.value()) {
        markDiskStopped(*live, **stopped);
      }
      return;
  }
}

void SandboxManager::markDiskStopped(Live& live, const std::string& error) {
  const bool was_recorded = live.state == SandboxState::kPaused && live.disk_error == error;
  live.state = SandboxState::kPaused;
  {
    std::lock_guard lock(mu_);
    live.disk_error = error;
  }
  // Calls waiting on the stopped guest (an exec) end now, and say why (agentFailed).
  live.vm->disconnectAgent(diskStopReason(error));
  if (was_recorded) return;
  spdlog::warn("sandbox {}: {}", live.id, diskStopReason(error));
  auto rec = store_.getSandbox(live.id);
  Status saved = rec.ok() ? okStatus() : Status(rec.error());
  if (rec.ok()) {
    rec->state = stateName(SandboxState::kPaused);
    rec->state_reason = diskStopReason(error);
    saved = store_.updateSandbox(rec.value());
  }
  // The state database may be on the full disk too: get() says it anyway (from live_).
  if (!saved.ok()) spdlog::error("sandbox {}: cannot record its disk error: {}", live.id, saved.error().message);
}

void SandboxManager::housekeeping() {
  auto last_purge = Clock::time_point{};
  auto last_suspended_check = Clock::time_point{};
  std::unique_lock wake(wake_mu_);
  while (!stopping_) {
    wake.unlock();
    // Only decisions here; what takes time is done by actions_, so every sandbox is looked at
    // every round whatever another one's suspend costs.
    std::vector<std::shared_ptr<Live>> all;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, live] : live_) all.push_back(live);
    }
    const int64_t now = nowMs();
    for (const auto& live : all) checkOne(live, now);
    if (Clock::now() - last_suspended_check > std::chrono::seconds(2)) {
      last_suspended_check = Clock::now();
      expireSuspended(now);
    }
    if (layers_dirty_.exchange(false)) collectLayers(/*wait=*/false);
    if (Clock::now() - last_purge > std::chrono::minutes(5)) {
      last_purge = Clock::now();
      auto cutoff = now - std::chrono::duration_cast<milliseconds>(config_.deleted_retention).count();
      if (auto purged = store_.purgeDeletedBefore(cutoff); !purged.ok()) {
        spdlog::warn("sandboxes: purge of old deleted records failed: {}", purged.error().message);
      }
    }
    wake.lock();
    wake_.wait_for(wake, config_.housekeeping_interval, [this] { return stopping_; });
  }
}

void SandboxManager::shutdown(ShutdownMode mode) {
  {
    std::lock_guard wake(wake_mu_);
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  wake_.notify_all();
  if (housekeeper_.joinable()) housekeeper_.join();
  if (actions_) actions_->stop();  // what runs finishes (a suspend is not cut short)
  pool_.reset();                   // waiting VMs are no sandboxes: never left running
  std::vector<std::shared_ptr<Live>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, live] : live_) all.push_back(live);
  }
  int kept = 0, stopped = 0;
  for (auto& live : all) {
    std::lock_guard control(live->control);
    if (live->finished || !live->vm) continue;
    if (mode == ShutdownMode::kKeepRunning) {
      live->vm->detach();
      live->vm.reset();
      ++kept;
    } else {
      (void)live->vm->shutdown(milliseconds(5000));
      (void)finish(live, SandboxState::kDeleted, "spaced stopped");
      ++stopped;
    }
  }
  spdlog::info("sandboxes: shut down ({} left running for the next start, {} stopped)", kept, stopped);
}

}  // namespace space::sandbox
