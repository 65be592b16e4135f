// Who may call a sandbox's envd front end: the holder of its access token (X-Access-Token), or,
// for /files only, a URL signed with that token (E2B's downloadUrl/uploadUrl).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace space::e2b {

// E2B's file URL signature: "v1_" + unpadded standard base64 of
// SHA-256("<path>:<operation>:<user>:<token>[:<expiration unix seconds>]"); operation is "read"
// or "write", user "" for the default.
std::string fileSignature(std::string_view path, std::string_view operation, std::string_view user,
                          std::string_view token, std::optional<int64_t> expiration_s);

// Equality in time that depends only on the lengths (CRYPTO_memcmp).
bool sameSecret(std::string_view a, std::string_view b);

}  // namespace space::e2b
