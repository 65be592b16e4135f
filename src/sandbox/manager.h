// SandboxManager: owns the sandboxes of one node. It records every sandbox in the state store,
// boots and destroys their VMs, enforces the node's limits, kills sandboxes whose hard timeout
// passed, notices VMs that died, and on start finds the sandboxes an earlier daemon left
// running (re-adopting their VMs, or marking them failed with the reason). Every VM it starts
// comes from the Launcher's specs, and each running sandbox's host resources are one
// SandboxRuntime. Its parts: manager.cc (requests, limits), recovery.cc, snapshots.cc,
// housekeeping.cc; manager_internal.h is what they share.
//
// Ordering rule (crash safety): a state is recorded after the work it describes, except
// `creating`, which is recorded before the VM exists so a crash mid-boot is found on restart.
// Every state change goes through lifecycle.h's checkTransition.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "net/sandbox_network.h"
#include "sandbox/action_pool.h"
#include "sandbox/launcher.h"
#include "sandbox/lifecycle.h"
#include "sandbox/metrics.h"
#include "sandbox/warm_pool.h"
#include "secrets/vault.h"
#include "snapshot/template_cache.h"
#include "store/state_store.h"
#include "vmm/vm.h"

namespace space::sandbox {

// What one tenant may hold on this node, on top of the node's own limits (0: no quota of that
// kind). A tenant at its quota gets 429 (tenant_quota) and the other tenants are unaffected.
struct TenantQuota {
  uint32_t max_sandboxes = 0;  // running or paused: those that hold a VM
  uint32_t max_vcpus = 0;
  uint64_t max_memory_mb = 0;
  uint32_t max_snapshots = 0;
  uint64_t max_snapshot_bytes = 0;
  // Suspended sandboxes (each keeps its disk and saved memory on the node's disk): how many,
  // and the disk they take.
  uint32_t max_suspended = 0;
  uint64_t max_suspended_bytes = 0;
};

// A tenant's quota as it applies now (its own values over the node's defaults) and what it
// holds against each, for the tenant to see (GET /v1/quota). Never another tenant's figures.
struct TenantQuotaReport {
  TenantQuota limits;
  bool own = false;  // whether the tenant has values of its own (spaced tenant quota)
  uint32_t sandboxes = 0;
  uint32_t vcpus = 0;
  uint64_t memory_mb = 0;
  uint32_t snapshots = 0;
  uint64_t snapshot_bytes = 0;
  uint32_t suspended = 0;
  uint64_t suspended_bytes = 0;
};

constexpr uint32_t kVmUidCount = 65535;

struct ManagerConfig {
  std::string data_dir;  // sandboxes/<id>/ holds each VM's files
  // Every QEMU starts through this space-jail program ("": directly), in a cgroup of its own
  // limited by its size where the host's cgroups allow. `require_cgroups`: a host where they do
  // not is an error at start rather than a warning.
  std::string jailer;
  bool require_cgroups = false;
  // Jailed QEMUs run as uids vm_uid_base+1 .. +kVmUidCount, one each, with gid vm_uid_base
  // (vmm/vm_users.h); no account may have one. 0: as uid 0 without capabilities.
  uint32_t vm_uid_base = 0;
  // How much of the host's disk each vCPU of a guest may use (QEMU throttles the guest's disk
  // device; vmm::vmDiskIoLimits). Zero: no limit.
  vmm::DiskIoRate disk_io_per_vcpu;
  // Under TCG, each QEMU's translation buffer (MiB; 0: QEMU's default, 1 GiB). It is counted in
  // each VM's share of the node's memory, beside its guest's (nodeShareMb).
  uint32_t tcg_tb_size_mib = vmm::kDefaultTcgTbSizeMib;
  std::map<std::string, Template> templates;
  // Images the templates' disks stand on besides their own rootfs_path (vmm::holdImageBases):
  // older root filesystems under sandboxes saved before an image rebuild. A jailed VM may
  // open them in its disk chain, as it may the templates' own.
  std::vector<std::string> base_images;
  vmm::Accelerator accelerator = vmm::Accelerator::kAuto;
  // The QEMU every VM runs (a name is looked up in PATH once, at start).
  std::string qemu_binary = "qemu-system-x86_64";
  std::chrono::milliseconds boot_timeout{60000};
  // Create sandboxes by restoring a template snapshot (built on first use per size) instead of
  // booting. Off: every create is a cold boot (for comparison and debugging).
  bool use_snapshots = true;
  // Guests of template "base" at the default size kept running and warmed up, waiting to
  // become sandboxes (see WarmPool). 0: no pool at all; every create restores its guest.
  uint32_t warm_pool_size = 2;
  // With a pool: what guests of other kinds (template, size), and more of the default kind,
  // may hold together when recent creates ask for them (PoolSizer). 0 MB: only the
  // warm_pool_size guests above. 0 vCPUs: as many as the host has CPUs.
  uint64_t warm_pool_budget_mb = 2048;
  uint32_t warm_pool_budget_cpus = 0;
  // Networking: every sandbox gets a slot and a gateway from this pool (null: no NIC at all).
  std::shared_ptr<net::NetworkPool> network;
  net::Policy default_policy = net::defaultPolicy();  // a sandbox's, unless its create says
  // Tenants' secrets, for the gateways' credential rules (null: rules get no values).
  secrets::SecretVault* secrets = nullptr;

