// DNS messages as the gateway sees them: queries from the guest (hostile), answers from the
// upstream resolver (untrusted), and the answers it builds. Parsing uses ldns, bounded: UDP
// messages of at most kMaxDnsMessage bytes, one question, names of at most 253 characters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::net {

inline constexpr size_t kMaxDnsMessage = 4096;

namespace dns {
inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kClassIn = 1;
inline constexpr uint8_t kNoError = 0;
inline constexpr uint8_t kServFail = 2;
inline constexpr uint8_t kNxDomain = 3;
inline constexpr uint8_t kNotImp = 4;
inline constexpr uint8_t kRefused = 5;
}  // namespace dns

struct DnsQuestion {
  uint16_t id = 0;
  std::string name;  // normalized (lowercase, no trailing dot); may be empty for the root
  uint16_t qtype = 0;
  uint16_t qclass = 0;
  bool recursion_desired = true;
  // The question name as it arrived (uncompressed wire labels, case kept), so answers echo it
  // byte for byte (clients using 0x20 case randomization compare it). Empty: answers encode
  // `name`.
  std::vector<uint8_t> wire_name;
};

// A query: QR=0, OPCODE=0 (QUERY), exactly one question, no answers. kInvalidArgument
// otherwise. A name that normalizeHostName refuses still parses (the gateway answers
// REFUSED); `name` then holds it lowercased, bytes other than letters, digits, '-' and '_'
// written as \DDD escapes (so a label containing a dot never reads as two labels).
Result<DnsQuestion> parseQuery(std::span<const uint8_t> message);

// An answer to `question` with the given rcode and no records (NXDOMAIN, REFUSED, NODATA).
std::vector<uint8_t> buildEmptyAnswer(const DnsQuestion& question, uint8_t rcode);
// A NOERROR answer with one A record per address, all with `ttl`.
std::vector<uint8_t> buildAAnswer(const DnsQuestion& question, const std::vector<uint32_t>& ipv4, uint32_t ttl);
// The gateway's own query upstream (RD set, no EDNS: answers stay within 512 bytes). Empty
// when `name` cannot be encoded (a label over 63 bytes, over 255 in all).
std::vector<uint8_t> buildQuery(uint16_t id, const std::string& name, uint16_t qtype);

struct DnsAnswer {
  uint8_t rcode = 0;
  std::vector<uint32_t> ipv4;  // A records for the name or the CNAME chain from it, host byte order
  uint32_t ttl = 0;            // the smallest TTL among those records
};
// An upstream response to buildQuery(id, name, kTypeA): the id and the question must match.
Result<DnsAnswer> parseAResponse(std::span<const uint8_t> message, uint16_t id, const std::string& name);

}  // namespace space::net
