#include "sandbox/manager.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/bounded_json.h"
#include "common/digest.h"
#include "common/fault.h"
#include "common/fs.h"
#include "common/scope_guard.h"
#include "jail/cgroup.h"
#include "net/tls_ca.h"
#include "sandbox/manager_internal.h"
#include "vmm/node_facts.h"

namespace space::sandbox {

using std::chrono::milliseconds;
using namespace internal;

namespace {

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

std::string SandboxManager::sandboxDir(const std::string& id) const { return config_.data_dir + "/sandboxes/" + id; }

namespace {
Error noNetwork() {
  return makeError(ErrorCode::kFailedPrecondition, "this node gives sandboxes no network (spaced --network off)",
                   "no_network");
}
}  // namespace

Result<net::Policy> SandboxManager::networkPolicy(const std::string& tenant, const std::string& id) {
  if (!config_.network) return noNetwork();
  auto rec = getOwned(tenant, id);
  if (!rec.ok()) return rec.error();
  auto policy = net::NetworkPool::readPolicy(net::NetworkPool::gatewayDir(config_.data_dir + "/network/" + id));
  if (!policy.ok()) return policy.error();
  return policy.value() ? *policy.value() : config_.default_policy;
}

Status SandboxManager::syncCredentials(Live& live) {
  net::SandboxNetwork* network = live.runtime ? live.runtime->network() : nullptr;
  if (network == nullptr) return okStatus();
  auto policy = net::NetworkPool::readPolicy(net::NetworkPool::gatewayDir(network->stateDir()));
  if (!policy.ok()) return policy.error();
  std::map<std::string, std::string> values;
  size_t total = 0;
  // A gateway's values together (its file must stay small: it lives in the host's /run).
  constexpr size_t kMaxCredentialBytes = 1 << 20;
  if (policy.value() && config_.secrets != nullptr) {
    for (const std::string& name : net::credentialSecretNames(*policy.value())) {
      auto value = config_.secrets->reveal(live.tenant, name);
      if (value.ok()) {
        total += value->size();
        values.emplace(name, std::move(value.value()));
      } else if (value.error().code != ErrorCode::kNotFound) {
        // A deleted secret just leaves its rule without a value (the gateway refuses to send
        // such requests); one that cannot be read is the node's problem, said loudly.
        return makeError(value.error().code, "sandbox " + live.id + ": " + value.error().message);
      }
    }
  }
  // Its own authority, made again from the node key whenever it is needed: the same for this
  // sandbox after a restart or a resume, another for every other sandbox (a branch's children too).
  std::optional<net::CaMaterial> ca;
  if (policy.value() && !policy.value()->credentials.empty() && config_.secrets != nullptr) {
    auto seed = config_.secrets->credentialCaSeed(live.id);
    auto made = net::deriveCredentialCa(seed, live.id);
    explicit_bzero(seed.data(), seed.size());
    if (!made.ok()) {
      for (auto& [name, value] : values) explicit_bzero(value.data(), value.size());
      return makeError(made.error().code, "sandbox " + live.id + ": " + made.error().message);
    }
    ca = std::move(made.value());
  }
  std::map<std::string, std::string> placeholders;  // what the guest sees -> the secret
  std::map<std::string, std::string> env;           // the guest's env var -> what it sees
  if (policy.value() && config_.secrets != nullptr) {
    for (const auto& [var, secret] : policy.value()->placeholders) {
      std::string seen = config_.secrets->placeholderFor(live.id, secret);
      placeholders[seen] = secret;
      env[var] = std::move(seen);
    }
  }
  Status written = total > kMaxCredentialBytes ? makeError(ErrorCode::kInvalidArgument,
                                                           "the secrets its credential rules name hold more than " +
                                                               std::to_string(kMaxCredentialBytes) + " bytes together")
                                               : network->setCredentials(values, ca ? &*ca : nullptr, placeholders);
  for (auto& [name, value] : values) explicit_bzero(value.data(), value.size());
  live.credential_ca_cert = ca ? ca->cert_pem : std::string();
  live.credential_env = std::move(env);
  if (ca) explicit_bzero(ca->key_pem.data(), ca->key_pem.size());
  return written;
}

Status SandboxManager::installCredentialCa(Live& live) {
  if (live.credential_ca_cert.empty() || !live.runtime) return okStatus();
  auto installed = live.vm().agent().call(
      "/agent.Agent/Configure", {{"credentialCa", live.credential_ca_cert}, {"credentialEnv", live.credential_env}});
  if (!installed.ok()) {
    return makeError(installed.error().code,
                     "sandbox " + live.id + ": its guest did not take its credential CA: " + installed.error().message);
  }
  return okStatus();
}

void SandboxManager::secretChanged(const std::string& tenant, const std::string& name) {
  std::vector<std::shared_ptr<Live>> lives;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, live] : live_) {
      if (live->tenant == tenant) lives.push_back(live);
    }
  }
  for (const auto& live : lives) {
    std::lock_guard control(live->control);
    if (live->finished || !live->runtime || live->runtime->network() == nullptr) continue;
    auto policy = net::NetworkPool::readPolicy(net::NetworkPool::gatewayDir(live->runtime->network()->stateDir()));
    if (!policy.ok() || !policy.value()) continue;
    auto names = net::credentialSecretNames(*policy.value());
    if (std::find(names.begin(), names.end(), name) == names.end()) continue;
    if (auto synced = syncCredentials(*live); !synced.ok()) {
      // Never the old value: without the file the gateway sends nothing for these rules.
      live->runtime->network()->dropCredentials();
      spdlog::error("sandbox {}: its gateway lost its secret values (its credential rules now get 502): {}", live->id,
                    synced.error().message);
    } else {
      spdlog::info("sandbox {}: its gateway has the current value of secret {}", live->id, name);
    }
  }
}

Status SandboxManager::setNetworkPolicy(const std::string& tenant, const std::string& id, const net::Policy& policy) {
  if (!config_.network) return noNetwork();
  auto live = findLive(tenant, id);
  if (live.ok()) {
    std::lock_guard control(live.value()->control);
    if (!live.value()->finished && live.value()->runtime && live.value()->runtime->network() != nullptr) {
      SPACE_TRY(live.value()->runtime->network()->setPolicy(policy));
      if (auto synced = syncCredentials(*live.value()); !synced.ok()) {
        // The policy is in force: its rules get no values rather than the previous policy's.
        live.value()->runtime->network()->dropCredentials();
        return synced.error();
      }
      // The policy is in force either way: a guest that will not take the CA only fails its own
      // TLS to the rules' hosts, which is no reason to report the change as not made.
      if (live.value()->state == SandboxState::kRunning) {
        if (auto installed = installCredentialCa(*live.value()); !installed.ok()) {
          spdlog::warn("sandbox {}: {}", id, installed.error().message);
        }
      }
      spdlog::info("sandbox {}: network policy set ({})", id, net::toJson(policy).dump());
      return okStatus();
    }
  }
  auto rec = getOwned(tenant, id);
  if (!rec.ok()) return rec.error();
  if (rec->state != stateName(SandboxState::kSuspended)) {
    return makeError(ErrorCode::kFailedPrecondition, "sandbox " + id + " is " + rec->state);
  }
  // Root's until its next gateway starts there (attach gives it the gateway's uid).
  const std::string dir = net::NetworkPool::gatewayDir(config_.data_dir + "/network/" + id);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  SPACE_TRY(net::NetworkPool::writePolicy(dir, policy));
  spdlog::info("sandbox {}: network policy set while suspended ({})", id, net::toJson(policy).dump());
  return okStatus();
}

Result<std::vector<nlohmann::json>> SandboxManager::networkLog(const std::string& tenant, const std::string& id,
                                                               const NetworkLogFilter& filter) {
  if (!config_.network) return noNetwork();
  auto rec = getOwned(tenant, id);
  if (!rec.ok()) return rec.error();
  // The gateway bounds the file (it rotates it); the tail read here is bounded again.
  std::string tail = net::NetworkPool::readAudit(config_.data_dir + "/network/" + id, 4 << 20);
  std::vector<nlohmann::json> entries;
  std::string_view text = tail;
  size_t end = text.size();
  // The file is the gateway's (a compromised one could write anything): fields are read as
  // their types or not at all.
  auto matches = [&](const nlohmann::json& e) {
    const auto time = e.find("time_ms");
    const int64_t ms = time != e.end() && time->is_number_integer() ? time->get<int64_t>() : -1;
    if (filter.after_ms >= 0 && ms <= filter.after_ms) return false;
    if (filter.before_ms >= 0 && (ms < 0 || ms >= filter.before_ms)) return false;
    if (filter.allowed) {
      const auto allowed = e.find("allowed");
      if (allowed == e.end() || !allowed->is_boolean() || allowed->get<bool>() != *filter.allowed) return false;
    }
    if (!filter.kind.empty()) {
      const auto kind = e.find("kind");
      if (kind == e.end() || !kind->is_string() || kind->get<std::string>() != filter.kind) return false;
    }
    return true;
  };
  while (end > 0 && entries.size() < filter.limit) {
    size_t start = text.rfind('\n', end - 1);
    size_t from = start == std::string_view::npos ? 0 : start + 1;
    auto line = text.substr(from, end - from);
    auto parsed = parseJsonBounded(line);
    if (parsed.ok() && parsed->is_object() && matches(parsed.value())) entries.push_back(std::move(parsed.value()));
    if (start == std::string_view::npos) break;
    end = start;
  }
  std::reverse(entries.begin(), entries.end());
  return entries;
}