  // Node limits; a request beyond them is refused, never overcommitted. The node's memory counts
  // what each VM holds of the host: its guest's memory and, under TCG, its translation buffer
  // (tenants' quotas count their guests' memory only).
  uint32_t max_sandboxes = 64;
  uint32_t max_total_vcpus = 0;      // 0: 4 x host CPUs (vCPUs are time-shared threads)
  uint64_t max_total_memory_mb = 0;  // 0: 80% of host memory at start
  uint64_t max_memory_mb = 8192;     // per sandbox

  uint32_t default_cpus = 2;
  uint64_t default_memory_mb = 512;
  int64_t default_timeout_s = 300;
  int64_t max_timeout_s = 24 * 3600;

  // How long deleted and failed sandboxes stay visible (GET shows why they ended); housekeeping
  // purges older ones at start and every 5 minutes (--deleted-retention).
  std::chrono::seconds deleted_retention{24 * 3600};
  // A sandbox with no API, exec or file activity for this long is suspended (per sandbox:
  // CreateRequest::idle_suspend_s). 0: never.
  int64_t idle_suspend_s = 6 * 3600;
  int64_t max_idle_suspend_s = 30 * 24 * 3600;
  // How long a sandbox suspended by its timeout (on_timeout "suspend") is kept before it is deleted.
  std::chrono::seconds suspended_retention{7 * 24 * 3600};
  // Most children one branch request may create.
  uint32_t max_branch = 64;
  // How many of a branch's children start at once (0: one per host CPU; 1: one after another).
  uint32_t branch_workers = 0;
  TenantQuota tenant_quota;
  // How many sizes (template snapshots) one template is kept for; a create of another size
  // beyond them boots and keeps nothing (the default size is always kept). 0: no limit.
  uint32_t max_template_sizes = 8;
  // The most files a sandbox's disk chain may hold (its overlay, the snapshot layers below it,
  // the template's image). Each snapshot adds one to its sandbox's chain, and a child of it
  // starts one deeper than it was; a snapshot that would pass this is refused, so that every
  // snapshot taken stays restorable (vmm::kMaxDiskChain, QEMU's 4096 descriptors).
  uint32_t max_disk_layers = 1024;
  // The only sizes ("<vcpus>x<MiB>") a template is kept for, besides the default size (empty:
  // any, up to max_template_sizes). Other sizes boot and keep nothing.
  std::set<std::string> template_sizes;
  // A template of a first-come size (no template_sizes) that no create used for this long, and
  // that no disk stands on, is removed. 0: kept. Stale templates (an image, QEMU or kernel
  // arguments changed) and those of sizes not kept go as soon as no disk stands on them.
  std::chrono::seconds template_idle{std::chrono::hours(24)};

