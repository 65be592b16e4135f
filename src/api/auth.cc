#include "api/auth.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include <cstdio>

#include "common/digest.h"

namespace space::api {

namespace {

bool unhex(const std::string& text, unsigned char out[32]) {
  if (text.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    unsigned value = 0;
    if (sscanf(text.c_str() + 2 * i, "%2x", &value) != 1) return false;
    out[i] = static_cast<unsigned char>(value);
  }
  return true;
}

}  // namespace

std::string generateApiKey() {
  // E2B's own key format, so E2B SDKs that check it (2.45 and older) accept SPACE's keys: one
  // key serves both APIs. 160 random bits.
  unsigned char bytes[20];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key = "e2b_";
  for (unsigned char b : bytes) {
    key += kHex[b >> 4];
    key += kHex[b & 15];
  }
  return key;
}

std::string apiKeyDigest(std::string_view key) { return sha256Hex(key); }

std::optional<std::string> bearerToken(std::string_view authorization) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() <= kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) !=
        std::tolower(static_cast<unsigned char>(kScheme[i]))) {
      return std::nullopt;
    }
  }
  std::string_view key = authorization.substr(kScheme.size());
  while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
  while (!key.empty() && key.back() == ' ') key.remove_suffix(1);
  if (key.empty() || key.size() > 256) return std::nullopt;
  return std::string(key);
}

Status KeyRing::load() {
  auto keys = store_.listApiKeys();
  if (!keys.ok()) return keys.error();
  std::vector<Entry> entries;
  for (const auto& k : keys.value()) {
    Entry e;
    e.tenant = k.tenant;
    if (!unhex(k.key_sha256_hex, e.digest)) continue;
    entries.push_back(std::move(e));
  }
  std::lock_guard lock(mu_);
  entries_ = std::move(entries);
  last_load_ = std::chrono::steady_clock::now();
  return okStatus();
}

std::optional<std::string> KeyRing::find(const unsigned char* digest) {
  std::lock_guard lock(mu_);
  std::optional<std::string> tenant;
  for (const auto& e : entries_) {
    // Every entry is compared, match or not.
    if (CRYPTO_memcmp(e.digest, digest, 32) == 0) tenant = e.tenant;
  }
  return tenant;
}

std::optional<std::string> KeyRing::authenticate(std::string_view key) {
  const auto digest_bytes = sha256(key);
  const unsigned char* digest = digest_bytes.data();
  auto since_load = [this] {
    std::lock_guard lock(mu_);
    return std::chrono::steady_clock::now() - last_load_;
  };
  // Revocations (spaced tenant rm) take effect within kRefresh even for keys still cached.
  if (since_load() > kRefresh) (void)load();
  if (auto tenant = find(digest)) return tenant;
  if (since_load() < std::chrono::seconds(1) || !load().ok()) return std::nullopt;
  return find(digest);
}

}  // namespace space::api