void SandboxManager::removeNetworkFiles(const std::string& id) const {
  if (!config_.network) return;
  std::error_code ec;
  std::filesystem::remove_all(config_.data_dir + "/network/" + id, ec);
}

std::string SandboxManager::snapshotDir(const std::string& snapshot_id) const {
  return config_.data_dir + "/snapshots/" + snapshot_id;
}

std::shared_ptr<SandboxManager::Live> SandboxManager::liveFromRecord(const store::SandboxRecord& rec) const {
  auto live = std::make_shared<Live>();
  live->id = rec.id;
  live->tenant = rec.tenant;
  live->cpus = rec.cpus;
  live->memory_mb = rec.memory_mb;
  live->qemu_mb = vmm::qemuShareMib(launcher_->recordedAccelerator(rec), launcher_->facts().tcg_tb_size_mib);
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
  // Resolved once: no create probes /dev/kvm, walks PATH or calibrates anything.
  auto facts = vmm::probeNodeFacts(config.accelerator, config.qemu_binary);
  if (!facts.ok()) return facts.error();
  facts->tsc_khz = vmm::rememberedTscKhz(config.data_dir + "/node-tsc.json", facts->tsc_khz);
  // The node's own disks: what layer walks follow and what a jail's view may hold.
  facts->disk_roots = {config.data_dir + "/layers", config.data_dir + "/templates"};
  for (const auto& [name, tpl] : config.templates) {
    std::error_code ec;
    facts->disk_images.push_back(std::filesystem::absolute(tpl.rootfs_path, ec).string());
    if (auto image = std::filesystem::canonical(tpl.rootfs_path, ec); !ec) facts->disk_images.push_back(image);
  }
  facts->disk_images.insert(facts->disk_images.end(), config.base_images.begin(), config.base_images.end());
  facts->disk_io_per_vcpu = config.disk_io_per_vcpu;
  facts->tcg_tb_size_mib = config.tcg_tb_size_mib;
  if (!config.jailer.empty()) {
    facts->jailer = config.jailer;
    if (config.vm_uid_base != 0) {
      auto users = vmm::VmUsers::create(config.vm_uid_base, kVmUidCount);
      if (!users.ok()) return users.error();
      SPACE_TRY(users.value()->checkNoAccount());
      // Said now rather than as every VM's failure to boot: its uid reads the images.
      for (const auto& [name, tpl] : config.templates) {
        for (const std::string& path : {tpl.kernel_path, tpl.rootfs_path}) {
          struct stat st {};
          if (::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IROTH) == 0) {
            return makeError(ErrorCode::kFailedPrecondition,
                             path + " (template " + name + ") is not readable by other users, and each QEMU runs as " +
                                 "a uid of its own (--vm-uid-base): chmod o+r it");
          }
        }
      }
      facts->vm_users = users.value();
    }
    // Named by data dir, like network slots: two daemons on one host never sweep each other's.
    auto cgroups = jail::setUpCgroups("spaced-" + sha256Hex(config.data_dir).substr(0, 8));
    if (cgroups.ok()) {
      facts->cgroups = cgroups.value();
      // Groups of VMs that ended while no spaced watched them; those of running VMs stay.
      const int stale = jail::removeEmptyVmGroups(facts->cgroups);
      spdlog::info("spaced: VMs start through {} in cgroups ({}) under {}{}{}", config.jailer,
                   jail::cgroupVersionName(facts->cgroups.version), facts->cgroups.roots.front().dir,
                   facts->cgroups.io ? "" : " (no I/O controller: QEMU's own disk I/O is not limited)",
                   stale > 0 ? " (" + std::to_string(stale) + " left over removed)" : std::string());
      // Before recovery, which adopts gateways (and replaces those outside their groups).
      if (config.network) {
        if (auto used = config.network->useCgroups(facts->cgroups); used.ok()) {
          spdlog::info("spaced: gateways run in cgroups of their own ({}% of a core, {} MiB, one task each)",
                       config.network->options().gateway_cpu_percent, config.network->options().gateway_memory_mb);
        } else if (config.require_cgroups) {
          return makeError(used.error().code, "gateways cannot get cgroups: " + used.error().message);
        } else {
          spdlog::warn("spaced: gateways run without cgroups (no CPU or memory limit of their own): {}",
                       used.error().message);
        }
      }
    } else if (config.require_cgroups) {
      return makeError(ErrorCode::kFailedPrecondition, "--jail on: VMs cannot get cgroups: " + cgroups.error().message);
    } else {
      spdlog::warn("spaced: VMs start through {} without cgroups (no memory, task or CPU limit per VM): {}",
                   config.jailer, cgroups.error().message);
    }
  } else {
    spdlog::warn("spaced: --jail off: QEMU starts unconfined (only its own seccomp filter)");
  }
  if (config.max_total_vcpus == 0) config.max_total_vcpus = 4 * facts->max_vcpus;
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
  manager->templates_ = std::make_unique<snapshot::TemplateCache>(
      manager->config_.data_dir + "/templates", manager->config_.max_template_sizes, manager->config_.template_sizes);
  manager->launcher_ = std::make_unique<Launcher>(
      Launcher::Config{manager->config_.templates, manager->config_.boot_timeout, manager->config_.use_snapshots,
                       manager->config_.network, manager->config_.data_dir + "/network",
                       manager->config_.default_policy},
      std::move(facts.value()), *manager->templates_);
  manager->templates_->setNetnsSource([l = manager->launcher_.get()] { return l->helperNetns(); });
  manager->vm_qemu_mb_ =
      vmm::qemuShareMib(manager->launcher_->accelerator(), manager->launcher_->facts().tcg_tb_size_mib);
  spdlog::info(
      "spaced: each VM's share of the node's {} MB is its guest's memory and {} MiB for its QEMU ({} MiB of "
      "its own{})",
      manager->config_.max_total_memory_mb, manager->vm_qemu_mb_, vmm::kQemuOwnMemoryMib,
      manager->vm_qemu_mb_ > vmm::kQemuOwnMemoryMib
          ? ", " + std::to_string(manager->vm_qemu_mb_ - vmm::kQemuOwnMemoryMib) +
                " MiB for its translation buffer, --tcg-tb-mib"
          : std::string());
  if (manager->nodeShareMb(manager->config_.max_memory_mb) > manager->config_.max_total_memory_mb) {
    spdlog::warn(
        "spaced: a sandbox of --max-sandbox-memory-mb {} MB holds {} MB of the node's memory with its QEMU, "
        "more than --max-memory-mb {}: sandboxes that large are refused (insufficient_capacity)",
        manager->config_.max_memory_mb, manager->nodeShareMb(manager->config_.max_memory_mb),
        manager->config_.max_total_memory_mb);
  }
  // Warns now, and again from housekeeping if a security update lands while the node runs.
  manager->qemu_build_ = std::make_unique<vmm::QemuBuildWatch>(manager->launcher_->facts().qemu_binary);
  (void)manager->qemu_build_->check();
  SPACE_TRY(manager->recover());
  if (const auto& users = manager->launcher_->facts().vm_users) {
    if (size_t n = users->killStrangers(manager->config_.data_dir); n > 0) {
      spdlog::warn("spaced: killed {} process(es) running as VM uids that no adopted VM holds", n);
    }
  }
  // Recovery killed the QEMUs it could not adopt: their groups are empty now.
  if (const auto& cgroups = manager->launcher_->facts().cgroups; cgroups.usable()) {
    if (int n = jail::removeEmptyVmGroups(cgroups); n > 0) spdlog::info("spaced: removed {} empty VM cgroup(s)", n);
  }
  // After recovery: the slots of re-adopted sandboxes are taken, every other one of ours is a
  // leftover of an earlier run and is removed.
  if (manager->config_.network) SPACE_TRY(manager->config_.network->start({}));
  // From here a failure returns through ~SandboxManager, which stops whatever was started.
  auto actions = ActionPool::start(manager->config_.housekeeping_workers);
  if (!actions.ok()) return actions.error();
  manager->actions_ = std::move(actions.value());
  auto housekeeper = startThread("housekeeping.thread", [m = manager.get()] { m->housekeeping(); });
  if (!housekeeper.ok()) return housekeeper.error();
  manager->housekeeper_ = std::move(housekeeper.value());
  if (manager->config_.use_snapshots && manager->config_.warm_pool_size > 0) {
    PoolSizerConfig sizing;
    sizing.default_key = {"base", manager->config_.default_cpus, manager->config_.default_memory_mb};
    sizing.default_min = manager->config_.templates.count("base") ? manager->config_.warm_pool_size : 0;
    sizing.budget_mb = manager->config_.warm_pool_budget_mb;
    sizing.vm_qemu_mb = manager->vm_qemu_mb_;
    sizing.budget_cpus = manager->config_.warm_pool_budget_cpus != 0 ? manager->config_.warm_pool_budget_cpus
                                                                     : manager->launcher_->facts().max_vcpus;
    auto pool =
        WarmPool::start(std::move(sizing), [m = manager.get()](const PoolKey& key) { return m->makeWarmVm(key); });
    if (!pool.ok()) return pool.error();
    manager->pool_ = std::move(pool.value());
  }
  return manager;
}

