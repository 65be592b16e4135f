#include "store/state_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <limits>
#include <string_view>
#include <system_error>
#include <utility>

#include "common/bounded_json.h"

namespace space::store {
namespace {

// Long enough to ride out a backup or an operator's sqlite3 shell holding the lock; short
// enough that a wedged peer shows up as an error instead of a hung API call.
constexpr int kBusyTimeoutMs = 5000;
constexpr size_t kMaxListLimit = 1000;
constexpr std::string_view kDeletedState = "deleted";
constexpr const char* kMemoryPath = ":memory:";

int64_t nowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

Error invalid(std::string message) { return makeError(ErrorCode::kInvalidArgument, std::move(message)); }

std::string errnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// `op` says what spaced was doing ("recording sandbox sb_..."), because SQLite's own message
// ("database or disk is full") does not say what was lost.
Error sqliteError(sqlite3* db, int rc, const std::string& op) {
  // The connection's message belongs to its last failure, which is not `rc` when a bind failed.
  std::string detail = (db != nullptr && sqlite3_extended_errcode(db) == rc) ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  switch (rc & 0xff) {
    case SQLITE_FULL: return makeError(ErrorCode::kResourceExhausted, "disk full while " + op + ": " + detail);
    case SQLITE_NOMEM: return makeError(ErrorCode::kResourceExhausted, "out of memory while " + op + ": " + detail);
    case SQLITE_IOERR: {
      int err = db != nullptr ? sqlite3_system_errno(db) : 0;
      return makeError(ErrorCode::kInternal,
                       "I/O error while " + op + ": " + detail + (err != 0 ? " (" + errnoText(err) + ")" : ""));
    }
    case SQLITE_CANTOPEN: {
      int err = db != nullptr ? sqlite3_system_errno(db) : 0;
      return makeError(ErrorCode::kInternal, op + ": " + detail + (err != 0 ? " (" + errnoText(err) + ")" : ""));
    }
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return makeError(ErrorCode::kInternal, "state database damaged or not a database, while " + op + ": " + detail);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return makeError(ErrorCode::kInternal,
                       "state database locked by another connection, while " + op + ": " + detail);
    default: return makeError(ErrorCode::kInternal, op + ": " + detail);
  }
}

// A prepared statement that finalizes itself. Parameters are bound by name; a bind failure is
// kept and reported by step() so that call sites stay a flat list of binds.
class Stmt {
 public:
  static Result<Stmt> prepare(sqlite3* db, const std::string& sql, const std::string& op) {
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size() + 1), &stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return sqliteError(db, rc, op);
    }
    return Stmt(db, stmt);
  }
  Stmt(Stmt&& other) noexcept : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), bind_rc_(other.bind_rc_) {}
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt() { sqlite3_finalize(stmt_); }

  void bind(const char* name, std::string_view value) {
    // A null pointer would bind SQL NULL, not an empty string.
    const char* data = value.data() != nullptr ? value.data() : "";
    keep(sqlite3_bind_text64(stmt_, index(name), data, value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
  }
  void bind(const char* name, int64_t value) { keep(sqlite3_bind_int64(stmt_, index(name), value)); }
  void bind(const char* name, const std::optional<int64_t>& value) {
    keep(value ? sqlite3_bind_int64(stmt_, index(name), *value) : sqlite3_bind_null(stmt_, index(name)));
  }
  void bindBlob(const char* name, std::string_view bytes) {
    keep(sqlite3_bind_blob64(stmt_, index(name), bytes.empty() ? "" : bytes.data(), bytes.size(), SQLITE_TRANSIENT));
  }

  // SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return bind_rc_ != SQLITE_OK ? bind_rc_ : sqlite3_step(stmt_); }

  // For a statement that returns no rows.
  Status run(const std::string& op) {
    int rc = step();
    if (rc != SQLITE_DONE) return sqliteError(db_, rc == SQLITE_ROW ? SQLITE_MISUSE : rc, op);
    return okStatus();
  }

  std::string text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    if (p == nullptr) return "";
    return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  std::optional<int64_t> optionalInteger(int col) const {
    if (sqlite3_column_type(stmt_, col) == SQLITE_NULL) return std::nullopt;
    return sqlite3_column_int64(stmt_, col);
  }
  std::string blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    if (p == nullptr) return "";
    return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }

 private:
  Stmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}

  int index(const char* name) const {
    int i = sqlite3_bind_parameter_index(stmt_, name);
    if (i == 0) {
      // The SQL and its binds are written together in this file; a mismatch is a bug.
      spdlog::critical("state store: statement has no parameter {}: {}", name, sqlite3_sql(stmt_));
      std::abort();
    }
    return i;
  }
  void keep(int rc) {
    if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;
};

// For fixed SQL only (DDL, transaction control): sqlite3_exec cannot bind parameters.
Status exec(sqlite3* db, const char* sql, const std::string& op) {
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return sqliteError(db, rc, op);
  return okStatus();
}

Result<int64_t> queryInt(sqlite3* db, const std::string& sql, const std::string& op) {
  auto stmt = Stmt::prepare(db, sql, op);
  if (!stmt.ok()) return stmt.error();
  int rc = stmt->step();
  if (rc != SQLITE_ROW) return sqliteError(db, rc == SQLITE_DONE ? SQLITE_MISUSE : rc, op);
  return stmt->integer(0);
}

// ---- Schema migrations ----
// Migration i (0-based) brings the schema from version i to i + 1, inside a transaction that
// also records the new version. To change the schema, append a function; never edit one that
// has shipped, since databases in the field already ran it.

Status migrateToV1(sqlite3* db, const std::string& op) {
  return exec(db,
              "CREATE TABLE sandboxes ("
              "  id TEXT PRIMARY KEY NOT NULL,"
              "  tenant TEXT NOT NULL,"
              "  state TEXT NOT NULL,"
              "  state_reason TEXT NOT NULL,"
              "  template_name TEXT NOT NULL,"
              "  cpus INTEGER NOT NULL,"
              "  memory_mb INTEGER NOT NULL,"
              "  created_at_ms INTEGER NOT NULL,"
              "  updated_at_ms INTEGER NOT NULL,"
              "  expires_at_ms INTEGER NOT NULL,"
              "  metadata TEXT NOT NULL,"
              "  env TEXT NOT NULL,"
              "  run_dir TEXT NOT NULL,"
              "  vm_pid INTEGER NOT NULL,"
              "  vm_identity TEXT NOT NULL,"
              "  accelerator TEXT NOT NULL);"
              // Serves per-tenant listing in its order, including the pagination cursor.
              "CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, created_at_ms, id);"
              // Serves re-adoption, the reaper and retention, which select by state.
              "CREATE INDEX sandboxes_by_state ON sandboxes (state);"
              "CREATE TABLE api_keys ("
              "  key_sha256_hex TEXT PRIMARY KEY NOT NULL,"
              "  tenant TEXT NOT NULL,"
              "  label TEXT NOT NULL,"
              "  created_at_ms INTEGER NOT NULL);"
              "CREATE INDEX api_keys_by_tenant ON api_keys (tenant);",
              op);
}

