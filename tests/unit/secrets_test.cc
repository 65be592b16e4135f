// Secrets at rest: the sealed format, the node's key file, and the vault's bounds. The store is
// a real SQLite database in a temporary directory.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <optional>
#include <string>

#include "common/fs.h"
#include "net/policy.h"
#include "secrets/secret_box.h"
#include "secrets/vault.h"
#include "store/state_store.h"

namespace space::secrets {
namespace {

SecretBox::Key keyOf(unsigned char fill) {
  SecretBox::Key key{};
  key.fill(fill);
  return key;
}

TEST(SecretBox, SealedBytesOpenOnlyWithTheSameKeyAndContext) {
  SecretBox box(keyOf(1));
  std::string sealed = box.seal("ghp_token-value", "acme/gh");
  EXPECT_EQ(sealed.find("ghp_token-value"), std::string::npos);
  auto opened = box.open(sealed, "acme/gh");
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened.value(), "ghp_token-value");
  // Another context (a row copied to another tenant), another key, a flipped bit: refused.
  EXPECT_FALSE(box.open(sealed, "evil/gh").ok());
  EXPECT_FALSE(SecretBox(keyOf(2)).open(sealed, "acme/gh").ok());
  for (size_t i = 0; i < sealed.size(); i += 7) {
    std::string changed = sealed;
    changed[i] = static_cast<char>(changed[i] ^ 0x01);
    auto refused = box.open(changed, "acme/gh");
    ASSERT_FALSE(refused.ok()) << "byte " << i;
    EXPECT_EQ(refused.error().reason, "secret_unreadable");
  }
  EXPECT_FALSE(box.open("", "acme/gh").ok());
  EXPECT_FALSE(box.open(sealed.substr(0, 20), "acme/gh").ok());
  // A fresh nonce each time: the same value never seals to the same bytes.
  EXPECT_NE(box.seal("ghp_token-value", "acme/gh"), sealed);
}

// Derived keys: fixed per key and label, different for another label or key, never the key.
TEST(SecretBox, DerivedKeysDependOnKeyAndLabelOnly) {
  SecretBox box(keyOf(1));
  EXPECT_EQ(box.derive("space credential CA v1\nsbx_a"), SecretBox(keyOf(1)).derive("space credential CA v1\nsbx_a"));
  EXPECT_NE(box.derive("space credential CA v1\nsbx_a"), box.derive("space credential CA v1\nsbx_b"));
  EXPECT_NE(box.derive("space credential CA v1\nsbx_a"), SecretBox(keyOf(2)).derive("space credential CA v1\nsbx_a"));
  EXPECT_NE(box.derive(""), keyOf(1));
}

class SecretKeyFileTest : public testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create(testing::TempDir(), "secrets-");
    ASSERT_TRUE(dir.ok()) << dir.error().message;
    dir_.emplace(std::move(dir.value()));
    path_ = dir_->path() + "/secret-key";
  }
  std::optional<TempDir> dir_;
  std::string path_;
};

TEST_F(SecretKeyFileTest, IsMadePrivateAtFirstStartAndReadBackAfter) {
  auto first = SecretBox::openOrCreateKey(path_);
  ASSERT_TRUE(first.ok()) << first.error().message;
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string sealed = first->seal("v", "c");
  auto again = SecretBox::openOrCreateKey(path_);
  ASSERT_TRUE(again.ok()) << again.error().message;
  auto opened = again->open(sealed, "c");
  ASSERT_TRUE(opened.ok()) << opened.error().message;
  EXPECT_EQ(opened.value(), "v");
}

