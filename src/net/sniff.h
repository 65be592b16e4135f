// Reads the name a guest's TCP connection claims from its first bytes: the TLS ClientHello's
// server_name, or the Host of a plain HTTP request head. Guest bytes: every length is checked,
// nothing is read past `bytes`, and at most kMaxSniffBytes are ever looked at.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace space::net {

inline constexpr size_t kMaxSniffBytes = 16 * 1024;

enum class SniffStatus {
  kNeedMore,   // could still become a complete ClientHello or request head: read more
  kTls,        // a complete ClientHello; `name` is its SNI host name, empty when it has none
  kHttp,       // a complete HTTP/1.x request head; `name` is its Host without the port
  kOther,      // neither TLS nor HTTP (e.g. SSH, a database protocol): decide by address
  kMalformed,  // looks like TLS or HTTP but is broken, oversized, or refused (`detail`)
};

struct SniffResult {
  SniffStatus status = SniffStatus::kNeedMore;
  std::string name;    // normalized (policy.h normalizeHostName); empty when none
  std::string detail;  // for the audit log: "no SNI", "CONNECT refused", "two Host headers"
};

// `bytes` is everything received so far. kNeedMore at kMaxSniffBytes or more becomes
// kMalformed. TLS: a handshake record (0x16, 3.x), ClientHello, extensions walked to
// server_name/host_name; a ClientHello split over several records is reassembled (bounded).
// HTTP: methods in upper-case token form, request line + headers parsed with Boost.Beast;
// CONNECT is refused, an absolute-form target must name the same host as Host, exactly one
// Host header, a valid host name.
SniffResult sniff(std::span<const uint8_t> bytes);

}  // namespace space::net
