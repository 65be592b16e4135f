#include "net/dns_message.h"

// stdbool.h before ldns: without __bool_true_false_are_defined, ldns/common.h defines the
// macros `bool`, `true` and `false`, which break standard headers included after it.
// clang-format off
#include <stdbool.h>  // NOLINT(modernize-deprecated-headers)
#include <ldns/ldns.h>
// clang-format on

#include <algorithm>
#include <memory>
#include <optional>
#include <string_view>

namespace space::net {

namespace {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxWireName = 255;  // RFC 1035 3.1
constexpr size_t kMaxLabel = 63;
constexpr uint16_t kTypeTsig = 250;
// RFC 1035 4.1.1 header bits (of the 16-bit flags word).
constexpr uint16_t kFlagQr = 0x8000;
constexpr uint16_t kFlagTc = 0x0200;
constexpr uint16_t kFlagRd = 0x0100;
constexpr uint16_t kFlagRa = 0x0080;
// A CNAME chain longer than this is refused (resolvers stop at similar depths, e.g. 8-16).
constexpr int kMaxCnameHops = 8;
// RFC 2181 8: a TTL with the top bit set is to be read as zero.
constexpr uint32_t kMaxTtl = 0x7fffffff;

struct PacketFree {
  void operator()(ldns_pkt* packet) const { ldns_pkt_free(packet); }
};
using Packet = std::unique_ptr<ldns_pkt, PacketFree>;

Error invalid(std::string message) { return makeError(ErrorCode::kInvalidArgument, std::move(message)); }

uint16_t read16(std::span<const uint8_t> m, size_t at) { return static_cast<uint16_t>(m[at] << 8 | m[at + 1]); }

// Skips one (possibly compressed) name without following pointers: labels end at a zero
// byte or at a two-byte pointer. Only the wire's extent is checked here; ldns decompresses.
bool skipName(std::span<const uint8_t> m, size_t& pos, size_t end) {
  for (;;) {
    if (pos >= end) return false;
    uint8_t length = m[pos];
    if ((length & 0xc0) == 0xc0) {
      if (end - pos < 2) return false;
      pos += 2;
      return true;
    }
    if (length & 0xc0) return false;  // 0x40/0x80: extended label types, obsolete
    pos += 1;
    if (length == 0) return true;
    if (end - pos < length) return false;
    pos += length;
  }
}

// Walks every record by its RDLENGTH before ldns sees the message, because ldns trusts the
// message more than we may:
// - ldns_wire2rdf stops after a type's fields even when RDLENGTH says more, and reads a name
//   in RDATA past RDLENGTH, so its record boundaries can drift from the sender's. For the
//   records we read (A, CNAME) the fields must fill RDLENGTH exactly; every record must end
//   where RDLENGTH says, and the message where the last record ends.
// - ldns_wire2pkt keeps one TSIG record and leaks any earlier one: TSIG is refused (the
//   gateway verifies no signatures; a guest has no business sending one).
Status checkStructure(std::span<const uint8_t> m) {
  size_t pos = kHeaderSize;
  size_t end = m.size();
  uint16_t questions = read16(m, 4);
  for (uint16_t i = 0; i < questions; ++i) {
    if (!skipName(m, pos, end) || end - pos < 4) return invalid("truncated question");
    pos += 4;
  }
  size_t records = size_t{read16(m, 6)} + read16(m, 8) + read16(m, 10);
  for (size_t i = 0; i < records; ++i) {
    if (!skipName(m, pos, end) || end - pos < 10) return invalid("truncated record");
    uint16_t type = read16(m, pos);
    uint16_t rdlength = read16(m, pos + 8);
    pos += 10;
    if (end - pos < rdlength) return invalid("record data past the end");
    if (type == kTypeTsig) return invalid("TSIG refused");
    if (type == dns::kTypeA && rdlength != 4) return invalid("A record of wrong length");
    if (type == dns::kTypeCname) {
      size_t name_end = pos;
      if (!skipName(m, name_end, pos + rdlength) || name_end != pos + rdlength) {
        return invalid("CNAME record of wrong length");
      }
    }
    pos += rdlength;
  }
  if (pos != end) return invalid("trailing bytes after the last record");
  return okStatus();
}

// Size and structure checks first (cheap, and they keep ldns on messages it handles well),
// then ldns_wire2pkt. The packet is freed by its owner on every path.
Result<Packet> parseMessage(std::span<const uint8_t> m) {
  if (m.size() < kHeaderSize) return invalid("DNS message shorter than its header");
  if (m.size() > kMaxDnsMessage) return invalid("DNS message larger than 4096 bytes");
  if (read16(m, 4) != 1) return invalid("DNS message without exactly one question");
  SPACE_TRY(checkStructure(m));
  ldns_pkt* raw = nullptr;
  ldns_status status = ldns_wire2pkt(&raw, m.data(), m.size());
  Packet packet(raw);  // ldns frees its partial packet itself on error and leaves raw null
  if (status != LDNS_STATUS_OK || !packet) {
    return invalid(std::string("malformed DNS message: ") + ldns_get_errorstr_by_id(status));
  }
  if (ldns_rr_list_rr_count(ldns_pkt_question(packet.get())) != 1) {
    return invalid("DNS message without exactly one question");
  }
  return Result<Packet>(std::move(packet));
}

// Wire labels to text: lowercase letters, digits, '-' and '_' as they are, every other byte
// as \DDD (RFC 1035 5.1), no trailing dot, "" for the root. Unambiguous (a '.' inside a
// label is \046), and what normalizeHostName accepts is exactly the plain host names.
std::string nameToText(const uint8_t* data, size_t size) {
  std::string out;
  size_t pos = 0;
  while (pos < size && data[pos] != 0) {
    size_t length = data[pos++];
    if (!out.empty()) out += '.';
    for (size_t i = 0; i < length && pos < size; ++i, ++pos) {
      uint8_t c = data[pos];
      if (c >= 'A' && c <= 'Z') {
        out += static_cast<char>(c - 'A' + 'a');
      } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_') {
        out += static_cast<char>(c);
      } else {
        char escaped[5] = {'\\', static_cast<char>('0' + c / 100), static_cast<char>('0' + c / 10 % 10),
                           static_cast<char>('0' + c % 10), 0};
        out += escaped;
      }
    }
  }
  return out;
}

std::string rdfText(const ldns_rdf* rdf) { return nameToText(ldns_rdf_data(rdf), ldns_rdf_size(rdf)); }

// Text (as nameToText writes it, or any name with \DDD and \c escapes, one optional
// trailing dot) to uncompressed wire labels; nullopt if it cannot be a DNS name.
std::optional<std::vector<uint8_t>> textToWire(std::string_view text) {
  std::vector<uint8_t> wire;
  if (text == "." || text.empty()) return std::vector<uint8_t>{0};
  std::vector<uint8_t> label;
  auto finishLabel = [&]() {
    if (label.empty() || label.size() > kMaxLabel || wire.size() + 1 + label.size() >= kMaxWireName) return false;
    wire.push_back(static_cast<uint8_t>(label.size()));
    wire.insert(wire.end(), label.begin(), label.end());
    label.clear();
    return true;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '.') {
      if (!finishLabel()) return std::nullopt;
    } else if (c == '\\') {
      if (i + 1 >= text.size()) return std::nullopt;
      if (text[i + 1] >= '0' && text[i + 1] <= '9') {
        if (i + 3 >= text.size()) return std::nullopt;
        unsigned value = 0;
        for (size_t k = 1; k <= 3; ++k) {
          char d = text[i + k];
          if (d < '0' || d > '9') return std::nullopt;
          value = value * 10 + static_cast<unsigned>(d - '0');
        }
        if (value > 255) return std::nullopt;
        label.push_back(static_cast<uint8_t>(value));
        i += 3;
      } else {
        label.push_back(static_cast<uint8_t>(text[++i]));
      }
    } else {
      label.push_back(static_cast<uint8_t>(c));
    }
    if (label.size() > kMaxLabel) return std::nullopt;
  }
  if (!label.empty() && !finishLabel()) return std::nullopt;
  wire.push_back(0);
  if (wire.size() > kMaxWireName) return std::nullopt;
  return wire;
}

