// SandboxManager, start-up recovery: re-adopts or fails what an earlier daemon left, and sweeps orphans.
#include <dirent.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <set>
#include <string_view>
#include <system_error>
#include <vector>

#include "common/fs.h"
#include "common/process.h"
#include "jail/cgroup.h"
#include "sandbox/manager_internal.h"

namespace space::sandbox {

using std::chrono::milliseconds;
using namespace internal;

// --- start-up recovery ---------------------------------------------------------------------

Status SandboxManager::recover() {
  auto rows = store_.sandboxesInStates({"creating", "running", "paused"});
  if (!rows.ok()) return rows.error();
  int adopted = 0, failed = 0;
  std::set<std::string> suspended_ids;
  // Their files are kept: without the list, the sweep below could not tell them from orphans.
  auto suspended = store_.sandboxesInStates({"suspended"});
  if (!suspended.ok()) return suspended.error();
  for (const auto& s : suspended.value()) suspended_ids.insert(s.id);
  // Adoptions run in parallel: each may wait up to its timeout for a guest that does not
  // answer, and the API is not served until recovery is done.
  std::vector<std::future<Result<std::unique_ptr<SandboxRuntime>>>> adoptions(rows->size());
  for (size_t i = 0; i < rows->size(); ++i) {
    const auto& row = rows.value()[i];
    if (row.state == "creating" || row.vm_pid <= 0 || row.run_dir.empty()) continue;
    if (std::filesystem::is_regular_file(std::filesystem::symlink_status(row.run_dir + kSuspendedState))) {
      continue;  // a suspend cut short
    }
    vmm::VmAdoptSpec spec = launcher_->adoption(row);
    auto network = launcher_->networkFor(row.run_dir, std::nullopt);
    try {
      adoptions[i] = std::async(std::launch::async, [spec, network] { return SandboxRuntime::adopt(spec, network); });
    } catch (const std::system_error&) {
      // No thread to spare: adopt this one in turn (slower, but recovery still completes).
      adoptions[i] =
          std::async(std::launch::deferred, [spec, network] { return SandboxRuntime::adopt(spec, network); });
    }
  }
  for (size_t i = 0; i < rows->size(); ++i) {
    auto& row = rows.value()[i];
    std::string reason;
    std::unique_ptr<SandboxRuntime> runtime;
    std::optional<std::string> disk_error;
    if (row.state != "creating" && !row.run_dir.empty() &&
        std::filesystem::is_regular_file(std::filesystem::symlink_status(row.run_dir + kSuspendedState))) {
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
        if (auto stopped = found.value()->vm().diskErrorStop(); stopped.ok()) disk_error = stopped.value();
      }
      if (found.ok() && row.state == "running" && !disk_error) {
        // Recorded running but stopped: a suspend or pause was cut short before it was
        // recorded. Continue the guest, as the record says.
        auto status = found.value()->vm().queryStatus();
        if (status.ok() && status.value() != "running") {
          if (auto resumed = found.value()->resume(); !resumed.ok()) {
            found = makeError(resumed.error().code, "cannot continue it: " + resumed.error().message);
          }
        }
      }
      if (found.ok()) {
        runtime = std::move(found.value());
      } else {
        reason = "its VM was lost while spaced was down: " + firstLine(found.error().message);
      }
    }
    if (runtime) {
      auto live = liveFromRecord(row);
      // Its QEMU may be an earlier spaced's, with another translation buffer (QEMU's 1 GiB
      // default before --tcg-tb-mib): counted as its command line says, never below a new VM's
      // and never above what its cgroup's memory limit (spaced's writing, not QEMU's) left room
      // for (adoptedTcgBufferMib). A QEMU recorded as KVM's has none, whatever it says.
      const uint64_t new_buffer_mb =
          vmm::tcgBufferMib(launcher_->recordedAccelerator(row), launcher_->facts().tcg_tb_size_mib);
      if (auto cmdline = processCmdline(runtime->vm().pid()); cmdline.ok() && new_buffer_mb > 0) {
        uint64_t most = std::max<uint64_t>(vmm::kQemuDefaultTcgTbSizeMib, launcher_->facts().tcg_tb_size_mib);
        if (auto limit = runtime->vm().cgroupMemoryLimit()) {
          most = std::min(most, vmm::tcgBufferMibWithin(*limit, row.memory_mb, row.cpus));
        }
        live->qemu_mb = vmm::kQemuOwnMemoryMib + vmm::adoptedTcgBufferMib(cmdline.value(), new_buffer_mb, most);
      }
      live->state = row.state == "paused" || disk_error ? SandboxState::kPaused : SandboxState::kRunning;
      live->runtime = std::move(runtime);
      // Secrets may have been rotated or deleted while spaced was down.
      if (auto synced = syncCredentials(*live); !synced.ok()) {
        spdlog::error("sandbox {}: its gateway may hold old secret values: {}", row.id, synced.error().message);
      }
      if (disk_error) {
        live->disk_error = *disk_error;
        row.state = stateName(SandboxState::kPaused);
        row.state_reason = diskStopReason(*disk_error);
        if (auto saved = store_.updateSandbox(row); !saved.ok()) {
          spdlog::error("sandbox {}: cannot record its disk error: {}", row.id, saved.error().message);
        }
      }
      {
        std::lock_guard lock(mu_);
        countIn(live);  // over a quota lowered since: kept, and counted
      }
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
  // Gateways run in spaced's namespace, not in their slot's, so the network pool's sweep of
  // slots misses them: one whose sandbox is not live now (a create or suspend cut short, a VM
  // lost while spaced was down) is found by the state directory on its command line.
  const std::string network_prefix = config_.data_dir + "/network/";
  // Exactly: argv holds --slot-netns, and --policy names <data dir>/network/<id>/gw/policy.json
  // for a well-formed id, so no other process (another data dir's gateway, a command that only
  // mentions the path) is ever killed for it.
  auto strayGateway = [&](const std::string& cmdline) {
    if (!config_.network) return false;
    std::vector<std::string_view> argv;
    for (size_t from = 0; from < cmdline.size();) {
      size_t nul = cmdline.find('\0', from);
      if (nul == std::string::npos) nul = cmdline.size();
      argv.emplace_back(cmdline.data() + from, nul - from);
      from = nul + 1;
    }
    bool in_slot = false;
    std::string_view policy;
    for (size_t i = 1; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--slot-netns") in_slot = true;
      if (argv[i] == "--policy") policy = argv[i + 1];
    }
    if (!in_slot || policy.substr(0, std::min(policy.size(), network_prefix.size())) != network_prefix) return false;
    const std::string_view rest = policy.substr(network_prefix.size());
    const std::string sandbox(rest.substr(0, rest.find('/')));
    if (sandbox.size() < 4 || sandbox.rfind("sb_", 0) != 0) return false;
    for (char c : sandbox.substr(3)) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
    }
    if (policy != net::NetworkPool::gatewayDir(network_prefix + sandbox) + "/" + net::kPolicyFile) return false;
    return live_.count(sandbox) == 0;
  };
  std::set<pid_t> owned;
  for (auto& [id, live] : live_) owned.insert(live->vm().pid());
  int killed = 0, gateways_killed = 0;
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
      if (cmdline.ok() && strayGateway(cmdline.value())) {
        orphan->kill();
        ++gateways_killed;
        continue;
      }
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
  // A QEMU can rewrite its command line, so VMs are found by their cgroup too: every process in
  // a VM group that holds no adopted VM is one no sandbox owns.
  for (const auto& root : launcher_->facts().cgroups.roots) {
    std::error_code ec;
    for (const auto& group : std::filesystem::directory_iterator(root.dir, ec)) {
      const std::vector<pid_t> pids = jail::processesInGroupDir(group.path().string());
      if (std::any_of(pids.begin(), pids.end(), [&](pid_t p) { return owned.count(p) != 0; })) continue;
      for (pid_t pid : pids) {
        if (pid <= 0 || pid == getpid()) continue;  // 0: outside our PID namespace (v2)
        if (auto orphan = ChildProcess::adopt(pid); orphan.ok()) {
          orphan->kill();
          ++killed;
        }
      }
    }
  }
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(prefix, ec)) {
    if (live_.count(entry.path().filename().string()) || suspended_ids.count(entry.path().filename().string()))
      continue;
    std::filesystem::remove_all(entry.path(), ec);
    ++removed;
  }
  // Network state (policy, audit log) is kept while its sandbox can be asked for it: live,
  // suspended or failed. One without such a sandbox was left by a create cut short.
  if (config_.network) {
    std::set<std::string> keeps_network = suspended_ids;
    if (auto failed_rows = store_.sandboxesInStates({"failed"}); failed_rows.ok()) {
      for (const auto& f : failed_rows.value()) keeps_network.insert(f.id);
    } else {
      return failed_rows.error();
    }
    for (const auto& entry : std::filesystem::directory_iterator(network_prefix, ec)) {
      const std::string id = entry.path().filename().string();
      if (live_.count(id) || keeps_network.count(id)) continue;
      std::filesystem::remove_all(entry.path(), ec);
      ++removed;
    }
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
  spdlog::info(
      "sandboxes: recovered: {} re-adopted, {} failed, {} orphaned QEMU killed, {} orphaned gateways killed, {} stale "
      "dirs removed",
      adopted, failed, killed, gateways_killed, removed);
  return okStatus();
}

}  // namespace space::sandbox
