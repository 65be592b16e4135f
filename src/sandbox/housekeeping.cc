// SandboxManager, background work: the housekeeping thread decides what is due for each sandbox (timeout, idle, VM
// gone, disk full) and hands it to the action pool.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "net/slot.h"
#include "sandbox/manager_internal.h"

namespace space::sandbox {

using std::chrono::milliseconds;
using namespace internal;

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
      removeNetworkFiles(rec->id);  // kept while it could be resumed
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

// --- background work -------------------------------------------------------------------------

SandboxManager::Due SandboxManager::dueFor(Live& live, int64_t now_ms) {
  if (live.finished || live.state == SandboxState::kCreating) return Due::kNothing;
  if (now_ms >= live.expires_at_ms) return Due::kTimeout;
  const bool idle = live.idle_suspend_s > 0 && live.active_calls == 0 &&
                    now_ms - live.last_active_ms >= live.idle_suspend_s * 1000 &&
                    (live.state == SandboxState::kRunning || live.state == SandboxState::kPaused);
  if (idle) return Due::kIdle;
  if (!live.runtime) return Due::kNothing;
  if (!live.vm().processRunning()) return Due::kVmExited;
  if (live.state == SandboxState::kRunning && live.vm().stopReported()) return Due::kStopReported;
  if (auto* network = live.runtime->network(); network != nullptr) {
    if (network->gatewayExited()) return Due::kGatewayExited;
    if (network->gatewayOutdated()) return Due::kGatewayOutdated;
  }
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
    if (due == Due::kNothing && live->runtime) {
      live->vm().trimConsole(kConsoleMaxBytes, kConsoleKeepBytes);
      if (live->state == SandboxState::kRunning) sampleMetrics(*live, now_ms);
    }
  }
  if (due == Due::kNothing) return;
  // Suspending streams the guest's RAM to disk (seconds to minutes); the rest ends a VM or asks
  // QEMU one question.
  const bool slow = due == Due::kIdle || (due == Due::kTimeout && live->on_timeout == "suspend");
  (void)actions_->submit({live->id, live->tenant, slow ? ActionPool::Kind::kSlow : ActionPool::Kind::kQuick,
                          [this, live, due] { act(live, due); }});
}

void SandboxManager::sampleMetrics(Live& live, int64_t now_ms) {
  if (now_ms - live.sampled_at_ms < kMetricsIntervalMs) return;
  const pid_t pid = live.vm().pid();
  auto usage = readProcessUsage(pid);
  // QEMU runs in the sandbox's slot, so its /proc net/dev is the slot's: the tap's counters.
  std::optional<net::TapBytes> nic;
  if (live.runtime && live.runtime->network() != nullptr) {
    auto read = net::readTapBytes(pid);
    if (read.ok()) {
      const auto& base = live.runtime->network()->tapBaseline();
      auto since = [](uint64_t now, uint64_t then) { return now >= then ? now - then : now; };  // a new tap: from 0
      nic = net::TapBytes{since(read->guest_sent, base.guest_sent), since(read->guest_received, base.guest_received)};
    }
  }
  // An adopted QEMU is reaped by someone else: if it exited just now, its pid may already be
  // another process's, whose figures must not become this sandbox's.
  if (usage.ok() && !live.vm().processRunning()) return;
  if (!usage.ok()) {
    spdlog::debug("sandbox {}: no metrics sample: {}", live.id, usage.error().message);
    return;  // it is exiting: the health check says so
  }
  // The first reading of a QEMU (after a create or a resume) only sets the baseline.
  if (pid == live.sampled_pid && live.sampled_at_ms > 0 && usage->cpu_ticks >= live.sampled_cpu_ticks) {
    MetricSample sample;
    sample.timestamp_ms = now_ms;
    sample.cpu_count = live.cpus;
    sample.cpu_used_pct = cpuPercent(usage->cpu_ticks - live.sampled_cpu_ticks, now_ms - live.sampled_at_ms, live.cpus,
                                     sysconf(_SC_CLK_TCK));
    sample.mem_used_bytes = usage->rss_bytes;
    sample.mem_total_bytes = live.memory_mb << 20;
    sample.guest = live.guest_stats->fresh(now_ms, kGuestStatsMaxAgeMs);
    struct stat st {};
    if (::lstat(live.vm().paths().disk.c_str(), &st) == 0)
      sample.disk_used_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    if (nic) {
      sample.net_sent_bytes = nic->guest_sent;
      sample.net_received_bytes = nic->guest_received;
      sample.has_nic = true;
    }
    live.metrics.add(sample);
  }
  live.sampled_pid = pid;
  live.sampled_cpu_ticks = usage->cpu_ticks;
  live.sampled_at_ms = now_ms;
  // The guest's own figures for the next sample: asked for without waiting, so a guest that
  // never answers costs housekeeping nothing, and holds at most one question at a time.
  if (live.guest_stats->startAsking()) {
    agentproto::CallOptions options;
    options.timeout = std::chrono::milliseconds(kGuestStatsTimeoutMs);
    options.max_response_bytes = kGuestStatsMaxBytes;  // five numbers: a few hundred bytes
    live.vm().sharedAgent()->callAsync(
        "/agent.Agent/Stats", nlohmann::json::object(), options,
        [cell = live.guest_stats, ram = live.memory_mb << 20](Result<nlohmann::json> answer) {
          cell->answer(answer.ok() ? parseGuestStats(answer.value(), ram) : std::nullopt, nowMs());
        });
  }
}