SandboxManager::~SandboxManager() { shutdown(ShutdownMode::kKeepRunning); }

Result<WarmVm> SandboxManager::makeWarmVm(const PoolKey& key) {
  auto tpl = launcher_->findTemplate(key.template_name);
  if (!tpl.ok()) return tpl.error();
  // Its share of the node first: a pool never holds capacity that sandboxes have.
  auto claim = claimForPool(key);
  if (!claim.ok()) return claim.error();
  WarmVm warm;
  warm.claim = std::move(claim.value());
  warm.sandbox_id = newSandboxId();
  auto launch = launcher_->fromTemplate(*tpl.value(), key.cpus, key.memory_mb, sandboxDir(warm.sandbox_id));
  if (!launch.ok()) return launch.error();
  // A sandbox may take the claim's capacity back while the guest is made: the making stops at
  // its next step (the VM goes with `runtime`).
  auto given_way = [] {
    return makeError(ErrorCode::kResourceExhausted, "a sandbox took its capacity while it started", kGivenWayReason);
  };
  auto runtime = SandboxRuntime::start(launch.value());
  if (!runtime.ok()) return runtime.error();
  if (!warm.claim->held()) return given_way();
  auto& agent = runtime.value()->vm().agent();
  // Its own random state at once: a clone of the template must never hand out the template's
  // randomness, not even to a warm-up command. (The create gives it fresh entropy again.)
  auto seeded = agent.call("/agent.Agent/Configure", nlohmann::json{{"timeMs", nowMs()}, {"entropy", freshEntropy()}});
  if (!seeded.ok()) return makeError(seeded.error().code, "warm pool: configure: " + seeded.error().message);
  if (!warm.claim->held()) return given_way();
  // The guest code on the exec path (the agent's process start, bash's start-up) is translated
  // now, under TCG, rather than on the new sandbox's first exec.
  for (bool shell : {true, false}) {
    agentproto::CommandSpec warm_up;
    if (shell) {
      warm_up.command = "true";
    } else {
      warm_up.argv = {"true"};
    }
    warm_up.timeout = config_.boot_timeout;
    auto ran = agentproto::runCommand(agent, warm_up, 4096);
    if (!ran.ok()) return makeError(ran.error().code, "warm pool: warm-up: " + ran.error().message);
  }
  if (!warm.claim->held()) return given_way();
  warm.runtime = std::move(runtime.value());
  setPoolClaim(warm.claim.get(), true, false);  // waiting: the first to give way
  return warm;
}

// --- bounds --------------------------------------------------------------------------------

Status SandboxManager::checkTimeout(int64_t timeout_s) const {
  if (timeout_s < 1 || timeout_s > config_.max_timeout_s) {
    return makeError(ErrorCode::kInvalidArgument, "timeout_s = " + std::to_string(timeout_s) + ": must be within 1.." +
                                                      std::to_string(config_.max_timeout_s));
  }
  return okStatus();
}

// --- node limits ---------------------------------------------------------------------------

Result<TenantQuota> SandboxManager::quotaOf(const std::string& tenant, bool* own_values) {
  TenantQuota quota = config_.tenant_quota;
  if (own_values != nullptr) *own_values = false;
  auto own = store_.getTenantQuota(tenant);
  if (!own.ok()) {
    if (own.error().code == ErrorCode::kNotFound) return quota;
    return own.error();  // a quota that cannot be read is not waived
  }
  if (own_values != nullptr) *own_values = true;
  for (const auto* v : {&own->max_sandboxes, &own->max_vcpus, &own->max_memory_mb, &own->max_snapshots,
                        &own->max_snapshot_mb, &own->max_suspended, &own->max_suspended_mb}) {
    if (v->has_value() && **v < 0) {
      return makeError(ErrorCode::kInternal, "the stored quota of tenant " + tenant + " holds a negative value");
    }
  }
  // Values beyond a field's range are no limit the node could reach anyway: saturate.
  auto narrow = [](int64_t v) { return static_cast<uint32_t>(std::min<int64_t>(v, UINT32_MAX)); };
  if (own->max_sandboxes) quota.max_sandboxes = narrow(*own->max_sandboxes);
  if (own->max_vcpus) quota.max_vcpus = narrow(*own->max_vcpus);
  if (own->max_memory_mb) quota.max_memory_mb = static_cast<uint64_t>(*own->max_memory_mb);
  if (own->max_snapshots) quota.max_snapshots = narrow(*own->max_snapshots);
  if (own->max_snapshot_mb) {
    quota.max_snapshot_bytes = static_cast<uint64_t>(std::min<int64_t>(*own->max_snapshot_mb, INT64_MAX >> 20)) << 20;
  }
  if (own->max_suspended) quota.max_suspended = narrow(*own->max_suspended);
  if (own->max_suspended_mb) {
    quota.max_suspended_bytes = static_cast<uint64_t>(std::min<int64_t>(*own->max_suspended_mb, INT64_MAX >> 20)) << 20;
  }
  return quota;
}

Result<std::optional<store::TenantQuotaRecord>> SandboxManager::ownQuota(const std::string& tenant) {
  auto own = store_.getTenantQuota(tenant);
  if (own.ok()) return std::optional<store::TenantQuotaRecord>(std::move(own.value()));
  if (own.error().code == ErrorCode::kNotFound) return std::optional<store::TenantQuotaRecord>();
  return own.error();
}

std::shared_ptr<std::mutex> SandboxManager::quotaClaimsLock(const std::string& tenant) {
  std::lock_guard guard(quota_claims_mu_);
  auto& slot = quota_claims_[tenant];
  auto lock = slot.lock();
  if (!lock) {
    lock = std::make_shared<std::mutex>();
    slot = lock;
  }
  // Tenants that hold none any more go (keys are authenticated tenants, but they come and go).
  std::erase_if(quota_claims_, [](const auto& entry) { return entry.second.expired(); });
  return lock;
}

Result<uint64_t> SandboxManager::suspendedBytes(const std::string& tenant) {
  auto suspended = store_.sandboxesInStates({stateName(SandboxState::kSuspended)}, tenant);
  if (!suspended.ok()) return suspended.error();
  // A run dir keeps its earlier overlays, which are hard links of snapshot layers: those count
  // against the snapshot bytes (as a snapshot's, or as stranded layers), not twice.
  std::set<std::pair<dev_t, ino_t>> layers;
  std::error_code ec;
  std::filesystem::directory_iterator it(config_.data_dir + "/layers", ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (::stat(it->path().c_str(), &st) == 0) layers.emplace(st.st_dev, st.st_ino);
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return makeError(ErrorCode::kUnavailable, "cannot list the disk layers: " + ec.message() + "; try again");
  }
  uint64_t bytes = 0;
  for (const auto& rec : suspended.value()) {
    auto held = chargeableBytesUnder(rec.run_dir, layers);
    if (!held.ok()) return held.error();
    bytes += held.value();
  }
  return bytes;
}

