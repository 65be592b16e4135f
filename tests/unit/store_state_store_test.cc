#include <grp.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "common/fs.h"
#include "store/state_store.h"

namespace space::store {
namespace {

std::string sbId(int n) {
  std::string digits = std::to_string(n);
  return "sb_" + std::string(20 - digits.size(), '0') + digits;
}

SandboxRecord sandbox(const std::string& id, const std::string& tenant, int64_t created_at_ms,
                      const std::string& state = "running") {
  SandboxRecord r;
  r.id = id;
  r.tenant = tenant;
  r.state = state;
  r.template_name = "base";
  r.cpus = 2;
  r.memory_mb = 512;
  r.created_at_ms = created_at_ms;
  r.expires_at_ms = created_at_ms + 3600 * 1000;
  return r;
}

int64_t nowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// Runs SQL on the file behind the store's back, as an operator or another version would.
void rawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  std::string message = err != nullptr ? err : "";
  sqlite3_free(err);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << message;
}

int64_t rawQueryInt(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK);
  int64_t value = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) value = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

SnapshotRecord snapshot(const std::string& id, const std::string& tenant, const std::string& sandbox_id,
                        int64_t created_at_ms) {
  SnapshotRecord r;
  r.id = id;
  r.tenant = tenant;
  r.sandbox_id = sandbox_id;
  r.template_name = "base";
  r.cpus = 2;
  r.memory_mb = 512;
  r.accelerator = "kvm";
  r.dir = "/var/lib/space/snapshots/" + id;
  r.disk = "/var/lib/space/layers/" + id + ".qcow2";
  r.size_bytes = 1 << 20;
  r.created_at_ms = created_at_ms;
  return r;
}

std::string snapId(int n) {
  std::string digits = std::to_string(n);
  return "snap_" + std::string(20 - digits.size(), '0') + digits;
}

template <class Record>
std::vector<std::string> ids(const std::vector<Record>& records) {
  std::vector<std::string> out;
  for (const auto& r : records) out.push_back(r.id);
  return out;
}

class StateStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create(testing::TempDir(), "store-");
    ASSERT_TRUE(dir.ok()) << dir.error().message;
    dir_.emplace(std::move(dir).value());
    path_ = dir_->path() + "/state.db";
    reopen();
  }

  void reopen() {
    store_.reset();
    auto store = StateStore::open(path_);
    ASSERT_TRUE(store.ok()) << store.error().message;
    store_ = std::move(store).value();
  }

  void insert(const SandboxRecord& r) {
    auto st = store_->insertSandbox(r);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  SandboxPage list(const ListFilter& filter) {
    auto page = store_->listSandboxes(filter);
    EXPECT_TRUE(page.ok()) << page.error().message;
    return page.ok() ? page.value() : SandboxPage{};
  }

  void insertSnap(const SnapshotRecord& r) {
    auto st = store_->insertSnapshot(r);
    ASSERT_TRUE(st.ok()) << st.error().message;
  }

  SnapshotPage listSnaps(const SnapshotFilter& filter) {
    auto page = store_->listSnapshots(filter);
    EXPECT_TRUE(page.ok()) << page.error().message;
    return page.ok() ? page.value() : SnapshotPage{};
  }

  std::optional<TempDir> dir_;
  std::string path_;
  std::unique_ptr<StateStore> store_;
};

TEST_F(StateStoreTest, ReopenKeepsDataAndVersion) {
  EXPECT_EQ(store_->schemaVersion(), StateStore::latestSchemaVersion());
  SandboxRecord r = sandbox(sbId(1), "acme", 1000);
  r.metadata = {{"team", "infra"}};
  insert(r);
  // Rows hold sandbox environments, which may carry secrets; the WAL holds rows too.
  constexpr auto kPrivate = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  EXPECT_EQ(std::filesystem::status(path_).permissions() & std::filesystem::perms::all, kPrivate);
  EXPECT_EQ(std::filesystem::status(path_ + "-wal").permissions() & std::filesystem::perms::all, kPrivate);
  reopen();
  EXPECT_EQ(store_->schemaVersion(), StateStore::latestSchemaVersion());
  auto got = store_->getSandbox(r.id);
  ASSERT_TRUE(got.ok()) << got.error().message;
  r.updated_at_ms = got->updated_at_ms;
  EXPECT_EQ(got.value(), r);
  store_.reset();
  EXPECT_EQ(rawQueryInt(path_, "PRAGMA user_version"), StateStore::latestSchemaVersion());
  // WAL is recorded in the file; synchronous=FULL is per connection and cannot be seen from here.
  EXPECT_EQ(rawQueryInt(path_, "SELECT journal_mode = 'wal' FROM pragma_journal_mode"), 1);
}

TEST_F(StateStoreTest, MigratesAnEmptyFile) {
  store_.reset();
  std::string path = dir_->path() + "/empty.db";
  ASSERT_TRUE(writeFileAtomic(path, "").ok());
  auto store = StateStore::open(path);
  ASSERT_TRUE(store.ok()) << store.error().message;
  EXPECT_EQ(store.value()->schemaVersion(), StateStore::latestSchemaVersion());
  EXPECT_TRUE(store.value()->insertSandbox(sandbox(sbId(1), "acme", 1)).ok());
  store.value().reset();
  EXPECT_EQ(rawQueryInt(path, "PRAGMA user_version"), StateStore::latestSchemaVersion());
  EXPECT_EQ(rawQueryInt(path, "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND name LIKE 'sandboxes_%'"),
            2);
  EXPECT_EQ(rawQueryInt(path, "SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND name LIKE 'snapshots_%'"),
            2);
}

