#include "sandbox/manager.h"

#include <dirent.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "agentproto/base64.h"
#include "common/process.h"
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
  // Guarded by `control`.
  SandboxState state = SandboxState::kCreating;
  std::unique_ptr<vmm::Vm> vm;
  bool finished = false;  // ended (deleted/failed) and out of live_
};

int64_t nowMs() {
  return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string newSandboxId() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[20];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  std::string id = "sb_";
  // 36 does not divide 256; the bias (at most 1/256 per character) does not matter for ids,
  // which need to be unique and unguessable, not uniform.
  for (unsigned char b : bytes) id += kAlphabet[b % 36];
  return id;
}

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
  std::filesystem::create_directories(config.data_dir + "/templates", ec);
  if (ec) return makeError(ErrorCode::kInternal, "create " + config.data_dir + "/templates: " + ec.message());
  std::unique_ptr<SandboxManager> manager(new SandboxManager(std::move(config), store));
  manager->templates_ = std::make_unique<snapshot::TemplateCache>(manager->config_.data_dir + "/templates");
  SPACE_TRY(manager->recover());
  manager->housekeeper_ = std::thread([m = manager.get()] { m->housekeeping(); });
  return manager;
}

SandboxManager::~SandboxManager() { shutdown(ShutdownMode::kKeepRunning); }

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
    adoptions[i] = std::async(std::launch::async, [spec] { return vmm::Vm::adopt(spec); });
  }
  for (size_t i = 0; i < rows->size(); ++i) {
    auto& row = rows.value()[i];
    std::string reason;
    std::unique_ptr<vmm::Vm> vm;
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
      if (found.ok() && row.state == "running") {
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
      auto live = std::make_shared<Live>();
      live->id = row.id;
      live->tenant = row.tenant;
      live->cpus = row.cpus;
      live->memory_mb = row.memory_mb;
      live->expires_at_ms = row.expires_at_ms;
      live->state = row.state == "paused" ? SandboxState::kPaused : SandboxState::kRunning;
      live->vm = std::move(vm);
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
  const std::string build_prefix = config_.data_dir + "/templates/.build-";  // a template build cut short
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
          (cmdline->find(prefix) == std::string::npos && cmdline->find(build_prefix) == std::string::npos)) {
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
  auto tpl = config_.templates.find(request.template_name);
  if (tpl == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + request.template_name + "\" not found",
                     "template_not_found");
  }
  const uint32_t cpus = request.cpus ? request.cpus : config_.default_cpus;
  const uint64_t memory_mb = request.memory_mb ? request.memory_mb : config_.default_memory_mb;
  const int64_t timeout_s = request.timeout_s >= 0 ? request.timeout_s : config_.default_timeout_s;
  if (memory_mb < vmm::kMinMemoryMib || memory_mb > config_.max_memory_mb) {
    return makeError(ErrorCode::kInvalidArgument, "memory_mb = " + std::to_string(memory_mb) + ": must be within " +
                                                      std::to_string(vmm::kMinMemoryMib) + ".." +
                                                      std::to_string(config_.max_memory_mb));
  }
  if (timeout_s < 1 || timeout_s > config_.max_timeout_s) {
    return makeError(ErrorCode::kInvalidArgument, "timeout_s = " + std::to_string(timeout_s) + ": must be within 1.." +
                                                      std::to_string(config_.max_timeout_s));
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

  auto live = std::make_shared<Live>();
  live->tenant = request.tenant;
  live->cpus = cpus;
  live->memory_mb = memory_mb;
  live->id = newSandboxId();
  std::unique_lock control(live->control);  // held through boot: other requests on it wait
  SPACE_TRY(reserve(live));
  auto release = [&] {
    unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kFailed;
  };

  store::SandboxRecord rec;
  rec.id = live->id;
  rec.tenant = request.tenant;
  rec.state = stateName(SandboxState::kCreating);
  rec.template_name = request.template_name;
  rec.cpus = cpus;
  rec.memory_mb = memory_mb;
  rec.created_at_ms = nowMs();
  rec.expires_at_ms = rec.created_at_ms + timeout_s * 1000;
  rec.metadata = request.metadata;
  rec.env = request.env;
  rec.run_dir = sandboxDir(rec.id);
  if (auto inserted = store_.insertSandbox(rec); !inserted.ok()) {
    release();
    return inserted.error();
  }
  live->expires_at_ms = rec.expires_at_ms;

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
    return makeError(e.code == ErrorCode::kInvalidArgument ? e.code : ErrorCode::kUnavailable,
                     "sandbox " + rec.id + " failed to start: " + firstLine(e.message),
                     e.code == ErrorCode::kInvalidArgument ? e.reason : "sandbox_start_failed");
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
  bool restored = false;
  if (config_.use_snapshots) {
    auto accel = vmm::chooseAccelerator(config_.accelerator, vmm::probeKvm());
    if (!accel.ok()) return fail(accel.error());
    snapshot::TemplateKey key{tpl->second.name, tpl->second.kernel_path, tpl->second.rootfs_path, cpus,
                              memory_mb,        accel->accelerator,      spec.qemu_binary};
    auto snap = templates_->ensure(key, config_.boot_timeout);
    if (!snap.ok()) return fail(snap.error());
    spec.accelerator = accel->accelerator;
    spec.rootfs_path = snap->disk;
    spec.rootfs_format = "qcow2";
    spec.memory_file = snap->memory_file;
    spec.memory_private = true;
    options.restore_from = snap->state_file;
    restored = true;
  }
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) return fail(vm.error());
  live->vm = std::move(vm.value());
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
  rec.state = stateName(SandboxState::kRunning);
  rec.vm_pid = live->vm->pid();
  rec.vm_identity = live->vm->identity();
  rec.accelerator = vmm::acceleratorName(live->vm->accelerator());
  if (auto saved = store_.updateSandbox(rec); !saved.ok()) return fail(saved.error());
  live->state = SandboxState::kRunning;
  spdlog::info("sandbox {}: running (tenant {}, {} vCPU, {} MB, {} {} ms, expires in {} s)", rec.id, rec.tenant, cpus,
               memory_mb, restored ? "restored in" : "booted in",
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(), timeout_s);
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
  return getOwned(tenant, id);
}