Result<TenantQuotaReport> SandboxManager::quotaReport(const std::string& tenant) {
  TenantQuotaReport report;
  auto quota = quotaOf(tenant, &report.own);
  if (!quota.ok()) return quota.error();
  report.limits = quota.value();
  auto snapshots = store_.snapshotUsage(tenant);
  if (!snapshots.ok()) return snapshots.error();
  report.snapshots = static_cast<uint32_t>(snapshots->count);
  auto stranded = strandedLayerBytes(tenant);  // counted as the quota counts them
  if (!stranded.ok()) return stranded.error();
  report.snapshot_bytes = snapshots->bytes + stranded.value();
  auto suspended = store_.countInState(tenant, stateName(SandboxState::kSuspended));
  if (!suspended.ok()) return suspended.error();
  report.suspended = static_cast<uint32_t>(suspended.value());
  auto suspended_bytes = suspendedBytes(tenant);
  if (!suspended_bytes.ok()) return suspended_bytes.error();
  report.suspended_bytes = suspended_bytes.value();
  std::lock_guard lock(mu_);
  if (auto it = tenant_usage_.find(tenant); it != tenant_usage_.end()) {
    report.sandboxes = it->second.sandboxes;
    report.vcpus = it->second.vcpus;
    report.memory_mb = it->second.memory_mb;
  }
  return report;
}

// A pooled guest's share of the node's capacity: counted in pooled_* from the start of its
// making until it becomes a sandbox (moved into that reservation), is taken back for a sandbox
// (revoked), or goes with its guest.
class SandboxManager::PoolClaim final : public CapacityClaim {
 public:
  PoolClaim(SandboxManager& manager, uint32_t cpus, uint64_t memory_mb)
      : manager(manager), cpus(cpus), memory_mb(memory_mb) {}
  ~PoolClaim() override {
    if (registered) manager.releasePoolClaim(*this);
  }
  bool held() const override { return counted.load(); }

  SandboxManager& manager;
  const uint32_t cpus;
  const uint64_t memory_mb;
  // Written under manager.mu_; read by the pool and the maker without it.
  std::atomic<bool> counted{false};
  // Under manager.mu_ (setPoolClaim): its guest is made and waiting (given way first), or a
  // create took it and is about to reserve with it (given way last).
  bool ready = false;
  bool taken = false;
  bool registered = false;  // in pool_claims_, at `at`
  std::list<PoolClaim*>::iterator at;
};

Result<std::unique_ptr<CapacityClaim>> SandboxManager::claimForPool(const PoolKey& key) {
  // Made before the lock, so no one waits on this allocation.
  auto claim = std::make_unique<PoolClaim>(*this, key.cpus, nodeShareMb(key.memory_mb));
  std::lock_guard lock(mu_);
  if (stopping_) return makeError(ErrorCode::kUnavailable, "spaced is shutting down", "shutting_down");
  if (reserved_vcpus_ + pooled_vcpus_ + key.cpus > config_.max_total_vcpus ||
      memoryHeldLocked() + pooled_memory_mb_ + claim->memory_mb > config_.max_total_memory_mb) {
    return makeError(
        ErrorCode::kResourceExhausted,
        "sandboxes hold " + std::to_string(reserved_vcpus_) + " vCPUs and " + std::to_string(reserved_memory_mb_) +
            " MB, snapshots' helpers " + std::to_string(helper_memory_mb_) + " MB, waiting guests " +
            std::to_string(pooled_vcpus_) + " and " + std::to_string(pooled_memory_mb_) + " MB, of the node's " +
            std::to_string(config_.max_total_vcpus) + " and " + std::to_string(config_.max_total_memory_mb) + " MB",
        kNoCapacityReason);
  }
  claim->at = pool_claims_.insert(pool_claims_.end(), claim.get());  // may throw: before any count
  claim->registered = true;
  claim->counted = true;
  pooled_vcpus_ += key.cpus;
  pooled_memory_mb_ += claim->memory_mb;
  return std::unique_ptr<CapacityClaim>(std::move(claim));
}

void SandboxManager::setPoolClaim(CapacityClaim* claim, bool ready, bool taken) {
  if (claim == nullptr) return;
  auto& ours = static_cast<PoolClaim&>(*claim);
  std::lock_guard lock(mu_);
  ours.ready = ready;
  ours.taken = taken;
}

void SandboxManager::releasePoolClaim(PoolClaim& claim) {
  std::lock_guard lock(mu_);
  if (claim.counted) {
    pooled_vcpus_ -= claim.cpus;
    pooled_memory_mb_ -= claim.memory_mb;
    claim.counted = false;
  }
  pool_claims_.erase(claim.at);
  claim.registered = false;
}

Status SandboxManager::reserve(const std::shared_ptr<Live>& live, CapacityClaim* from_pool) {
  // Read before the lock: the store is not asked while every other create waits on mu_.
  auto tenant_quota = quotaOf(live->tenant);
  if (!tenant_quota.ok()) return tenant_quota.error();
  size_t revoked = 0;
  auto reserved = reserveLocked(live, tenant_quota.value(), static_cast<PoolClaim*>(from_pool), revoked);
  // The waiting guests whose capacity this sandbox took are killed before it starts using it
  // (outside mu_: each claim gives itself back under it).
  if (revoked > 0 && pool_) pool_->prune();
  return reserved;
}

Status SandboxManager::reserveLocked(const std::shared_ptr<Live>& live, const TenantQuota& quota, PoolClaim* from_pool,
                                     size_t& revoked) {
  std::lock_guard lock(mu_);
  if (stopping_) return makeError(ErrorCode::kUnavailable, "spaced is shutting down", "shutting_down");
  if (live_.count(live->id)) {
    return makeError(ErrorCode::kUnavailable, "sandbox " + live->id + " is changing state; retry");
  }
  // The tenant's quota first: a tenant at its quota is told so, whatever the node has free.
  const auto usage = tenant_usage_.find(live->tenant);
  const TenantUsage used = usage == tenant_usage_.end() ? TenantUsage{} : usage->second;
  auto overQuota = [&](const std::string& what, uint64_t have, uint64_t want, uint64_t max, const char* unit) {
    return makeError(ErrorCode::kResourceExhausted,
                     "tenant " + live->tenant + " is at its quota of " + std::to_string(max) + unit + " " + what +
                         " (" + std::to_string(have) + " in use, " + std::to_string(want) + " requested)",
                     "tenant_quota");
  };
  if (quota.max_sandboxes && used.sandboxes + 1 > quota.max_sandboxes) {
    return overQuota("running or paused sandboxes", used.sandboxes, 1, quota.max_sandboxes, "");
  }
  if (quota.max_vcpus && used.vcpus + live->cpus > quota.max_vcpus) {
    return overQuota("vCPUs", used.vcpus, live->cpus, quota.max_vcpus, "");
  }
  if (quota.max_memory_mb && used.memory_mb + live->memory_mb > quota.max_memory_mb) {
    return overQuota("memory", used.memory_mb, live->memory_mb, quota.max_memory_mb, " MB of");
  }
  if (live_.size() >= config_.max_sandboxes) {
    return makeError(ErrorCode::kResourceExhausted,
                     "this node already runs its maximum of " + std::to_string(config_.max_sandboxes) + " sandboxes",
                     "too_many_sandboxes");
  }
  // Every pooled guest but the one becoming this sandbox gives way if need be: the sandbox fits
  // if it fits beside the other sandboxes' reservations.
  PoolClaim* own = from_pool != nullptr && from_pool->counted ? from_pool : nullptr;
  if (reserved_vcpus_ + live->cpus > config_.max_total_vcpus) {
    return makeError(ErrorCode::kResourceExhausted,
                     "not enough vCPU capacity: " + std::to_string(live->cpus) + " requested, " +
                         std::to_string(config_.max_total_vcpus - std::min(config_.max_total_vcpus, reserved_vcpus_)) +
                         " of " + std::to_string(config_.max_total_vcpus) + " free on this node",
                     "insufficient_capacity");
  }
  // Snapshots' helper QEMUs hold theirs until their snapshot is made (seconds); they never give way.
  if (memoryHeldLocked() + live->memory_mb + live->qemu_mb > config_.max_total_memory_mb) {
    return makeError(
        ErrorCode::kResourceExhausted,
        "not enough memory: " + std::to_string(live->memory_mb) + " MB requested and " + std::to_string(live->qemu_mb) +
            " MB for its QEMU, " +
            std::to_string(config_.max_total_memory_mb - std::min(config_.max_total_memory_mb, memoryHeldLocked())) +
            " of " + std::to_string(config_.max_total_memory_mb) + " MB free on this node",
        "insufficient_capacity");
  }
  countIn(live);  // may throw (it allocates): before any claim moves or is taken back
  if (own) {      // the guest's capacity becomes this sandbox's: never counted twice
    own->counted = false;
    pooled_vcpus_ -= own->cpus;
    pooled_memory_mb_ -= own->memory_mb;
  }
  revoked = takeBackPoolCapacityLocked();
  if (revoked > 0) {
    spdlog::info("sandbox {}: {} guest(s) of the pool give their capacity to it", live->id, revoked);
  }
  return okStatus();
}