// Existing rows get the values a sandbox created without these settings has. The ALTERs come
// first, so a conflicting snapshots table fails the migration after they ran and shows that
// the transaction undoes them.
Status migrateToV2(sqlite3* db, const std::string& op) {
  return exec(db,
              "ALTER TABLE sandboxes ADD COLUMN timeout_s INTEGER NOT NULL DEFAULT 0;"
              "ALTER TABLE sandboxes ADD COLUMN idle_suspend_s INTEGER NOT NULL DEFAULT 0;"
              "ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'delete';"
              "ALTER TABLE sandboxes ADD COLUMN source_snapshot TEXT NOT NULL DEFAULT '';"
              // No foreign key to sandboxes: a snapshot outlives the sandbox it was taken of,
              // including its row once retention purges it.
              "CREATE TABLE snapshots ("
              "  id TEXT PRIMARY KEY NOT NULL,"
              "  tenant TEXT NOT NULL,"
              "  name TEXT NOT NULL,"
              "  sandbox_id TEXT NOT NULL,"
              "  template_name TEXT NOT NULL,"
              "  cpus INTEGER NOT NULL,"
              "  memory_mb INTEGER NOT NULL,"
              "  accelerator TEXT NOT NULL,"
              "  dir TEXT NOT NULL,"
              "  disk TEXT NOT NULL,"
              "  size_bytes INTEGER NOT NULL,"
              "  created_at_ms INTEGER NOT NULL,"
              "  metadata TEXT NOT NULL);"
              // Serves per-tenant listing in its order, including the pagination cursor.
              "CREATE INDEX snapshots_by_tenant ON snapshots (tenant, created_at_ms, id);"
              // Serves listing the snapshots of one sandbox.
              "CREATE INDEX snapshots_by_sandbox ON snapshots (sandbox_id);",
              op);
}

// Tenants' secrets, sealed by the secrets module (the store never sees a value in clear).
Status migrateToV3(sqlite3* db, const std::string& op) {
  return exec(db,
              "CREATE TABLE secrets ("
              "  tenant TEXT NOT NULL,"
              "  name TEXT NOT NULL,"
              "  sealed BLOB NOT NULL,"
              "  version INTEGER NOT NULL,"
              "  created_at_ms INTEGER NOT NULL,"
              "  updated_at_ms INTEGER NOT NULL,"
              "  PRIMARY KEY (tenant, name));",
              op);
}

// Whether traffic resumes a suspended sandbox (E2B's autoResume); existing rows: no.
Status migrateToV4(sqlite3* db, const std::string& op) {
  return exec(db, "ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;", op);
}

// Tenants' own quotas; a NULL limit takes the node's default.
Status migrateToV5(sqlite3* db, const std::string& op) {
  return exec(db,
              "CREATE TABLE tenant_quotas ("
              "  tenant TEXT PRIMARY KEY NOT NULL,"
              "  max_sandboxes INTEGER CHECK (max_sandboxes IS NULL OR "
              "    (typeof(max_sandboxes) = 'integer' AND max_sandboxes >= 0)),"
              "  max_vcpus INTEGER CHECK (max_vcpus IS NULL OR (typeof(max_vcpus) = 'integer' AND max_vcpus >= 0)),"
              "  max_memory_mb INTEGER CHECK (max_memory_mb IS NULL OR "
              "    (typeof(max_memory_mb) = 'integer' AND max_memory_mb >= 0)),"
              "  max_snapshots INTEGER CHECK (max_snapshots IS NULL OR "
              "    (typeof(max_snapshots) = 'integer' AND max_snapshots >= 0)),"
              "  max_snapshot_mb INTEGER CHECK (max_snapshot_mb IS NULL OR "
              "    (typeof(max_snapshot_mb) = 'integer' AND max_snapshot_mb >= 0)),"
              "  max_suspended INTEGER CHECK (max_suspended IS NULL OR "
              "    (typeof(max_suspended) = 'integer' AND max_suspended >= 0)),"
              "  updated_at_ms INTEGER NOT NULL);",
              op);
}

// The disk a tenant's suspended sandboxes may take.
Status migrateToV6(sqlite3* db, const std::string& op) {
  return exec(db,
              "ALTER TABLE tenant_quotas ADD COLUMN max_suspended_mb INTEGER CHECK (max_suspended_mb IS NULL OR "
              "  (typeof(max_suspended_mb) = 'integer' AND max_suspended_mb >= 0));",
              op);
}

// A tenant's own API request rate (per second, and the burst).
Status migrateToV7(sqlite3* db, const std::string& op) {
  return exec(db,
              "ALTER TABLE tenant_quotas ADD COLUMN requests_per_s INTEGER CHECK (requests_per_s IS NULL OR "
              "  (typeof(requests_per_s) = 'integer' AND requests_per_s >= 0));"
              "ALTER TABLE tenant_quotas ADD COLUMN request_burst INTEGER CHECK (request_burst IS NULL OR "
              "  (typeof(request_burst) = 'integer' AND request_burst >= 0));",
              op);
}

struct Migration {
  const char* summary;
  Status (*apply)(sqlite3* db, const std::string& op);
};

constexpr Migration kMigrations[] = {
    {"sandboxes and api_keys tables", migrateToV1},
    {"sandbox timeout/idle settings and snapshots", migrateToV2},
    {"sealed secrets", migrateToV3},
    {"sandbox auto_resume", migrateToV4},
    {"tenant quotas", migrateToV5},
    {"tenant quota of suspended disk", migrateToV6},
    {"tenant request rate", migrateToV7},
};
constexpr int kLatestVersion = static_cast<int>(std::size(kMigrations));

Status runMigration(sqlite3* db, const std::string& path, int to_version) {
  const Migration& m = kMigrations[to_version - 1];
  const std::string op =
      "migrating state database " + path + " to schema version " + std::to_string(to_version) + " (" + m.summary + ")";
  // IMMEDIATE takes the write lock up front, so a second daemon on the same file waits here
  // and then sees the version this one wrote, instead of migrating twice.
  SPACE_TRY(exec(db, "BEGIN IMMEDIATE", op));
  auto body = [&]() -> Status {
    auto current = queryInt(db, "PRAGMA user_version", op);
    if (!current.ok()) return current.error();
    if (current.value() >= to_version) return okStatus();
    SPACE_TRY(m.apply(db, op));
    // PRAGMA takes no parameters; the value is this file's own constant, not input.
    return exec(db, ("PRAGMA user_version = " + std::to_string(to_version)).c_str(), op);
  };
  Status st = body();
  if (st.ok()) st = exec(db, "COMMIT", op);
  if (!st.ok()) {
    // A failed COMMIT (disk full) can leave the transaction open; the old schema must stay.
    if (sqlite3_get_autocommit(db) == 0) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    return st.error();
  }
  spdlog::info("state database {}: schema version {} ({})", path, to_version, m.summary);
  return okStatus();
}

