// spaced: the SPACE host daemon. Owns the sandboxes of this node (microVMs), keeps their state
// in SQLite under the data directory, and serves the REST API (docs/api.md).
//
//   spaced [--listen 127.0.0.1:8080] [--data-dir /var/lib/space] [--api-key-file FILE] ...
//   spaced tenant add NAME | tenant ls | tenant rm NAME
//
// Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when it cannot start, 2 for usage.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "api/api_service.h"
#include "api/auth.h"
#include "cli/default_images.h"
#include "common/bounded_json.h"
#include "common/digest.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/unix_socket.h"
#include "e2b/control_plane.h"
#include "e2b/envd_front.h"
#include "http/server.h"
#include "http/tls_relay.h"
#include "net/policy.h"
#include "net/sandbox_network.h"
#include "sandbox/manager.h"
#include "store/state_store.h"
#include "vmm/disk_overlay.h"
#include "vmm/image_bases.h"
#include "vmm/node_facts.h"

namespace {

using namespace space;

constexpr const char* kDefaultTenant = "default";

int fatal(const std::string& message) {
  spdlog::error("spaced: {}", message);
  std::cerr << "spaced: " << message << "\n";
  return 1;
}

Result<std::unique_ptr<store::StateStore>> openStore(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) return makeError(ErrorCode::kInternal, "create data dir " + data_dir + ": " + ec.message());
  // Keys, sockets and guest consoles live here: not for other users' eyes.
  if (::chmod(data_dir.c_str(), 0700) != 0) {
    return makeError(ErrorCode::kPermissionDenied,
                     "cannot make " + data_dir + " private (chmod 0700): " + std::string(strerror(errno)));
  }
  return store::StateStore::open(data_dir + "/state.db");
}

// Whether "ip:port" / "[v6]:port" names a loopback address (127.0.0.0/8 or ::1).
bool isLoopbackListen(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

// The key given with --api-key-file or SPACE_API_KEY (empty when neither): never on the command
// line, where every local user reads it in /proc/*/cmdline.
Result<std::string> givenKey(const std::string& key_file) {
  std::string key;
  if (!key_file.empty()) {
    auto text = readSmallFile(key_file, 4096);
    if (!text.ok()) return makeError(ErrorCode::kInvalidArgument, "--api-key-file: " + text.error().message);
    key = text.value();
  } else if (const char* env = std::getenv("SPACE_API_KEY"); env != nullptr) {
    key = env;
  }
  // Every process spaced starts (QEMU, qemu-img) inherits its environment: the key leaves it.
  ::unsetenv("SPACE_API_KEY");
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
  return key;
}

// An existing key file readable by others is made private again (and said so): a copy made with
// the wrong umask must not stay readable by every local user.
void keepPrivate(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  if (::chmod(path.c_str(), 0600) == 0) {
    spdlog::warn("spaced: {} was readable by other users (mode {:o}); made it 0600", path, st.st_mode & 0777);
  } else {
    spdlog::warn("spaced: {} is readable by other users (mode {:o}) and chmod 0600 failed: {}", path, st.st_mode & 0777,
                 strerror(errno));
  }
}

// The secret behind sandboxes' ingress access tokens: kept in <data-dir>/ingress-key (mode
// 0600), made at first start. Removing it (with spaced stopped) revokes every token.
Result<std::string> ingressKey(const std::string& data_dir) {
  const std::string path = data_dir + "/ingress-key";
  keepPrivate(path);
  auto existing = readSmallFile(path, 4096);
  if (existing.ok()) {
    std::string key = existing.value();
    while (!key.empty() && (key.back() == '\n' || key.back() == ' ')) key.pop_back();
    if (key.size() >= 32) return key;
    return makeError(ErrorCode::kInvalidArgument, path +
                                                      " holds no usable key (under 32 characters); remove it "
                                                      "to have a new one made (every access token changes)");
  }
  if (existing.error().code != ErrorCode::kNotFound)
    return makeError(existing.error().code, path + ": " + existing.error().message);
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  const std::string key = hexEncode(bytes, sizeof bytes);
  SPACE_TRY(writeFileAtomic(path, key + "\n", 0600));
  return key;
}

// The default tenant's key: the given one (it then replaces the tenant's other keys), else the
// one kept in <data-dir>/api-key, else a new one written there (mode 0600).
Result<std::string> bootstrapKey(store::StateStore& store, const std::string& data_dir, const std::string& given) {
  const std::string key_file = data_dir + "/api-key";
  keepPrivate(key_file);
  std::string key = given;
  if (key.empty()) {
    auto existing = readSmallFile(key_file, 4096);
    if (existing.ok()) {
      key = existing.value();
      while (!key.empty() && (key.back() == '\n' || key.back() == ' ')) key.pop_back();
    }
  }
  const bool generated = key.empty();
  if (generated) key = api::generateApiKey();
  if (key.size() < 16 || key.size() > 256 || key.find_first_of(" \t\r\n") != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "the API key must be 16..256 characters without spaces");
  }
  const std::string digest = api::apiKeyDigest(key);
  auto keys = store.listApiKeys();
  if (!keys.ok()) return keys.error();
  bool known = false;
  for (const auto& k : keys.value()) known = known || (k.key_sha256_hex == digest && k.tenant == kDefaultTenant);
  if (!given.empty() && !known) (void)store.removeApiKeys(kDefaultTenant);
  if (!known) {
    store::ApiKeyRecord rec{kDefaultTenant, digest, given.empty() ? "generated" : "given at start", 0};
    SPACE_TRY(store.addApiKey(rec));
  }
  if (generated || !given.empty()) SPACE_TRY(writeFileAtomic(key_file, key + "\n", 0600));
  if (generated) spdlog::info("spaced: generated an API key for tenant \"{}\" ({})", kDefaultTenant, key_file);
  return key;
}