size_t SandboxManager::takeBackPoolCapacityLocked() {
  // As many claims as the node needs back: guests waiting first (the oldest first), then guests
  // still being made (their making stops at its next step), then guests other creates have
  // taken (each such create then reserves afresh, as if it had found no guest).
  auto over = [&] {
    return reserved_vcpus_ + pooled_vcpus_ > config_.max_total_vcpus ||
           memoryHeldLocked() + pooled_memory_mb_ > config_.max_total_memory_mb;
  };
  auto rank = [](const PoolClaim& claim) { return claim.taken ? 2 : claim.ready ? 0 : 1; };
  size_t revoked = 0;
  for (int giving = 0; giving < 3 && over(); ++giving) {
    for (PoolClaim* claim : pool_claims_) {
      if (!over()) break;
      if (!claim->counted || rank(*claim) != giving) continue;
      claim->counted = false;
      pooled_vcpus_ -= claim->cpus;
      pooled_memory_mb_ -= claim->memory_mb;
      ++revoked;
    }
  }
  return revoked;
}

void SandboxManager::countIn(const std::shared_ptr<Live>& live) {
  // The inserts (which allocate, and may throw) before any count: a throw counts nothing.
  auto placed = live_.insert_or_assign(live->id, live).first;
  TenantUsage* used = nullptr;
  try {
    used = &tenant_usage_[live->tenant];
  } catch (...) {
    live_.erase(placed);
    throw;
  }
  reserved_vcpus_ += live->cpus;
  reserved_memory_mb_ += live->memory_mb + live->qemu_mb;
  ++used->sandboxes;
  used->vcpus += live->cpus;
  used->memory_mb += live->memory_mb;
}