// ---- Rows ----

constexpr const char* kSandboxColumns =
    "id, tenant, state, state_reason, template_name, cpus, memory_mb, created_at_ms, updated_at_ms, "
    "expires_at_ms, metadata, env, run_dir, vm_pid, vm_identity, accelerator, timeout_s, idle_suspend_s, on_timeout, "
    "source_snapshot, auto_resume";

// A JSON object of strings, as text for the row. The dump can throw on invalid UTF-8, which
// is the caller's input, so it becomes kInvalidArgument here rather than an exception.
Result<std::string> stringMapText(const nlohmann::json& value, const char* what) {
  if (!value.is_object()) return invalid(std::string(what) + " must be a JSON object, got " + value.type_name());
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) return invalid(std::string(what) + " value for key \"" + key + "\" is not a string");
  }
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    return invalid(std::string(what) + " is not valid UTF-8: " + e.what());
  }
}

struct SandboxText {
  std::string metadata;
  std::string env;
};

Result<SandboxText> validateSandbox(const SandboxRecord& r) {
  if (r.id.empty()) return invalid("sandbox id is empty");
  if (r.tenant.empty()) return invalid("sandbox " + r.id + " has an empty tenant");
  if (r.state.empty()) return invalid("sandbox " + r.id + " has an empty state");
  if (r.memory_mb > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return invalid("sandbox " + r.id + " memory_mb is out of range");
  }
  auto metadata = stringMapText(r.metadata, "metadata");
  if (!metadata.ok()) return metadata.error();
  auto env = stringMapText(r.env, "env");
  if (!env.ok()) return env.error();
  return SandboxText{std::move(metadata).value(), std::move(env).value()};
}

void bindSandbox(Stmt& stmt, const SandboxRecord& r, const SandboxText& text, int64_t updated_at_ms) {
  stmt.bind(":id", r.id);
  stmt.bind(":tenant", r.tenant);
  stmt.bind(":state", r.state);
  stmt.bind(":state_reason", r.state_reason);
  stmt.bind(":template_name", r.template_name);
  stmt.bind(":cpus", static_cast<int64_t>(r.cpus));
  stmt.bind(":memory_mb", static_cast<int64_t>(r.memory_mb));
  stmt.bind(":created_at_ms", r.created_at_ms);
  stmt.bind(":updated_at_ms", updated_at_ms);
  stmt.bind(":expires_at_ms", r.expires_at_ms);
  stmt.bind(":metadata", text.metadata);
  stmt.bind(":env", text.env);
  stmt.bind(":run_dir", r.run_dir);
  stmt.bind(":vm_pid", r.vm_pid);
  stmt.bind(":vm_identity", r.vm_identity);
  stmt.bind(":accelerator", r.accelerator);
  stmt.bind(":timeout_s", r.timeout_s);
  stmt.bind(":idle_suspend_s", r.idle_suspend_s);
  stmt.bind(":on_timeout", r.on_timeout);
  stmt.bind(":source_snapshot", r.source_snapshot);
  stmt.bind(":auto_resume", static_cast<int64_t>(r.auto_resume ? 1 : 0));
}

// `owner` names the row ("sandbox sb_...") for the message.
Result<nlohmann::json> parseStringMap(const std::string& text, const std::string& owner, const char* what) {
  auto parsed = parseJsonBounded(text);
  nlohmann::json value = parsed.ok() ? std::move(parsed.value()) : nlohmann::json();
  if (!value.is_object()) {
    return makeError(ErrorCode::kInternal, owner + " has unreadable " + what + " in the state database");
  }
  return value;
}

// Column order is kSandboxColumns.
Result<SandboxRecord> readSandbox(const Stmt& stmt) {
  SandboxRecord r;
  r.id = stmt.text(0);
  r.tenant = stmt.text(1);
  r.state = stmt.text(2);
  r.state_reason = stmt.text(3);
  r.template_name = stmt.text(4);
  r.cpus = static_cast<uint32_t>(stmt.integer(5));
  r.memory_mb = static_cast<uint64_t>(stmt.integer(6));
  r.created_at_ms = stmt.integer(7);
  r.updated_at_ms = stmt.integer(8);
  r.expires_at_ms = stmt.integer(9);
  auto metadata = parseStringMap(stmt.text(10), "sandbox " + r.id, "metadata");
  if (!metadata.ok()) return metadata.error();
  r.metadata = std::move(metadata).value();
  auto env = parseStringMap(stmt.text(11), "sandbox " + r.id, "env");
  if (!env.ok()) return env.error();
  r.env = std::move(env).value();
  r.run_dir = stmt.text(12);
  r.vm_pid = stmt.integer(13);
  r.vm_identity = stmt.text(14);
  r.accelerator = stmt.text(15);
  r.timeout_s = stmt.integer(16);
  r.idle_suspend_s = stmt.integer(17);
  r.on_timeout = stmt.text(18);
  r.source_snapshot = stmt.text(19);
  r.auto_resume = stmt.integer(20) != 0;
  return r;
}

Result<std::vector<SandboxRecord>> readSandboxes(sqlite3* db, Stmt& stmt, const std::string& op) {
  std::vector<SandboxRecord> out;
  for (;;) {
    int rc = stmt.step();
    if (rc == SQLITE_DONE) return out;
    if (rc != SQLITE_ROW) return sqliteError(db, rc, op);
    auto record = readSandbox(stmt);
    if (!record.ok()) return record.error();
    out.push_back(std::move(record).value());
  }
}

constexpr const char* kSnapshotColumns =
    "id, tenant, name, sandbox_id, template_name, cpus, memory_mb, accelerator, dir, disk, size_bytes, "
    "created_at_ms, metadata";

Result<std::string> validateSnapshot(const SnapshotRecord& r) {
  if (r.id.empty()) return invalid("snapshot id is empty");
  if (r.tenant.empty()) return invalid("snapshot " + r.id + " has an empty tenant");
  constexpr auto kMaxInt = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (r.memory_mb > kMaxInt) return invalid("snapshot " + r.id + " memory_mb is out of range");
  if (r.size_bytes > kMaxInt) return invalid("snapshot " + r.id + " size_bytes is out of range");
  return stringMapText(r.metadata, "metadata");
}

// Column order is kSnapshotColumns.
Result<SnapshotRecord> readSnapshot(const Stmt& stmt) {
  SnapshotRecord r;
  r.id = stmt.text(0);
  r.tenant = stmt.text(1);
  r.name = stmt.text(2);
  r.sandbox_id = stmt.text(3);
  r.template_name = stmt.text(4);
  r.cpus = static_cast<uint32_t>(stmt.integer(5));
  r.memory_mb = static_cast<uint64_t>(stmt.integer(6));
  r.accelerator = stmt.text(7);
  r.dir = stmt.text(8);
  r.disk = stmt.text(9);
  r.size_bytes = static_cast<uint64_t>(stmt.integer(10));
  r.created_at_ms = stmt.integer(11);
  auto metadata = parseStringMap(stmt.text(12), "snapshot " + r.id, "metadata");
  if (!metadata.ok()) return metadata.error();
  r.metadata = std::move(metadata).value();
  return r;
}