// Whether `wire` is one uncompressed name of at most 255 bytes, nothing after it.
bool validWireName(const std::vector<uint8_t>& wire) {
  if (wire.empty() || wire.size() > kMaxWireName) return false;
  size_t pos = 0;
  while (pos < wire.size()) {
    uint8_t length = wire[pos];
    if (length == 0) return pos + 1 == wire.size();
    if (length > kMaxLabel) return false;
    pos += 1 + length;
  }
  return false;
}

void put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}
void put32(std::vector<uint8_t>& out, uint32_t v) {
  put16(out, static_cast<uint16_t>(v >> 16));
  put16(out, static_cast<uint16_t>(v));
}

// Messages are built by hand rather than with ldns_pkt2wire: they are a header, one question
// and fixed-size A records, so a few lines give exactly the bytes we mean (flags, the name
// echoed verbatim, answers pointing at it, no EDNS) with no allocation failures to handle.
std::vector<uint8_t> header(uint16_t id, uint16_t flags, uint16_t questions, uint16_t answers) {
  std::vector<uint8_t> out;
  out.reserve(512);
  put16(out, id);
  put16(out, flags);
  put16(out, questions);
  put16(out, answers);
  put16(out, 0);  // authority
  put16(out, 0);  // additional
  return out;
}

std::optional<std::vector<uint8_t>> questionWire(const DnsQuestion& question) {
  if (!question.wire_name.empty()) {
    if (validWireName(question.wire_name)) return question.wire_name;
    return std::nullopt;
  }
  return textToWire(question.name);
}