// The schema as version 1 of spaced wrote it, copied rather than shared with the store: the
// test must keep meaning "a database from the field" even if the store's code moves on.
constexpr const char* kSchemaV1 =
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
    "CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, created_at_ms, id);"
    "CREATE INDEX sandboxes_by_state ON sandboxes (state);"
    "CREATE TABLE api_keys ("
    "  key_sha256_hex TEXT PRIMARY KEY NOT NULL,"
    "  tenant TEXT NOT NULL,"
    "  label TEXT NOT NULL,"
    "  created_at_ms INTEGER NOT NULL);"
    "CREATE INDEX api_keys_by_tenant ON api_keys (tenant);"
    "PRAGMA user_version = 1;";

TEST_F(StateStoreTest, MigratesAVersion1DatabaseKeepingItsRows) {
  std::string path = dir_->path() + "/v1.db";
  const std::string digest(64, 'c');
  rawExec(path, kSchemaV1);
  rawExec(path, "INSERT INTO sandboxes VALUES ('" + sbId(7) +
                    "', 'acme', 'suspended', 'timeout', 'base', 2, 512, 1000, 2000, 3000, '{\"team\":\"infra\"}', "
                    "'{\"A\":\"1\"}', '/run/sb_7', 0, 'st:1', 'kvm');"
                    "INSERT INTO api_keys VALUES ('" +
                    digest + "', 'acme', 'ci', 5);");
  ASSERT_EQ(rawQueryInt(path, "PRAGMA user_version"), 1);

  auto store = StateStore::open(path);
  ASSERT_TRUE(store.ok()) << store.error().message;
  EXPECT_EQ(store.value()->schemaVersion(), StateStore::latestSchemaVersion());
  SandboxRecord want = sandbox(sbId(7), "acme", 1000, "suspended");
  want.state_reason = "timeout";
  want.updated_at_ms = 2000;
  want.expires_at_ms = 3000;
  want.metadata = {{"team", "infra"}};
  want.env = {{"A", "1"}};
  want.run_dir = "/run/sb_7";
  want.vm_identity = "st:1";
  want.accelerator = "kvm";
  auto got = store.value()->getSandbox(sbId(7));
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(got.value(), want);  // including the new fields' defaults
  EXPECT_EQ(got->timeout_s, 0);
  EXPECT_EQ(got->idle_suspend_s, 0);
  EXPECT_EQ(got->on_timeout, "delete");
  EXPECT_EQ(got->source_snapshot, "");
  EXPECT_FALSE(got->auto_resume);
  EXPECT_EQ(store.value()->listApiKeys().value(), (std::vector<ApiKeyRecord>{{"acme", digest, "ci", 5}}));

  // The migrated row takes the new fields, and the new table works.
  want.timeout_s = 60;
  want.on_timeout = "suspend";
  ASSERT_TRUE(store.value()->updateSandbox(want).ok());
  EXPECT_EQ(store.value()->getSandbox(sbId(7))->on_timeout, "suspend");
  EXPECT_TRUE(store.value()->allSnapshots()->empty());
  TenantQuotaRecord quota{"acme"};
  quota.max_suspended_mb = 2048;
  ASSERT_TRUE(store.value()->putTenantQuota(quota).ok());
  EXPECT_EQ(store.value()->getTenantQuota("acme")->max_suspended_mb, 2048);
  store.value().reset();
  EXPECT_EQ(rawQueryInt(path, "PRAGMA user_version"), StateStore::latestSchemaVersion());
}

TEST_F(StateStoreTest, FailedVersion2MigrationLeavesVersion1) {
  std::string path = dir_->path() + "/v1-conflict.db";
  rawExec(path, kSchemaV1);
  // Version 2 alters sandboxes before it creates snapshots, so it fails after the ALTERs ran.
  rawExec(path, "CREATE TABLE snapshots (x INTEGER)");
  auto store = StateStore::open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kInternal);
  EXPECT_NE(store.error().message.find("schema version 2"), std::string::npos) << store.error().message;
  EXPECT_EQ(rawQueryInt(path, "PRAGMA user_version"), 1);
  EXPECT_EQ(rawQueryInt(path, "SELECT COUNT(*) FROM pragma_table_info('sandboxes') WHERE name = 'timeout_s'"), 0);
}

TEST_F(StateStoreTest, FailedMigrationLeavesTheOldSchema) {
  std::string path = dir_->path() + "/conflict.db";
  // Version 1 creates sandboxes before api_keys, so it fails halfway through.
  rawExec(path, "CREATE TABLE api_keys (x INTEGER)");
  auto store = StateStore::open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kInternal);
  EXPECT_NE(store.error().message.find("schema version 1"), std::string::npos) << store.error().message;
  EXPECT_EQ(rawQueryInt(path, "PRAGMA user_version"), 0);
  EXPECT_EQ(rawQueryInt(path, "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'sandboxes'"), 0);
}

TEST_F(StateStoreTest, RefusesNewerSchemaAndLeavesFileUnchanged) {
  insert(sandbox(sbId(1), "acme", 1));
  store_.reset();
  const int newer = StateStore::latestSchemaVersion() + 1;
  rawExec(path_, "PRAGMA user_version = " + std::to_string(newer));
  auto before = readSmallFile(path_, 1 << 20);
  ASSERT_TRUE(before.ok());

  auto store = StateStore::open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kFailedPrecondition);
  const std::string& msg = store.error().message;
  EXPECT_NE(msg.find("schema version " + std::to_string(newer)), std::string::npos) << msg;
  EXPECT_NE(msg.find("version " + std::to_string(StateStore::latestSchemaVersion())), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;

  auto after = readSmallFile(path_, 1 << 20);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(before.value(), after.value());
  EXPECT_EQ(rawQueryInt(path_, "PRAGMA user_version"), newer);
}