Result<std::vector<SnapshotRecord>> readSnapshots(sqlite3* db, Stmt& stmt, const std::string& op) {
  std::vector<SnapshotRecord> out;
  for (;;) {
    int rc = stmt.step();
    if (rc == SQLITE_DONE) return out;
    if (rc != SQLITE_ROW) return sqliteError(db, rc, op);
    auto record = readSnapshot(stmt);
    if (!record.ok()) return record.error();
    out.push_back(std::move(record).value());
  }
}

Result<std::string> jsonText(const nlohmann::json& value, const char* what) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    return invalid(std::string(what) + " is not valid UTF-8: " + e.what());
  }
}

bool isLowerHex(const std::string& s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbHandle = std::unique_ptr<sqlite3, DbCloser>;

// Creating the file before SQLite does fixes its mode: SQLite gives the -wal and -shm files
// the mode of the database, and rows hold sandbox environments, which may carry secrets.
Status createPrivateFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return okStatus();
    return makeError(ErrorCode::kInternal, "creating state database " + path + ": " + errnoText(errno));
  }
  ::close(fd);
  // The new name must survive a power loss along with the rows that will be committed to it.
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return okStatus();
}

}  // namespace

int StateStore::latestSchemaVersion() { return kLatestVersion; }

Result<std::unique_ptr<StateStore>> StateStore::open(const std::string& path) {
  if (path.empty()) return invalid("state database path is empty");
  if (path != kMemoryPath) SPACE_TRY(createPrivateFile(path));

  const std::string op = "opening state database " + path;
  sqlite3* raw = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  DbHandle db(raw);
  if (rc != SQLITE_OK) return sqliteError(raw, rc, op);
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);
  // SQLite quietly opens a write-protected file read-only; every later write would then fail
  // one by one, long after start-up.
  if (sqlite3_db_readonly(db.get(), "main") == 1) {
    return makeError(ErrorCode::kInternal, "state database " + path +
                                               " is read-only; spaced must be able to write it (check the "
                                               "permissions and owner of the file and its directory)");
  }

  // Before anything that writes (even the journal mode is recorded in the file), so that a
  // database from a newer spaced is left exactly as it was.
  auto version = queryInt(db.get(), "PRAGMA user_version", "reading schema version of state database " + path);
  if (!version.ok()) return version.error();
  if (version.value() > kLatestVersion) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "state database " + path + " has schema version " + std::to_string(version.value()) +
                         ", newer than version " + std::to_string(kLatestVersion) +
                         " that this spaced supports; refusing to open it (run a newer spaced or restore a backup)");
  }
  if (version.value() < 0) {
    return makeError(ErrorCode::kFailedPrecondition,
                     "state database " + path + " has invalid schema version " + std::to_string(version.value()));
  }

  {
    auto stmt = Stmt::prepare(db.get(), "PRAGMA journal_mode = WAL", "setting WAL journal on " + path);
    if (!stmt.ok()) return stmt.error();
    if (stmt->step() == SQLITE_ROW) {
      std::string mode = stmt->text(0);
      // Not fatal: other journal modes are as durable, only slower for concurrent readers.
      if (mode != "wal" && path != kMemoryPath) {
        spdlog::warn("state database {}: journal mode is {}, WAL unavailable here", path, mode);
      }
    }
  }
  SPACE_TRY(exec(db.get(), "PRAGMA synchronous = FULL", "setting synchronous=FULL on " + path));
  SPACE_TRY(exec(db.get(), "PRAGMA foreign_keys = ON", "enabling foreign keys on " + path));

  for (int v = static_cast<int>(version.value()) + 1; v <= kLatestVersion; ++v) {
    SPACE_TRY(runMigration(db.get(), path, v));
  }
  return std::unique_ptr<StateStore>(new StateStore(db.release(), path, kLatestVersion));
}

StateStore::~StateStore() {
  int rc = sqlite3_close_v2(db_);
  if (rc != SQLITE_OK) spdlog::warn("closing state database {}: {}", path_, sqlite3_errstr(rc));
}

Status StateStore::insertSandbox(SandboxRecord& record) {
  const int64_t now = nowMs();
  SPACE_TRY(insertSandboxAt(record, now));
  record.updated_at_ms = now;
  return okStatus();
}

Status StateStore::updateSandbox(SandboxRecord& record) {
  const int64_t now = nowMs();
  SPACE_TRY(updateSandboxAt(record, now));
  record.updated_at_ms = now;
  return okStatus();
}

Status StateStore::insertSandbox(const SandboxRecord& record) { return insertSandboxAt(record, nowMs()); }

Status StateStore::updateSandbox(const SandboxRecord& record) { return updateSandboxAt(record, nowMs()); }

Status StateStore::insertSandboxAt(const SandboxRecord& record, int64_t now) {
  auto text = validateSandbox(record);
  if (!text.ok()) return text.error();
  std::lock_guard lock(mu_);
  const std::string op = "recording sandbox " + record.id;
  auto stmt = Stmt::prepare(db_,
                            std::string("INSERT INTO sandboxes (") + kSandboxColumns +
                                ") VALUES (:id, :tenant, :state, :state_reason, :template_name, :cpus, :memory_mb, "
                                ":created_at_ms, :updated_at_ms, :expires_at_ms, :metadata, :env, :run_dir, :vm_pid, "
                                ":vm_identity, :accelerator, :timeout_s, :idle_suspend_s, :on_timeout, "
                                ":source_snapshot, :auto_resume)",
                            op);
  if (!stmt.ok()) return stmt.error();
  bindSandbox(stmt.value(), record, text.value(), now);
  int rc = stmt->step();
  if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
    return makeError(ErrorCode::kAlreadyExists, "sandbox " + record.id + " already exists");
  }
  if (rc != SQLITE_DONE) return sqliteError(db_, rc, op);
  return okStatus();
}

Status StateStore::updateSandboxAt(const SandboxRecord& record, int64_t now) {
  auto text = validateSandbox(record);
  if (!text.ok()) return text.error();
  std::lock_guard lock(mu_);
  const std::string op = "updating sandbox " + record.id;
  auto stmt = Stmt::prepare(db_,
                            "UPDATE sandboxes SET tenant = :tenant, state = :state, state_reason = :state_reason, "
                            "template_name = :template_name, cpus = :cpus, memory_mb = :memory_mb, "
                            "created_at_ms = :created_at_ms, updated_at_ms = :updated_at_ms, "
                            "expires_at_ms = :expires_at_ms, metadata = :metadata, env = :env, run_dir = :run_dir, "
                            "vm_pid = :vm_pid, vm_identity = :vm_identity, accelerator = :accelerator, "
                            "timeout_s = :timeout_s, idle_suspend_s = :idle_suspend_s, on_timeout = :on_timeout, "
                            "source_snapshot = :source_snapshot, auto_resume = :auto_resume WHERE id = :id",
                            op);
  if (!stmt.ok()) return stmt.error();
  bindSandbox(stmt.value(), record, text.value(), now);
  SPACE_TRY(stmt->run(op));
  if (sqlite3_changes(db_) == 0) return makeError(ErrorCode::kNotFound, "sandbox " + record.id + " not found");
  return okStatus();
}

