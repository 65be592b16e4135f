// spaced's durable state: sandboxes, their snapshots and API keys in one SQLite database, so
// that a restarted daemon finds its VMs and snapshots again and a recorded state change
// survives a crash or power loss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

struct sqlite3;

namespace space::store {

struct SandboxRecord {
  std::string id;  // "sb_" + 20 lowercase alphanumerics (made by the caller)
  std::string tenant;
  std::string state;         // lifecycle name: creating, running, paused, suspended, deleted, failed (opaque here)
  std::string state_reason;  // why it is in that state (failure message, "timeout", ...), "" if none
  std::string template_name;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;                              // at most INT64_MAX: SQLite integers are signed
  int64_t created_at_ms = 0;                           // unix epoch milliseconds
  int64_t updated_at_ms = 0;                           // set by the store on every insert/update; ignored on input
  int64_t expires_at_ms = 0;                           // hard timeout
  nlohmann::json metadata = nlohmann::json::object();  // string -> string
  nlohmann::json env = nlohmann::json::object();       // string -> string
  // Where its VM lives, so a restarted daemon can find it again.
  std::string run_dir;
  int64_t vm_pid = 0;
  std::string vm_identity;  // e.g. the process start time, to tell a reused pid apart
  std::string accelerator;
  // The timeout it was created with or last set to, in seconds: expires_at_ms only says when
  // the current one ends, and a resumed sandbox needs the length to re-arm it.
  int64_t timeout_s = 0;
  int64_t idle_suspend_s = 0;         // suspend after this long without activity; 0 = never
  std::string on_timeout = "delete";  // what expiry does: "delete" or "suspend" (opaque here)
  std::string source_snapshot;        // id of the snapshot it was branched from, "" if none
  // Whether any request that reaches it resumes it when suspended (E2B's autoResume). SPACE's
  // own API always does; the E2B front end only for sandboxes made with this set.
  bool auto_resume = false;

  bool operator==(const SandboxRecord&) const = default;
};

struct ListFilter {
  std::string tenant;                           // required: lists never cross tenants
  std::vector<std::string> states;              // empty = every state except "deleted"
  std::map<std::string, std::string> metadata;  // all must match exactly
  size_t limit = 100;                           // 1..1000
  std::string after_id;                         // pagination cursor: results strictly after this id in list order
};

struct SandboxPage {
  std::vector<SandboxRecord> items;
  std::string next_cursor;  // "" when no more; otherwise pass as ListFilter::after_id
};

// A saved point of a sandbox that new sandboxes can be branched from. The row records where
// its files are, so a restarted daemon can find them again and know what still uses a layer.
struct SnapshotRecord {
  std::string id;  // made by the caller
  std::string tenant;
  std::string name;           // the caller's label, "" if none; not unique
  std::string sandbox_id;     // the sandbox it was taken of (which may since have been deleted)
  std::string template_name;  // what that sandbox was created from
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;  // at most INT64_MAX: SQLite integers are signed
  std::string accelerator;
  // Its files: the published directory (memory and device state) and the frozen disk layer.
  std::string dir;
  std::string disk;
  uint64_t size_bytes = 0;                             // at most INT64_MAX
  int64_t created_at_ms = 0;                           // unix epoch milliseconds
  nlohmann::json metadata = nlohmann::json::object();  // string -> string

  bool operator==(const SnapshotRecord&) const = default;
};

struct SnapshotFilter {
  std::string tenant;      // required: lists never cross tenants
  std::string sandbox_id;  // only snapshots of this sandbox; "" = all of the tenant's
  size_t limit = 100;      // 1..1000
  std::string after_id;    // pagination cursor: results strictly after this id in list order
};

struct SnapshotUsage {
  uint64_t count = 0;
  uint64_t bytes = 0;
};

struct SnapshotPage {
  std::vector<SnapshotRecord> items;
  std::string next_cursor;  // "" when no more; otherwise pass as SnapshotFilter::after_id
};

struct ApiKeyRecord {
  std::string tenant;
  std::string key_sha256_hex;  // 64 lowercase hex digits; the key itself is never stored
  std::string label;
  int64_t created_at_ms = 0;

  bool operator==(const ApiKeyRecord&) const = default;
};

// A tenant's secret as stored: the value only sealed (secrets::SecretBox), never in clear.
struct SecretRecord {
  std::string tenant;
  std::string name;
  std::string sealed;         // opaque bytes
  int64_t version = 0;        // 1 when created, +1 on every rotation; set by putSecret
  int64_t created_at_ms = 0;  // set by putSecret
  int64_t updated_at_ms = 0;  // set by putSecret
  bool created = false;       // putSecret: whether the row is new (not stored)

  bool operator==(const SecretRecord&) const = default;
};

// A tenant's own limits, where the node's defaults (spaced's --tenant-max-* flags) do not suit
// it. An absent value takes the node's default; 0 means no limit at all.
struct TenantQuotaRecord {
  std::string tenant;
  std::optional<int64_t> max_sandboxes;
  std::optional<int64_t> max_vcpus;
  std::optional<int64_t> max_memory_mb;
  std::optional<int64_t> max_snapshots;
  std::optional<int64_t> max_snapshot_mb;
  std::optional<int64_t> max_suspended;
  std::optional<int64_t> max_suspended_mb;  // the disk its suspended sandboxes take
  std::optional<int64_t> requests_per_s;    // API requests it may start per second
  std::optional<int64_t> request_burst;     // and at once
  int64_t updated_at_ms = 0;                // set by putTenantQuota