TEST_F(StateStoreTest, RoundTripsEveryField) {
  SandboxRecord r;
  r.id = sbId(42);
  r.tenant = "tenant-ünïcode";
  r.state = "failed";
  r.state_reason = "guest agent said \"no\"; exit 3\n";
  r.template_name = "python-3.12";
  r.cpus = 4000000000u;
  r.memory_mb = (1ull << 40);
  r.created_at_ms = 1700000000123;
  r.updated_at_ms = 5;  // the store's clock wins
  r.expires_at_ms = -1;
  r.metadata = {{"owner", "o'brien"}, {"emoji", "🚀"}, {"", "empty key"}};
  r.env = {{"PATH", "/usr/bin:/bin"}, {"SECRET", std::string("a\0b", 3)}};
  r.run_dir = "/var/lib/space/run/sb_42";
  r.vm_pid = 123456;
  r.vm_identity = "starttime:987654321";
  r.accelerator = "kvm";
  r.timeout_s = 3600;
  r.idle_suspend_s = 300;
  r.on_timeout = "suspend";
  r.source_snapshot = "snap_0123456789";
  r.auto_resume = true;

  int64_t before = nowMs();
  insert(r);
  auto got = store_->getSandbox(r.id);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_GE(got->updated_at_ms, before);
  EXPECT_LE(got->updated_at_ms, nowMs());
  int64_t first_update = got->updated_at_ms;
  r.updated_at_ms = got->updated_at_ms;
  EXPECT_EQ(got.value(), r);

  SandboxRecord changed;
  changed.id = r.id;
  changed.tenant = "other";
  changed.state = "running";
  changed.template_name = "node";
  changed.cpus = 1;
  changed.memory_mb = 128;
  changed.created_at_ms = 1;
  changed.expires_at_ms = 2;
  changed.metadata = {{"k", "v"}};
  changed.run_dir = "/run/x";
  changed.vm_pid = 7;
  changed.vm_identity = "id2";
  changed.accelerator = "tcg";
  changed.timeout_s = 10;  // the other new fields go back to their defaults
  ASSERT_TRUE(store_->updateSandbox(changed).ok());
  got = store_->getSandbox(r.id);
  ASSERT_TRUE(got.ok());
  EXPECT_GE(got->updated_at_ms, first_update);
  changed.updated_at_ms = got->updated_at_ms;
  EXPECT_EQ(got.value(), changed);
}

TEST_F(StateStoreTest, DuplicateIdIsAlreadyExistsAndKeepsTheOriginal) {
  insert(sandbox(sbId(1), "acme", 1));
  auto st = store_->insertSandbox(sandbox(sbId(1), "evil", 2));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kAlreadyExists);
  EXPECT_NE(st.error().message.find(sbId(1)), std::string::npos);
  EXPECT_EQ(store_->getSandbox(sbId(1))->tenant, "acme");
}

TEST_F(StateStoreTest, UnknownIdIsNotFound) {
  auto got = store_->getSandbox(sbId(9));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, ErrorCode::kNotFound);
  auto st = store_->updateSandbox(sandbox(sbId(9), "acme", 1));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->getSandbox(sbId(9)).error().code, ErrorCode::kNotFound);  // update did not create it
}

TEST_F(StateStoreTest, ListNeverCrossesTenants) {
  insert(sandbox(sbId(1), "acme", 1));
  insert(sandbox(sbId(2), "globex", 2));
  insert(sandbox(sbId(3), "acme", 3));
  EXPECT_EQ(ids(list({.tenant = "acme"}).items), (std::vector<std::string>{sbId(1), sbId(3)}));
  EXPECT_EQ(ids(list({.tenant = "globex"}).items), (std::vector<std::string>{sbId(2)}));
  EXPECT_TRUE(list({.tenant = "nobody"}).items.empty());
  // A cursor naming another tenant's sandbox reveals nothing about it.
  auto page = store_->listSandboxes({.tenant = "acme", .after_id = sbId(2)});
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.error().code, ErrorCode::kInvalidArgument);
}

TEST_F(StateStoreTest, ListFiltersByState) {
  insert(sandbox(sbId(1), "acme", 1, "running"));
  insert(sandbox(sbId(2), "acme", 2, "deleted"));
  insert(sandbox(sbId(3), "acme", 3, "paused"));
  insert(sandbox(sbId(4), "acme", 4, "failed"));
  EXPECT_EQ(ids(list({.tenant = "acme"}).items), (std::vector<std::string>{sbId(1), sbId(3), sbId(4)}));
  EXPECT_EQ(ids(list({.tenant = "acme", .states = {"paused", "running"}}).items),
            (std::vector<std::string>{sbId(1), sbId(3)}));
  EXPECT_EQ(ids(list({.tenant = "acme", .states = {"deleted"}}).items), (std::vector<std::string>{sbId(2)}));
  EXPECT_TRUE(list({.tenant = "acme", .states = {"suspended"}}).items.empty());
}

TEST_F(StateStoreTest, ListFiltersByMetadataWithAwkwardKeysAndValues) {
  const std::string quote_key = "a\"b";
  const std::string dot_key = "team.name";
  const std::string path_key = "$.x[0]";
  const std::string sql_value = "x'); DROP TABLE sandboxes; --";
  SandboxRecord a = sandbox(sbId(1), "acme", 1);
  a.metadata = {{quote_key, "1"}, {dot_key, "infra"}, {path_key, sql_value}};
  SandboxRecord b = sandbox(sbId(2), "acme", 2);
  b.metadata = {{quote_key, "2"}, {dot_key, "infra"}};
  SandboxRecord c = sandbox(sbId(3), "acme", 3);
  c.metadata = {{"team", "infra"}};  // the dotted key must not match a nested path
  SandboxRecord d = sandbox(sbId(4), "globex", 4);
  d.metadata = a.metadata;
  for (const auto& r : {a, b, c, d}) insert(r);

  EXPECT_EQ(ids(list({.tenant = "acme", .metadata = {{dot_key, "infra"}}}).items),
            (std::vector<std::string>{sbId(1), sbId(2)}));
  EXPECT_EQ(ids(list({.tenant = "acme", .metadata = {{quote_key, "2"}}}).items), (std::vector<std::string>{sbId(2)}));
  EXPECT_EQ(ids(list({.tenant = "acme", .metadata = {{path_key, sql_value}, {dot_key, "infra"}}}).items),
            (std::vector<std::string>{sbId(1)}));
  EXPECT_TRUE(list({.tenant = "acme", .metadata = {{quote_key, "1"}, {dot_key, "other"}}}).items.empty());
  EXPECT_TRUE(list({.tenant = "acme", .metadata = {{"missing", ""}}}).items.empty());
  EXPECT_TRUE(list({.tenant = "acme", .metadata = {{"team", "' OR '1'='1"}}}).items.empty());
  EXPECT_TRUE(store_->getSandbox(sbId(1)).ok());  // the table is still there
}