Result<SandboxRecord> StateStore::getSandbox(const std::string& id) {
  if (id.empty()) return invalid("sandbox id is empty");
  std::lock_guard lock(mu_);
  const std::string op = "reading sandbox " + id;
  auto stmt = Stmt::prepare(db_, std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE id = :id", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":id", id);
  int rc = stmt->step();
  if (rc == SQLITE_DONE) return makeError(ErrorCode::kNotFound, "sandbox " + id + " not found");
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return readSandbox(stmt.value());
}

Result<SandboxPage> StateStore::listSandboxes(const ListFilter& filter) {
  if (filter.tenant.empty()) return invalid("listing sandboxes needs a tenant");
  if (filter.limit < 1 || filter.limit > kMaxListLimit) {
    return invalid("list limit must be between 1 and " + std::to_string(kMaxListLimit) + ", got " +
                   std::to_string(filter.limit));
  }
  // Sets of values travel as one bound JSON text and are unpacked with json_each, so the SQL
  // stays fixed whatever the caller sends (keys with quotes or dots need no JSON-path escaping).
  std::string states_json;
  if (!filter.states.empty()) {
    auto text = jsonText(nlohmann::json(filter.states), "state filter");
    if (!text.ok()) return text.error();
    states_json = std::move(text).value();
  }
  std::string metadata_json;
  if (!filter.metadata.empty()) {
    auto text = jsonText(nlohmann::json(filter.metadata), "metadata filter");
    if (!text.ok()) return text.error();
    metadata_json = std::move(text).value();
  }

  std::lock_guard lock(mu_);
  const std::string op = "listing sandboxes of tenant " + filter.tenant;
  int64_t after_created_at_ms = 0;
  if (!filter.after_id.empty()) {
    auto stmt = Stmt::prepare(db_, "SELECT created_at_ms FROM sandboxes WHERE id = :id AND tenant = :tenant", op);
    if (!stmt.ok()) return stmt.error();
    stmt->bind(":id", filter.after_id);
    stmt->bind(":tenant", filter.tenant);
    int rc = stmt->step();
    if (rc == SQLITE_DONE) {
      return invalid("pagination cursor " + filter.after_id + " is not a sandbox of tenant " + filter.tenant);
    }
    if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
    after_created_at_ms = stmt->integer(0);
  }

  std::string sql = std::string("SELECT ") + kSandboxColumns + " FROM sandboxes WHERE tenant = :tenant";
  sql += filter.states.empty() ? " AND state <> :deleted" : " AND state IN (SELECT value FROM json_each(:states))";
  if (!filter.metadata.empty()) {
    // No wanted pair may be missing from the row's metadata.
    sql +=
        " AND NOT EXISTS (SELECT 1 FROM json_each(:metadata) AS want WHERE NOT EXISTS ("
        "SELECT 1 FROM json_each(sandboxes.metadata) AS have "
        "WHERE have.key = want.key AND have.type = 'text' AND have.value = want.value))";
  }
  if (!filter.after_id.empty()) sql += " AND (created_at_ms, id) > (:after_created_at_ms, :after_id)";
  sql += " ORDER BY created_at_ms, id LIMIT :limit";

  auto stmt = Stmt::prepare(db_, sql, op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":tenant", filter.tenant);
  if (filter.states.empty()) {
    stmt->bind(":deleted", kDeletedState);
  } else {
    stmt->bind(":states", states_json);
  }
  if (!filter.metadata.empty()) stmt->bind(":metadata", metadata_json);
  if (!filter.after_id.empty()) {
    stmt->bind(":after_created_at_ms", after_created_at_ms);
    stmt->bind(":after_id", filter.after_id);
  }
  // One extra row tells whether another page exists, so the last page never comes back empty.
  stmt->bind(":limit", static_cast<int64_t>(filter.limit + 1));
  auto rows = readSandboxes(db_, stmt.value(), op);
  if (!rows.ok()) return rows.error();

  SandboxPage page;
  page.items = std::move(rows).value();
  if (page.items.size() > filter.limit) {
    page.items.pop_back();
    page.next_cursor = page.items.back().id;
  }
  return page;
}

Result<std::vector<SandboxRecord>> StateStore::sandboxesInStates(const std::vector<std::string>& states,
                                                                 const std::string& tenant) {
  if (states.empty()) return std::vector<SandboxRecord>{};
  auto states_json = jsonText(nlohmann::json(states), "state filter");
  if (!states_json.ok()) return states_json.error();
  std::lock_guard lock(mu_);
  const std::string op = "listing sandboxes by state";
  auto stmt = Stmt::prepare(db_,
                            std::string("SELECT ") + kSandboxColumns +
                                " FROM sandboxes WHERE state IN (SELECT value FROM json_each(:states))" +
                                (tenant.empty() ? "" : " AND tenant = :tenant") + " ORDER BY created_at_ms, id",
                            op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":states", states_json.value());
  if (!tenant.empty()) stmt->bind(":tenant", tenant);
  return readSandboxes(db_, stmt.value(), op);
}

Result<std::map<std::string, int64_t>> StateStore::countByState() {
  std::lock_guard lock(mu_);
  const std::string op = "counting sandboxes by state";
  auto stmt = Stmt::prepare(db_, "SELECT state, COUNT(*) FROM sandboxes GROUP BY state", op);
  if (!stmt.ok()) return stmt.error();
  std::map<std::string, int64_t> counts;
  for (;;) {
    int rc = stmt->step();
    if (rc == SQLITE_DONE) return counts;
    if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
    counts[stmt->text(0)] = stmt->integer(1);
  }
}

Result<int64_t> StateStore::countInState(const std::string& tenant, const std::string& state) {
  std::lock_guard lock(mu_);
  const std::string op = "counting " + state + " sandboxes of tenant " + tenant;
  auto stmt = Stmt::prepare(db_, "SELECT COUNT(*) FROM sandboxes WHERE tenant = :tenant AND state = :state", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":tenant", tenant);
  stmt->bind(":state", state);
  int rc = stmt->step();
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return stmt->integer(0);
}

Result<SnapshotUsage> StateStore::snapshotUsage(const std::string& tenant) {
  std::lock_guard lock(mu_);
  const std::string op = "counting snapshots of tenant " + tenant;
  auto stmt =
      Stmt::prepare(db_, "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM snapshots WHERE tenant = :tenant", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":tenant", tenant);
  int rc = stmt->step();
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return SnapshotUsage{static_cast<uint64_t>(stmt->integer(0)), static_cast<uint64_t>(stmt->integer(1))};
}

Result<std::vector<std::string>> StateStore::purgeDeletedBefore(int64_t updated_before_ms) {
  std::lock_guard lock(mu_);
  const std::string op = "purging deleted and failed sandboxes";
  // Failed ones too: nobody may ever delete them, and their records would pile up.
  auto stmt = Stmt::prepare(db_,
                            "DELETE FROM sandboxes WHERE state IN (:deleted, 'failed') AND updated_at_ms < :before "
                            "RETURNING id, state",
                            op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":deleted", kDeletedState);
  stmt->bind(":before", updated_before_ms);
  std::vector<std::string> failed;
  int purged = 0;
  for (int rc = stmt->step();; rc = stmt->step()) {
    if (rc == SQLITE_DONE) break;
    if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
    ++purged;
    if (stmt->text(1) == "failed") failed.push_back(stmt->text(0));
  }
  if (purged > 0) spdlog::debug("state database {}: purged {} deleted or failed sandboxes", path_, purged);
  return failed;
}

Status StateStore::insertSnapshot(const SnapshotRecord& record) {
  auto metadata = validateSnapshot(record);
  if (!metadata.ok()) return metadata.error();
  std::lock_guard lock(mu_);
  const std::string op = "recording snapshot " + record.id;
  auto stmt = Stmt::prepare(db_,
                            std::string("INSERT INTO snapshots (") + kSnapshotColumns +
                                ") VALUES (:id, :tenant, :name, :sandbox_id, :template_name, :cpus, :memory_mb, "
                                ":accelerator, :dir, :disk, :size_bytes, :created_at_ms, :metadata)",
                            op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":id", record.id);
  stmt->bind(":tenant", record.tenant);
  stmt->bind(":name", record.name);
  stmt->bind(":sandbox_id", record.sandbox_id);
  stmt->bind(":template_name", record.template_name);
  stmt->bind(":cpus", static_cast<int64_t>(record.cpus));
  stmt->bind(":memory_mb", static_cast<int64_t>(record.memory_mb));
  stmt->bind(":accelerator", record.accelerator);
  stmt->bind(":dir", record.dir);
  stmt->bind(":disk", record.disk);
  stmt->bind(":size_bytes", static_cast<int64_t>(record.size_bytes));
  stmt->bind(":created_at_ms", record.created_at_ms);
  stmt->bind(":metadata", metadata.value());
  int rc = stmt->step();
  if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
    return makeError(ErrorCode::kAlreadyExists, "snapshot " + record.id + " already exists");
  }
  if (rc != SQLITE_DONE) return sqliteError(db_, rc, op);
  return okStatus();
}

