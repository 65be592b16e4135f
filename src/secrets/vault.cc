#include "secrets/vault.h"

namespace space::secrets {
namespace {

// The sealed value is bound to its tenant and name: a row copied elsewhere does not open.
std::string sealContext(const std::string& tenant, const std::string& name) {
  return "space-secret-v1\n" + tenant + '\n' + name;
}

SecretInfo infoOf(const store::SecretRecord& r) {
  return SecretInfo{r.name, r.version, r.created_at_ms, r.updated_at_ms, r.created};
}

bool nameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

}  // namespace

Status checkSecretName(std::string_view name) {
  bool valid = !name.empty() && name.size() <= kMaxNameBytes && nameChar(name[0]) && name[0] != '_' && name[0] != '.' &&
               name[0] != '-';
  for (char c : name) valid = valid && nameChar(c);
  if (!valid) {
    return makeError(ErrorCode::kInvalidArgument, "name: a secret's name is 1-" + std::to_string(kMaxNameBytes) +
                                                      " of A-Z a-z 0-9 _ . -, starting with a letter or digit");
  }
  return okStatus();
}

Status checkSecretValue(std::string_view value) {
  if (value.empty() || value.size() > kMaxValueBytes) {
    return makeError(ErrorCode::kInvalidArgument, "value: a secret is 1-" + std::to_string(kMaxValueBytes) +
                                                      " bytes, got " + std::to_string(value.size()));
  }
  for (char c : value) {
    auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\t') || byte == 0x7f) {
      return makeError(ErrorCode::kInvalidArgument,
                       "value: a secret is sent in HTTP header values, so it may not contain control characters "
                       "such as CR, LF or NUL (a trailing newline from a file? spacectl secret set strips one)");
    }
  }
  return okStatus();
}

Result<SecretInfo> SecretVault::put(const std::string& tenant, const std::string& name, std::string_view value) {
  return store(tenant, name, value, /*create_only=*/false);
}

Result<SecretInfo> SecretVault::create(const std::string& tenant, const std::string& name, std::string_view value) {
  return store(tenant, name, value, /*create_only=*/true);
}

Result<SecretInfo> SecretVault::store(const std::string& tenant, const std::string& name, std::string_view value,
                                      bool create_only) {
  SPACE_TRY(checkSecretName(name));
  SPACE_TRY(checkSecretValue(value));
  store::SecretRecord record;
  record.tenant = tenant;
  record.name = name;
  record.sealed = box_.seal(value, sealContext(tenant, name));
  SPACE_TRY(store_.putSecret(record, kMaxSecretsPerTenant, create_only));
  return infoOf(record);
}

Result<SecretInfo> SecretVault::info(const std::string& tenant, const std::string& name) {
  SPACE_TRY(checkSecretName(name));
  auto record = store_.getSecret(tenant, name);
  if (!record.ok()) return record.error();
  return infoOf(record.value());
}

Result<std::vector<SecretInfo>> SecretVault::list(const std::string& tenant) {
  auto records = store_.listSecrets(tenant);
  if (!records.ok()) return records.error();
  std::vector<SecretInfo> out;
  out.reserve(records->size());
  for (const auto& r : records.value()) out.push_back(infoOf(r));
  return out;
}

Status SecretVault::remove(const std::string& tenant, const std::string& name) {
  SPACE_TRY(checkSecretName(name));
  return store_.deleteSecret(tenant, name);
}

std::string SecretVault::placeholderFor(const std::string& sandbox_id, const std::string& name) const {
  auto key = box_.derive("space secret placeholder v1\n" + sandbox_id + "\n" + name);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "space-secret-" + name + "-";
  for (size_t i = 0; i < 16; ++i) {
    out += kHex[key[i] >> 4];
    out += kHex[key[i] & 15];
  }
  return out;
}

std::string SecretVault::envdAccessToken(const std::string& sandbox_id) const {
  auto key = box_.derive("space e2b envd token v1\n" + sandbox_id);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char byte : key) {
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

Result<std::string> SecretVault::reveal(const std::string& tenant, const std::string& name) {
  SPACE_TRY(checkSecretName(name));
  auto record = store_.getSecret(tenant, name);
  if (!record.ok()) return record.error();
  auto value = box_.open(record->sealed, sealContext(tenant, name));
  if (!value.ok())
    return makeError(value.error().code, "secret " + name + ": " + value.error().message, value.error().reason);
  return value;
}

}  // namespace space::secrets