Result<store::SandboxPage> SandboxManager::list(const store::ListFilter& filter) {
  return store_.listSandboxes(filter);
}

Result<std::shared_ptr<SandboxManager::Live>> SandboxManager::findLive(const std::string& tenant,
                                                                       const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = live_.find(id);
  if (it == live_.end() || it->second->tenant != tenant) return notFound(id);
  return it->second;
}

// --- ending sandboxes ------------------------------------------------------------------------

Status SandboxManager::finish(const std::shared_ptr<Live>& live, SandboxState to, const std::string& reason) {
  SPACE_TRY(checkTransition(live->state, to, to == SandboxState::kDeleted ? "delete" : "fail"));
  auto rec = store_.getSandbox(live->id);
  if (!rec.ok()) return rec.error();
  live->vm.reset();  // the work first (QEMU gone, files removed), then the record
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
  auto& sandbox = *live.value();
  std::lock_guard control(sandbox.control);
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
    if (was_running) (void)sandbox.vm->resume();
    if (!sandbox.vm->processRunning()) {
      (void)finish(live.value(), SandboxState::kFailed, "its VM stopped while suspending");
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " failed while suspending", "sandbox_failed");
    }
    return makeError(saved.error().code, "cannot suspend sandbox " + id + ": " + saved.error().message +
                                             (was_running ? " (it keeps running)" : " (it stays paused)"));
  }
  sandbox.vm->quit();
  sandbox.vm->detach();  // keep the run dir: it holds the disk and the saved state
  sandbox.vm.reset();
  rec->state = stateName(SandboxState::kSuspended);
  rec->state_reason.clear();
  rec->vm_pid = 0;
  rec->vm_identity.clear();
  auto recorded = store_.updateSandbox(rec.value());
  sandbox.state = SandboxState::kSuspended;
  sandbox.finished = true;
  unreserve(sandbox);
  if (!recorded.ok()) return recorded.error();  // recovery finds the saved state and records it
  spdlog::info("sandbox {}: suspended in {} ms", id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
  return store_.getSandbox(id);
}