Result<SnapshotRecord> StateStore::getSnapshot(const std::string& id) {
  if (id.empty()) return invalid("snapshot id is empty");
  std::lock_guard lock(mu_);
  const std::string op = "reading snapshot " + id;
  auto stmt = Stmt::prepare(db_, std::string("SELECT ") + kSnapshotColumns + " FROM snapshots WHERE id = :id", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":id", id);
  int rc = stmt->step();
  if (rc == SQLITE_DONE) return makeError(ErrorCode::kNotFound, "snapshot " + id + " not found");
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return readSnapshot(stmt.value());
}

Result<SnapshotPage> StateStore::listSnapshots(const SnapshotFilter& filter) {
  if (filter.tenant.empty()) return invalid("listing snapshots needs a tenant");
  if (filter.limit < 1 || filter.limit > kMaxListLimit) {
    return invalid("list limit must be between 1 and " + std::to_string(kMaxListLimit) + ", got " +
                   std::to_string(filter.limit));
  }

  std::lock_guard lock(mu_);
  const std::string op = "listing snapshots of tenant " + filter.tenant;
  int64_t after_created_at_ms = 0;
  if (!filter.after_id.empty()) {
    auto stmt = Stmt::prepare(db_, "SELECT created_at_ms FROM snapshots WHERE id = :id AND tenant = :tenant", op);
    if (!stmt.ok()) return stmt.error();
    stmt->bind(":id", filter.after_id);
    stmt->bind(":tenant", filter.tenant);
    int rc = stmt->step();
    if (rc == SQLITE_DONE) {
      return invalid("pagination cursor " + filter.after_id + " is not a snapshot of tenant " + filter.tenant);
    }
    if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
    after_created_at_ms = stmt->integer(0);
  }

  std::string sql = std::string("SELECT ") + kSnapshotColumns + " FROM snapshots WHERE tenant = :tenant";
  if (!filter.sandbox_id.empty()) sql += " AND sandbox_id = :sandbox_id";
  if (!filter.after_id.empty()) sql += " AND (created_at_ms, id) > (:after_created_at_ms, :after_id)";
  sql += " ORDER BY created_at_ms, id LIMIT :limit";

  auto stmt = Stmt::prepare(db_, sql, op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":tenant", filter.tenant);
  if (!filter.sandbox_id.empty()) stmt->bind(":sandbox_id", filter.sandbox_id);
  if (!filter.after_id.empty()) {
    stmt->bind(":after_created_at_ms", after_created_at_ms);
    stmt->bind(":after_id", filter.after_id);
  }
  // One extra row tells whether another page exists, so the last page never comes back empty.
  stmt->bind(":limit", static_cast<int64_t>(filter.limit + 1));
  auto rows = readSnapshots(db_, stmt.value(), op);
  if (!rows.ok()) return rows.error();

  SnapshotPage page;
  page.items = std::move(rows).value();
  if (page.items.size() > filter.limit) {
    page.items.pop_back();
    page.next_cursor = page.items.back().id;
  }
  return page;
}

Result<std::vector<SnapshotRecord>> StateStore::allSnapshots(const std::string& tenant) {
  std::lock_guard lock(mu_);
  const std::string op = tenant.empty() ? "listing all snapshots" : "listing the snapshots of tenant " + tenant;
  auto stmt = Stmt::prepare(db_,
                            std::string("SELECT ") + kSnapshotColumns + " FROM snapshots" +
                                (tenant.empty() ? "" : " WHERE tenant = :tenant") + " ORDER BY created_at_ms, id",
                            op);
  if (!stmt.ok()) return stmt.error();
  if (!tenant.empty()) stmt->bind(":tenant", tenant);
  return readSnapshots(db_, stmt.value(), op);
}

Status StateStore::deleteSnapshot(const std::string& id) {
  if (id.empty()) return invalid("snapshot id is empty");
  std::lock_guard lock(mu_);
  const std::string op = "deleting snapshot " + id;
  auto stmt = Stmt::prepare(db_, "DELETE FROM snapshots WHERE id = :id", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":id", id);
  SPACE_TRY(stmt->run(op));
  if (sqlite3_changes(db_) == 0) return makeError(ErrorCode::kNotFound, "snapshot " + id + " not found");
  return okStatus();
}