void SandboxManager::unreserve(const Live& live) {
  std::lock_guard lock(mu_);
  live_.erase(live.id);
  reserved_vcpus_ -= live.cpus;
  reserved_memory_mb_ -= live.memory_mb + live.qemu_mb;
  auto it = tenant_usage_.find(live.tenant);
  if (it == tenant_usage_.end()) return;
  --it->second.sandboxes;
  it->second.vcpus -= live.cpus;
  it->second.memory_mb -= live.memory_mb;
  if (it->second.sandboxes == 0) tenant_usage_.erase(it);
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
    // A guest saved under one accelerator (and its CPU model) is never restored under another.
    if (snap->accelerator != vmm::acceleratorName(launcher_->accelerator())) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "snapshot " + snap->id + " was taken under " + snap->accelerator + "; this node runs " +
                           vmm::acceleratorName(launcher_->accelerator()),
                       "snapshot_incompatible");
    }
    template_name = snap->template_name;
    cpus = snap->cpus;
    memory_mb = snap->memory_mb;
    from_snapshot = std::move(snap.value());
  }
  auto tpl = launcher_->findTemplate(template_name);
  if (!tpl.ok()) return tpl.error();
  const int64_t timeout_s = request.timeout_s >= 0 ? request.timeout_s : config_.default_timeout_s;
  const int64_t idle_suspend_s = request.idle_suspend_s >= 0 ? request.idle_suspend_s : config_.idle_suspend_s;
  const std::string on_timeout = request.on_timeout.empty() ? "delete" : request.on_timeout;
  if (memory_mb < vmm::kMinMemoryMib || memory_mb > config_.max_memory_mb) {
    return makeError(ErrorCode::kInvalidArgument, "memory_mb = " + std::to_string(memory_mb) + ": must be within " +
                                                      std::to_string(vmm::kMinMemoryMib) + ".." +
                                                      std::to_string(config_.max_memory_mb));
  }
  SPACE_TRY(checkTimeout(timeout_s));
  if (idle_suspend_s > config_.max_idle_suspend_s) {
    return makeError(ErrorCode::kInvalidArgument, "idle_suspend_s = " + std::to_string(idle_suspend_s) +
                                                      ": must be within 0.." +
                                                      std::to_string(config_.max_idle_suspend_s) + " (0: never)");
  }
  if (on_timeout != "delete" && on_timeout != "suspend") {
    return makeError(ErrorCode::kInvalidArgument, "on_timeout = \"" + on_timeout + "\": must be delete or suspend");
  }
  if (request.network && !config_.network) {
    return makeError(ErrorCode::kInvalidArgument,
                     "network: this node gives sandboxes no network (spaced --network off)");
  }
  // The policy: the request's, else the snapshot's (children carry it), else the node's.
  net::Policy policy = config_.default_policy;
  if (request.network) {
    policy = *request.network;
  } else if (from_snapshot && config_.network) {
    auto carried = net::NetworkPool::readPolicy(snapshotDir(from_snapshot->id));
    if (carried.ok() && carried.value()) policy = std::move(*carried.value());
  }
  // Checked before anything is recorded: a request the host can never satisfy leaves no trace.
  SPACE_TRY(launcher_->checkFits(*tpl.value(), cpus, memory_mb));

  // A VM started ahead of need, if one fits: the request then only loads the guest's state.
  std::optional<WarmVm> warm;
  const PoolKey pool_key{template_name, cpus, memory_mb};
  if (pool_ && !from_snapshot) warm = pool_->take(pool_key);
  // Its capacity is about to become this sandbox's: other reservations take it back last.
  CapacityClaim* warm_claim = warm ? warm->claim.get() : nullptr;
  setPoolClaim(warm_claim, true, true);
  // A guest taken is handed back (put) or kept (used) on every path; an exception before
  // either must not leave its place counted as taken, or the pool would never refill it.
  bool pool_settled = !warm.has_value();
  ScopeGuard pool_on_exception([&] {
    if (pool_settled) return;
    try {
      warm.reset();  // its VM goes first: the refill builds the one that replaces it
    } catch (...) {
    }
    pool_->used(pool_key);
  });
  if (warm) faultPoint("create.pool_taken");
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
  rec.auto_resume = request.auto_resume;
  rec.source_snapshot = request.snapshot_id;
  rec.metadata = request.metadata;
  rec.env = request.env;
  rec.run_dir = sandboxDir(rec.id);
  auto live = liveFromRecord(rec);
  std::unique_lock control(live->control);  // held through boot: other requests on it wait
  if (auto reserved = reserve(live, warm_claim); !reserved.ok()) {
    pool_settled = true;  // first: put() counts the take back even if it then throws
    setPoolClaim(warm_claim, true, false);
    if (warm) pool_->put(pool_key, std::move(*warm));
    return reserved.error();
  }
  bool released = false;
  bool inserted = false;
  auto release = [&] {
    if (released) return;
    released = true;
    unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kFailed;
  };
  // An exception (bad_alloc, a thread that cannot start) leaves by none of the error returns
  // below: its reservation comes back (first: that cannot fail), its VM goes, and a recorded
  // sandbox is recorded failed, each step on its own so that one throwing skips no other.
  ScopeGuard on_exception([&] {
    if (released) return;
    release();
    try {
      live->runtime.reset();
    } catch (...) {
    }
    if (inserted) {
      try {
        rec.state = stateName(SandboxState::kFailed);
        rec.state_reason = "spaced failed while starting it";
        rec.vm_pid = 0;
        (void)store_.updateSandbox(rec);
      } catch (...) {
      }
    }
    spdlog::error("sandbox {}: create failed by an exception; its VM and reservation are released", rec.id);
  });
  // Its own identity before anyone sees it running: a restored clone still has the template's
  // hostname, a clock stopped at the snapshot and the template's random state.
  auto identity = [&] {
    nlohmann::json configure{{"hostname", hostnameFor(rec.id)}, {"timeMs", nowMs()}, {"entropy", freshEntropy()}};
    // Trusted before the tenant's first command, in the same call (no second round trip).
    if (!live->credential_ca_cert.empty()) {
      configure["credentialCa"] = live->credential_ca_cert;
      configure["credentialEnv"] = live->credential_env;
    }
    if (!request.env.empty()) {
      nlohmann::json vars = nlohmann::json::object();
      for (const auto& [k, v] : request.env) vars[k] = v;
      configure["envVars"] = vars;
    }
    return live->vm().agent().call("/agent.Agent/Configure", configure);
  };
  auto started = Clock::now();
  auto recordRunning = [&] {
    rec.state = stateName(SandboxState::kRunning);
    rec.vm_pid = live->vm().pid();
    rec.vm_identity = live->vm().identity();
    rec.accelerator = vmm::acceleratorName(live->vm().accelerator());
  };
  auto ran = [&](const std::string& how) {
    live->state = SandboxState::kRunning;
    live->last_active_ms = nowMs();
    spdlog::info("sandbox {}: running (tenant {}, {} vCPU, {} MB, {} in {} ms, expires in {} s)", rec.id, rec.tenant,
                 cpus, memory_mb, how, std::chrono::duration_cast<milliseconds>(Clock::now() - started).count(),
                 timeout_s);
  };
  if (warm) {
    // Its place is refilled once this create is done with the pool's guest, however it ends:
    // a refill (a QEMU restore, and with networking a slot and a gateway) started earlier would
    // compete for the CPUs with the guest taking its identity, which the client waits for.
    struct RefillAfter {
      WarmPool* pool;
      const PoolKey& key;
      ~RefillAfter() { pool->used(key); }
    } refill_after{pool_.get(), pool_key};
    pool_settled = true;
    // A running guest from the pool: it only takes its identity, and is recorded once, running.
    // (Nothing is recorded before: a crash meanwhile leaves an unrecorded VM, which the next
    // start's orphan sweep removes, and the client never had an answer.)
    live->runtime = std::move(warm->runtime);
    warm.reset();
    // Its policy before the guest runs anything of the tenant's: the gateway applies it from
    // its next connection, and the pool guest has made none.
    if (auto* network = live->runtime->network(); network != nullptr) {
      // Not fsynced here (a millisecond of the create): a running sandbox does not outlive a
      // host crash, and a suspend makes the file durable before it records the sandbox.
      auto set = network->setPolicy(policy, /*durable=*/false);
      if (set.ok()) set = syncCredentials(*live);
      if (!set.ok()) {
        live->runtime.reset();
        release();
        return set.error();
      }
    }
    // Refilled at low priority; a sandbox runs at the priority of every other.
    if (auto raised = live->runtime->setHostNice(0); !raised.ok()) {
      spdlog::warn("sandbox {}: its QEMU keeps the pool's low priority: {}", rec.id, raised.error().message);
    }
    auto configured = identity();
    // Refused for what the request asked (not the guest's health): no second guest is spent on it.
    if (!configured.ok() && configured.error().code != ErrorCode::kUnavailable &&
        configured.error().code != ErrorCode::kDeadlineExceeded) {
      live->runtime.reset();
      release();
      return makeError(configured.error().code == ErrorCode::kInvalidArgument ? ErrorCode::kInvalidArgument
                                                                              : ErrorCode::kUnavailable,
                       "sandbox " + rec.id + " failed to start: " + firstLine(configured.error().message),
                       configured.error().code == ErrorCode::kInvalidArgument ? "" : "sandbox_start_failed");
    }
    if (configured.ok()) {
      faultPoint("create.configured");
      recordRunning();
      inserted = true;  // before the write: one that throws may have been committed
      if (auto saved = store_.insertSandbox(rec); !saved.ok()) {
        live->runtime.reset();
        release();
        return saved.error();
      }
      faultPoint("create.recorded");
      on_exception.dismiss();
      ran("taken from the pool");
      return rec;  // as recorded: not read back
    } else {
      // The pool's guest is unwell: dropped, and this sandbox restored the usual way.
      spdlog::warn("sandbox {}: the pool's VM did not take its identity ({}); restoring a new one", rec.id,
                   configured.error().message);
      live->runtime.reset();  // its QEMU killed and its run directory removed
    }
  }
  inserted = true;  // before the write: one that throws may have been committed
  if (auto saved = store_.insertSandbox(rec); !saved.ok()) {
    release();
    return saved.error();
  }
  faultPoint("create.inserted");

  auto fail = [&](const Error& e) -> Error {
    live->runtime.reset();  // kills QEMU and removes its files, if any
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

  const auto deadline = Clock::now() + config_.boot_timeout;
  std::string how;
  if (from_snapshot) {
    // The snapshot's files must stay while QEMU opens them and the state loads, and no
    // longer: a guest slow to answer must not hold up the snapshot's deletion.
    auto opening = openSnapshotFiles(from_snapshot->id);
    if (!opening.ok()) return fail(opening.error());
    {
      std::shared_lock layers(layers_mu_);  // the child's overlay is made over the snapshot's layer
      // Deleted since it was looked up? Then its files are gone.
      if (auto still = store_.getSnapshot(from_snapshot->id); !still.ok()) {
        return fail(snapshotNotFound(from_snapshot->id));
      }
      auto launch = launcher_->fromSnapshot(
          *tpl.value(), snapshot::snapshotFilesIn(snapshotDir(from_snapshot->id), from_snapshot->disk), cpus, memory_mb,
          rec.run_dir);
      if (launch.network) launch.network->policy = policy;
      how = launch.how;
      auto runtime = SandboxRuntime::prepare(launch);
      if (!runtime.ok()) return fail(runtime.error());
      live->runtime = std::move(runtime.value());
    }
    if (auto loaded = live->runtime->load(deadline); !loaded.ok()) return fail(loaded.error());
    opening.value().reset();  // QEMU holds what it needs of the files now
    faultPoint("create.state_loaded");
    if (auto answered = live->runtime->awaitAgent(deadline); !answered.ok()) return fail(answered.error());
  } else {
    auto launch = launcher_->fromTemplate(*tpl.value(), cpus, memory_mb, rec.run_dir,
                                          cpus == config_.default_cpus && memory_mb == config_.default_memory_mb);
    if (!launch.ok()) return fail(launch.error());
    if (launch->network) launch->network->policy = policy;
    how = launch->how;
    auto runtime = SandboxRuntime::start(launch.value());
    if (!runtime.ok()) return fail(runtime.error());
    live->runtime = std::move(runtime.value());
  }
  if (auto synced = syncCredentials(*live); !synced.ok()) return fail(synced.error());
  if (auto configured = identity(); !configured.ok()) return fail(configured.error());
  if (faultFails("create.configured"))
    return fail(makeError(ErrorCode::kInternal, "injected failure (SPACE_FAULT_FAIL)"));
  faultPoint("create.configured");
  recordRunning();
  if (auto saved = store_.updateSandbox(rec); !saved.ok()) return fail(saved.error());
  faultPoint("create.recorded");
  on_exception.dismiss();
  ran(how);
  return rec;  // as recorded: not read back
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
  live->runtime.reset();  // the work first (QEMU gone, files removed), then the record
  if (to == SandboxState::kDeleted) removeNetworkFiles(live->id);
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
  removeNetworkFiles(rec->id);  // a failed sandbox kept its policy and audit log until now
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
  // The tenant's suspended quota, counting suspends under way (a place is held until recorded).
  auto tenant_quota = quotaOf(sandbox.tenant);
  if (!tenant_quota.ok()) return tenant_quota.error();
  const uint32_t max_suspended = tenant_quota->max_suspended;
  const uint64_t max_suspended_bytes = tenant_quota->max_suspended_bytes;
  // Suspends under way count at an estimate (the guest's memory and the disk as it is now), so
  // that many at once cannot all pass under the quota.
  const uint64_t estimate = (sandbox.memory_mb << 20) + allocatedBytesUnder(rec->run_dir);
  const bool claimed = max_suspended != 0 || max_suspended_bytes != 0;
  if (claimed) {
    auto claims_lock = quotaClaimsLock(sandbox.tenant);
    std::lock_guard claims(*claims_lock);
    auto suspended = store_.countInState(sandbox.tenant, stateName(SandboxState::kSuspended));
    if (!suspended.ok()) return suspended.error();
    uint64_t bytes = 0;
    if (max_suspended_bytes != 0) {
      auto held_bytes = suspendedBytes(sandbox.tenant);
      if (!held_bytes.ok()) return held_bytes.error();
      bytes = held_bytes.value();
    }
    std::lock_guard lock(mu_);
    const PendingSuspends pending = suspending_.count(sandbox.tenant) ? suspending_[sandbox.tenant] : PendingSuspends{};
    const uint64_t held = static_cast<uint64_t>(suspended.value()) + pending.count;
    if (max_suspended != 0 && held >= max_suspended) {
      return makeError(ErrorCode::kResourceExhausted,
                       "tenant " + sandbox.tenant + " is at its quota of " + std::to_string(max_suspended) +
                           " suspended sandboxes (" + std::to_string(held) +
                           " suspended or being suspended); delete or resume one first",
                       "tenant_quota");
    }
    if (max_suspended_bytes != 0 && bytes + pending.bytes >= max_suspended_bytes) {
      return makeError(ErrorCode::kResourceExhausted,
                       "tenant " + sandbox.tenant + " is at its quota of " + std::to_string(max_suspended_bytes >> 20) +
                           " MiB of suspended sandboxes (" + std::to_string((bytes + pending.bytes) >> 20) +
                           " MiB suspended or being suspended); delete or resume one first",
                       "tenant_quota");
    }
    PendingSuspends& mine = suspending_[sandbox.tenant];
    ++mine.count;
    mine.bytes += estimate;
  }
  struct ReleaseSuspending {
    SandboxManager* manager;
    const std::string& tenant;
    bool held;
    uint64_t bytes;
    ~ReleaseSuspending() {
      if (!held) return;
      auto claims_lock = manager->quotaClaimsLock(tenant);
      std::lock_guard claims(*claims_lock);
      std::lock_guard lock(manager->mu_);
      auto it = manager->suspending_.find(tenant);
      if (it == manager->suspending_.end()) return;
      --it->second.count;
      it->second.bytes -= bytes;
      if (it->second.count == 0) manager->suspending_.erase(it);
    }
  } release_suspending{this, sandbox.tenant, claimed, estimate};
  const bool was_running = sandbox.state == SandboxState::kRunning;
  auto started = Clock::now();
  // saveState writes a temp file and renames it when complete: a failure (disk full) leaves no
  // partial state, and the guest is continued as it was.
  auto saved = sandbox.runtime->suspendTo(rec->run_dir + kSuspendedState, std::chrono::minutes(5));
  if (!saved.ok()) {
    (void)(was_running ? sandbox.runtime->resume() : sandbox.vm().reactivateStopped());
    if (!sandbox.vm().processRunning()) {
      (void)finish(live, SandboxState::kFailed, "its VM stopped while suspending");
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " failed while suspending", "sandbox_failed");
    }
    return makeError(saved.error().code, "cannot suspend sandbox " + id + ": " + saved.error().message +
                                             (was_running ? " (it keeps running)" : " (it stays paused)"));
  }
  faultPoint("suspend.saved");
  sandbox.runtime.reset();  // released by suspendTo: the run dir with its disk and saved state stays
  rec->state = stateName(SandboxState::kSuspended);
  rec->vm_pid = 0;
  rec->vm_identity.clear();
  switch (cause) {
    case SuspendCause::kRequest: rec->state_reason.clear(); break;
    case SuspendCause::kIdle:
      rec->state_reason =
          std::string(kIdleSuspendReasonPrefix) + "no activity for " + std::to_string(sandbox.idle_suspend_s) + " s";
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
  return rec;  // as recorded
}