  // How often the background thread checks expiries and VM health.
  std::chrono::milliseconds housekeeping_interval{500};
  // The threads that carry out what those checks find due (see ActionPool).
  ActionPool::Limits housekeeping_workers;
};

struct CreateRequest {
  std::string tenant;
  std::string template_name = "base";
  uint32_t cpus = 0;       // 0: default
  uint64_t memory_mb = 0;  // 0: default
  int64_t timeout_s = -1;  // -1: default
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> metadata;
  // Restore this snapshot (of the same tenant) instead of the template; cpus and memory_mb
  // are the snapshot's (0 or equal).
  std::string snapshot_id;
  int64_t idle_suspend_s = -1;  // -1: the node's default; 0: never
  std::string on_timeout;       // "delete" (default) or "suspend"
  bool auto_resume = false;     // see store::SandboxRecord::auto_resume
  // Its egress policy; nullopt: the snapshot's (when restoring one), else the node's default.
  std::optional<net::Policy> network;
};

// Whether the sandbox is suspended because it was idle (rather than by request or its timeout).
bool suspendedForIdleness(const store::SandboxRecord& rec);

struct SnapshotRequest {
  std::string tenant;
  std::string sandbox_id;
  std::string name;
  nlohmann::json metadata = nlohmann::json::object();
};

// A running sandbox's agent, for processes and files. Holding it does not keep the VM alive:
// if the sandbox is deleted meanwhile, calls fail with `unavailable`.
struct AgentLease {
  std::string sandbox_id;
  std::shared_ptr<agentproto::AgentClient> agent;
  bool resumed = false;  // the sandbox was suspended and this request resumed it
  // While any lease lives the sandbox counts as active (never idle-suspended); its release
  // marks the time of last activity.
  std::shared_ptr<void> activity;
};

// Which audit entries a read returns: the newest `limit` that match. Times are the entries'
// `time_ms` (the gateway's clock, ms since the epoch): `after_ms` for following a log (entries
// newer than the last one seen), `before_ms` for paging back.
struct NetworkLogFilter {
  size_t limit = 1000;
  std::optional<bool> allowed;  // only allowed (true) or denied (false) decisions
  std::string kind;             // "dns", "tcp", "gateway"; empty: all
  int64_t after_ms = -1;        // -1: no bound
  int64_t before_ms = -1;
};

// A connection into a sandbox's guest (shut down when the sandbox stops running); while
// `activity` lives the sandbox counts as active.
struct PortConnection {
  net::GuestConnection connection;
  std::shared_ptr<void> activity;
};

enum class ShutdownMode {
  kKeepRunning,  // VMs keep running; the next daemon re-adopts them
  kStop,         // VMs are powered off; their sandboxes are recorded as deleted
};

// Counters the metrics endpoint reads.
struct ManagerStats {
  std::map<std::string, int64_t> by_state;
  uint32_t reserved_vcpus = 0;
  uint64_t reserved_memory_mb = 0;  // of the host: guests' and, under TCG, translation buffers
  uint32_t max_total_vcpus = 0;
  uint64_t max_total_memory_mb = 0;
  size_t warm_pool_ready = 0;    // running guests waiting in the hot pool now
  size_t warm_pool_target = 0;   // what it is being filled to now, all kinds (0: no pool)
  uint32_t warm_pool_vcpus = 0;  // what the pool's guests hold of the node's capacity
  uint64_t warm_pool_memory_mb = 0;
  uint64_t snapshot_helpers_memory_mb = 0;      // held by the QEMUs making snapshots' memory files
  bool qemu_build_stale = false;                // vmm::QemuBuildWatch: a security update waits for make images
  uint64_t gateway_egress_refused_packets = 0;  // net::NetworkPool::egressRefusedPackets (0 without network)
  bool gateway_resolver_stale = false;          // net::NetworkPool::resolverStale
};

class SandboxManager {
 public:
  // Re-adopts or fails the sandboxes left by an earlier daemon, removes orphaned VM files and
  // processes, then starts the background thread.
  static Result<std::unique_ptr<SandboxManager>> start(ManagerConfig config, store::StateStore& store);
  ~SandboxManager();  // shutdown(kKeepRunning) unless shutdown() ran
  SandboxManager(const SandboxManager&) = delete;
  SandboxManager& operator=(const SandboxManager&) = delete;