Result<std::vector<MetricSample>> SandboxManager::metrics(const std::string& tenant, const std::string& id,
                                                          int64_t start_ms, int64_t end_ms) {
  auto rec = getOwned(tenant, id);  // kNotFound for others' sandboxes
  if (!rec.ok()) return rec.error();
  std::shared_ptr<Live> live;
  {
    std::lock_guard lock(mu_);
    auto it = live_.find(id);
    if (it != live_.end()) live = it->second;
  }
  if (!live) return std::vector<MetricSample>{};
  return live->metrics.between(start_ms, end_ms);
}

std::vector<SandboxManager::SandboxUsage> SandboxManager::latestMetrics() {
  std::vector<std::shared_ptr<Live>> lives;
  {
    std::lock_guard lock(mu_);
    lives.reserve(live_.size());
    for (const auto& [id, live] : live_) lives.push_back(live);
  }
  std::vector<SandboxUsage> out;
  // A sandbox that stopped running (suspended, paused) keeps its series but is no longer current.
  const int64_t fresh_after = nowMs() - 3 * kMetricsIntervalMs;
  for (const auto& live : lives) {
    auto sample = live->metrics.latest();
    if (sample && sample->timestamp_ms >= fresh_after) out.push_back({live->tenant, live->id, *sample});
  }
  return out;
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
        // Over the tenant's suspended quota it would otherwise run on past its timeout for good.
        if (suspended.error().reason == "tenant_quota") {
          (void)finish(live, SandboxState::kDeleted,
                       "timeout: its timeout_s expired and the tenant's suspended quota is full (" +
                           suspended.error().message + ")");
          return;
        }
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
      auto exit = live->vm().exitStatus();
      std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
      if (auto line = lastConsoleLine(live->vm()); !line.empty()) reason += "; console: " + line;
      (void)finish(live, SandboxState::kFailed, reason);
      return;
    }
    case Due::kGatewayExited:
    case Due::kGatewayOutdated: {
      // Exited: the guest lost its open connections, not its policy (a new gateway reads the
      // same file). Outdated: the host's resolver changed, and the table lets only the new one
      // through (NetworkPool::checkResolver).
      const bool exited = due == Due::kGatewayExited;
      auto* network = live->runtime->network();
      if (auto restarted =
              network->restartGateway(exited ? "" : "the host's resolver changed; the gateway was restarted to ask it");
          !restarted.ok()) {
        spdlog::error("sandbox {}: its network gateway {} and cannot be restarted (next try in a moment): {}", live->id,
                      exited ? "exited" : "asks the host's former resolver", restarted.error().message);
      } else if (exited) {
        spdlog::warn("sandbox {}: its network gateway exited; restarted (pid {}), open connections were lost", live->id,
                     network->gatewayPid());
      } else {
        spdlog::info("sandbox {}: its network gateway was restarted to ask the host's new resolver (pid {})", live->id,
                     network->gatewayPid());
      }
      return;
    }
    case Due::kStopReported:
      // Usually our own pause or save; what matters is a guest QEMU stopped by itself.
      if (auto stopped = live->vm().diskErrorStop(); stopped.ok() && stopped.value()) {
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
  live.vm().disconnectAgent(diskStopReason(error));
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
  auto last_collect = Clock::now();     // recovery has just collected
  auto last_qemu_check = Clock::now();  // start has just checked
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
    // Also once a minute: a template's idle time runs out with nothing else changing.
    if (Clock::now() - last_collect > std::chrono::minutes(1)) layers_dirty_ = true;
    if (layers_dirty_.exchange(false)) {
      last_collect = Clock::now();
      collectLayers(/*wait=*/false);
    }
    if (Clock::now() - last_qemu_check > std::chrono::minutes(1)) {
      last_qemu_check = Clock::now();
      (void)qemu_build_->check();  // logs when a security update makes the build stale
    }
    if (Clock::now() - last_purge > std::chrono::minutes(5)) {
      last_purge = Clock::now();
      auto cutoff = now - std::chrono::duration_cast<milliseconds>(config_.deleted_retention).count();
      if (auto purged = store_.purgeDeletedBefore(cutoff); !purged.ok()) {
        spdlog::warn("sandboxes: purge of old deleted records failed: {}", purged.error().message);
      } else {
        for (const auto& id : purged.value()) removeNetworkFiles(id);  // kept for its audit log until now
      }
    }
    wake.lock();
    wake_.wait_for(wake, config_.housekeeping_interval, [this] { return stopping_; });
  }
}

}  // namespace space::sandbox
