#include "e2b/envd_auth.h"

#include <openssl/crypto.h>

#include "agentproto/base64.h"
#include "common/digest.h"

namespace space::e2b {

std::string fileSignature(std::string_view path, std::string_view operation, std::string_view user,
                          std::string_view token, std::optional<int64_t> expiration_s) {
  std::string raw;
  raw.append(path).append(":").append(operation).append(":").append(user).append(":").append(token);
  if (expiration_s) raw.append(":").append(std::to_string(*expiration_s));
  auto digest = sha256(raw);
  std::string encoded =
      agentproto::base64Encode(std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
  while (!encoded.empty() && encoded.back() == '=') encoded.pop_back();
  return "v1_" + encoded;
}

bool sameSecret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace space::e2b