  // Boots a sandbox and returns it running. Errors: kInvalidArgument (request), kNotFound
  // (template), kResourceExhausted (node limits), kUnavailable (the VM failed to boot; the
  // sandbox is then recorded as failed and its id named in the message).
  //
  // A VM whose guest QEMU stopped because the node's disk is full (its writes failed with
  // ENOSPC) becomes `paused` with a state_reason saying so; calls needing its agent answer
  // kResourceExhausted with that reason (exec calls in progress too, at once) until a resume
  // finds room again.
  Result<store::SandboxRecord> create(const CreateRequest& request);
  // kNotFound for unknown ids and for other tenants' sandboxes.
  Result<store::SandboxRecord> get(const std::string& tenant, const std::string& id);
  Result<store::SandboxPage> list(const store::ListFilter& filter);
  // Its egress policy (kFailedPrecondition on a node without networking).
  Result<net::Policy> networkPolicy(const std::string& tenant, const std::string& id);
  // Changes it: a running sandbox's gateway applies it from its next DNS answer or connection;
  // a suspended one gets it when it resumes.
  Status setNetworkPolicy(const std::string& tenant, const std::string& id, const net::Policy& policy);
  // A tenant's secret was created, rotated or deleted: every running sandbox of the tenant whose
  // credential rules name it gets the new value (or loses it) before this returns.
  void secretChanged(const std::string& tenant, const std::string& name);
  // The newest entries of its network audit log (JSON lines) that pass `filter`, oldest first.
  Result<std::vector<nlohmann::json>> networkLog(const std::string& tenant, const std::string& id,
                                                 const NetworkLogFilter& filter);
  // Kills the VM, removes its files, records `deleted` (reason "deleted by request").
  Status remove(const std::string& tenant, const std::string& id);
  // running -> paused: the vCPUs stop, memory stays resident (QMP stop). The hard timeout
  // keeps running while paused.
  Result<store::SandboxRecord> pause(const std::string& tenant, const std::string& id);
  // paused -> running (QMP cont; re-attaches the agent if needed, e.g. after a daemon restart);
  // suspended -> running (restores the saved guest into a new QEMU; needs the node's capacity).
  Result<store::SandboxRecord> resume(const std::string& tenant, const std::string& id);
  // running|paused -> suspended: device state and RAM saved next to its disk, QEMU exits, no
  // host memory or reservation is held. On failure (e.g. disk full) nothing partial is kept
  // and the sandbox keeps running. Exec and file calls resume a suspended sandbox on demand.
  Result<store::SandboxRecord> suspend(const std::string& tenant, const std::string& id);
  // A saved point of a running or paused sandbox, which stays as it was. kFailedPrecondition
  // (invalid_state) in other states, kResourceExhausted when the disk is full (nothing kept).
  Result<store::SnapshotRecord> snapshot(const SnapshotRequest& request);
  Result<store::SnapshotRecord> getSnapshot(const std::string& tenant, const std::string& snapshot_id);
  Result<store::SnapshotPage> listSnapshots(const store::SnapshotFilter& filter);
  // Children already branched from it keep working: its disk layer stays while they use it.
  Status deleteSnapshot(const std::string& tenant, const std::string& snapshot_id);
  // `count` sandboxes restored from request.snapshot_id, all running, or none (the ones made
  // are deleted again and the first error returned).
  Result<std::vector<store::SandboxRecord>> branch(const CreateRequest& request, uint32_t count);
  // What it cost the host between start_ms and end_ms (unix ms), sampled every 5 s while it
  // ran (the last hour's; a suspended sandbox adds none). kNotFound for others' sandboxes.
  Result<std::vector<MetricSample>> metrics(const std::string& tenant, const std::string& id, int64_t start_ms,
                                            int64_t end_ms);
  // The newest sample of every sandbox that has one (those that ran within the last interval or
  // so), for the node's Prometheus series.
  struct SandboxUsage {
    std::string tenant;
    std::string id;
    MetricSample sample;
  };
  std::vector<SandboxUsage> latestMetrics();
  // The tenant's quota (its own values over the node's defaults) and its usage.
  Result<TenantQuotaReport> quotaReport(const std::string& tenant);
  // The tenant's own values (spaced tenant quota); nullopt where it has none.
  Result<std::optional<store::TenantQuotaRecord>> ownQuota(const std::string& tenant);
  // Sets the hard timeout to now + timeout_s.
  Result<store::SandboxRecord> setTimeout(const std::string& tenant, const std::string& id, int64_t timeout_s);