Result<store::SandboxRecord> SandboxManager::resumeSuspended(const store::SandboxRecord& suspended) {
  auto tpl = launcher_->findTemplate(suspended.template_name);
  if (!tpl.ok()) return tpl.error();
  store::SandboxRecord rec = suspended;
  // Suspended by its timeout: the time it spent suspended does not count; the timeout starts again.
  const bool rearm = suspended.state_reason == kTimeoutSuspendReason;
  if (rearm) rec.expires_at_ms = nowMs() + std::max<int64_t>(suspended.timeout_s, 1) * 1000;
  auto live = liveFromRecord(rec);
  std::unique_lock control(live->control);
  SPACE_TRY(reserve(live));
  bool released = false;
  bool recorded_running = false;
  auto unreserve = [&] {
    if (released) return;
    released = true;
    this->unreserve(*live);
    live->finished = true;
    live->state = SandboxState::kSuspended;
  };
  // Until its saved state is removed, an exception (bad_alloc, a thread that cannot start)
  // leaves it as every error return does: suspended, its files untouched, its QEMU gone and
  // its reservation given back, so that the next call resumes it (steps as in create's guard).
  ScopeGuard on_exception([&] {
    if (released) return;
    unreserve();
    try {
      if (live->runtime) {
        live->runtime->release();  // keeps the suspended files
        live->runtime.reset();
      }
    } catch (...) {
    }
    if (recorded_running) {
      try {
        (void)store_.updateSandbox(suspended);
      } catch (...) {
      }
    }
    spdlog::error("sandbox {}: resume failed by an exception; it stays suspended", suspended.id);
  });
  // Restored stopped (see Launcher::fromSuspended): it is continued only once the resume is
  // recorded and the state file removed. A crash at any step leaves either a suspended sandbox
  // whose disk matches its saved RAM, or a running one (recovery continues a stopped guest
  // recorded as running).
  auto launch = launcher_->fromSuspended(*tpl.value(), suspended, suspended.run_dir + kSuspendedState);
  auto started = Clock::now();
  auto runtime = SandboxRuntime::start(launch);
  if (!runtime.ok()) {
    unreserve();
    // The saved state and disk are untouched: the sandbox stays suspended and can be retried.
    const Error& e = runtime.error();
    return makeError(e.code == ErrorCode::kInvalidArgument ? e.code : ErrorCode::kUnavailable,
                     "cannot resume sandbox " + suspended.id + ": " + firstLine(e.message));
  }
  live->runtime = std::move(runtime.value());
  // Values may have been rotated while it slept, and its slot (with the file) is a new one.
  // Rules may have been given while it slept: its guest trusts its CA before it runs anything.
  Status synced = syncCredentials(*live);
  if (synced.ok()) synced = installCredentialCa(*live);
  if (!synced.ok()) {
    live->runtime->release();
    live->runtime.reset();
    unreserve();
    return synced.error();
  }
  faultPoint("resume.restored");
  rec.state = stateName(SandboxState::kRunning);
  rec.state_reason.clear();
  rec.vm_pid = live->vm().pid();
  rec.vm_identity = live->vm().identity();
  rec.accelerator = vmm::acceleratorName(live->vm().accelerator());
  recorded_running = true;  // before the write: one that throws may have been committed
  if (auto saved = store_.updateSandbox(rec); !saved.ok()) {
    live->runtime->release();  // keep the suspended files: the record still says suspended
    live->runtime.reset();
    unreserve();
    return saved.error();
  }
  faultPoint("resume.recorded");
  std::error_code ec;
  std::filesystem::remove(suspended.run_dir + kSuspendedState, ec);
  if (ec) {
    // The guest has not run and its state is still there: put the record back, and the sandbox
    // stays suspended as it was.
    live->runtime->release();
    live->runtime.reset();
    unreserve();
    if (auto back = store_.updateSandbox(suspended); !back.ok()) return back.error();
    return makeError(ErrorCode::kInternal,
                     "cannot resume sandbox " + suspended.id + ": cannot remove its saved state: " + ec.message());
  }
  // From here the saved state is gone: the guest must continue, or it is lost. It is running
  // as recorded, whatever follows. An exception before it continues would leave a stopped
  // guest recorded running: it is continued once more then, or failed if it cannot be.
  on_exception.dismiss();
  bool continued = false;
  ScopeGuard continue_on_exception([&] {
    if (continued) return;
    try {
      // As the normal path: a guest that continued but whose agent was slow is kept.
      const bool ran = live->runtime->resume().ok();
      auto status = ran ? Result<std::string>(std::string("running")) : live->vm().queryStatus();
      if (status.ok() && status.value() == "running") {
        spdlog::error("sandbox {}: resume interrupted by an exception; its guest was continued", suspended.id);
        return;
      }
    } catch (...) {
    }
    if (auto failed = finish(live, SandboxState::kFailed, "spaced failed while resuming it"); !failed.ok()) {
      spdlog::error("sandbox {}: resume interrupted by an exception, and it could not be failed: {}", suspended.id,
                    failed.error().message);
    }
  });
  live->state = SandboxState::kRunning;
  if (auto synced = fsyncPath(suspended.run_dir); !synced.ok()) {
    // The state is gone either way now; a crash before the directory reaches the disk could
    // bring it back, which is the window this order closes everywhere else. Say so and go on.
    spdlog::warn("sandbox {}: resumed, but the removal of its saved state may not be durable: {}", suspended.id,
                 synced.error().message);
  }
  faultPoint("resume.state_removed");
  if (auto resumed = live->runtime->resume(); !resumed.ok()) {
    auto status = live->vm().queryStatus();
    if (status.ok() && status.value() == "running") {
      // It continued; only its agent was slow to answer (a loaded host under TCG). Give it the
      // boot timeout; if it still does not answer, the sandbox runs on and calls fail as
      // unavailable until it does, which is better than losing the guest.
      if (auto agent = live->vm().reconnectAgent(config_.boot_timeout); !agent.ok()) {
        spdlog::warn("sandbox {}: resumed, but its agent does not answer yet: {}", suspended.id, agent.error().message);
      }
    } else {
      continued = true;  // it will not: failed here
      live->state = SandboxState::kRunning;
      (void)finish(live, SandboxState::kFailed, "its VM did not continue after the resume: " + resumed.error().message);
      return makeError(ErrorCode::kUnavailable,
                       "sandbox " + suspended.id + " failed while resuming: " + resumed.error().message,
                       "sandbox_failed");
    }
  }
  continued = true;
  // The clock stood still while suspended.
  auto configured = live->vm().agent().call("/agent.Agent/Configure",
                                            nlohmann::json{{"timeMs", nowMs()}, {"entropy", freshEntropy()}});
  if (!configured.ok())
    spdlog::warn("sandbox {}: resumed, but its clock was not set: {}", suspended.id, configured.error().message);
  live->state = SandboxState::kRunning;
  spdlog::info("sandbox {}: resumed from suspension in {} ms", suspended.id,
               std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
  return rec;  // as recorded
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
  auto done = to == SandboxState::kPaused ? sandbox.runtime->pause() : sandbox.runtime->resume();
  if (!done.ok()) {
    if (!sandbox.vm().processRunning()) {
      auto exit = sandbox.vm().exitStatus();
      std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
      (void)finish(live.value(), SandboxState::kFailed, reason);
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " failed: " + reason, "sandbox_failed");
    }
    // Continued, and QEMU stopped it again at once: its disk is still full.
    if (to == SandboxState::kRunning) {
      if (auto stopped = sandbox.vm().diskErrorStop(); stopped.ok() && stopped.value()) {
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
    (void)(to == SandboxState::kPaused ? sandbox.runtime->resume() : sandbox.runtime->pause());
    return recorded.error();
  }
  sandbox.state = to;
  // Credential rules given while it was paused: its guest trusts their CA from now on.
  if (to == SandboxState::kRunning) {
    if (auto installed = installCredentialCa(sandbox); !installed.ok()) {
      spdlog::warn("sandbox {}: {}", id, installed.error().message);
    }
  }
  if (!sandbox.disk_error.empty()) {
    std::lock_guard lock(mu_);
    sandbox.disk_error.clear();
  }
  spdlog::info("sandbox {}: {}", id, stateName(to));
  return rec;  // as recorded
}

Result<store::SandboxRecord> SandboxManager::setTimeout(const std::string& tenant, const std::string& id,
                                                        int64_t timeout_s) {
  SPACE_TRY(checkTimeout(timeout_s));
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
  return rec;  // as recorded
}

// --- agent access ----------------------------------------------------------------------------

Result<AgentLease> SandboxManager::agent(const std::string& tenant, const std::string& id, std::string_view operation,
                                         bool may_resume) {
  auto live = findLive(tenant, id);
  if (!live.ok()) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    auto state = parseState(rec->state);
    if (!state.ok()) return state.error();
    if (state.value() == SandboxState::kSuspended && may_resume) {
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
    return agent(tenant, id, operation, may_resume);
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
  return AgentLease{id, live.value()->vm().sharedAgent(), false, std::move(activity)};
}

Result<PortConnection> SandboxManager::connectPort(const std::string& tenant, const std::string& id, uint16_t port,
                                                   Clock::time_point deadline, bool may_resume) {
  if (!config_.network) return noNetwork();
  if (!may_resume) {
    auto rec = getOwned(tenant, id);
    if (!rec.ok()) return rec.error();
    if (rec->state == stateName(SandboxState::kSuspended)) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "sandbox " + id + " is suspended; its ports wake it only for its tenant's API key",
                       "invalid_state");
    }
  }
  auto lease = agent(tenant, id, "connect to a port of");
  if (!lease.ok()) return lease.error();
  auto live = findLive(tenant, id);
  if (!live.ok()) return makeError(ErrorCode::kUnavailable, "sandbox " + id + " is between states; retry");
  // The socket is made and registered under `control`, so the slot is still this sandbox's:
  // once the sandbox ends its slot is scrubbed and may serve another sandbox, and the end shuts
  // every registered socket down first, connected or still connecting. The connect itself
  // needs no lock, so a guest that drops SYNs holds no lifecycle operation up.
  Result<net::GuestConnection> connection = makeError(ErrorCode::kInternal, "unset");
  {
    std::lock_guard control(live.value()->control);
    if (live.value()->finished || !live.value()->runtime || live.value()->state != SandboxState::kRunning) {
      return makeError(ErrorCode::kUnavailable, "sandbox " + id + " stopped running; retry");
    }
    net::SandboxNetwork* network = live.value()->runtime->network();
    if (network == nullptr) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "sandbox " + id + " has no network (it was made before this node had networking)");
    }
    connection = network->socketToGuest();
  }
  if (!connection.ok()) return connection.error();
  SPACE_TRY(connection->connect(port, std::min(deadline, Clock::now() + std::chrono::seconds(5))));
  return PortConnection{std::move(connection).value(), std::move(lease->activity)};
}

