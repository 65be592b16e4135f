// Sealing secret values for storage at rest: AES-256-GCM (OpenSSL EVP) under the node's key.
// The key lives in one file (<data-dir>/secret-key, mode 0600, made at first start); the
// database holds only sealed values, so a copy of state.db without the key file reveals no
// secret. Each value is bound to its place (`context`, e.g. tenant and name) as associated
// data: a sealed value copied into another tenant's row fails to open instead of being used.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::secrets {

class SecretBox {
 public:
  static constexpr size_t kKeyBytes = 32;
  using Key = std::array<unsigned char, kKeyBytes>;

  // Reads the key file, or creates it (32 random bytes as hex, mode 0600, temp + fsync +
  // rename) when there is none. A file that is not a key is an error that says so: making a
  // new key would leave every stored secret unreadable.
  static Result<SecretBox> openOrCreateKey(const std::string& key_path);
  explicit SecretBox(const Key& key) : key_(key) {}
  SecretBox(const SecretBox&) = default;
  SecretBox& operator=(const SecretBox&) = default;
  ~SecretBox();

  // Format: version byte 1 | 12-byte random nonce | ciphertext | 16-byte tag.
  std::string seal(std::string_view plaintext, std::string_view context) const;
  // kInternal (reason secret_unreadable) when the bytes were not sealed by this key for this context (or were changed).
  Result<std::string> open(std::string_view sealed, std::string_view context) const;
  // 32 bytes of HKDF-SHA256 of the node key for `label`: keys of other purposes (a sandbox's
  // credential CA) that reveal nothing of this one, and that the node can make again at will.
  Key derive(std::string_view label) const;

 private:
  Key key_;
};

}  // namespace space::secrets