Status StateStore::addApiKey(const ApiKeyRecord& key) {
  if (key.tenant.empty()) return invalid("API key has an empty tenant");
  if (key.key_sha256_hex.size() != 64 || !isLowerHex(key.key_sha256_hex)) {
    return invalid("API key digest must be 64 lowercase hex digits");
  }
  std::lock_guard lock(mu_);
  const std::string op = "recording API key for tenant " + key.tenant;
  auto stmt = Stmt::prepare(db_,
                            "INSERT INTO api_keys (key_sha256_hex, tenant, label, created_at_ms) "
                            "VALUES (:digest, :tenant, :label, :created_at_ms)",
                            op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":digest", key.key_sha256_hex);
  stmt->bind(":tenant", key.tenant);
  stmt->bind(":label", key.label);
  stmt->bind(":created_at_ms", key.created_at_ms);
  int rc = stmt->step();
  // The digest is left out: it identifies a live credential.
  if (rc == SQLITE_CONSTRAINT_PRIMARYKEY) return makeError(ErrorCode::kAlreadyExists, "API key already exists");
  if (rc != SQLITE_DONE) return sqliteError(db_, rc, op);
  return okStatus();
}

Result<std::vector<ApiKeyRecord>> StateStore::listApiKeys() {
  std::lock_guard lock(mu_);
  const std::string op = "listing API keys";
  auto stmt = Stmt::prepare(db_,
                            "SELECT tenant, key_sha256_hex, label, created_at_ms FROM api_keys "
                            "ORDER BY tenant, created_at_ms, key_sha256_hex",
                            op);
  if (!stmt.ok()) return stmt.error();
  std::vector<ApiKeyRecord> keys;
  for (;;) {
    int rc = stmt->step();
    if (rc == SQLITE_DONE) return keys;
    if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
    keys.push_back(ApiKeyRecord{stmt->text(0), stmt->text(1), stmt->text(2), stmt->integer(3)});
  }
}

Status StateStore::removeApiKeys(const std::string& tenant) {
  if (tenant.empty()) return invalid("tenant is empty");
  std::lock_guard lock(mu_);
  const std::string op = "removing API keys of tenant " + tenant;
  auto stmt = Stmt::prepare(db_, "DELETE FROM api_keys WHERE tenant = :tenant", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":tenant", tenant);
  SPACE_TRY(stmt->run(op));
  if (sqlite3_changes(db_) == 0) return makeError(ErrorCode::kNotFound, "tenant " + tenant + " has no API keys");
  return okStatus();
}

Status StateStore::limitGrowthForTesting(int64_t extra_pages) {
  std::lock_guard lock(mu_);
  const std::string op = "limiting state database size";
  auto pages = queryInt(db_, "PRAGMA page_count", op);
  if (!pages.ok()) return pages.error();
  // PRAGMA takes no parameters; the value is a computed integer.
  auto limit = queryInt(db_, "PRAGMA max_page_count = " + std::to_string(pages.value() + extra_pages), op);
  if (!limit.ok()) return limit.error();
  return okStatus();
}

namespace {

Status validateSecretKey(const std::string& tenant, const std::string& name) {
  if (tenant.empty()) return invalid("secret has an empty tenant");
  if (name.empty()) return invalid("secret has an empty name");
  return okStatus();
}

SecretRecord secretFrom(const Stmt& stmt) {
  SecretRecord r;
  r.tenant = stmt.text(0);
  r.name = stmt.text(1);
  r.sealed = stmt.blob(2);
  r.version = stmt.integer(3);
  r.created_at_ms = stmt.integer(4);
  r.updated_at_ms = stmt.integer(5);
  return r;
}

constexpr const char* kSecretColumns = "tenant, name, sealed, version, created_at_ms, updated_at_ms";

}  // namespace

Status StateStore::putSecret(SecretRecord& record, size_t max_per_tenant, bool create_only) {
  SPACE_TRY(validateSecretKey(record.tenant, record.name));
  if (record.sealed.empty()) return invalid("secret " + record.name + " has no sealed value");
  std::lock_guard lock(mu_);
  const std::string op = "storing secret " + record.name + " of tenant " + record.tenant;
  const int64_t now = nowMs();
  SPACE_TRY(exec(db_, "BEGIN IMMEDIATE", op));
  auto body = [&]() -> Status {
    auto existing =
        Stmt::prepare(db_, "SELECT version, created_at_ms FROM secrets WHERE tenant = :t AND name = :n", op);
    if (!existing.ok()) return existing.error();
    existing->bind(":t", record.tenant);
    existing->bind(":n", record.name);
    int rc = existing->step();
    if (rc == SQLITE_ROW) {
      if (create_only) {
        return makeError(ErrorCode::kAlreadyExists, "a secret named " + record.name + " exists");
      }
      record.version = existing->integer(0) + 1;
      record.created_at_ms = existing->integer(1);
      record.created = false;
    } else if (rc == SQLITE_DONE) {
      auto count = Stmt::prepare(db_, "SELECT COUNT(*) FROM secrets WHERE tenant = :t", op);
      if (!count.ok()) return count.error();
      count->bind(":t", record.tenant);
      if (count->step() != SQLITE_ROW) return sqliteError(db_, SQLITE_MISUSE, op);
      if (static_cast<size_t>(count->integer(0)) >= max_per_tenant) {
        return makeError(ErrorCode::kResourceExhausted,
                         "the tenant has " + std::to_string(count->integer(0)) + " secrets (the limit is " +
                             std::to_string(max_per_tenant) + "); delete one first",
                         "too_many_secrets");
      }
      record.version = 1;
      record.created_at_ms = now;
      record.created = true;
    } else {
      return sqliteError(db_, rc, op);
    }
    record.updated_at_ms = now;
    auto write = Stmt::prepare(db_,
                               "INSERT OR REPLACE INTO secrets (tenant, name, sealed, version, created_at_ms, "
                               "updated_at_ms) VALUES (:t, :n, :sealed, :version, :created, :updated)",
                               op);
    if (!write.ok()) return write.error();
    write->bind(":t", record.tenant);
    write->bind(":n", record.name);
    write->bindBlob(":sealed", record.sealed);
    write->bind(":version", record.version);
    write->bind(":created", record.created_at_ms);
    write->bind(":updated", record.updated_at_ms);
    return write->run(op);
  };
  Status st = body();
  if (st.ok()) st = exec(db_, "COMMIT", op);
  if (!st.ok() && sqlite3_get_autocommit(db_) == 0) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return st;
}