TEST_F(StateStoreTest, PaginatesWithoutDuplicatesOrGaps) {
  std::vector<std::string> expected;
  // Several sandboxes share a creation time, so the id must break ties across page ends.
  for (int i = 0; i < 23; ++i) {
    int n = (i * 7) % 23;  // inserted out of order
    insert(sandbox(sbId(n), "acme", 1000 + n / 3));
    insert(sandbox(sbId(100 + n), "globex", 1000 + n / 3));
  }
  for (int n = 0; n < 23; ++n) expected.push_back(sbId(n));
  insert(sandbox(sbId(50), "acme", 1001, "deleted"));

  for (size_t limit : {1, 5, 7, 23, 100}) {
    std::vector<std::string> seen;
    std::string cursor;
    int pages = 0;
    do {
      auto page = list({.tenant = "acme", .limit = limit, .after_id = cursor});
      EXPECT_LE(page.items.size(), limit);
      EXPECT_FALSE(page.items.empty());
      for (const auto& r : page.items) seen.push_back(r.id);
      cursor = page.next_cursor;
      ASSERT_LT(++pages, 100);
    } while (!cursor.empty());
    EXPECT_EQ(seen, expected) << "limit " << limit;
    EXPECT_EQ(pages, static_cast<int>((expected.size() + limit - 1) / limit)) << "limit " << limit;
  }

  // Cursors combine with filters: the cursor row itself need not match them.
  auto first = list({.tenant = "acme", .states = {"deleted"}, .limit = 1});
  ASSERT_EQ(ids(first.items), (std::vector<std::string>{sbId(50)}));
  EXPECT_EQ(first.next_cursor, "");
  auto rest = list({.tenant = "acme", .limit = 1000, .after_id = sbId(50)});
  EXPECT_EQ(rest.items.front().id, sbId(6));  // sbId(50) sorts between sbId(5) and sbId(6) at t=1001
}

TEST_F(StateStoreTest, UnknownCursorIsInvalid) {
  auto page = store_->listSandboxes({.tenant = "acme", .after_id = sbId(404)});
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.error().code, ErrorCode::kInvalidArgument);
}

TEST_F(StateStoreTest, SandboxesInStatesSpansTenants) {
  insert(sandbox(sbId(1), "acme", 3, "running"));
  insert(sandbox(sbId(2), "globex", 1, "paused"));
  insert(sandbox(sbId(3), "acme", 2, "deleted"));
  insert(sandbox(sbId(4), "initech", 4, "creating"));
  auto live = store_->sandboxesInStates({"running", "paused", "creating"});
  ASSERT_TRUE(live.ok()) << live.error().message;
  EXPECT_EQ(ids(live.value()), (std::vector<std::string>{sbId(2), sbId(1), sbId(4)}));
  EXPECT_TRUE(store_->sandboxesInStates({})->empty());
  // One tenant's only (a quota's walk is the size of that tenant, not of the node).
  EXPECT_EQ(ids(store_->sandboxesInStates({"running", "paused", "creating", "deleted"}, "acme").value()),
            (std::vector<std::string>{sbId(3), sbId(1)}));
  EXPECT_TRUE(store_->sandboxesInStates({"running"}, "nobody")->empty());
}

TEST_F(StateStoreTest, CountsByStateAcrossTenants) {
  EXPECT_TRUE(store_->countByState()->empty());
  insert(sandbox(sbId(1), "acme", 1, "running"));
  insert(sandbox(sbId(2), "globex", 2, "running"));
  insert(sandbox(sbId(3), "acme", 3, "deleted"));
  auto counts = store_->countByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts.value(), (std::map<std::string, int64_t>{{"running", 2}, {"deleted", 1}}));
}

TEST_F(StateStoreTest, PurgesOnlyOldDeletedAndFailedRows) {
  insert(sandbox(sbId(1), "acme", 1, "deleted"));
  insert(sandbox(sbId(2), "acme", 2, "running"));
  insert(sandbox(sbId(3), "acme", 3, "failed"));
  insert(sandbox(sbId(5), "acme", 5, "suspended"));
  int64_t updated = store_->getSandbox(sbId(1))->updated_at_ms;
  ASSERT_TRUE(store_->purgeDeletedBefore(updated).ok());  // strictly before: kept
  EXPECT_TRUE(store_->getSandbox(sbId(1)).ok());
  auto purged = store_->purgeDeletedBefore(nowMs() + 1000);
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(purged.value(), std::vector<std::string>{sbId(3)});  // the failed one: its files go too
  EXPECT_EQ(store_->getSandbox(sbId(1)).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->getSandbox(sbId(3)).error().code, ErrorCode::kNotFound);  // nobody deletes failed ones
  EXPECT_TRUE(store_->getSandbox(sbId(2)).ok());                              // not ended, however old
  EXPECT_TRUE(store_->getSandbox(sbId(5)).ok());
  EXPECT_TRUE(store_->purgeDeletedBefore(nowMs() + 1000).ok());  // nothing to do is fine
}