int tenantCommand(const std::string& action, const std::string& data_dir, const std::string& name, bool json) {
  if (action != "add" && !std::filesystem::exists(data_dir + "/state.db")) {
    return fatal("no state database in " + data_dir + " (is --data-dir the daemon's?)");
  }
  auto store = openStore(data_dir);
  if (!store.ok()) return fatal(store.error().message);
  auto& db = *store.value();
  if (action == "add") {
    std::string key = api::generateApiKey();
    auto added = db.addApiKey(store::ApiKeyRecord{name, api::apiKeyDigest(key), "spaced tenant add", 0});
    if (!added.ok()) return fatal(added.error().message);
    if (json) {
      std::cout << nlohmann::json{{"tenant", name}, {"api_key", key}}.dump() << "\n";
    } else {
      std::cout << key << "\n";
      std::cerr << "spaced: new API key for tenant \"" << name << "\" (shown once; only its digest is kept)\n";
    }
    return 0;
  }
  if (action == "rm") {
    // A tenant with no key left (or only a quota) is removed all the same: a second rm after a
    // failed one finishes the job, and nothing stays for a later tenant of the name.
    auto removed = db.removeApiKeys(name);
    if (!removed.ok() && removed.error().code != ErrorCode::kNotFound) return fatal(removed.error().message);
    // A tenant added later under the same name must not inherit them, nor its quota.
    auto forgotten = db.deleteSecretsOf(name);
    if (!forgotten.ok()) return fatal(forgotten.error().message);
    if (auto unquota = db.deleteTenantQuota(name); !unquota.ok() && unquota.error().code != ErrorCode::kNotFound) {
      return fatal(unquota.error().message);
    }
    std::cerr << "spaced: removed tenant \"" << name << "\": its API keys ("
              << (removed.ok() ? "revoked" : "it had none") << "), " << forgotten.value()
              << " secret(s) and its quota\n";
    return 0;
  }
  auto keys = db.listApiKeys();
  if (!keys.ok()) return fatal(keys.error().message);
  std::map<std::string, int> per_tenant;
  for (const auto& k : keys.value()) ++per_tenant[k.tenant];
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [tenant, n] : per_tenant) out.push_back({{"tenant", tenant}, {"keys", n}});
    std::cout << out.dump() << "\n";
  } else {
    std::printf("%-24s %s\n", "TENANT", "KEYS");
    for (const auto& [tenant, n] : per_tenant) std::printf("%-24s %d\n", tenant.c_str(), n);
  }
  return 0;
}

// What `spaced tenant quota` changes: each value given replaces the tenant's own one; the rest
// stay, unless `reset` drops them all first (back to the node's defaults).
struct QuotaChange {
  bool reset = false;
  std::optional<int64_t> sandboxes, vcpus, memory_mb, snapshots, snapshot_mb, suspended, suspended_mb, requests_per_s,
      request_burst;
  bool any() const {
    return reset || sandboxes || vcpus || memory_mb || snapshots || snapshot_mb || suspended || suspended_mb ||
           requests_per_s || request_burst;
  }
};

nlohmann::json quotaJson(const store::TenantQuotaRecord& q) {
  auto value = [](const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json("default"); };
  return {{"tenant", q.tenant},
          {"max_sandboxes", value(q.max_sandboxes)},
          {"max_vcpus", value(q.max_vcpus)},
          {"max_memory_mb", value(q.max_memory_mb)},
          {"max_snapshots", value(q.max_snapshots)},
          {"max_snapshot_mb", value(q.max_snapshot_mb)},
          {"max_suspended", value(q.max_suspended)},
          {"max_suspended_mb", value(q.max_suspended_mb)},
          {"requests_per_s", value(q.requests_per_s)},
          {"request_burst", value(q.request_burst)}};
}