  // The agent of a running sandbox (kFailedPrecondition naming the state otherwise). A suspended
  // sandbox is resumed first unless `may_resume` is false (a background poll, which must not
  // undo a suspend): then it is kFailedPrecondition too.
  Result<AgentLease> agent(const std::string& tenant, const std::string& id, std::string_view operation,
                           bool may_resume = true);
  // A TCP connection to `port` of a running sandbox's guest (ingress), resuming a suspended
  // one as agent() does. kUnavailable when nothing listens there; kFailedPrecondition on a
  // node without networking, for a sandbox without a NIC, or in a state without a guest.
  // `may_resume` false: a suspended sandbox is refused (kFailedPrecondition), not resumed.
  Result<PortConnection> connectPort(const std::string& tenant, const std::string& id, uint16_t port,
                                     Clock::time_point deadline, bool may_resume);
  // The tenant of sandbox `id` (kNotFound if there is none, or it is deleted): for requests
  // that prove access to one sandbox rather than carry a tenant's key (ingress).
  Result<std::string> ownerOf(const std::string& id);
  // (id, tenant) of every sandbox that holds a VM now (running or paused), all tenants: for a
  // request that proves access to one sandbox by a token it must be matched against (E2B's
  // signed file URLs).
  std::vector<std::pair<std::string, std::string>> liveSandboxes();
  // A call through a lease failed with `unavailable`: checks whether the VM died, and if so
  // records the sandbox as failed. Returns the error to give the client.
  Error agentFailed(const AgentLease& lease, const Error& error);
  // The tail of the guest console.
  Result<std::string> consoleLog(const std::string& tenant, const std::string& id, size_t max_bytes);

  ManagerStats stats();
  const ManagerConfig& config() const { return config_; }

  void shutdown(ShutdownMode mode);

  struct Live;

