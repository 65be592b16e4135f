#include "http/byte_range.h"

#include <optional>

namespace space::http {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// 1*DIGIT, without overflow (a value past 2^62 is no size any file has).
std::optional<uint64_t> digits(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

}  // namespace

ByteRange parseByteRange(std::string_view header, uint64_t size) {
  ByteRange whole;
  header = trim(header);
  constexpr std::string_view kUnit = "bytes=";
  if (header.size() <= kUnit.size()) return whole;
  for (size_t i = 0; i < kUnit.size(); ++i) {
    if ((header[i] | 0x20) != kUnit[i] && header[i] != kUnit[i]) return whole;
  }
  std::string_view spec = trim(header.substr(kUnit.size()));
  if (spec.find(',') != std::string_view::npos) return whole;  // several ranges: serve it all
  const size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return whole;
  const std::string_view first_text = trim(spec.substr(0, dash));
  const std::string_view last_text = trim(spec.substr(dash + 1));
  ByteRange r;
  if (first_text.empty()) {  // "-N": the last N bytes
    auto suffix = digits(last_text);
    if (!suffix) return whole;
    if (*suffix == 0 || size == 0) return ByteRange{ByteRange::Kind::kUnsatisfiable};
    r.kind = ByteRange::Kind::kPartial;
    r.first = *suffix >= size ? 0 : size - *suffix;
    r.last = size - 1;
    return r;
  }
  auto first = digits(first_text);
  if (!first) return whole;
  std::optional<uint64_t> last;
  if (!last_text.empty()) {
    last = digits(last_text);
    if (!last || *last < *first) return whole;  // invalid: ignored, as the RFC says
  }
  if (*first >= size) return ByteRange{ByteRange::Kind::kUnsatisfiable};
  r.kind = ByteRange::Kind::kPartial;
  r.first = *first;
  r.last = last && *last < size ? *last : size - 1;
  return r;
}

}  // namespace space::http