TEST_F(SecretKeyFileTest, AKeyReadableByOthersIsMadePrivate) {
  ASSERT_TRUE(SecretBox::openOrCreateKey(path_).ok());
  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  ASSERT_TRUE(SecretBox::openOrCreateKey(path_).ok());
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(SecretKeyFileTest, AFileThatIsNotAKeyIsAnErrorAndIsLeftAlone) {
  ASSERT_TRUE(writeFileAtomic(path_, "not a key\n", 0600).ok());
  auto refused = SecretBox::openOrCreateKey(path_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("64 hex digits"), std::string::npos) << refused.error().message;
  auto content = readSmallFile(path_, 100);
  ASSERT_TRUE(content.ok());
  EXPECT_EQ(content.value(), "not a key\n");
}

class SecretVaultTest : public SecretKeyFileTest {
 protected:
  void SetUp() override {
    SecretKeyFileTest::SetUp();
    db_path_ = dir_->path() + "/state.db";
    openVault();
  }
  void openVault() {
    auto store = store::StateStore::open(db_path_);
    ASSERT_TRUE(store.ok()) << store.error().message;
    store_ = std::move(store.value());
    auto box = SecretBox::openOrCreateKey(path_);
    ASSERT_TRUE(box.ok());
    vault_.emplace(*store_, box.value());
  }
  // Every byte of the database file, WAL included, as the disk holds it.
  std::string databaseBytes() {
    std::string all;
    for (const std::string& p : {db_path_, db_path_ + "-wal"}) {
      auto bytes = readSmallFile(p, 64 << 20);
      if (bytes.ok()) all += bytes.value();
    }
    return all;
  }
  std::string db_path_;
  std::unique_ptr<store::StateStore> store_;
  std::optional<SecretVault> vault_;
};

TEST_F(SecretVaultTest, PutCreatesThenRotatesAndRevealGivesTheCurrentValue) {
  auto created = vault_->put("acme", "gh", "first-value-0123456789");
  ASSERT_TRUE(created.ok()) << created.error().message;
  EXPECT_TRUE(created->created);
  EXPECT_EQ(created->version, 1);
  auto rotated = vault_->put("acme", "gh", "second-value-0123456789");
  ASSERT_TRUE(rotated.ok()) << rotated.error().message;
  EXPECT_FALSE(rotated->created);
  EXPECT_EQ(rotated->version, 2);
  EXPECT_EQ(rotated->created_at_ms, created->created_at_ms);
  EXPECT_EQ(vault_->reveal("acme", "gh").value(), "second-value-0123456789");
  // Tenants do not see each other's secrets, even by name.
  EXPECT_EQ(vault_->reveal("globex", "gh").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(vault_->list("globex").value().size(), 0u);
  auto listed = vault_->list("acme");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ(listed->front().name, "gh");
  EXPECT_EQ(listed->front().version, 2);
  ASSERT_TRUE(vault_->remove("acme", "gh").ok());
  EXPECT_EQ(vault_->reveal("acme", "gh").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(vault_->remove("acme", "gh").error().code, ErrorCode::kNotFound);
}

TEST_F(SecretVaultTest, CreateNeverRotatesAndARemovedTenantLeavesNoSecrets) {
  ASSERT_TRUE(vault_->create("acme", "gh", "first").ok());
  auto again = vault_->create("acme", "gh", "second");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::kAlreadyExists);
  EXPECT_EQ(vault_->reveal("acme", "gh").value(), "first");
  ASSERT_TRUE(vault_->put("acme", "other", "x").ok());
  ASSERT_TRUE(vault_->put("globex", "gh", "y").ok());
  EXPECT_EQ(store_->deleteSecretsOf("acme").value(), 2);
  EXPECT_EQ(vault_->list("acme").value().size(), 0u);
  EXPECT_EQ(vault_->reveal("globex", "gh").value(), "y");
}

TEST_F(SecretVaultTest, TheDatabaseFileNeverHoldsAValueInClear) {
  const std::string value = "sk-live-ABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789";
  ASSERT_TRUE(vault_->put("acme", "model", value).ok());
  ASSERT_TRUE(vault_->put("acme", "model", value + "-rotated").ok());
  std::string bytes = databaseBytes();
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(bytes.find("sk-live-ABCDEFGHIJKLMNOPQRSTUVWXYZ"), std::string::npos);
}

TEST_F(SecretVaultTest, ARowMovedToAnotherTenantDoesNotOpen) {
  ASSERT_TRUE(vault_->put("acme", "gh", "acme-only-value").ok());
  ASSERT_TRUE(vault_->put("globex", "gh", "globex-value").ok());
  store_.reset();
  vault_.reset();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE tenant = 'acme') "
                         "WHERE tenant = 'globex'",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  openVault();
  auto stolen = vault_->reveal("globex", "gh");
  ASSERT_FALSE(stolen.ok());
  EXPECT_EQ(stolen.error().reason, "secret_unreadable");
  EXPECT_EQ(stolen.error().message.find("acme-only-value"), std::string::npos);
}

TEST_F(SecretVaultTest, BadNamesAndValuesAreRefusedWithoutQuotingTheValue) {
  for (std::string name : std::initializer_list<std::string>{"", "_x", ".x", "-x", "a b", "a/b", "{{x}}",
                                                             std::string(65, 'a'), std::string("a\0b", 3)}) {
    auto r = vault_->put("acme", name, "value");
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(vault_->put("acme", std::string(64, 'a'), "value").ok());
  EXPECT_TRUE(vault_->put("acme", "GH_token.v2-x", "value").ok());
  for (std::string value :
       {std::string(), std::string("secret-with\nnewline"), std::string("cr\rhere"), std::string("nul\0here", 8),
        std::string("bell\x07"), std::string("del\x7f"), std::string(kMaxValueBytes + 1, 'v')}) {
    auto r = vault_->put("acme", "v", value);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    if (!value.empty() && value.size() < 100) {
      EXPECT_EQ(r.error().message.find(value), std::string::npos) << r.error().message;
    }
  }
  EXPECT_TRUE(vault_->put("acme", "v", std::string(kMaxValueBytes, 'v')).ok());
  EXPECT_TRUE(vault_->put("acme", "tabbed", "a\tb").ok());
  EXPECT_EQ(vault_->list("acme").value().size(), 4u);
}

TEST_F(SecretVaultTest, ATenantHasAtMostTheLimitOfSecretsButMayStillRotate) {
  for (size_t i = 0; i < kMaxSecretsPerTenant; ++i) {
    ASSERT_TRUE(vault_->put("acme", "s" + std::to_string(i), "value").ok()) << i;
  }
  auto over = vault_->put("acme", "one-more", "value");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().reason, "too_many_secrets");
  EXPECT_TRUE(vault_->put("acme", "s0", "new value").ok());
  EXPECT_TRUE(vault_->put("globex", "one-more", "value").ok());
}

TEST_F(SecretVaultTest, AnotherNodeKeyCannotReadTheSecrets) {
  ASSERT_TRUE(vault_->put("acme", "gh", "value").ok());
  ASSERT_EQ(unlink(path_.c_str()), 0);
  auto box = SecretBox::openOrCreateKey(path_);
  ASSERT_TRUE(box.ok());
  SecretVault other(*store_, box.value());
  auto refused = other.reveal("acme", "gh");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().reason, "secret_unreadable");
  EXPECT_NE(refused.error().message.find("secret gh"), std::string::npos) << refused.error().message;
}

// A name a secret may have is exactly a name a credential rule may refer to (net checks templates
// without depending on this module).
TEST(SecretNames, AreTheNamesCredentialTemplatesAccept) {
  for (std::string name :
       std::initializer_list<std::string>{"gh", "GH_token.v2-x", "9", std::string(64, 'a'), std::string(65, 'a'), "_x",
                                          ".x", "-x", "a b", "a/b", "a}b", "a{b", "ä", ""}) {
    nlohmann::json policy = {
        {"credentials", {{{"host", "x.example"}, {"headers", {{"A", "{{secret:" + name + "}}"}}}}}}};
    EXPECT_EQ(checkSecretName(name).ok(), net::parsePolicy(policy).ok()) << name;
  }
}

}  // namespace
}  // namespace space::secrets