TEST_F(StateStoreTest, SnapshotUsagePerTenant) {
  auto none = store_->snapshotUsage("acme");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_EQ(none->count, 0u);
  EXPECT_EQ(none->bytes, 0u);
  insertSnap(snapshot(snapId(1), "acme", sbId(1), 1));
  insertSnap(snapshot(snapId(2), "acme", sbId(1), 2));
  insertSnap(snapshot(snapId(3), "globex", sbId(2), 3));
  auto acme = store_->snapshotUsage("acme");
  ASSERT_TRUE(acme.ok());
  EXPECT_EQ(acme->count, 2u);
  EXPECT_EQ(acme->bytes, 2u << 20);
  EXPECT_EQ(store_->snapshotUsage("globex")->count, 1u);
}

TEST_F(StateStoreTest, ApiKeys) {
  const std::string d1(64, 'a'), d2(64, 'b'), d3(64, '1');
  ASSERT_TRUE(store_->addApiKey({"acme", d1, "ci", 10}).ok());
  ASSERT_TRUE(store_->addApiKey({"globex", d2, "", 5}).ok());
  ASSERT_TRUE(store_->addApiKey({"acme", d3, "laptop", 20}).ok());
  auto dup = store_->addApiKey({"globex", d1, "stolen", 30});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code, ErrorCode::kAlreadyExists);
  EXPECT_EQ(dup.error().message.find(d1), std::string::npos);  // no credential material in errors

  auto keys = store_->listApiKeys();
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(keys.value(),
            (std::vector<ApiKeyRecord>{{"acme", d1, "ci", 10}, {"acme", d3, "laptop", 20}, {"globex", d2, "", 5}}));
  ASSERT_TRUE(store_->removeApiKeys("acme").ok());
  EXPECT_EQ(store_->listApiKeys().value(), (std::vector<ApiKeyRecord>{{"globex", d2, "", 5}}));
  auto again = store_->removeApiKeys("acme");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::kNotFound);
  reopen();
  EXPECT_EQ(store_->listApiKeys()->size(), 1u);
}

TEST_F(StateStoreTest, TenantQuotasKeepOnlyWhatWasSetAndSurviveReopen) {
  auto none = store_->getTenantQuota("acme");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kNotFound);

  TenantQuotaRecord acme{"acme"};
  acme.max_sandboxes = 3;
  acme.max_memory_mb = 0;  // explicitly unlimited, unlike absent
  ASSERT_TRUE(store_->putTenantQuota(acme).ok());
  EXPECT_GT(acme.updated_at_ms, 0);
  TenantQuotaRecord globex{"globex"};
  globex.max_snapshot_mb = 512;
  globex.max_suspended = 7;
  globex.max_suspended_mb = 4096;
  globex.requests_per_s = 5;
  globex.request_burst = 10;
  ASSERT_TRUE(store_->putTenantQuota(globex).ok());

  reopen();
  auto got = store_->getTenantQuota("acme");
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(got.value(), acme);
  EXPECT_FALSE(got->max_vcpus.has_value());
  EXPECT_EQ(store_->listTenantQuotas().value(), (std::vector<TenantQuotaRecord>{acme, globex}));

  // A put replaces the whole row: what it leaves out goes back to the node's default.
  TenantQuotaRecord replaced{"acme"};
  replaced.max_vcpus = 8;
  ASSERT_TRUE(store_->putTenantQuota(replaced).ok());
  EXPECT_EQ(store_->getTenantQuota("acme").value(), replaced);

  // Nothing set: the row goes.
  TenantQuotaRecord cleared{"globex"};
  ASSERT_TRUE(store_->putTenantQuota(cleared).ok());
  EXPECT_EQ(store_->getTenantQuota("globex").error().code, ErrorCode::kNotFound);

  TenantQuotaRecord negative{"acme"};
  negative.max_sandboxes = -1;
  auto bad = store_->putTenantQuota(negative);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  TenantQuotaRecord negative_disk{"acme"};
  negative_disk.max_suspended_mb = -1;
  EXPECT_EQ(store_->putTenantQuota(negative_disk).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(store_->getTenantQuota("acme").value(), replaced);  // unchanged
  TenantQuotaRecord nameless{""};
  nameless.max_sandboxes = 1;
  EXPECT_EQ(store_->putTenantQuota(nameless).error().code, ErrorCode::kInvalidArgument);

  ASSERT_TRUE(store_->deleteTenantQuota("acme").ok());
  EXPECT_EQ(store_->deleteTenantQuota("acme").error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(store_->listTenantQuotas()->empty());
}

TEST_F(StateStoreTest, ConcurrentCallsFromManyThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20;
  std::atomic<bool> failed{false};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      if (!store_->listSandboxes({.tenant = "t0", .limit = 1000}).ok() || !store_->countByState().ok()) failed = true;
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        SandboxRecord r = sandbox(sbId(t * 1000 + i), "t" + std::to_string(t % 2), i);
        if (!store_->insertSandbox(r).ok()) failed = true;
        r.state = "paused";
        if (!store_->updateSandbox(r).ok()) failed = true;
      }
    });
  }
  for (auto& w : writers) w.join();
  done = true;
  reader.join();
  EXPECT_FALSE(failed);
  auto counts = store_->countByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts.value(), (std::map<std::string, int64_t>{{"paused", kThreads * kPerThread}}));
  EXPECT_EQ(list({.tenant = "t1", .limit = 1000}).items.size(), static_cast<size_t>(kThreads / 2 * kPerThread));
}

