// SHA-256 (OpenSSL) and the hex form the project stores digests in.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace space {

std::array<unsigned char, 32> sha256(std::string_view data);
// Lower-case hex of `bytes`.
std::string hexEncode(const unsigned char* bytes, size_t n);
inline std::string sha256Hex(std::string_view data) {
  auto digest = sha256(data);
  return hexEncode(digest.data(), digest.size());
}

}  // namespace space
