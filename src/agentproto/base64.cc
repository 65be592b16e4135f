#include "agentproto/base64.h"

#include <array>
#include <cstdint>

namespace space::agentproto {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> makeDecodeTable() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr auto kDecode = makeDecodeTable();

}  // namespace

std::string base64Encode(std::string_view in) {
  std::string out;
  out.reserve(4 * ((in.size() + 2) / 3));
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(in[k])); };
  for (; i + 3 <= in.size(); i += 3) {
    uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  size_t left = in.size() - i;
  if (left == 1) {
    uint32_t v = byte(i) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (left == 2) {
    uint32_t v = (byte(i) << 16) | (byte(i + 1) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> base64Decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    bool last = i + 4 == in.size();
    int pad = 0;
    if (last && in[i + 3] == '=') pad = in[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      int d;
      if (k >= 4 - pad) {
        d = 0;
      } else {
        d = kDecode[static_cast<uint8_t>(in[i + static_cast<size_t>(k)])];
        if (d < 0) return std::nullopt;
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>((v >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(v & 0xff);
    // Canonical form: the bits dropped by padding must be zero.
    if ((pad == 1 && (v & 0xff) != 0) || (pad == 2 && (v & 0xffff) != 0)) return std::nullopt;
  }
  return out;
}

std::optional<size_t> base64DecodedSize(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  if (in.empty()) return size_t{0};
  size_t pad = in[in.size() - 1] != '=' ? 0 : in[in.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < in.size() - pad; ++i) {
    if (kDecode[static_cast<uint8_t>(in[i])] < 0) return std::nullopt;
  }
  // Canonical form: the bits dropped by padding must be zero.
  auto last = static_cast<uint32_t>(kDecode[static_cast<uint8_t>(in[in.size() - 1 - pad])]);
  if ((pad == 1 && (last & 0x3) != 0) || (pad == 2 && (last & 0xf) != 0)) return std::nullopt;
  return in.size() / 4 * 3 - pad;
}

}  // namespace space::agentproto
