// API keys. A key is a random secret the client sends as `Authorization: Bearer <key>`; the
// store keeps only its SHA-256 digest and the tenant it belongs to. Lookup compares the
// presented key's digest with every known digest in constant time (CRYPTO_memcmp, no early
// exit), so response timing says nothing about how close a guess was.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "store/state_store.h"

namespace space::api {

// "e2b_" + 40 random lowercase hex digits (160 bits): E2B's key format, so the same key works
// with SPACE's API (Bearer) and E2B's SDKs (X-API-KEY).
std::string generateApiKey();
// Lower-case hex SHA-256 of the key.
std::string apiKeyDigest(std::string_view key);
// The key in an `Authorization: Bearer <key>` header value; nullopt if absent or malformed.
std::optional<std::string> bearerToken(std::string_view authorization);

class KeyRing {
 public:
  explicit KeyRing(store::StateStore& store) : store_(store) {}
  Status load();
  // The tenant owning `key`, or nullopt. An unknown key triggers a reload from the store (at
  // most once a second), so keys added with `spaced tenant add` work without a restart; the
  // keys are also reloaded every kRefresh, so removed ones stop working.
  std::optional<std::string> authenticate(std::string_view key);
  static constexpr std::chrono::seconds kRefresh{5};

 private:
  struct Entry {
    std::string tenant;
    unsigned char digest[32];
  };
  std::optional<std::string> find(const unsigned char* digest);

  store::StateStore& store_;
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::chrono::steady_clock::time_point last_load_{};
};

}  // namespace space::api