 private:
  SandboxManager(ManagerConfig config, store::StateStore& store) : config_(std::move(config)), store_(store) {}
  Status recover();
  void housekeeping();
  // What housekeeping found due for a sandbox; decided on its thread, done by actions_.
  enum class Due { kNothing, kTimeout, kIdle, kVmExited, kStopReported, kGatewayExited, kGatewayOutdated };
  Due dueFor(Live& live, int64_t now_ms);  // `control` held; never waits
  // Adds a metrics sample of a running sandbox, at most every kMetricsIntervalMs (under its control lock).
  void sampleMetrics(Live& live, int64_t now_ms);
  static constexpr int64_t kMetricsIntervalMs = 5000;
  // A guest's own figures: how long its agent has to answer, and for how long an answer counts.
  static constexpr int64_t kGuestStatsTimeoutMs = 2000;
  static constexpr size_t kGuestStatsMaxBytes = 4096;
  static constexpr int64_t kGuestStatsMaxAgeMs = 2 * kMetricsIntervalMs + kGuestStatsTimeoutMs;
  void checkOne(const std::shared_ptr<Live>& live, int64_t now_ms);
  void act(const std::shared_ptr<Live>& live, Due due);
  // The guest stopped on a disk error: recorded paused with why, agent calls ended. `control` held.
  void markDiskStopped(Live& live, const std::string& error);
  // Ends a sandbox that holds a VM: destroys the VM, records `to` with `reason`, frees its reservation.
  Status finish(const std::shared_ptr<Live>& live, SandboxState to, const std::string& reason);
  Result<std::shared_ptr<Live>> findLive(const std::string& tenant, const std::string& id);
  // Under the sandbox's `control`: its gateway gets the current values of the secrets its policy's
  // credential rules name. A sandbox without a network, or without rules, needs nothing.
  // Gives the sandbox's gateway the values of its rules' secrets, and its credential CA when it
  // has rules (live.credential_ca_cert then says what the guest must trust).
  Status syncCredentials(Live& live);
  // Has the guest trust its credential CA (the agent adds it to the system bundle and points
  // Node, Python and pip at it); nothing when it has none.
  Status installCredentialCa(Live& live);
  Result<store::SandboxRecord> getOwned(const std::string& tenant, const std::string& id);
  Result<store::SandboxRecord> resumeSuspended(const store::SandboxRecord& rec);
  enum class SuspendCause { kRequest, kIdle, kTimeout };
  // The suspension itself, with `live->control` held.
  Result<store::SandboxRecord> suspendLocked(const std::shared_ptr<Live>& live, SuspendCause cause);
  std::shared_ptr<Live> liveFromRecord(const store::SandboxRecord& rec) const;
  // Removes disk layers that no sandbox disk and no snapshot stands on any more. Without
  // `wait` it gives up (for a later round) if the storage lock is busy.
  void collectLayers(bool wait);
  std::string snapshotDir(const std::string& snapshot_id) const;
  // The node's limits, in one place: counts the sandbox in (live_ and the reservations) if it
  // fits, else the refusal (429/503 reasons). unreserve() undoes it. The hot pool's guests
  // count against the node too, but give way: a sandbox that fits only without some of them
  // takes their capacity back (their claims); those waiting are killed before this returns,
  // those being made stop at their maker's next step.
  // `from_pool`: the claim of the pooled guest this sandbox becomes; its capacity moves to the
  // sandbox's reservation.
  class PoolClaim;
  Status reserve(const std::shared_ptr<Live>& live, CapacityClaim* from_pool = nullptr);
  // The node's capacity for one more waiting guest of `key`, or kResourceExhausted with reason
  // kNoCapacityReason. Given back when the claim goes (with its guest).
  Result<std::unique_ptr<CapacityClaim>> claimForPool(const PoolKey& key);
  // reserve()'s decision under mu_; `revoked`: how many pooled guests gave their capacity.
  Status reserveLocked(const std::shared_ptr<Live>& live, const TenantQuota& quota, PoolClaim* from_pool,
                       size_t& revoked);
  // Under mu_, once something was counted in: takes back as many pooled guests' claims as the
  // node needs to be within its limits again, and says how many (the pool's prune() kills the
  // waiting ones).
  size_t takeBackPoolCapacityLocked();
  // The memory of the helper QEMU that makes a snapshot's memory file (sized like its sandbox;
  // its vCPUs never run, so it holds none): counted against the node's memory (pooled guests
  // give way) and against the tenant's: its helpers hold at most what its sandboxes hold. The
  // node counts `qemu_mb` too (the helper QEMU's own memory and translation buffer), the tenant
  // only its guest.
  // Given back when the guard goes; else the refusal (insufficient_capacity, tenant_quota).
  Result<std::shared_ptr<void>> reserveSnapshotHelper(const std::string& tenant, const std::string& sandbox_id,
                                                      uint64_t memory_mb, uint64_t qemu_mb);
  void releasePoolClaim(PoolClaim& claim);
  // Under mu_: whether the claim's guest is made and waiting, and whether a create took it.
  void setPoolClaim(CapacityClaim* claim, bool ready, bool taken);
  // The quota that applies to `tenant`: the values it was given (store), else the node's. Read
  // on every check, so `spaced tenant quota` takes effect on a running daemon at once.
  // `own_values`, if given, says whether the tenant has values of its own.
  Result<TenantQuota> quotaOf(const std::string& tenant, bool* own_values = nullptr);
  // The disk a tenant's suspended sandboxes take (their run dirs' allocated bytes).
  Result<uint64_t> suspendedBytes(const std::string& tenant);
  // A sandbox's hard timeout, whether at create or set later: one bound, one message.
  Status checkTimeout(int64_t timeout_s) const;
  void unreserve(const Live& live);
  void countIn(const std::shared_ptr<Live>& live);  // `mu_` held
  // A place in the tenant's snapshot quota while one is taken (released with the guard), or
  // the refusal (tenant_quota).
  Result<std::shared_ptr<void>> claimSnapshotPlace(const std::string& tenant, uint64_t estimate_bytes);
  // Bytes of disk layers whose snapshots are deleted but that `tenant`'s sandboxes or snapshots
  // still stand on (a child branched from a snapshot keeps its layer; a later snapshot keeps the
  // one frozen before it): counted with its snapshots' bytes, or loops of snapshot, branch or
  // snapshot again, delete would pile up layers no quota sees.
  Result<uint64_t> strandedLayerBytes(const std::string& tenant);
  void expireSuspended(int64_t now_ms);
  void expireOneSuspended(const store::SandboxRecord& row, int64_t now_ms);
  // A child is opening snapshot `id`'s files: deleteSnapshot(id) waits until the returned
  // guard is gone. kNotFound if the snapshot is being deleted.
  Result<std::shared_ptr<void>> openSnapshotFiles(const std::string& id);
  // pause/resume: moves a live sandbox between running and paused.
  Result<store::SandboxRecord> changeRunState(const std::string& tenant, const std::string& id, SandboxState to);
  std::string sandboxDir(const std::string& id) const;
  // A deleted sandbox's network files (policy, audit log).
  void removeNetworkFiles(const std::string& id) const;

  ManagerConfig config_;
  store::StateStore& store_;
  std::unique_ptr<snapshot::TemplateCache> templates_;
  std::unique_ptr<Launcher> launcher_;  // how every VM here is started
  std::unique_ptr<vmm::QemuBuildWatch> qemu_build_;
  Result<WarmVm> makeWarmVm(const PoolKey& key);