  bool operator==(const TenantQuotaRecord&) const = default;
};

// Every method may be called from any thread: one connection, serialized by a mutex (spaced's
// write rate is low, and one connection keeps every read consistent with the writes before it).
// Errors: kInvalidArgument for bad input, kNotFound / kAlreadyExists as documented,
// kResourceExhausted when the disk is full, kInternal for any other SQLite failure. A failed
// write changes nothing.
class StateStore {
 public:
  // Opens or creates the database (a new file is created 0600: env may hold secrets), runs
  // pending migrations in one transaction each (schema version in PRAGMA user_version), and
  // refuses a database written by a newer schema (kFailedPrecondition) without touching it.
  // ":memory:" gives a private in-memory database, gone when the store is.
  static Result<std::unique_ptr<StateStore>> open(const std::string& path);
  static int latestSchemaVersion();

  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  int schemaVersion() const { return schema_version_; }

  Status insertSandbox(const SandboxRecord& record);  // kAlreadyExists on duplicate id
  Status updateSandbox(const SandboxRecord& record);  // whole row by id; kNotFound if absent
  // The same, and `record` then says what was written (its updated_at_ms): the caller has the
  // row as stored without reading it back.
  Status insertSandbox(SandboxRecord& record);
  Status updateSandbox(SandboxRecord& record);
  Result<SandboxRecord> getSandbox(const std::string& id);  // kNotFound
  // Stable order: created_at_ms, then id. kInvalidArgument if after_id is not a sandbox of the
  // tenant (including one purged since the previous page).
  Result<SandboxPage> listSandboxes(const ListFilter& filter);
  // All tenants, same order; for start-up re-adoption and the expiry reaper.
  // Every tenant's, or `tenant`'s only.
  Result<std::vector<SandboxRecord>> sandboxesInStates(const std::vector<std::string>& states,
                                                       const std::string& tenant = "");
  Result<std::map<std::string, int64_t>> countByState();                              // all tenants, for metrics
  Result<int64_t> countInState(const std::string& tenant, const std::string& state);  // one tenant's
  // Retention of deleted and failed rows; answers the ids of the failed ones it purged (their
  // sandboxes' files, kept for a failed sandbox, go with them).
  Result<std::vector<std::string>> purgeDeletedBefore(int64_t updated_before_ms);

  Status insertSnapshot(const SnapshotRecord& record);        // kAlreadyExists on duplicate id
  Result<SnapshotRecord> getSnapshot(const std::string& id);  // kNotFound
  // Same order and cursor rules as listSandboxes (the cursor row need not match sandbox_id).
  Result<SnapshotPage> listSnapshots(const SnapshotFilter& filter);
  // How many snapshots a tenant has and their bytes (for its quota).
  Result<SnapshotUsage> snapshotUsage(const std::string& tenant);
  // All tenants, same order; for start-up recovery (which files and layers are still owned).
  // With `tenant`, that tenant's only (its quota's walks: never node-sized work for one tenant).
  Result<std::vector<SnapshotRecord>> allSnapshots(const std::string& tenant = "");
  Status deleteSnapshot(const std::string& id);  // kNotFound if absent

  Status addApiKey(const ApiKeyRecord& key);        // kAlreadyExists if the digest exists
  Result<std::vector<ApiKeyRecord>> listApiKeys();  // ordered by tenant, created_at_ms, digest
  Status removeApiKeys(const std::string& tenant);  // kNotFound if the tenant had none

  // Creates or replaces (rotates) the tenant's secret of that name, in one transaction; fills in
  // version, timestamps and `created`. kResourceExhausted (reason too_many_secrets) when it
  // would be the tenant's secret number max_per_tenant + 1.
  // `create_only`: kAlreadyExists when it exists (checked in the same transaction).
  Status putSecret(SecretRecord& record, size_t max_per_tenant, bool create_only = false);
  Result<SecretRecord> getSecret(const std::string& tenant, const std::string& name);  // kNotFound
  Result<std::vector<SecretRecord>> listSecrets(const std::string& tenant);            // by name
  Status deleteSecret(const std::string& tenant, const std::string& name);             // kNotFound
  Result<int64_t> deleteSecretsOf(const std::string& tenant);                          // how many went

  // Creates or replaces the tenant's quota row (a record with no value set removes it); fills in
  // updated_at_ms. kInvalidArgument for a negative value.
  Status putTenantQuota(TenantQuotaRecord& record);
  Result<TenantQuotaRecord> getTenantQuota(const std::string& tenant);  // kNotFound: the node's defaults
  Result<std::vector<TenantQuotaRecord>> listTenantQuotas();            // by tenant
  Status deleteTenantQuota(const std::string& tenant);                  // kNotFound if it had none

  // Caps the database at its current size plus `extra_pages`, so tests can see what a full
  // disk does without filling one.
  Status limitGrowthForTesting(int64_t extra_pages);

 private:
  Status insertSandboxAt(const SandboxRecord& record, int64_t now);
  Status updateSandboxAt(const SandboxRecord& record, int64_t now);
  StateStore(sqlite3* db, std::string path, int schema_version)
      : db_(db), path_(std::move(path)), schema_version_(schema_version) {}

  std::mutex mu_;
  sqlite3* db_;
  const std::string path_;
  const int schema_version_;
};

}  // namespace space::store