int tenantQuotaCommand(const std::string& data_dir, const std::string& name, const QuotaChange& change, bool json) {
  // A mistyped --data-dir would make a new database that no daemon reads.
  if (!std::filesystem::exists(data_dir + "/state.db")) {
    return fatal("no state database in " + data_dir + " (is --data-dir the daemon's?)");
  }
  auto store = openStore(data_dir);
  if (!store.ok()) return fatal(store.error().message);
  auto& db = *store.value();
  store::TenantQuotaRecord quota{name};
  auto existing = db.getTenantQuota(name);
  if (existing.ok()) {
    quota = existing.value();
  } else if (existing.error().code != ErrorCode::kNotFound) {
    return fatal(existing.error().message);
  }
  if (change.any()) {
    if (change.reset) quota = store::TenantQuotaRecord{name};
    for (auto [from, to] : {std::pair{&change.sandboxes, &quota.max_sandboxes},
                            {&change.vcpus, &quota.max_vcpus},
                            {&change.memory_mb, &quota.max_memory_mb},
                            {&change.snapshots, &quota.max_snapshots},
                            {&change.snapshot_mb, &quota.max_snapshot_mb},
                            {&change.suspended, &quota.max_suspended},
                            {&change.suspended_mb, &quota.max_suspended_mb},
                            {&change.requests_per_s, &quota.requests_per_s},
                            {&change.request_burst, &quota.request_burst}}) {
      if (*from) *to = *from;
    }
    auto put = db.putTenantQuota(quota);
    if (!put.ok()) return fatal(put.error().message);
    spdlog::info("spaced: quota of tenant \"{}\" set: {}", name, quotaJson(quota).dump());
  }
  const nlohmann::json out = quotaJson(quota);
  if (json) {
    std::cout << out.dump() << "\n";
  } else {
    for (const char* key : {"tenant", "max_sandboxes", "max_vcpus", "max_memory_mb", "max_snapshots", "max_snapshot_mb",
                            "max_suspended", "max_suspended_mb", "requests_per_s", "request_burst"}) {
      const auto& value = out.at(key);
      std::printf("%-16s %s\n", key, value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
    }
    std::cerr << "(default: the node's --tenant-max-* or --tenant-request* value; 0: no limit. A running spaced "
                 "applies changes at once, the request rate within a second.)\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "spaced: the SPACE daemon. Runs sandboxes (microVMs) on this node and serves the REST API.\n"
      "Example: spaced --listen 127.0.0.1:8080 --data-dir /var/lib/space\n"
      "Then:    spacectl run --rm -- uname -a"};
  std::string listen = "127.0.0.1:8080";
  std::string data_dir = "/var/lib/space";
  std::string api_key_file;
  std::string api_key_in_argv;
  bool plaintext_remote = false;
  std::string log_level = "info";
  bool log_json = false;
  std::string accel = "auto";
  std::string on_shutdown = "keep";
  sandbox::ManagerConfig config;
  sandbox::Template base{"base", cli::defaultImagePath("SPACE_KERNEL", "vmlinux"),
                         cli::defaultImagePath("SPACE_ROOTFS", "rootfs.ext4")};
  double boot_timeout_s = 60;
  uint64_t tenant_max_snapshot_mb = 0;

  app.add_option("--listen", listen, "address to serve the API on (ip:port; port 0 picks one)")->capture_default_str();
  std::string e2b_api_listen = "127.0.0.1:3000";
  std::string e2b_envd_listen = "127.0.0.1:3002";
  app.add_option("--e2b-api-listen", e2b_api_listen,
                 "address of the E2B-compatible control plane (the SDK's E2B_API_URL); \"off\": none (docs/e2b.md)")
      ->capture_default_str();
  app.add_option("--e2b-envd-listen", e2b_envd_listen,
                 "address of the E2B-compatible envd front end for every sandbox (the SDK's E2B_SANDBOX_URL); "
                 "\"off\": none")
      ->capture_default_str();
  app.add_flag("--allow-plaintext-remote", plaintext_remote,
               "allow --listen on an address beyond loopback without --tls-cert (keys and data cross the network "
               "in clear: only behind a TLS-terminating proxy or on a private network)");
  std::string ui_dir = SPACE_DEFAULT_UI_DIR;
  app.add_option(
         "--ui-dir", ui_dir,
         "the web console's built files (make ui writes them), served at /ui/ on --listen; \"off\": no console, "
         "and session cookies are not accepted")
      ->capture_default_str();
  std::string console_origin;
  app.add_option(
      "--console-origin", console_origin,
      "the origin browsers reach the console at when it is not --listen's own, e.g. behind a TLS-terminating "
      "proxy: https://space.example.com (an https one makes the session cookie Secure); requests of the "
      "console must come from it");
  http::TlsFiles tls_files;
  app.add_option("--tls-cert", tls_files.cert_file,
                 "serve HTTPS on --listen and the E2B listeners with this certificate chain (PEM; the node's own "
                 "certificate first); needs --tls-key")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", tls_files.key_file, "the private key of --tls-cert (PEM; keep it mode 0600)")
      ->check(CLI::ExistingFile);
  app.add_option("--data-dir", data_dir, "state database, API key, sandbox files")->capture_default_str();
  app.add_option("--api-key-file", api_key_file,
                 "file holding the API key of tenant \"default\" (the operator; env SPACE_API_KEY also works); a "
                 "key not known yet replaces that tenant's other keys. Default: the one kept in <data-dir>/api-key, "
                 "generated on first start");
  app.add_option("--api-key", api_key_in_argv, "refused: use --api-key-file or SPACE_API_KEY")->group("");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  app.add_flag("--log-json", log_json, "log one JSON object per line (stderr)");
  app.add_option("--kernel", base.kernel_path, "guest kernel of template \"base\"; env SPACE_KERNEL")
      ->capture_default_str();
  app.add_option("--rootfs", base.rootfs_path, "root filesystem of template \"base\"; env SPACE_ROOTFS")
      ->capture_default_str();
  config.qemu_binary = cli::defaultQemuBinary();
  app.add_option("--qemu", config.qemu_binary,
                 "the QEMU every sandbox runs; env SPACE_QEMU. Default: SPACE's own (make images builds it from "
                 "the installed Debian QEMU's source, with only the microvm machine and its virtio-mmio devices), "
                 "else qemu-system-x86_64 in PATH")
      ->capture_default_str();
  app.add_option("--accel", accel, "auto (KVM on real hardware KVM, else TCG), kvm, tcg")->capture_default_str();
  app.add_option("--tcg-tb-mib", config.tcg_tb_size_mib,
                 "under TCG, the translation buffer each sandbox's QEMU may fill, MiB (translated guest code, never "
                 "given back; a full one is emptied and refilled). Counted in the node's memory beside the "
                 "guest's. 0: QEMU's own default, 1 GiB")
      ->check(CLI::Range(uint32_t{0}, uint32_t{16384}))
      ->capture_default_str();
  app.add_option("--boot-timeout", boot_timeout_s, "seconds a sandbox may take to boot")->capture_default_str();
  app.add_option("--max-sandboxes", config.max_sandboxes, "sandboxes this node runs at most")->capture_default_str();
  app.add_option("--max-vcpus", config.max_total_vcpus, "vCPUs all sandboxes may have together (0: 4 x host CPUs)")
      ->capture_default_str();
  app.add_option("--max-memory-mb", config.max_total_memory_mb,
                 "memory all sandboxes may hold together: their guests', and each one's QEMU's (" +
                     std::to_string(vmm::kQemuOwnMemoryMib) +
                     " MiB of its own and, under TCG, its translation buffer, --tcg-tb-mib) (0: 80% of host memory)")
      ->capture_default_str();
  app.add_option("--max-sandbox-memory-mb", config.max_memory_mb, "memory one sandbox may have")->capture_default_str();
  // Per-tenant quotas (0: none beyond the node's limits). A tenant at one gets 429 tenant_quota;
  // the others are unaffected.
  app.add_option("--tenant-max-sandboxes", config.tenant_quota.max_sandboxes,
                 "running or paused sandboxes one tenant may have (0: only the node's limit)")
      ->capture_default_str();
  app.add_option("--tenant-max-vcpus", config.tenant_quota.max_vcpus,
                 "vCPUs one tenant's sandboxes may have together (0: only the node's limit)")
      ->capture_default_str();
  app.add_option("--tenant-max-memory-mb", config.tenant_quota.max_memory_mb,
                 "memory one tenant's sandboxes may have together (0: only the node's limit)")
      ->capture_default_str();
  app.add_option("--tenant-max-snapshots", config.tenant_quota.max_snapshots,
                 "snapshots one tenant may keep (0: no quota)")
      ->capture_default_str();
  app.add_option("--tenant-max-snapshot-mb", tenant_max_snapshot_mb,
                 "disk (MB) one tenant's snapshots may take; new ones are refused once reached (0: no quota)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))  // in bytes it must not wrap
      ->capture_default_str();
  config.tenant_quota.max_suspended = 256;
  app.add_option("--tenant-max-suspended", config.tenant_quota.max_suspended,
                 "suspended sandboxes one tenant may keep (each holds its disk and memory on the node's disk); a "
                 "suspend beyond it is refused, an idle one keeps running, and one whose timeout would suspend "
                 "it is deleted (0: no quota)")
      ->capture_default_str();
  uint64_t tenant_max_suspended_mb = 0;
  app.add_option("--tenant-max-suspended-mb", tenant_max_suspended_mb,
                 "disk (MB) one tenant's suspended sandboxes may take (their disks and saved memory); a suspend "
                 "beyond it is refused as --tenant-max-suspended's is (0: no quota)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 40))  // in bytes it must not wrap
      ->capture_default_str();
  app.add_option("--max-disk-layers", config.max_disk_layers,
                 "files a sandbox's disk may stand on (each snapshot of it adds one): a snapshot beyond it is "
                 "refused (409 disk_layers), so that every snapshot and its children still start")
      ->check(CLI::Range(3u, static_cast<unsigned>(vmm::kMaxDiskChain) - 64))
      ->capture_default_str();
  app.add_option("--max-template-sizes", config.max_template_sizes,
                 "sizes (vCPUs x memory) a template is kept restorable for; a create of another size beyond "
                 "them boots (seconds) and keeps nothing, so creates over many sizes cannot fill the disk (0: no "
                 "limit)")
      ->capture_default_str();
  std::vector<std::string> template_sizes;
  app.add_option("--template-sizes", template_sizes,
                 "the only sizes a template is kept for, as VCPUSxMB (e.g. 1x512,2x1024), besides the default "
                 "size; a create of another size boots (seconds) and keeps nothing, so no tenant can take the "
                 "--max-template-sizes places with sizes nobody else uses (default: any size, first come)")
      ->delimiter(',')
      ->check([](const std::string& size) {
        static const std::regex kSize("[1-9][0-9]{0,3}x[1-9][0-9]{0,7}");
        return std::regex_match(size, kSize) ? std::string() : "a size is VCPUSxMB, e.g. 2x1024, not " + size;
      });
  int64_t template_idle_s = config.template_idle.count();
  app.add_option("--template-idle", template_idle_s,
                 "seconds a template of a size outside --template-sizes (not the default size) is kept when no "
                 "create uses it and no sandbox or snapshot stands on it (0: kept); templates of an old image, "
                 "QEMU or kernel, and of sizes no longer kept, go as soon as nothing stands on them")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 24 * 3600));
  app.add_option("--default-cpus", config.default_cpus, "vCPUs of a sandbox when a request gives none")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--default-memory-mb", config.default_memory_mb, "memory (MB) of a sandbox when a request gives none")
      ->capture_default_str()
      ->check(CLI::Range(128, 1 << 20));
  app.add_option("--default-timeout", config.default_timeout_s, "sandbox lifetime (s) when a request gives none")
      ->capture_default_str();
  app.add_option("--max-timeout", config.max_timeout_s, "longest sandbox lifetime (s) a request may ask for")
      ->capture_default_str();
  bool no_snapshots = false;
  app.add_option("--idle-suspend", config.idle_suspend_s,
                 "suspend a sandbox after this many seconds without API, exec or file activity, unless its "
                 "create request says otherwise (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{30} * 24 * 3600));
  int64_t retention_s = config.suspended_retention.count();
  app.add_option("--suspended-retention", retention_s,
                 "seconds a sandbox suspended by its timeout (on_timeout=suspend) is kept before it is deleted")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{60}, int64_t{365} * 24 * 3600));
  int64_t deleted_retention_s = config.deleted_retention.count();
  app.add_option("--deleted-retention", deleted_retention_s,
                 "seconds the record of a deleted or failed sandbox is kept (GET shows why it ended) before "
                 "housekeeping purges it, at start and every 5 minutes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600));
  app.add_option("--warm-pool", config.warm_pool_size,
                 "sandboxes of template base and the default size kept running and warmed up ahead of need, so "
                 "a create only gives one its identity (0: no pool at all; each costs its guest's memory in use "
                 "and ~0.1% of a core when idle under TCG). Pooled guests count against --max-memory-mb and "
                 "--max-vcpus, and give way to a sandbox that would not fit otherwise")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  app.add_option("--warm-pool-budget-mb", config.warm_pool_budget_mb,
                 "memory that all pooled guests may hold together (as the node counts it: with their QEMUs' own "
                 "memory and translation buffers): the --warm-pool ones (kept even over it) and "
                 "those of the kinds (template, size) that creates asked for at least twice in 10 minutes, each "
                 "kind getting what its recent bursts and rate need (0: only the --warm-pool guests)")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  app.add_option("--warm-pool-budget-cpus", config.warm_pool_budget_cpus,
                 "vCPUs those pooled guests may have together (0: as many as the host has CPUs)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  app.add_option("--max-branch", config.max_branch, "children one branch request may create")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--branch-workers", config.branch_workers,
                 "children of a branch started at once (0: one per host CPU; 1: one after another)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  api::ApiLimits api_limits;
  api_limits.tenant_requests_per_s = 100;
  api_limits.tenant_request_burst = 500;
  app.add_option("--max-requests-per-tenant", api_limits.max_requests_per_tenant,
                 "requests one tenant may have running at once (streams included); more get 429")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-terminals", api_limits.max_terminals,
                 "terminal sessions (spacectl shell, the console's terminal) open at once; a tenant may hold a "
                 "quarter of them, more get 429")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  app.add_option("--tenant-requests-per-s", api_limits.tenant_requests_per_s,
                 "requests one tenant may start per second, sustained (0: no limit); more get 429 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--tenant-request-burst", api_limits.tenant_request_burst,
                 "requests one tenant may start at once before its rate applies")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  std::string network_mode = "on";
  net::NetworkOptions network_options;
  std::string egress_policy = R"({"egress":"allow"})";
  app.add_option("--network", network_mode,
                 "on: every sandbox gets a NIC whose traffic its own gateway filters (docs/network.md); off: no "
                 "NIC at all")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--egress-policy", egress_policy,
                 "the network policy of a sandbox whose create gives none, as JSON: {\"egress\": "
                 "\"allow\"|\"deny\"|\"policy\", \"allow\": [...], \"deny\": [...]}; allow = the internet, "
                 "never private, loopback, link-local or metadata addresses")
      ->capture_default_str();
  std::string jail_mode = "auto";
  app.add_option("--jail", jail_mode,
                 "confine each QEMU: space-jail (next to spaced) starts it as pid 1 of a PID namespace of its own, "
                 "seeing only its own files (a private mount namespace), without capabilities, core dumps or new "
                 "privileges, in a cgroup of its own limited by the sandbox's size. auto: cgroups where the host "
                 "allows (else a warning); on: refuse to start without them; off: QEMU unconfined "
                 "(docs/threat-model.md)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  uint32_t vm_uid_base = 1600000000;
  app.add_option("--vm-uid-base", vm_uid_base,
                 "jailed QEMUs run as uids BASE+1..BASE+" + std::to_string(sandbox::kVmUidCount) +
                     ", a uid of its own each, with gid BASE; ids no account or group of this host may have. 0: QEMUs "
                     "run as uid 0 without capabilities")
      ->check(CLI::Range(uint32_t{0}, uint32_t{2147483647u - sandbox::kVmUidCount}))
      ->capture_default_str();
  // Per vCPU, so a sandbox's share grows with its size: a 2-vCPU one gets 128 MiB/s and 2000
  // requests a second, about a general-purpose cloud volume's baseline.
  uint64_t disk_mib_per_vcpu = 64;
  app.add_option("--disk-mib-per-vcpu", disk_mib_per_vcpu,
                 "disk I/O each vCPU of a sandbox may use, MiB/s (reads and writes together; QEMU holds the guest's "
                 "disk to it). 0: no limit")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 20))
      ->capture_default_str();
  uint64_t disk_iops_per_vcpu = 1000;
  app.add_option("--disk-iops-per-vcpu", disk_iops_per_vcpu,
                 "disk requests each vCPU of a sandbox may make per second (reads and writes together). 0: no limit")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--gateway-binary", network_options.gateway_binary,
                 "the space-gateway program (default: next to spaced)");
  bool allow_unconfined_gateways = false;
  app.add_flag("--allow-unconfined-gateways", allow_unconfined_gateways,
               "start even if a gateway is not refused everything a compromised one would try, or cannot read what "
               "it needs (the host's trust store): a kernel without Landlock (Linux 5.13+, 'landlock' in lsm=) "
               "leaves its files open to it. spaced checks this at start and says what it found; without this "
               "flag it refuses to start then");
  // What the default is now; accepted so that scripts written for earlier versions still start.
  bool require_gateway_confinement = true;
  app.add_flag("--require-gateway-confinement", require_gateway_confinement,
               "(the default; see --allow-unconfined-gateways)")
      ->group("");
  app.add_option("--gateway-cpu-percent", network_options.gateway_cpu_percent,
                 "the CPU each sandbox's gateway may use, in percent of one core (its cgroup's quota; a gateway "
                 "runs one thread, so 100 limits nothing it could use)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--gateway-memory-mb", network_options.gateway_memory_mb,
                 "the memory each sandbox's gateway may use (its cgroup's limit): its own pages (320 MiB at most), "
                 "the page cache it fills, and on cgroup v2 its sockets' buffers; over it the kernel kills the "
                 "gateway and spaced starts another (open connections are lost)")
      ->check(CLI::Range(uint64_t{128}, uint64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--gateway-upstream-netns", network_options.upstream_netns,
                 "a network namespace (path) the gateways reach the outside from (default: spaced's own)");
  app.add_option("--gateway-upstream-dns", network_options.upstream_dns,
                 "the resolver the gateways ask, IP[:PORT], the one address their egress table lets through "
                 "whatever its range (default: the host's, the first IPv4 nameserver of --gateway-resolv-conf, "
                 "followed when it changes)");
  app.add_option("--gateway-resolv-conf", network_options.resolv_conf,
                 "where the host's resolver is read, at start and with each egress check (every 10 s), when "
                 "--gateway-upstream-dns is not given (systemd-resolved's upstream: "
                 "/run/systemd/resolve/resolv.conf); a new one that stays 10 s is let through the egress table "
                 "instead of the old, and each sandbox's gateway is restarted to ask it (its open connections are "
                 "lost), at most once in 5 minutes")
      ->capture_default_str();
  app.add_option("--gateway-upstream-ca", network_options.upstream_ca,
                 "PEM certificates the hosts of credential rules must chain to when their TLS is terminated "
                 "(default: the host's trust store; tests point it at their fake internet's CA)");
  app.add_option("--tenant-openable-cidrs", network_options.openable_cidrs,
                 "private IPv4 ranges a tenant's allow rule may open (e.g. a shared database subnet); default "
                 "none: no tenant rule reaches a private, CGNAT or host address. Link-local (cloud metadata) and "
                 "loopback are never reachable")
      ->delimiter(',');
  app.add_option("--netns-dir", network_options.netns_dir, "where the slots' network namespaces are mounted")
      ->capture_default_str();
  app.add_option("--spare-slots", network_options.spare_slots, "network slots kept made ahead of need")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  api::IngressOptions ingress;
  app.add_option("--ingress-domain", ingress.domain,
                 "serve sandbox ports also by host name, {port}-{sandbox id with - for _}.DOMAIN (point a wildcard "
                 "DNS record at spaced); default: only by path, /v1/sandboxes/{id}/ports/{port}/");
  int64_t ingress_idle_s = 600;
  app.add_option("--ingress-idle-timeout-s", ingress_idle_s,
                 "a proxied connection to a sandbox port (a WebSocket) with no traffic for this long is closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 7 * 24 * 3600));
  app.add_option("--ingress-max-connections", ingress.max_connections,
                 "proxied connections to sandbox ports at once, on each front end (REST, E2B); a tenant may hold a "
                 "quarter of them; more get 503 (REST) or 429 (E2B). Of them, at most 256 (a tenant 64) may wait "
                 "for their guest's first answer, each holding a thread")
      ->capture_default_str()
      ->check(CLI::Range(4, 4096));
  app.add_flag("--no-snapshots", no_snapshots,
               "boot every sandbox instead of restoring its template's snapshot (slower; for comparison)");
  app.add_option("--on-shutdown", on_shutdown,
                 "on SIGTERM: keep (sandboxes keep running; the next start re-adopts them) or stop (power them off)")
      ->check(CLI::IsMember({"keep", "stop"}))
      ->capture_default_str();

  auto* tenant = app.add_subcommand("tenant", "manage tenants and their API keys (works on --data-dir directly)");
  tenant->require_subcommand(1);
  tenant->fallthrough();  // --data-dir may follow the subcommand
  std::string tenant_name;
  bool tenant_json = false;
  auto* tenant_add = tenant->add_subcommand("add", "create an API key for a tenant and print it");
  tenant_add->add_option("name", tenant_name, "tenant name")->required();
  tenant_add->add_flag("--json", tenant_json, "print {\"tenant\",\"api_key\"}");
  tenant_add->fallthrough();
  auto* tenant_rm = tenant->add_subcommand("rm", "revoke every API key of a tenant");
  tenant_rm->add_option("name", tenant_name, "tenant name")->required();
  tenant_rm->fallthrough();
  auto* tenant_ls = tenant->add_subcommand("ls", "list tenants and how many keys each has");
  tenant_ls->add_flag("--json", tenant_json, "JSON output");
  tenant_ls->fallthrough();
  QuotaChange quota_change;
  const auto kQuotaRange = CLI::Range(int64_t{0}, int64_t{1} << 40);
  auto* tenant_quota = tenant->add_subcommand(
      "quota",
      "show or set a tenant's own quota, which replaces the node's --tenant-max-* defaults for it "
      "(0: no limit). Without values it shows the quota. Example: spaced tenant quota acme --sandboxes 20 --vcpus 40");
  tenant_quota->add_option("name", tenant_name, "tenant name")->required();
  tenant_quota->add_option("--sandboxes", quota_change.sandboxes, "running or paused sandboxes")->check(kQuotaRange);
  tenant_quota->add_option("--vcpus", quota_change.vcpus, "vCPUs of those together")->check(kQuotaRange);
  tenant_quota->add_option("--memory-mb", quota_change.memory_mb, "memory of those together (MB)")->check(kQuotaRange);
  tenant_quota->add_option("--snapshots", quota_change.snapshots, "snapshots kept")->check(kQuotaRange);
  tenant_quota->add_option("--snapshot-mb", quota_change.snapshot_mb, "disk the snapshots take (MB)")
      ->check(kQuotaRange);
  tenant_quota->add_option("--suspended", quota_change.suspended, "suspended sandboxes")->check(kQuotaRange);
  tenant_quota->add_option("--suspended-mb", quota_change.suspended_mb, "disk the suspended sandboxes take (MB)")
      ->check(kQuotaRange);
  tenant_quota->add_option("--requests-per-s", quota_change.requests_per_s, "API requests it may start per second")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  tenant_quota->add_option("--request-burst", quota_change.request_burst, "API requests it may start at once")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  tenant_quota->add_flag("--reset", quota_change.reset,
                         "drop the tenant's own values first (alone: back to the node's defaults)");
  tenant_quota->add_flag("--json", tenant_json, "JSON output (\"default\" where the node's value applies)");
  tenant_quota->fallthrough();

  CLI11_PARSE(app, argc, argv);
  if (auto st = initLogging(log_level, log_json); !st.ok()) {
    std::cerr << "spaced: " << st.error().message << "\n";
    return 2;
  }
  if (!tenant->parsed() && config.qemu_binary.find('/') == std::string::npos) {
    // Said loudly: the threat model counts on SPACE's build (fewer devices for a guest to reach).
    spdlog::warn(
        "spaced: running {} from PATH (Debian's full QEMU), not SPACE's build: run make images, or give "
        "--qemu",
        config.qemu_binary);
  }
  if (tenant->parsed()) {
    if (tenant_name.empty() && !tenant_ls->parsed()) return fatal("tenant name required");
    const bool bad_name =
        tenant_name.size() > 64 || tenant_name.find('/') != std::string::npos ||
        std::any_of(tenant_name.begin(), tenant_name.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
    if (!tenant_ls->parsed() && bad_name) {
      return fatal("tenant names are 1..64 characters without spaces, control characters or '/'");
    }
    if (tenant_quota->parsed()) return tenantQuotaCommand(data_dir, tenant_name, quota_change, tenant_json);
    return tenantCommand(tenant_add->parsed()  ? "add"
                         : tenant_rm->parsed() ? "rm"
                                               : "ls",
                         data_dir, tenant_name, tenant_json);
  }

  if (!api_key_in_argv.empty()) {
    std::cerr << "spaced: --api-key is refused: every local user reads a process's arguments in /proc/*/cmdline. "
                 "Put the key in a file (mode 0600) and pass --api-key-file FILE, or set SPACE_API_KEY\n";
    return 2;
  }
  if (tls_files.cert_file.empty() != tls_files.key_file.empty()) {
    std::cerr << "spaced: --tls-cert and --tls-key go together\n";
    return 2;
  }
  std::shared_ptr<boost::asio::ssl::context> tls;
  if (!tls_files.cert_file.empty()) {
    // Absolute: spaced.json names the certificate for clients on this node (spacectl trusts it).
    std::error_code abs_ec;
    tls_files.cert_file = std::filesystem::absolute(tls_files.cert_file, abs_ec).string();
    auto context = http::serverTlsContext(tls_files);
    if (!context.ok()) {
      std::cerr << "spaced: " << context.error().message << "\n";
      return 2;
    }
    tls = std::move(context.value());
  }
  for (const std::string* e2b : {&e2b_api_listen, &e2b_envd_listen}) {
    if (*e2b != "off" && !isLoopbackListen(*e2b) && !plaintext_remote && !tls) {
      std::cerr << "spaced: refusing to serve the E2B front end on " << *e2b
                << " beyond loopback without TLS; pass --tls-cert and --tls-key, or --allow-plaintext-remote "
                   "behind a TLS-terminating proxy, or listen on 127.0.0.1\n";
      return 2;
    }
  }
  if (!isLoopbackListen(listen) && !plaintext_remote && !tls) {
    std::cerr << "spaced: refusing to serve " << listen
              << " beyond loopback without TLS: keys and data would cross the network in clear. Pass --tls-cert "
                 "and --tls-key, or put a TLS-terminating proxy in front and pass --allow-plaintext-remote, or "
                 "listen on 127.0.0.1\n";
    return 2;
  }

  auto parsed_accel = vmm::parseAccelerator(accel);
  if (!parsed_accel.ok()) return fatal(parsed_accel.error().message);
  // Resolve the image links now: a sandbox's disk overlay names its base image by path, and the
  // links move when the images are rebuilt.
  std::error_code ec;
  for (std::string* path : {&base.kernel_path, &base.rootfs_path}) {
    auto real = std::filesystem::canonical(*path, ec);
    if (ec) return fatal("template \"base\": " + *path + ": " + ec.message() + " (build the images: make images)");
    *path = real.string();
  }
  // The image-cache entries resolved here (and the QEMU's, which node facts resolve the same
  // way) stay in use while spaced runs: a `make images` that builds newer ones prunes older
  // entries, but never these (images/lib.sh, prune_kind).
  std::vector<UniqueFd> images_in_use;
  for (const std::string& path : {base.kernel_path, base.rootfs_path,
                                  config.qemu_binary.find('/') == std::string::npos
                                      ? std::string()
                                      : std::filesystem::weakly_canonical(config.qemu_binary, ec).string()}) {
    if (path.empty()) continue;
    if (UniqueFd held = holdImageCacheEntry(path); held.valid()) images_in_use.push_back(std::move(held));
  }

  // Signals are taken by sigwait in this thread only; every thread started later inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // The listeners hold up to 4096 + 4096 + 8192 connections (idle ones cost descriptors, not
  // threads; 5 each, 11 over TLS), and each sandbox holds a few descriptors of its own; a default
  // soft limit of 1024 would fail accept() first. Raised within the hard limit, which only the
  // administrator sets; the listeners shrink to what it allows (see ServerLimits).
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < 262144) {
    nofile.rlim_cur = std::min<rlim_t>(262144, nofile.rlim_max);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  auto store = openStore(data_dir);
  if (!store.ok()) return fatal(store.error().message);
  // One daemon per data dir: a second one would re-adopt (and on failure kill) the first one's
  // VMs. The lock lives as long as this process.
  UniqueFd lock(::open((data_dir + "/spaced.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid() || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return fatal("another spaced is using " + data_dir + " (" + data_dir + "/spaced.lock is locked)");
  }
  // The images saved sandboxes stand on, current and older (a root filesystem rebuilt since
  // their template was made): kept in the cache, and admitted in jailed VMs' disk chains.
  auto bases = vmm::holdImageBases(data_dir, {base.rootfs_path});
  if (!bases.ok()) return fatal(bases.error().message);
  config.base_images = bases->images;
  std::vector<UniqueFd> bases_in_use = std::move(bases->held);
  auto given = givenKey(api_key_file);
  if (!given.ok()) return fatal(given.error().message);
  auto key = bootstrapKey(*store.value(), data_dir, given.value());
  if (!key.ok()) return fatal(key.error().message);
  api::KeyRing keys(*store.value());
  if (auto loaded = keys.load(); !loaded.ok()) return fatal(loaded.error().message);

  config.data_dir = data_dir;
  config.templates["base"] = base;
  config.accelerator = parsed_accel.value();
  config.boot_timeout = std::chrono::milliseconds(static_cast<int64_t>(boot_timeout_s * 1000));
  config.tenant_quota.max_snapshot_bytes = tenant_max_snapshot_mb << 20;
  config.tenant_quota.max_suspended_bytes = tenant_max_suspended_mb << 20;
  config.template_sizes = std::set<std::string>(template_sizes.begin(), template_sizes.end());
  config.use_snapshots = !no_snapshots;
  config.suspended_retention = std::chrono::seconds(retention_s);
  config.deleted_retention = std::chrono::seconds(deleted_retention_s);
  config.template_idle = std::chrono::seconds(template_idle_s);
  if (jail_mode != "off") {
    std::error_code exe_ec;
    config.jailer = (std::filesystem::read_symlink("/proc/self/exe", exe_ec).parent_path() / "space-jail").string();
    if (::access(config.jailer.c_str(), X_OK) != 0) {
      return fatal("--jail " + jail_mode + " needs " + config.jailer +
                   " (built next to spaced); --jail off runs "
                   "QEMU unconfined");
    }
    config.require_cgroups = jail_mode == "on";
    config.vm_uid_base = vm_uid_base;
  }
  config.disk_io_per_vcpu = vmm::DiskIoRate{disk_mib_per_vcpu << 20, disk_iops_per_vcpu};
  auto policy_json = parseJsonBounded(egress_policy);
  if (!policy_json.ok()) return fatal("--egress-policy: " + policy_json.error().message);
  auto policy = net::parsePolicy(policy_json.value());
  if (!policy.ok()) return fatal("--egress-policy: " + policy.error().message);
  config.default_policy = policy.value();
  if (network_mode == "on") {
    // Slots are network namespaces with taps and nftables rules, and gateways drop to uids of
    // their own: all of it needs root. Said at once, not as the first create's failure.
    if (::geteuid() != 0) {
      return fatal(
          "--network on needs root (it makes network namespaces, taps and nftables rules for the "
          "sandboxes' gateways); run spaced as root, or with --network off for sandboxes without a NIC");
    }
    if (network_options.gateway_binary.empty()) {
      network_options.gateway_binary =
          (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "space-gateway").string();
    }
    if (::access(network_options.gateway_binary.c_str(), X_OK) != 0) {
      return fatal("--network on needs the gateway: " + network_options.gateway_binary + " is not executable");
    }
    // Slots are named by data dir, so two daemons on one host (tests do that) never take or
    // reclaim each other's.
    network_options.slot_prefix = "space-" + sha256Hex(data_dir).substr(0, 8);
    config.network = net::NetworkPool::create(network_options);
    if (!config.network->configError().empty()) return fatal(config.network->configError());
    // A gateway confined as every gateway will be, trying what a compromised one would: what
    // this host's kernel actually refuses, said once, rather than assumed.
    auto probe = config.network->probeGatewayConfinement(data_dir + "/network/.gateway-probe");
    std::string allowed;
    if (!probe.ok()) {
      allowed = probe.error().message;
    } else {
      for (const auto& [name, check] : probe.value()["checks"].items()) {
        const auto refused = check.is_object() ? check.find("refused") : check.end();
        if (refused != check.end() && refused->is_boolean() && refused->get<bool>()) continue;
        allowed += (allowed.empty() ? "" : ", ") + name;
      }
      if (allowed.empty() && !probe.value()["confined"].get<bool>()) allowed = "(unnamed)";
    }
    if (allowed.empty()) {
      spdlog::info(
          "network: gateways are confined (Landlock ABI {}): {} checks of what a compromised one would "
          "try, all refused",
          probe.value().value("landlock_abi", 0), probe.value()["checks"].size());
    } else if (!allow_unconfined_gateways) {
      return fatal("network: a gateway is not confined: " + allowed + (probe.ok() ? " allowed" : "") +
                   " (--allow-unconfined-gateways starts anyway; docs/network.md)");
    } else {
      spdlog::warn("network: gateways are not fully confined: {}{}", allowed, probe.ok() ? " allowed" : "");
    }
    // And what a confined gateway must still read: the trust store that credential rules' TLS
    // verifies upstream servers against.
    if (probe.ok() && probe.value().value("works", true) != true) {
      const std::string what = probe.value().value("needs", nlohmann::json::object()).dump();
      if (!allow_unconfined_gateways) {
        return fatal("network: a confined gateway cannot read what it needs: " + what +
                     " (--allow-unconfined-gateways starts anyway, and credential rules' TLS will fail)");
      }
      spdlog::warn("network: a confined gateway cannot read what it needs (credential rules' TLS will fail): {}", what);
    }
  }
  // Tenants' secrets are sealed under <data-dir>/secret-key: state.db alone reveals none.
  auto secret_box = secrets::SecretBox::openOrCreateKey(data_dir + "/secret-key");
  if (!secret_box.ok()) return fatal(secret_box.error().message);
  secrets::SecretVault vault(*store.value(), secret_box.value());
  config.secrets = &vault;
  auto manager = sandbox::SandboxManager::start(config, *store.value());
  if (!manager.ok()) return fatal(manager.error().message);

  ingress.idle_timeout = std::chrono::seconds(ingress_idle_s);
  auto ingress_key = ingressKey(data_dir);
  if (!ingress_key.ok()) {
    manager.value()->shutdown(sandbox::ShutdownMode::kKeepRunning);
    return fatal(ingress_key.error().message);
  }
  ingress.token_key = ingress_key.value();
  // One token bucket per tenant for every front end: a tenant's rate is its rate, however it
  // spreads its requests over SPACE's API, E2B's API and envd.
  api_limits.tenant_rates = std::make_shared<api::TenantRates>(
      api::TenantRates::Rate{api_limits.tenant_requests_per_s, api_limits.tenant_request_burst});
  api_limits.tenant_rates->setRateSource(api::tenantRateSource(
      *manager.value(), api::TenantRates::Rate{api_limits.tenant_requests_per_s, api_limits.tenant_request_burst}));
  api::ApiService service(*manager.value(), keys, api_limits, kDefaultTenant, ingress, &vault);
  // The web console: its pages, and sessions that a browser holds in place of a key.
  std::optional<api::ConsoleAssets> console_assets;
  std::optional<api::Console> console;
  if (ui_dir != "off") {
    auto loaded = api::ConsoleAssets::load(ui_dir);
    if (loaded.ok()) {
      console_assets = std::move(loaded.value());
      spdlog::info("console: {} files from {}, served at /ui/", console_assets->count(), ui_dir);
    } else {
      spdlog::warn("console: not served (its pages answer 503): {}", loaded.error().message);
    }
    if (!console_origin.empty()) {
      const bool scheme = console_origin.rfind("https://", 0) == 0 || console_origin.rfind("http://", 0) == 0;
      const std::string host = scheme ? console_origin.substr(console_origin.find("://") + 3) : "";
      if (!scheme || host.empty() ||
          host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                 "0123456789.-:[]") != std::string::npos) {
        return fatal("--console-origin " + console_origin +
                     ": must be an origin, scheme and host (and port) only, e.g. https://space.example.com");
      }
    }
    api::ConsoleOptions console_options;
    console_options.https = tls != nullptr;
    console_options.public_origin = console_origin;
    console_options.operator_tenant = kDefaultTenant;
    console.emplace(keys, console_assets ? &*console_assets : nullptr, console_options);
    service.setConsole(&*console);
  }
  // The listeners split the process's descriptors: 30% for SPACE's API, 15% for each of E2B's,
  // so that filling them all still leaves 40% for VMs, gateways, files and the database.
  http::ServerLimits api_server_limits;
  api_server_limits.descriptor_share = 0.3;
  auto server = http::Server::start(
      listen, [&](http::Request& rq, http::Response& rs) { service.handle(rq, rs); }, api_server_limits, tls);
  if (!server.ok()) {
    manager.value()->shutdown(sandbox::ShutdownMode::kKeepRunning);
    return fatal(server.error().message);
  }
  const std::string url = server.value()->url();
  // The E2B front ends: the same sandboxes, E2B's wire shapes (docs/e2b.md).
  e2b::ControlPlaneOptions e2b_options;
  e2b_options.max_json_body = api_limits.max_json_body;
  e2b_options.tenant_gate = api::TenantGate::Limits{api_limits.max_requests_per_tenant,
                                                    api_limits.tenant_requests_per_s, api_limits.tenant_request_burst};
  e2b_options.tenant_rates = api_limits.tenant_rates;
  if (auto size = std::filesystem::file_size(base.rootfs_path, ec); !ec) e2b_options.disk_size_mb = size >> 20;
  // E2B's traffic token is SPACE's ingress token: it opens a sandbox's ports, never its envd.
  if (config.network) e2b_options.traffic_token_key = ingress.token_key;
  e2b::ControlPlane e2b_api(*manager.value(), keys, vault, e2b_options);
  e2b::EnvdOptions envd_options;
  envd_options.tenant_calls.rate_per_s = api_limits.tenant_requests_per_s;
  envd_options.tenant_calls.burst = api_limits.tenant_request_burst;
  envd_options.tenant_rates = api_limits.tenant_rates;
  envd_options.ports = ingress;  // the operator's ingress timeouts, caps and token key
  e2b::EnvdFront e2b_envd(*manager.value(), vault, envd_options);
  std::unique_ptr<http::Server> e2b_api_server, e2b_envd_server;
  for (auto [listen_at, slot, what] : {std::tuple{&e2b_api_listen, &e2b_api_server, "E2B API"},
                                       std::tuple{&e2b_envd_listen, &e2b_envd_server, "envd"}}) {
    if (*listen_at == "off") continue;
    http::Handler handler =
        slot == &e2b_api_server
            ? http::Handler([&](http::Request& rq, http::Response& rs) { e2b_api.handle(rq, rs); })
            : http::Handler([&](http::Request& rq, http::Response& rs) { e2b_envd.handle(rq, rs); });
    // Every E2B stream (a command, a PTY, a watch) holds its own connection for its life (a
    // detached response: no thread), and a proxied port connection a thread: one client may run
    // many at once. All of loopback counts as one client address, so per-address limits would
    // let one tenant lock out the others here: the listeners' shares are per tenant (the gates)
    // instead.
    http::ServerLimits limits;
    if (slot == &e2b_envd_server) {
      limits.max_running_requests = 4096;
      limits.max_connections = 8192;
    }
    limits.max_running_requests_per_client = limits.max_running_requests;
    limits.max_connections_per_client = limits.max_connections;
    limits.max_streams = limits.max_connections;
    limits.max_streams_per_client = limits.max_connections;
    limits.descriptor_share = 0.15;
    auto started = http::Server::start(*listen_at, std::move(handler), limits, tls);
    if (!started.ok()) {
      server.value()->stop(std::chrono::seconds(0));
      manager.value()->shutdown(sandbox::ShutdownMode::kKeepRunning);
      return fatal(std::string(what) + " front end: " + started.error().message + " (--e2b-" +
                   (slot == &e2b_api_server ? "api" : "envd") + "-listen ADDR, or off)");
    }
    *slot = std::move(started.value());
  }
  const std::string e2b_api_url = e2b_api_server ? e2b_api_server->url() : "";
  const std::string e2b_sandbox_url = e2b_envd_server ? e2b_envd_server->url() : "";
  // Where clients on this host (spacectl, tests) find the daemon.
  nlohmann::json endpoint{{"url", url}, {"pid", getpid()}};
  if (tls) endpoint["tls_cert"] = tls_files.cert_file;
  if (!e2b_api_url.empty()) endpoint["e2b_api_url"] = e2b_api_url;
  if (!e2b_sandbox_url.empty()) endpoint["e2b_sandbox_url"] = e2b_sandbox_url;
  if (console_assets) endpoint["console_url"] = url + "/ui/";
  if (auto written = writeFileAtomic(data_dir + "/spaced.json", endpoint.dump() + "\n", 0600); !written.ok()) {
    spdlog::warn("spaced: cannot write {}/spaced.json: {}", data_dir, written.error().message);
  }
  spdlog::info("spaced: serving {} (data dir {}, accelerator {}, network {}, on SIGTERM: {})", url, data_dir, accel,
               network_mode, on_shutdown);
  if (!e2b_api_url.empty() || !e2b_sandbox_url.empty()) {
    spdlog::info("spaced: E2B front ends: API {}, envd {}", e2b_api_url.empty() ? "off" : e2b_api_url,
                 e2b_sandbox_url.empty() ? "off" : e2b_sandbox_url);
  }
  if (isatty(STDOUT_FILENO) || getenv("SPACE_PRINT_KEY")) {
    std::printf("spaced is up.\n  API:     %s\n  API key: %s  (also in %s/api-key)\n  Try:     ", url.c_str(),
                key->c_str(), data_dir.c_str());
    std::printf("SPACE_API=%s SPACE_API_KEY=%s spacectl run --rm -- uname -a\n", url.c_str(), key->c_str());
    if (console_assets) std::printf("  Console: %s/ui/  (log in with the API key)\n", url.c_str());
    if (!e2b_api_url.empty() && !e2b_sandbox_url.empty()) {
      std::printf("  E2B SDK: paste these three lines into the shell that runs your agent:\n");
      std::printf("    export E2B_API_URL=%s\n    export E2B_SANDBOX_URL=%s\n    export E2B_API_KEY=%s\n",
                  e2b_api_url.c_str(), e2b_sandbox_url.c_str(), key->c_str());
    }
    std::fflush(stdout);
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("spaced: {} received; shutting down", strsignal(sig));
  server.value()->stop(std::chrono::seconds(10));
  if (e2b_api_server) e2b_api_server->stop(std::chrono::seconds(2));
  if (e2b_envd_server) e2b_envd_server->stop(std::chrono::seconds(2));
  service.endTerminals();
  manager.value()->shutdown(on_shutdown == "stop" ? sandbox::ShutdownMode::kStop : sandbox::ShutdownMode::kKeepRunning);
  std::filesystem::remove(data_dir + "/spaced.json", ec);
  spdlog::info("spaced: stopped");
  return 0;
}