Result<SecretRecord> StateStore::getSecret(const std::string& tenant, const std::string& name) {
  SPACE_TRY(validateSecretKey(tenant, name));
  std::lock_guard lock(mu_);
  const std::string op = "reading secret " + name + " of tenant " + tenant;
  auto stmt =
      Stmt::prepare(db_, std::string("SELECT ") + kSecretColumns + " FROM secrets WHERE tenant = :t AND name = :n", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  stmt->bind(":n", name);
  int rc = stmt->step();
  if (rc == SQLITE_DONE) return makeError(ErrorCode::kNotFound, "no secret named " + name);
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return secretFrom(*stmt);
}

Result<std::vector<SecretRecord>> StateStore::listSecrets(const std::string& tenant) {
  if (tenant.empty()) return invalid("listing secrets needs a tenant");
  std::lock_guard lock(mu_);
  const std::string op = "listing secrets of tenant " + tenant;
  auto stmt =
      Stmt::prepare(db_, std::string("SELECT ") + kSecretColumns + " FROM secrets WHERE tenant = :t ORDER BY name", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  std::vector<SecretRecord> out;
  int rc;
  while ((rc = stmt->step()) == SQLITE_ROW) out.push_back(secretFrom(*stmt));
  if (rc != SQLITE_DONE) return sqliteError(db_, rc, op);
  return out;
}

Status StateStore::deleteSecret(const std::string& tenant, const std::string& name) {
  SPACE_TRY(validateSecretKey(tenant, name));
  std::lock_guard lock(mu_);
  const std::string op = "deleting secret " + name + " of tenant " + tenant;
  auto stmt = Stmt::prepare(db_, "DELETE FROM secrets WHERE tenant = :t AND name = :n", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  stmt->bind(":n", name);
  SPACE_TRY(stmt->run(op));
  if (sqlite3_changes(db_) == 0) return makeError(ErrorCode::kNotFound, "no secret named " + name);
  return okStatus();
}

Result<int64_t> StateStore::deleteSecretsOf(const std::string& tenant) {
  if (tenant.empty()) return invalid("deleting secrets needs a tenant");
  std::lock_guard lock(mu_);
  const std::string op = "deleting the secrets of tenant " + tenant;
  auto stmt = Stmt::prepare(db_, "DELETE FROM secrets WHERE tenant = :t", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  SPACE_TRY(stmt->run(op));
  return static_cast<int64_t>(sqlite3_changes(db_));
}

namespace {

constexpr const char* kTenantQuotaColumns =
    "tenant, max_sandboxes, max_vcpus, max_memory_mb, max_snapshots, max_snapshot_mb, max_suspended, "
    "max_suspended_mb, requests_per_s, request_burst, updated_at_ms";

TenantQuotaRecord tenantQuotaFrom(const Stmt& stmt) {
  return TenantQuotaRecord{stmt.text(0),
                           stmt.optionalInteger(1),
                           stmt.optionalInteger(2),
                           stmt.optionalInteger(3),
                           stmt.optionalInteger(4),
                           stmt.optionalInteger(5),
                           stmt.optionalInteger(6),
                           stmt.optionalInteger(7),
                           stmt.optionalInteger(8),
                           stmt.optionalInteger(9),
                           stmt.integer(10)};
}

}  // namespace

Status StateStore::putTenantQuota(TenantQuotaRecord& record) {
  if (record.tenant.empty()) return invalid("a quota needs a tenant");
  const std::optional<int64_t>* values[] = {&record.max_sandboxes,    &record.max_vcpus,       &record.max_memory_mb,
                                            &record.max_snapshots,    &record.max_snapshot_mb, &record.max_suspended,
                                            &record.max_suspended_mb, &record.requests_per_s,  &record.request_burst};
  bool any = false;
  for (const auto* v : values) {
    if (v->has_value() && **v < 0) return invalid("quota values must be 0 (no limit) or more");
    any = any || v->has_value();
  }
  if (!any) {
    auto removed = deleteTenantQuota(record.tenant);
    if (!removed.ok() && removed.error().code != ErrorCode::kNotFound) return removed;
    record.updated_at_ms = nowMs();
    return okStatus();
  }
  std::lock_guard lock(mu_);
  const std::string op = "setting the quota of tenant " + record.tenant;
  auto stmt = Stmt::prepare(db_,
                            std::string("INSERT OR REPLACE INTO tenant_quotas (") + kTenantQuotaColumns +
                                ") VALUES (:tenant, :sandboxes, :vcpus, :memory, :snapshots, :snapshot_mb, "
                                ":suspended, :suspended_mb, :rate, :burst, :now)",
                            op);
  if (!stmt.ok()) return stmt.error();
  const int64_t now = nowMs();
  stmt->bind(":tenant", record.tenant);
  stmt->bind(":sandboxes", record.max_sandboxes);
  stmt->bind(":vcpus", record.max_vcpus);
  stmt->bind(":memory", record.max_memory_mb);
  stmt->bind(":snapshots", record.max_snapshots);
  stmt->bind(":snapshot_mb", record.max_snapshot_mb);
  stmt->bind(":suspended", record.max_suspended);
  stmt->bind(":suspended_mb", record.max_suspended_mb);
  stmt->bind(":rate", record.requests_per_s);
  stmt->bind(":burst", record.request_burst);
  stmt->bind(":now", now);
  SPACE_TRY(stmt->run(op));
  record.updated_at_ms = now;
  return okStatus();
}

Result<TenantQuotaRecord> StateStore::getTenantQuota(const std::string& tenant) {
  if (tenant.empty()) return invalid("reading a quota needs a tenant");
  std::lock_guard lock(mu_);
  const std::string op = "reading the quota of tenant " + tenant;
  auto stmt =
      Stmt::prepare(db_, std::string("SELECT ") + kTenantQuotaColumns + " FROM tenant_quotas WHERE tenant = :t", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  int rc = stmt->step();
  if (rc == SQLITE_DONE) return makeError(ErrorCode::kNotFound, "tenant " + tenant + " has no quota of its own");
  if (rc != SQLITE_ROW) return sqliteError(db_, rc, op);
  return tenantQuotaFrom(*stmt);
}

Result<std::vector<TenantQuotaRecord>> StateStore::listTenantQuotas() {
  std::lock_guard lock(mu_);
  const std::string op = "listing tenant quotas";
  auto stmt =
      Stmt::prepare(db_, std::string("SELECT ") + kTenantQuotaColumns + " FROM tenant_quotas ORDER BY tenant", op);
  if (!stmt.ok()) return stmt.error();
  std::vector<TenantQuotaRecord> out;
  int rc;
  while ((rc = stmt->step()) == SQLITE_ROW) out.push_back(tenantQuotaFrom(*stmt));
  if (rc != SQLITE_DONE) return sqliteError(db_, rc, op);
  return out;
}

Status StateStore::deleteTenantQuota(const std::string& tenant) {
  if (tenant.empty()) return invalid("deleting a quota needs a tenant");
  std::lock_guard lock(mu_);
  const std::string op = "deleting the quota of tenant " + tenant;
  auto stmt = Stmt::prepare(db_, "DELETE FROM tenant_quotas WHERE tenant = :t", op);
  if (!stmt.ok()) return stmt.error();
  stmt->bind(":t", tenant);
  SPACE_TRY(stmt->run(op));
  if (sqlite3_changes(db_) == 0)
    return makeError(ErrorCode::kNotFound, "tenant " + tenant + " has no quota of its own");
  return okStatus();
}

}  // namespace space::store