  std::mutex mu_;  // guards live_ and the reservations
  std::map<std::string, std::shared_ptr<Live>> live_;
  struct PendingSuspends {
    uint32_t count = 0;
    uint64_t bytes = 0;  // estimated: their guests' memory and their disks as they are
  };
  std::map<std::string, PendingSuspends> suspending_;  // guarded by mu_: suspends under way, per tenant
  uint32_t reserved_vcpus_ = 0;
  uint64_t reserved_memory_mb_ = 0;
  // What a new VM whose guest has `guest_mb` holds of the node's memory: that, its QEMU's own
  // memory and, under the node's TCG, its translation buffer (vmm::qemuShareMib; set once at
  // start). The node's counts (reserved_*, helper_*, pooled_*) are of such shares (a sandbox's:
  // Live::qemu_mb, its own VM's); a tenant's usage and its helpers' count its guests' memory only.
  uint64_t vm_qemu_mb_ = 0;
  uint64_t nodeShareMb(uint64_t guest_mb) const { return guest_mb + vm_qemu_mb_; }
  // What snapshots' helper QEMUs hold now, on the node (host memory) and per tenant (guests').
  uint64_t helper_memory_mb_ = 0;
  // Under mu_: the node's memory that nothing gives back on demand (sandboxes and helpers);
  // pooled guests' comes on top and gives way.
  uint64_t memoryHeldLocked() const { return reserved_memory_mb_ + helper_memory_mb_; }
  std::map<std::string, uint64_t> tenant_helper_memory_mb_;
  // What the hot pool's guests hold (their claims' sizes), and the claims, oldest first.
  uint32_t pooled_vcpus_ = 0;
  uint64_t pooled_memory_mb_ = 0;
  std::list<PoolClaim*> pool_claims_;
  // After mu_ and the claims: it goes first, and a guest it still held gives its claim back to
  // a manager that is still whole.
  std::unique_ptr<WarmPool> pool_;
  struct TenantUsage {
    uint32_t sandboxes = 0;
    uint32_t vcpus = 0;
    uint64_t memory_mb = 0;
  };
  std::map<std::string, TenantUsage> tenant_usage_;  // tenants holding VMs now
  struct PendingSnapshots {
    uint32_t count = 0;
    uint64_t bytes = 0;  // estimated: their guests' memory
  };
  std::map<std::string, PendingSnapshots> snapshots_pending_;  // snapshots being taken, per tenant
  // One quota claim (a snapshot's or a suspend's place) of a tenant decided or released at a
  // time: a place released between a claim's read of the store and its check would make the
  // read stale. Per tenant, since the reads walk the tenant's own files (as many as it made):
  // one tenant's claims never wait for another's.
  std::shared_ptr<std::mutex> quotaClaimsLock(const std::string& tenant);
  std::mutex quota_claims_mu_;  // guards the map below
  std::map<std::string, std::weak_ptr<std::mutex>> quota_claims_;

  // Disk layers: shared while one is being made or a new disk made over one (a snapshot's
  // capture, a child's overlay), exclusive to sweep them. Only the sweep takes it exclusively,
  // and while spaced runs only with try_lock, so no request ever waits behind a capture for it.
  std::shared_mutex layers_mu_;
  // Which backing names a layer walk follows: the node's own disks only (a QEMU can write any
  // name into its overlay's header; vmm::isNodeDiskPath).
  std::function<bool(const std::string&)> nodeDisk() const;
  std::mutex collect_mu_;  // one collectLayers round at a time (taken before layers_mu_)
  std::atomic<bool> layers_dirty_{false};
  // Children opening a snapshot's files (QEMU starting, the state loading), per snapshot, and
  // snapshots being deleted. Deleting one waits only for its own children to have opened its
  // files, never for a guest to answer; no new child starts from it meanwhile.
  std::mutex snapshot_use_mu_;
  std::condition_variable snapshot_unused_;
  std::map<std::string, int> snapshot_openers_;
  std::set<std::string> snapshots_deleting_;

  std::mutex wake_mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::unique_ptr<ActionPool> actions_;
  std::thread housekeeper_;
};

// "sb_" + 20 random lowercase alphanumerics.
std::string newSandboxId();
// "snap_" + 20 random lowercase alphanumerics.
std::string newSnapshotId();
int64_t nowMs();

}  // namespace space::sandbox