Result<store::SandboxRecord> SandboxManager::resumeSuspended(const store::SandboxRecord& suspended) {
  auto tpl = config_.templates.find(suspended.template_name);
  if (tpl == config_.templates.end()) {
    return makeError(ErrorCode::kNotFound, "template \"" + suspended.template_name + "\" not found",
                     "template_not_found");
  }
  auto live = std::make_shared<Live>();
  live->id = suspended.id;
  live->tenant = suspended.tenant;
  live->cpus = suspended.cpus;
  live->memory_mb = suspended.memory_mb;
  live->expires_at_ms = suspended.expires_at_ms;
  std::unique_lock control(live->control);
  SPACE_TRY(reserve(live));
  auto unreserve = [&] {
    this->unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kSuspended;
  };
  vmm::VmSpec spec;
  spec.kernel_path = tpl->second.kernel_path;
  spec.rootfs_path = suspended.run_dir + "/disk.qcow2";  // the disk is in place; named for validation
  spec.vcpus = suspended.cpus;
  spec.memory_mib = suspended.memory_mb;
  auto accel = vmm::parseAccelerator(suspended.accelerator);
  spec.accelerator = accel.ok() ? accel.value() : config_.accelerator;
  spec.boot_timeout = config_.boot_timeout;
  vmm::VmStartOptions options;
  options.run_dir = suspended.run_dir;
  options.reuse_run_dir = true;
  options.restore_from = suspended.run_dir + kSuspendedState;
  auto started = Clock::now();
  auto vm = vmm::Vm::start(spec, options);
  if (!vm.ok()) {
    unreserve();
    // The saved state and disk are untouched: the sandbox stays suspended and can be retried.
    return makeError(vm.error().code == ErrorCode::kInvalidArgument ? vm.error().code : ErrorCode::kUnavailable,
                     "cannot resume sandbox " + suspended.id + ": " + firstLine(vm.error().message));
  }
  live->vm = std::move(vm.value());
  // The clock stood still while suspended.
  auto configured = live->vm->agent().call("/agent.Agent/Configure",
                                           nlohmann::json{{"timeMs", nowMs()}, {"entropy", freshEntropy()}});
  if (!configured.ok())
    spdlog::warn("sandbox {}: resumed, but its clock was not set: {}", suspended.id, configured.error().message);
  store::SandboxRecord rec = suspended;
  rec.state = stateName(SandboxState::kRunning);
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
  std::error_code ec;
  std::filesystem::remove(suspended.run_dir + kSuspendedState, ec);
  live->state = SandboxState::kRunning;
  spdlog::info("sandbox {}: resumed from suspension in {} ms", suspended.id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
  return store_.getSandbox(suspended.id);
}

void SandboxManager::expireSuspended(int64_t now_ms) {
  auto rows = store_.sandboxesInStates({"suspended"});
  if (!rows.ok()) return;
  for (auto& rec : rows.value()) {
    if (rec.expires_at_ms > now_ms) continue;
    {
      std::lock_guard lock(mu_);
      if (live_.count(rec.id)) continue;  // being resumed
    }
    std::error_code ec;
    std::filesystem::remove_all(rec.run_dir, ec);
    rec.state = stateName(SandboxState::kDeleted);
    rec.state_reason = "timeout: its timeout_s expired (while suspended)";
    if (store_.updateSandbox(rec).ok()) spdlog::info("sandbox {}: deleted ({})", rec.id, rec.state_reason);
  }
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
  std::lock_guard control(sandbox.control);
  if (sandbox.finished) {
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
    return makeError(done.error().code,
                     std::string("cannot ") + operation + " sandbox " + id + ": " + done.error().message);
  }
  auto rec = store_.getSandbox(id);
  if (!rec.ok()) return rec.error();
  rec->state = stateName(to);
  rec->state_reason.clear();
  SPACE_TRY(store_.updateSandbox(rec.value()));
  sandbox.state = to;
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
  SPACE_TRY(store_.updateSandbox(rec.value()));
  live.value()->expires_at_ms = rec->expires_at_ms;
  return store_.getSandbox(id);
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
  std::lock_guard control(live.value()->control);
  SPACE_TRY(requireState(live.value()->state, SandboxState::kRunning, operation));
  return AgentLease{id, live.value()->vm->sharedAgent()};
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
  return s;
}

// --- background work -------------------------------------------------------------------------

void SandboxManager::checkOne(const std::string& id, int64_t now_ms) {
  std::shared_ptr<Live> live;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return;
    live = it->second;
  }
  // A sandbox busy with a lifecycle operation (booting, being deleted) is checked next round.
  std::unique_lock control(live->control, std::try_to_lock);
  if (!control.owns_lock() || live->finished || live->state == SandboxState::kCreating) return;
  if (now_ms >= live->expires_at_ms) {
    (void)finish(live, SandboxState::kDeleted, "timeout: its timeout_s expired");
    return;
  }
  if (live->vm) live->vm->trimConsole(kConsoleMaxBytes, kConsoleKeepBytes);
  if (live->vm && !live->vm->processRunning()) {
    auto exit = live->vm->exitStatus();
    std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
    if (auto line = lastConsoleLine(*live->vm); !line.empty()) reason += "; console: " + line;
    (void)finish(live, SandboxState::kFailed, reason);
  }
}

void SandboxManager::housekeeping() {
  auto last_purge = Clock::time_point{};
  auto last_suspended_check = Clock::time_point{};
  std::unique_lock wake(wake_mu_);
  while (!stopping_) {
    wake.unlock();
    std::vector<std::string> ids;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, live] : live_) ids.push_back(id);
    }
    const int64_t now = nowMs();
    for (const auto& id : ids) checkOne(id, now);
    if (Clock::now() - last_suspended_check > std::chrono::seconds(2)) {
      last_suspended_check = Clock::now();
      expireSuspended(now);
    }
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