uint16_t answerFlags(const DnsQuestion& question, uint8_t rcode) {
  return static_cast<uint16_t>(kFlagQr | (question.recursion_desired ? kFlagRd : 0) | kFlagRa | (rcode & 0x0f));
}

void putQuestion(std::vector<uint8_t>& out, const std::vector<uint8_t>& name, uint16_t qtype, uint16_t qclass) {
  out.insert(out.end(), name.begin(), name.end());
  put16(out, qtype);
  put16(out, qclass);
}

std::string stripTrailingDot(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  std::string out(name);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace

Result<DnsQuestion> parseQuery(std::span<const uint8_t> message) {
  if (message.size() >= kHeaderSize) {
    // Cheap refusals before any parsing: a guest's query has one question and no answers.
    if (read16(message, 6) != 0) return invalid("DNS query with answers");
  }
  auto parsed = parseMessage(message);
  if (!parsed.ok()) return parsed.error();
  ldns_pkt* packet = parsed.value().get();
  if (ldns_pkt_qr(packet)) return invalid("DNS message is not a query");
  if (ldns_pkt_get_opcode(packet) != LDNS_PACKET_QUERY) return invalid("DNS opcode is not QUERY");
  const ldns_rr* rr = ldns_rr_list_rr(ldns_pkt_question(packet), 0);
  const ldns_rdf* owner = ldns_rr_owner(rr);
  DnsQuestion question;
  question.id = ldns_pkt_id(packet);
  question.name = rdfText(owner);
  question.qtype = static_cast<uint16_t>(ldns_rr_get_type(rr));
  question.qclass = static_cast<uint16_t>(ldns_rr_get_class(rr));
  question.recursion_desired = ldns_pkt_rd(packet);
  question.wire_name.assign(ldns_rdf_data(owner), ldns_rdf_data(owner) + ldns_rdf_size(owner));
  return question;
}

std::vector<uint8_t> buildEmptyAnswer(const DnsQuestion& question, uint8_t rcode) {
  auto name = questionWire(question);
  // A question the gateway made up with a name that cannot be encoded: answer without it.
  if (!name) return header(question.id, answerFlags(question, rcode), 0, 0);
  auto out = header(question.id, answerFlags(question, rcode), 1, 0);
  putQuestion(out, *name, question.qtype, question.qclass);
  return out;
}

std::vector<uint8_t> buildAAnswer(const DnsQuestion& question, const std::vector<uint32_t>& ipv4, uint32_t ttl) {
  auto name = questionWire(question);
  if (!name) return header(question.id, answerFlags(question, dns::kServFail), 0, 0);
  constexpr size_t kRecordSize = 16;  // pointer 2, type 2, class 2, TTL 4, RDLENGTH 2, address 4
  size_t fixed = kHeaderSize + name->size() + 4;
  // Never more than a message we would accept ourselves; the rest is cut and TC says so.
  size_t count = std::min(ipv4.size(), (kMaxDnsMessage - fixed) / kRecordSize);
  uint16_t flags = answerFlags(question, dns::kNoError);
  if (count < ipv4.size()) flags |= kFlagTc;
  auto out = header(question.id, flags, 1, static_cast<uint16_t>(count));
  putQuestion(out, *name, question.qtype, question.qclass);
  for (size_t i = 0; i < count; ++i) {
    put16(out, static_cast<uint16_t>(0xc000 | kHeaderSize));  // the question's name
    put16(out, dns::kTypeA);
    put16(out, dns::kClassIn);
    put32(out, std::min(ttl, kMaxTtl));
    put16(out, 4);
    put32(out, ipv4[i]);
  }
  return out;
}

std::vector<uint8_t> buildQuery(uint16_t id, const std::string& name, uint16_t qtype) {
  auto wire = textToWire(name);
  if (!wire) return {};
  auto out = header(id, kFlagRd, 1, 0);
  putQuestion(out, *wire, qtype, dns::kClassIn);
  return out;
}

Result<DnsAnswer> parseAResponse(std::span<const uint8_t> message, uint16_t id, const std::string& name) {
  auto parsed = parseMessage(message);
  if (!parsed.ok()) return parsed.error();
  ldns_pkt* packet = parsed.value().get();
  if (ldns_pkt_id(packet) != id) return invalid("DNS response id does not match the query");
  if (!ldns_pkt_qr(packet)) return invalid("DNS message is not a response");
  if (ldns_pkt_get_opcode(packet) != LDNS_PACKET_QUERY) return invalid("DNS opcode is not QUERY");
  const ldns_rr* question = ldns_rr_list_rr(ldns_pkt_question(packet), 0);
  std::string wanted = stripTrailingDot(name);
  if (rdfText(ldns_rr_owner(question)) != wanted || ldns_rr_get_type(question) != LDNS_RR_TYPE_A ||
      ldns_rr_get_class(question) != LDNS_RR_CLASS_IN) {
    return invalid("DNS response question does not match the query");
  }
  DnsAnswer answer;
  answer.rcode = static_cast<uint8_t>(ldns_pkt_get_rcode(packet));
  if (answer.rcode != dns::kNoError) return answer;

  // The answer section's IN records as (owner text, record).
  const ldns_rr_list* section = ldns_pkt_answer(packet);
  std::vector<std::pair<std::string, const ldns_rr*>> records;
  for (size_t i = 0; i < ldns_rr_list_rr_count(section); ++i) {
    const ldns_rr* rr = ldns_rr_list_rr(section, i);
    if (ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN) continue;
    ldns_rr_type type = ldns_rr_get_type(rr);
    if (type != LDNS_RR_TYPE_A && type != LDNS_RR_TYPE_CNAME) continue;
    records.emplace_back(rdfText(ldns_rr_owner(rr)), rr);
  }

  // The chain of names from the question through CNAMEs, loop-free and bounded.
  std::vector<std::string> chain{wanted};
  for (;;) {
    const ldns_rr* cname = nullptr;
    for (const auto& [owner, rr] : records) {
      if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_CNAME || owner != chain.back()) continue;
      if (cname) return invalid("two CNAME records for one name");  // RFC 2181 10.1
      cname = rr;
    }
    if (!cname) break;
    const ldns_rdf* target = ldns_rr_rdf(cname, 0);
    if (!target || ldns_rr_rd_count(cname) != 1 || ldns_rdf_get_type(target) != LDNS_RDF_TYPE_DNAME) {
      return invalid("malformed CNAME record");
    }
    std::string next = rdfText(target);
    if (std::find(chain.begin(), chain.end(), next) != chain.end()) return invalid("CNAME loop");
    if (static_cast<int>(chain.size()) > kMaxCnameHops) return invalid("CNAME chain longer than 8");
    chain.push_back(std::move(next));
  }

  bool any = false;
  uint32_t ttl = 0;
  for (const auto& [owner, rr] : records) {
    if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_A) continue;
    if (std::find(chain.begin(), chain.end(), owner) == chain.end()) continue;  // not ours: ignored
    const ldns_rdf* address = ldns_rr_rdf(rr, 0);
    if (!address || ldns_rdf_size(address) != 4) return invalid("malformed A record");
    const uint8_t* a = ldns_rdf_data(address);
    uint32_t ipv4 = uint32_t{a[0]} << 24 | uint32_t{a[1]} << 16 | uint32_t{a[2]} << 8 | a[3];
    uint32_t record_ttl = ldns_rr_ttl(rr);
    if (record_ttl > kMaxTtl) record_ttl = 0;
    ttl = any ? std::min(ttl, record_ttl) : record_ttl;
    any = true;
    if (std::find(answer.ipv4.begin(), answer.ipv4.end(), ipv4) == answer.ipv4.end()) answer.ipv4.push_back(ipv4);
  }
  answer.ttl = ttl;
  return answer;
}

}  // namespace space::net