TEST_F(StateStoreTest, RejectsBadInput) {
  auto expectInvalid = [](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument) << what << ": " << st.error().message;
  };
  SandboxRecord good = sandbox(sbId(1), "acme", 1);
  SandboxRecord r = good;
  r.id = "";
  expectInvalid(store_->insertSandbox(r), "empty id");
  expectInvalid(store_->updateSandbox(r), "empty id on update");
  r = good;
  r.tenant = "";
  expectInvalid(store_->insertSandbox(r), "empty tenant");
  r = good;
  r.state = "";
  expectInvalid(store_->insertSandbox(r), "empty state");
  r = good;
  r.metadata = nlohmann::json::array({"a"});
  expectInvalid(store_->insertSandbox(r), "metadata array");
  r = good;
  r.metadata = {{"n", 1}};
  expectInvalid(store_->insertSandbox(r), "metadata number");
  r = good;
  r.env = {{"nested", {{"a", "b"}}}};
  expectInvalid(store_->insertSandbox(r), "env nested");
  r = good;
  r.env = nullptr;
  expectInvalid(store_->insertSandbox(r), "env null");
  r = good;
  r.env = {{"BAD", "\xff\xfe"}};
  expectInvalid(store_->insertSandbox(r), "env invalid UTF-8");
  r = good;
  r.memory_mb = UINT64_MAX;
  expectInvalid(store_->insertSandbox(r), "memory out of range");
  EXPECT_EQ(store_->getSandbox(good.id).error().code, ErrorCode::kNotFound);  // nothing half-written

  insert(good);
  r = good;
  r.metadata = {{"k", false}};
  expectInvalid(store_->updateSandbox(r), "metadata bool on update");
  EXPECT_EQ(store_->getSandbox(good.id)->metadata, nlohmann::json::object());

  EXPECT_EQ(store_->getSandbox("").error().code, ErrorCode::kInvalidArgument);
  auto listErr = [&](const ListFilter& f) -> Status {
    auto page = store_->listSandboxes(f);
    if (page.ok()) return okStatus();
    return page.error();
  };
  expectInvalid(listErr({.tenant = ""}), "list without tenant");
  expectInvalid(listErr({.tenant = "acme", .limit = 0}), "limit 0");
  expectInvalid(listErr({.tenant = "acme", .limit = 1001}), "limit 1001");
  EXPECT_TRUE(listErr({.tenant = "acme", .limit = 1000}).ok());
  expectInvalid(listErr({.tenant = "acme", .metadata = {{"k", "\xc3"}}}), "metadata filter invalid UTF-8");

  expectInvalid(store_->addApiKey({"", std::string(64, 'a'), "", 0}), "key without tenant");
  expectInvalid(store_->addApiKey({"acme", std::string(63, 'a'), "", 0}), "short digest");
  expectInvalid(store_->addApiKey({"acme", std::string(64, 'A'), "", 0}), "uppercase digest");
  expectInvalid(store_->addApiKey({"acme", std::string(64, 'g'), "", 0}), "non-hex digest");
  expectInvalid(store_->removeApiKeys(""), "remove without tenant");
  EXPECT_TRUE(store_->listApiKeys()->empty());

  auto store = StateStore::open("");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kInvalidArgument);
}

TEST_F(StateStoreTest, DiskFullIsResourceExhaustedAndKeepsPreviousData) {
  SandboxRecord r = sandbox(sbId(1), "acme", 1);
  r.env = {{"A", "1"}};
  insert(r);
  ASSERT_TRUE(store_->limitGrowthForTesting(0).ok());

  SandboxRecord big = sandbox(sbId(2), "acme", 2);
  big.env = {{"BLOB", std::string(256 * 1024, 'x')}};
  auto st = store_->insertSandbox(big);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().message.find("disk full while recording sandbox " + big.id), std::string::npos)
      << st.error().message;

  SandboxRecord grown = r;
  grown.state = "paused";
  grown.env = big.env;
  st = store_->updateSandbox(grown);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().message.find("disk full while updating sandbox " + r.id), std::string::npos)
      << st.error().message;

  // The failed writes left nothing behind, and the store keeps working.
  EXPECT_EQ(store_->getSandbox(big.id).error().code, ErrorCode::kNotFound);
  auto got = store_->getSandbox(r.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state, "running");
  EXPECT_EQ(got->env, r.env);
  reopen();  // the limit belongs to the connection
  EXPECT_EQ(store_->getSandbox(r.id)->state, "running");
  insert(big);
}

TEST_F(StateStoreTest, SnapshotRoundTripsEveryFieldAndSurvivesReopen) {
  SnapshotRecord r;
  r.id = snapId(1);
  r.tenant = "tenant-ünïcode";
  r.name = "before \"risky\" step; 🚀";
  r.sandbox_id = sbId(9);
  r.template_name = "python-3.12";
  r.cpus = 4000000000u;
  r.memory_mb = (1ull << 40);
  r.accelerator = "kvm";
  r.dir = "/var/lib/space/snapshots/o'brien";
  r.disk = "/var/lib/space/layers/x.qcow2";
  r.size_bytes = static_cast<uint64_t>(INT64_MAX);
  r.created_at_ms = -1;
  r.metadata = {{"owner", "o'brien"}, {"", "empty key"}, {"nul", std::string("a\0b", 3)}};
  insertSnap(r);
  auto got = store_->getSnapshot(r.id);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(got.value(), r);
  reopen();
  got = store_->getSnapshot(r.id);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(got.value(), r);
  // Snapshots and sandboxes are separate: the same id in one says nothing about the other.
  EXPECT_EQ(store_->getSandbox(sbId(9)).error().code, ErrorCode::kNotFound);
}

TEST_F(StateStoreTest, SnapshotDuplicateIdIsAlreadyExistsAndKeepsTheOriginal) {
  insertSnap(snapshot(snapId(1), "acme", sbId(1), 1));
  auto st = store_->insertSnapshot(snapshot(snapId(1), "evil", sbId(2), 2));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kAlreadyExists);
  EXPECT_NE(st.error().message.find(snapId(1)), std::string::npos) << st.error().message;
  EXPECT_EQ(store_->getSnapshot(snapId(1))->tenant, "acme");
}

TEST_F(StateStoreTest, SnapshotUnknownIdIsNotFound) {
  auto got = store_->getSnapshot(snapId(9));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, ErrorCode::kNotFound);
  EXPECT_NE(got.error().message.find(snapId(9)), std::string::npos) << got.error().message;
  auto st = store_->deleteSnapshot(snapId(9));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kNotFound);
}