Result<std::string> SandboxManager::ownerOf(const std::string& id) {
  auto rec = store_.getSandbox(id);
  if (!rec.ok()) return rec.error().code == ErrorCode::kNotFound ? notFound(id) : rec.error();
  if (rec->state == stateName(SandboxState::kDeleted)) return notFound(id);
  return rec->tenant;
}

std::vector<std::pair<std::string, std::string>> SandboxManager::liveSandboxes() {
  std::lock_guard lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(live_.size());
  for (const auto& [id, live] : live_) out.emplace_back(id, live->tenant);
  return out;
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
  // A lifecycle operation (a snapshot, a boot, a resume) may hold the sandbox for long, and
  // what waits here is a client's step or request: past the deadline the error stays as it
  // came (the operation is likely why the agent went away).
  std::unique_lock control(live->control, std::defer_lock);
  if (!control.try_lock_for(std::chrono::seconds(2))) return error;
  // Cut off because the guest stopped on a full disk (markDiskStopped ended the connection).
  if (!live->finished && live->state == SandboxState::kPaused && !live->disk_error.empty()) {
    return diskStopped(lease.sandbox_id, live->disk_error);
  }
  if (live->finished || !live->runtime || live->vm().processRunning()) return error;
  auto exit = live->vm().exitStatus();
  std::string reason = "its VM stopped (QEMU " + (exit ? exit->describe() : std::string("exited")) + ")";
  if (auto line = lastConsoleLine(live->vm()); !line.empty()) reason += "; console: " + line;
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
  if (live.value()->finished || !live.value()->runtime) {
    return makeError(ErrorCode::kFailedPrecondition,
                     std::string("sandbox is ") + stateName(live.value()->state) + "; its console is gone",
                     "invalid_state");
  }
  return live.value()->vm().consoleTail(max_bytes);
}

ManagerStats SandboxManager::stats() {
  ManagerStats s;
  if (auto counts = store_.countByState(); counts.ok()) s.by_state = counts.value();
  // Outside mu_: a check after an update reads dpkg's status file.
  s.qemu_build_stale = qemu_build_ && qemu_build_->check().has_value();
  if (config_.network) {
    s.gateway_egress_refused_packets = config_.network->egressRefusedPackets();
    s.gateway_resolver_stale = config_.network->resolverStale();
  }
  if (pool_) {  // before mu_: the pool's lock is never taken inside it
    s.warm_pool_ready = pool_->size();
    s.warm_pool_target = pool_->target();
  }
  std::lock_guard lock(mu_);
  s.reserved_vcpus = reserved_vcpus_;
  s.reserved_memory_mb = reserved_memory_mb_;
  s.warm_pool_vcpus = pooled_vcpus_;
  s.warm_pool_memory_mb = pooled_memory_mb_;
  s.snapshot_helpers_memory_mb = helper_memory_mb_;
  s.max_total_vcpus = config_.max_total_vcpus;
  s.max_total_memory_mb = config_.max_total_memory_mb;
  return s;
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
  if (pool_)
    pool_->stop();                               // waiting VMs are no sandboxes: never left running (the
                                                 // object stays: a create still running may put one back)
  if (config_.network) config_.network->stop();  // no more spare slots made
  std::vector<std::shared_ptr<Live>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, live] : live_) all.push_back(live);
  }
  int kept = 0, stopped = 0;
  for (auto& live : all) {
    std::lock_guard control(live->control);
    if (live->finished || !live->runtime) continue;
    if (mode == ShutdownMode::kKeepRunning) {
      live->runtime->detach();
      live->runtime.reset();
      ++kept;
    } else {
      (void)live->vm().shutdown(milliseconds(5000));
      (void)finish(live, SandboxState::kDeleted, "spaced stopped");
      ++stopped;
    }
  }
  spdlog::info("sandboxes: shut down ({} left running for the next start, {} stopped)", kept, stopped);
  // This daemon's group of VM groups, once none is left in it (a kept VM keeps its group).
  if (launcher_) {
    for (const auto& root : launcher_->facts().cgroups.roots) {
      (void)::rmdir((root.dir + "/" + jail::kGatewayGroups).c_str());  // once no gateway's is left
      (void)::rmdir(root.dir.c_str());
    }
  }
}

bool suspendedForIdleness(const store::SandboxRecord& rec) {
  return rec.state == stateName(SandboxState::kSuspended) && rec.state_reason.rfind(kIdleSuspendReasonPrefix, 0) == 0;
}

}  // namespace space::sandbox
