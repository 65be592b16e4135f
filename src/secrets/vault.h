// A tenant's secrets: named values (API tokens) that spaced keeps for the gateways to inject,
// and that nobody reads back. The value is sealed before it reaches the store, never leaves
// through the API, and never appears in a log line or an error message; reveal() is for the
// code that hands a value to a sandbox's gateway, and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "secrets/secret_box.h"
#include "store/state_store.h"

namespace space::secrets {

// Bounded input: a value goes into HTTP headers, a name into `{{secret:NAME}}` templates.
inline constexpr size_t kMaxNameBytes = 64;
inline constexpr size_t kMaxValueBytes = 16 * 1024;
inline constexpr size_t kMaxSecretsPerTenant = 256;

// What the API shows of a secret: everything but its value.
struct SecretInfo {
  std::string name;
  int64_t version = 0;
  int64_t created_at_ms = 0;
  int64_t updated_at_ms = 0;
  bool created = false;  // put(): a new secret rather than a rotation
};

// A name is 1-64 of [A-Za-z0-9_.-], starting with a letter or digit.
Status checkSecretName(std::string_view name);
// 1-16 KiB of bytes a header value may hold: no control characters but tab (CR, LF and NUL would
// forge headers; the rest bloat escaped copies). The error never quotes it.
Status checkSecretValue(std::string_view value);

class SecretVault {
 public:
  SecretVault(store::StateStore& store, SecretBox box) : store_(store), box_(std::move(box)) {}

  // Creates the secret, or replaces its value (a rotation) when it exists.
  Result<SecretInfo> put(const std::string& tenant, const std::string& name, std::string_view value);
  // Creates it; kAlreadyExists when it exists (never a rotation, even under a concurrent create).
  Result<SecretInfo> create(const std::string& tenant, const std::string& name, std::string_view value);
  Result<SecretInfo> info(const std::string& tenant, const std::string& name);  // kNotFound
  Result<std::vector<SecretInfo>> list(const std::string& tenant);
  Status remove(const std::string& tenant, const std::string& name);  // kNotFound
  // The value in clear: for the gateway's credential rules only.
  Result<std::string> reveal(const std::string& tenant, const std::string& name);
  // The seed of sandbox `sandbox_id`'s credential CA (net::deriveCredentialCa): the same for
  // the same id on this node, another for every other id.
  SecretBox::Key credentialCaSeed(const std::string& sandbox_id) const {
    return box_.derive("space credential CA v1\n" + sandbox_id);
  }
  // What sandbox `sandbox_id`'s guest sees in place of secret `name` (network.placeholders):
  // "space-secret-NAME-" and 32 hex digits, the same for the sandbox whenever it is made (a
  // resume, a restart), another in every other sandbox, and saying nothing of the value.
  std::string placeholderFor(const std::string& sandbox_id, const std::string& name) const;
  // Sandbox `sandbox_id`'s envd access token for the E2B front end ("e2b envd token v1"): 64 hex
  // digits, the same after a restart or resume without being stored anywhere.
  std::string envdAccessToken(const std::string& sandbox_id) const;

 private:
  store::StateStore& store_;
  Result<SecretInfo> store(const std::string& tenant, const std::string& name, std::string_view value,
                           bool create_only);
  SecretBox box_;
};

}  // namespace space::secrets