TEST_F(StateStoreTest, DeleteSnapshotRemovesOnlyThatOne) {
  insertSnap(snapshot(snapId(1), "acme", sbId(1), 1));
  insertSnap(snapshot(snapId(2), "acme", sbId(1), 2));
  ASSERT_TRUE(store_->deleteSnapshot(snapId(1)).ok());
  EXPECT_EQ(store_->getSnapshot(snapId(1)).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(ids(listSnaps({.tenant = "acme"}).items), (std::vector<std::string>{snapId(2)}));
  auto again = store_->deleteSnapshot(snapId(1));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::kNotFound);
  // A cursor naming a deleted snapshot cannot say where the next page starts.
  auto page = store_->listSnapshots({.tenant = "acme", .after_id = snapId(1)});
  ASSERT_FALSE(page.ok());
  EXPECT_EQ(page.error().code, ErrorCode::kInvalidArgument);
  reopen();
  EXPECT_EQ(ids(store_->allSnapshots().value()), (std::vector<std::string>{snapId(2)}));
}

TEST_F(StateStoreTest, SnapshotListNeverCrossesTenantsAndFiltersBySandbox) {
  insertSnap(snapshot(snapId(1), "acme", sbId(1), 1));
  insertSnap(snapshot(snapId(2), "globex", sbId(1), 2));  // same sandbox id, other tenant
  insertSnap(snapshot(snapId(3), "acme", sbId(2), 3));
  insertSnap(snapshot(snapId(4), "acme", sbId(1), 4));
  EXPECT_EQ(ids(listSnaps({.tenant = "acme"}).items), (std::vector<std::string>{snapId(1), snapId(3), snapId(4)}));
  EXPECT_EQ(ids(listSnaps({.tenant = "globex"}).items), (std::vector<std::string>{snapId(2)}));
  EXPECT_TRUE(listSnaps({.tenant = "nobody"}).items.empty());
  EXPECT_EQ(ids(listSnaps({.tenant = "acme", .sandbox_id = sbId(1)}).items),
            (std::vector<std::string>{snapId(1), snapId(4)}));
  EXPECT_EQ(ids(listSnaps({.tenant = "globex", .sandbox_id = sbId(1)}).items), (std::vector<std::string>{snapId(2)}));
  EXPECT_TRUE(listSnaps({.tenant = "acme", .sandbox_id = sbId(3)}).items.empty());
  // The cursor row need not match the sandbox filter.
  EXPECT_EQ(ids(listSnaps({.tenant = "acme", .sandbox_id = sbId(1), .after_id = snapId(3)}).items),
            (std::vector<std::string>{snapId(4)}));

  // A cursor naming another tenant's snapshot, or none at all, reveals nothing.
  for (const std::string& cursor : {snapId(2), snapId(404), sbId(1)}) {
    auto page = store_->listSnapshots({.tenant = "acme", .after_id = cursor});
    ASSERT_FALSE(page.ok()) << cursor;
    EXPECT_EQ(page.error().code, ErrorCode::kInvalidArgument) << cursor;
  }
}

TEST_F(StateStoreTest, SnapshotsPaginateWithoutDuplicatesOrGaps) {
  std::vector<std::string> expected;
  // Several snapshots share a creation time, so the id must break ties across page ends.
  for (int i = 0; i < 23; ++i) {
    int n = (i * 7) % 23;  // inserted out of order
    insertSnap(snapshot(snapId(n), "acme", sbId(n % 2), 1000 + n / 3));
    insertSnap(snapshot(snapId(100 + n), "globex", sbId(n % 2), 1000 + n / 3));
  }
  for (int n = 0; n < 23; ++n) expected.push_back(snapId(n));

  for (size_t limit : {1, 5, 7, 23, 100}) {
    std::vector<std::string> seen;
    std::string cursor;
    int pages = 0;
    do {
      auto page = listSnaps({.tenant = "acme", .limit = limit, .after_id = cursor});
      EXPECT_LE(page.items.size(), limit);
      EXPECT_FALSE(page.items.empty());
      for (const auto& r : page.items) seen.push_back(r.id);
      cursor = page.next_cursor;
      ASSERT_LT(++pages, 100);
    } while (!cursor.empty());
    EXPECT_EQ(seen, expected) << "limit " << limit;
    EXPECT_EQ(pages, static_cast<int>((expected.size() + limit - 1) / limit)) << "limit " << limit;
  }

  std::vector<std::string> odd;
  for (int n = 1; n < 23; n += 2) odd.push_back(snapId(n));
  std::vector<std::string> seen;
  std::string cursor;
  do {
    auto page = listSnaps({.tenant = "acme", .sandbox_id = sbId(1), .limit = 4, .after_id = cursor});
    for (const auto& r : page.items) seen.push_back(r.id);
    cursor = page.next_cursor;
  } while (!cursor.empty() && seen.size() < 100);
  EXPECT_EQ(seen, odd);
}

TEST_F(StateStoreTest, AllSnapshotsSpansTenantsInOrder) {
  EXPECT_TRUE(store_->allSnapshots()->empty());
  insertSnap(snapshot(snapId(1), "acme", sbId(1), 3));
  insertSnap(snapshot(snapId(2), "globex", sbId(2), 1));
  insertSnap(snapshot(snapId(3), "initech", sbId(3), 3));
  insertSnap(snapshot(snapId(4), "acme", sbId(1), 2));
  auto all = store_->allSnapshots();
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(ids(all.value()), (std::vector<std::string>{snapId(2), snapId(4), snapId(1), snapId(3)}));
  EXPECT_EQ(all->front(), snapshot(snapId(2), "globex", sbId(2), 1));
  EXPECT_EQ(ids(store_->allSnapshots("acme").value()), (std::vector<std::string>{snapId(4), snapId(1)}));
  EXPECT_TRUE(store_->allSnapshots("nobody")->empty());
}

TEST_F(StateStoreTest, RejectsBadSnapshotInput) {
  auto expectInvalid = [](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument) << what << ": " << st.error().message;
  };
  SnapshotRecord good = snapshot(snapId(1), "acme", sbId(1), 1);
  SnapshotRecord r = good;
  r.id = "";
  expectInvalid(store_->insertSnapshot(r), "empty id");
  r = good;
  r.tenant = "";
  expectInvalid(store_->insertSnapshot(r), "empty tenant");
  r = good;
  r.memory_mb = UINT64_MAX;
  expectInvalid(store_->insertSnapshot(r), "memory out of range");
  r = good;
  r.size_bytes = static_cast<uint64_t>(INT64_MAX) + 1;
  expectInvalid(store_->insertSnapshot(r), "size out of range");
  r = good;
  r.metadata = {{"n", 1}};
  expectInvalid(store_->insertSnapshot(r), "metadata number");
  r = good;
  r.metadata = nullptr;
  expectInvalid(store_->insertSnapshot(r), "metadata null");
  r = good;
  r.metadata = {{"bad", "\xff"}};
  expectInvalid(store_->insertSnapshot(r), "metadata invalid UTF-8");
  EXPECT_TRUE(store_->allSnapshots()->empty());  // nothing half-written

  EXPECT_EQ(store_->getSnapshot("").error().code, ErrorCode::kInvalidArgument);
  expectInvalid(store_->deleteSnapshot(""), "delete empty id");
  auto listErr = [&](const SnapshotFilter& f) -> Status {
    auto page = store_->listSnapshots(f);
    if (page.ok()) return okStatus();
    return page.error();
  };
  expectInvalid(listErr({.tenant = ""}), "list without tenant");
  expectInvalid(listErr({.tenant = "acme", .limit = 0}), "limit 0");
  expectInvalid(listErr({.tenant = "acme", .limit = 1001}), "limit 1001");
  EXPECT_TRUE(listErr({.tenant = "acme", .limit = 1000}).ok());
}

TEST_F(StateStoreTest, SnapshotDiskFullIsResourceExhaustedAndChangesNothing) {
  SnapshotRecord kept = snapshot(snapId(1), "acme", sbId(1), 1);
  insertSnap(kept);
  ASSERT_TRUE(store_->limitGrowthForTesting(0).ok());

  SnapshotRecord big = snapshot(snapId(2), "acme", sbId(1), 2);
  big.metadata = {{"blob", std::string(256 * 1024, 'x')}};
  auto st = store_->insertSnapshot(big);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(st.error().message.find("disk full while recording snapshot " + big.id), std::string::npos)
      << st.error().message;

  // The sandbox row's new columns hit the same limit.
  SandboxRecord sb = sandbox(sbId(1), "acme", 1);
  sb.source_snapshot = std::string(256 * 1024, 's');
  st = store_->insertSandbox(sb);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted);

  EXPECT_EQ(store_->getSnapshot(big.id).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->getSandbox(sb.id).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(store_->allSnapshots().value(), (std::vector<SnapshotRecord>{kept}));
  ASSERT_TRUE(store_->deleteSnapshot(kept.id).ok());  // freeing space still works
  reopen();                                           // the limit belongs to the connection
  EXPECT_TRUE(store_->allSnapshots()->empty());
  insertSnap(big);
  EXPECT_EQ(store_->getSnapshot(big.id).value(), big);
}

TEST_F(StateStoreTest, MissingDirectoryIsAClearError) {
  std::string path = dir_->path() + "/no-such-dir/state.db";
  auto store = StateStore::open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kInternal);
  EXPECT_NE(store.error().message.find(path), std::string::npos) << store.error().message;
  EXPECT_NE(store.error().message.find("No such file or directory"), std::string::npos) << store.error().message;
}

TEST_F(StateStoreTest, NotADatabaseIsAClearError) {
  std::string path = dir_->path() + "/junk.db";
  std::string junk;
  for (int i = 0; i < 100; ++i) junk += "this is not an SQLite database\n";
  ASSERT_TRUE(writeFileAtomic(path, junk).ok());
  auto store = StateStore::open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code, ErrorCode::kInternal);
  EXPECT_NE(store.error().message.find(path), std::string::npos) << store.error().message;
  EXPECT_NE(store.error().message.find("not a database"), std::string::npos) << store.error().message;
  EXPECT_EQ(readSmallFile(path, 1 << 20).value(), junk);
}

// Root writes through any file mode, so as root the open runs in a child that has dropped to
// nobody: what an unprivileged daemon would see.
TEST_F(StateStoreTest, ReadOnlyDatabaseIsAClearError) {
  store_.reset();
  ASSERT_EQ(chmod(path_.c_str(), 0444), 0);
  if (geteuid() != 0) {
    auto store = StateStore::open(path_);
    ASSERT_FALSE(store.ok());
    EXPECT_NE(store.error().message.find("read-only"), std::string::npos) << store.error().message;
    EXPECT_NE(store.error().message.find(path_), std::string::npos) << store.error().message;
    return;
  }
  ASSERT_EQ(chmod(dir_->path().c_str(), 0755), 0);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    constexpr int kNobody = 65534;
    if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(2);
    if (access(path_.c_str(), R_OK) != 0) _exit(4);
    auto store = StateStore::open(path_);
    if (store.ok()) _exit(1);
    const std::string& msg = store.error().message;
    _exit(write(fds[1], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()) ? 0 : 3);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  // Only a machine that cannot switch to nobody at all (no such id mapped) is a reason to skip;
  // a database nobody cannot even read is this test's own fault.
  if (WEXITSTATUS(status) == 2) GTEST_SKIP() << "setuid/setgid to nobody (65534) refused here";
  ASSERT_NE(WEXITSTATUS(status), 4) << "nobody cannot read " << path_ << ": the test's directory is not reachable";
  ASSERT_EQ(WEXITSTATUS(status), 0) << "a read-only database opened without error";
  EXPECT_NE(msg.find("read-only"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path_), std::string::npos) << msg;
}

}  // namespace
}  // namespace space::store
