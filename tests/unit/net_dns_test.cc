// DNS messages as the gateway sees them (src/net/dns_message.h): hostile guest queries, untrusted
// upstream responses, and the answers the gateway builds. Messages are built byte by byte here
// so each test says exactly what is on the wire.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "net/dns_message.h"

namespace space::net {
namespace {

using Bytes = std::vector<uint8_t>;

void put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v >> 8));
  b.push_back(static_cast<uint8_t>(v));
}
void put32(Bytes& b, uint32_t v) {
  put16(b, static_cast<uint16_t>(v >> 16));
  put16(b, static_cast<uint16_t>(v));
}
void append(Bytes& b, const Bytes& more) { b.insert(b.end(), more.begin(), more.end()); }

// "a.b" -> 1a1b0 (no escapes; tests that need odd bytes write labels by hand).
Bytes name(const std::string& text) {
  Bytes out;
  size_t start = 0;
  while (start < text.size()) {
    size_t dot = text.find('.', start);
    if (dot == std::string::npos) dot = text.size();
    out.push_back(static_cast<uint8_t>(dot - start));
    out.insert(out.end(), text.begin() + static_cast<long>(start), text.begin() + static_cast<long>(dot));
    start = dot + 1;
  }
  out.push_back(0);
  return out;
}

Bytes header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns = 0, uint16_t ar = 0) {
  Bytes b;
  put16(b, id);
  put16(b, flags);
  put16(b, qd);
  put16(b, an);
  put16(b, ns);
  put16(b, ar);
  return b;
}

Bytes question(const Bytes& qname, uint16_t type = dns::kTypeA, uint16_t cls = dns::kClassIn) {
  Bytes b = qname;
  put16(b, type);
  put16(b, cls);
  return b;
}

Bytes record(const Bytes& owner, uint16_t type, uint32_t ttl, const Bytes& rdata, uint16_t cls = dns::kClassIn) {
  Bytes b = owner;
  put16(b, type);
  put16(b, cls);
  put32(b, ttl);
  put16(b, static_cast<uint16_t>(rdata.size()));
  append(b, rdata);
  return b;
}
Bytes aRecord(const Bytes& owner, uint32_t ipv4, uint32_t ttl = 300, uint16_t cls = dns::kClassIn) {
  Bytes rdata;
  put32(rdata, ipv4);
  return record(owner, dns::kTypeA, ttl, rdata, cls);
}
Bytes cname(const Bytes& owner, const std::string& target, uint32_t ttl = 300) {
  return record(owner, dns::kTypeCname, ttl, name(target));
}

Bytes query(const std::string& qname, uint16_t id = 0x1234, uint16_t type = dns::kTypeA) {
  Bytes b = header(id, 0x0100, 1, 0);
  append(b, question(name(qname), type));
  return b;
}

// A response to buildQuery(id, qname, A) with the given answer records.
Bytes response(uint16_t id, const std::string& qname, const std::vector<Bytes>& answers, uint8_t rcode = 0) {
  Bytes b = header(id, static_cast<uint16_t>(0x8180 | rcode), 1, static_cast<uint16_t>(answers.size()));
  append(b, question(name(qname)));
  for (const auto& a : answers) append(b, a);
  return b;
}

constexpr uint32_t ip(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return uint32_t{a} << 24 | uint32_t{b} << 16 | uint32_t{c} << 8 | d;
}

const Bytes kPointerToQuestion = {0xc0, 0x0c};

// ---- Queries from the guest ---------------------------------------------------------------

TEST(DnsQuery, ParsesAQuestion) {
  Bytes q = header(0xbeef, 0x0100, 1, 0);
  append(q, question(name("WwW.Example.COM"), dns::kTypeAaaa));
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->id, 0xbeef);
  EXPECT_EQ(parsed->name, "www.example.com");
  EXPECT_EQ(parsed->qtype, dns::kTypeAaaa);
  EXPECT_EQ(parsed->qclass, dns::kClassIn);
  EXPECT_TRUE(parsed->recursion_desired);
  EXPECT_EQ(parsed->wire_name, name("WwW.Example.COM"));

  Bytes no_rd = header(1, 0x0000, 1, 0);
  append(no_rd, question(name("example.com")));
  ASSERT_TRUE(parseQuery(no_rd).ok());
  EXPECT_FALSE(parseQuery(no_rd)->recursion_desired);
}

TEST(DnsQuery, EdnsQueryParses) {
  Bytes q = header(7, 0x0120, 1, 0, 0, 1);
  append(q, question(name("example.com")));
  Bytes opt = {0x00};  // root owner
  put16(opt, 41);      // OPT
  put16(opt, 1232);    // UDP payload size
  put32(opt, 0);
  Bytes cookie = {0x00, 0x0a, 0x00, 0x08, 1, 2, 3, 4, 5, 6, 7, 8};
  put16(opt, static_cast<uint16_t>(cookie.size()));
  append(opt, cookie);
  append(q, opt);
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->name, "example.com");
}

TEST(DnsQuery, OddNamesParseButAreNotHostNames) {
  // A label holding a dot must not read as two labels.
  Bytes dotted = {3, 'a', '.', 'b', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0};
  Bytes q = header(1, 0x0100, 1, 0);
  append(q, question(dotted));
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->name, "a\\046b.example");

  Bytes odd = {5, 'E', 'v', 0, '\\', ' ', 3, 'c', 'o', 'm', 0};
  q = header(1, 0x0100, 1, 0);
  append(q, question(odd));
  parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->name, "ev\\000\\092\\032.com");

  q = header(1, 0x0100, 1, 0);
  append(q, question({0}, 2));  // the root, NS
  parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->name, "");
}

TEST(DnsQuery, HeaderRefusals) {
  auto refused = [](const Bytes& b) { return !parseQuery(b).ok(); };
  Bytes response = header(1, 0x8100, 1, 0);
  append(response, question(name("example.com")));
  EXPECT_TRUE(refused(response));
  Bytes notify = header(1, 0x2000, 1, 0);  // opcode 4
  append(notify, question(name("example.com")));
  EXPECT_TRUE(refused(notify));
  Bytes none = header(1, 0x0100, 0, 0);
  EXPECT_TRUE(refused(none));
  Bytes two = header(1, 0x0100, 2, 0);
  append(two, question(name("a.example")));
  append(two, question(name("b.example")));
  EXPECT_TRUE(refused(two));
  Bytes with_answer = header(1, 0x0100, 1, 1);
  append(with_answer, question(name("example.com")));
  append(with_answer, aRecord(kPointerToQuestion, ip(1, 2, 3, 4)));
  EXPECT_TRUE(refused(with_answer));
  EXPECT_TRUE(refused({}));
  EXPECT_TRUE(refused(Bytes(11, 0)));
  EXPECT_TRUE(refused(Bytes(12, 0)));  // no question
}

TEST(DnsQuery, HundredQuestionsAndCountMismatches) {
  Bytes hundred = header(1, 0x0100, 100, 0);
  for (int i = 0; i < 100; ++i) append(hundred, question(name("q" + std::to_string(i) + ".example")));
  auto parsed = parseQuery(hundred);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("exactly one question"), std::string::npos) << parsed.error().message;

  // The header promises one question, the message holds two.
  Bytes extra = header(1, 0x0100, 1, 0);
  append(extra, question(name("a.example")));
  append(extra, question(name("b.example")));
  EXPECT_FALSE(parseQuery(extra).ok());
  // The header promises an additional record that is not there.
  Bytes missing = header(1, 0x0100, 1, 0, 0, 1);
  append(missing, question(name("a.example")));
  EXPECT_FALSE(parseQuery(missing).ok());
}

TEST(DnsQuery, CompressionPointerAbuse) {
  // The question's name is a pointer to itself.
  Bytes loop = header(1, 0x0100, 1, 0);
  append(loop, question({0xc0, 0x0c}));
  EXPECT_FALSE(parseQuery(loop).ok());
  // Past the end of the message.
  Bytes past = header(1, 0x0100, 1, 0);
  append(past, question({0xc0, 0xff}));
  EXPECT_FALSE(parseQuery(past).ok());
  Bytes far = header(1, 0x0100, 1, 0);
  append(far, question({0xff, 0xff}));
  EXPECT_FALSE(parseQuery(far).ok());
  // A pointer cut in half, an extended label type (0x40).
  Bytes half = header(1, 0x0100, 1, 0);
  half.push_back(0xc0);
  EXPECT_FALSE(parseQuery(half).ok());
  Bytes extended = header(1, 0x0100, 1, 0);
  append(extended, question({0x41, 'a', 0}));
  EXPECT_FALSE(parseQuery(extended).ok());
}

TEST(DnsQuery, LongNamesAreRefused) {
  // 300 bytes of name: five labels of 59.
  std::string label(59, 'a');
  std::string text = label + "." + label + "." + label + "." + label + "." + label;
  Bytes q = header(1, 0x0100, 1, 0);
  append(q, question(name(text)));
  EXPECT_FALSE(parseQuery(q).ok());
  // A label of 64.
  q = header(1, 0x0100, 1, 0);
  append(q, question(name(std::string(64, 'a') + ".com")));
  EXPECT_FALSE(parseQuery(q).ok());
  // Built through a pointer into another record's data: 8 labels of 40 decompress to 329.
  Bytes chain = header(1, 0x0100, 1, 0, 0, 1);
  append(chain, question({0xc0, 29}));  // the data of the record below starts at 29
  Bytes labels;
  for (int i = 0; i < 8; ++i) {
    labels.push_back(40);
    labels.insert(labels.end(), 40, 'x');
  }
  labels.push_back(0);
  append(chain, record({0}, 0xff00, 0, labels));
  auto parsed = parseQuery(chain);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("malformed DNS message"), std::string::npos) << parsed.error().message;
}

TEST(DnsQuery, TruncatedQueriesAreRefused) {
  Bytes q = query("truncated.example");
  for (size_t n = 0; n < q.size(); ++n) {
    EXPECT_FALSE(parseQuery(Bytes(q.begin(), q.begin() + static_cast<long>(n))).ok()) << n;
  }
  EXPECT_TRUE(parseQuery(q).ok());
}

TEST(DnsQuery, TrailingBytesOversizeAndTsigAreRefused) {
  Bytes q = query("example.com");
  q.push_back(0);
  EXPECT_FALSE(parseQuery(q).ok());

  Bytes big = header(1, 0x0100, 1, 0, 0, 1);
  append(big, question(name("example.com")));
  append(big, record({0}, 16, 0, Bytes(4100, 'x')));  // a TXT-ish blob past 4096
  EXPECT_FALSE(parseQuery(big).ok());

  // Two TSIG records (ldns would keep one and leak the other).
  Bytes tsig = header(1, 0x0100, 1, 0, 0, 2);
  append(tsig, question(name("example.com")));
  append(tsig, record(name("key"), 250, 0, Bytes(30, 0), 255));
  append(tsig, record(name("key"), 250, 0, Bytes(30, 0), 255));
  auto parsed = parseQuery(tsig);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("TSIG"), std::string::npos);
}

// ---- Answers the gateway builds -----------------------------------------------------------

TEST(DnsBuild, EmptyAnswerEchoesTheQuestion) {
  Bytes q = header(0x4242, 0x0100, 1, 0);
  append(q, question(name("ExAmPlE.cOm"), dns::kTypeAaaa));
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok());
  Bytes answer = buildEmptyAnswer(*parsed, dns::kNxDomain);
  Bytes expected = header(0x4242, 0x8183, 1, 0);  // QR RD RA, NXDOMAIN
  append(expected, question(name("ExAmPlE.cOm"), dns::kTypeAaaa));
  EXPECT_EQ(answer, expected);

  DnsQuestion made{
      .id = 9, .name = "made.example", .qtype = dns::kTypeA, .qclass = dns::kClassIn, .recursion_desired = false};
  expected = header(9, 0x8085, 1, 0);  // QR RA, REFUSED
  append(expected, question(name("made.example")));
  EXPECT_EQ(buildEmptyAnswer(made, dns::kRefused), expected);

  // A made-up question whose name cannot be encoded: an answer without a question.
  made.name = std::string(64, 'a') + ".example";
  EXPECT_EQ(buildEmptyAnswer(made, dns::kRefused), header(9, 0x8085, 0, 0));
  made.name = "a..b";
  EXPECT_EQ(buildEmptyAnswer(made, dns::kRefused), header(9, 0x8085, 0, 0));
}

TEST(DnsBuild, AAnswerHasOneRecordPerAddress) {
  auto parsed = parseQuery(query("Example.com", 0x0102));
  ASSERT_TRUE(parsed.ok());
  Bytes answer = buildAAnswer(*parsed, {ip(93, 184, 216, 34), ip(10, 0, 0, 1)}, 120);
  Bytes expected = header(0x0102, 0x8180, 1, 2);
  append(expected, question(name("Example.com")));
  append(expected, aRecord(kPointerToQuestion, ip(93, 184, 216, 34), 120));
  append(expected, aRecord(kPointerToQuestion, ip(10, 0, 0, 1), 120));
  EXPECT_EQ(answer, expected);

  auto back = parseAResponse(answer, 0x0102, "example.com");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->ipv4, (std::vector<uint32_t>{ip(93, 184, 216, 34), ip(10, 0, 0, 1)}));
  EXPECT_EQ(back->ttl, 120u);

  // TTLs past 2^31-1 are clamped (RFC 2181 8).
  back = parseAResponse(buildAAnswer(*parsed, {ip(1, 1, 1, 1)}, 0xffffffff), 0x0102, "example.com");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->ttl, 0x7fffffffu);

  // More addresses than fit in 4096 bytes: cut, with TC set, still parseable.
  std::vector<uint32_t> many;
  for (uint32_t i = 0; i < 1000; ++i)
    many.push_back(ip(198, 51, static_cast<uint8_t>(i >> 8), static_cast<uint8_t>(i)));
  Bytes big = buildAAnswer(*parsed, many, 60);
  EXPECT_LE(big.size(), kMaxDnsMessage);
  EXPECT_TRUE(big[2] & 0x02);
  back = parseAResponse(big, 0x0102, "example.com");
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_GT(back->ipv4.size(), 200u);
}

TEST(DnsBuild, QueryBytesAreExact) {
  Bytes expected = header(0xabcd, 0x0100, 1, 0);
  append(expected, question(name("pypi.org"), dns::kTypeA));
  EXPECT_EQ(buildQuery(0xabcd, "pypi.org", dns::kTypeA), expected);
  EXPECT_EQ(buildQuery(0xabcd, "pypi.org.", dns::kTypeA), expected);
  EXPECT_TRUE(buildQuery(1, std::string(64, 'a') + ".org", dns::kTypeA).empty());
  EXPECT_TRUE(buildQuery(1,
                         std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." +
                             std::string(63, 'd'),
                         dns::kTypeA)
                  .empty());
  // The text form of an odd name round-trips through buildQuery and parseQuery.
  auto back = parseQuery(buildQuery(3, "a\\046b.ex\\000ample", dns::kTypeA));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->name, "a\\046b.ex\\000ample");
}

// ---- Responses from upstream --------------------------------------------------------------

TEST(DnsResponse, PlainAAnswer) {
  Bytes r = response(0x1111, "example.com", {aRecord(kPointerToQuestion, ip(93, 184, 216, 34), 3600)});
  auto parsed = parseAResponse(r, 0x1111, "example.com");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->rcode, dns::kNoError);
  EXPECT_EQ(parsed->ipv4, std::vector<uint32_t>{ip(93, 184, 216, 34)});
  EXPECT_EQ(parsed->ttl, 3600u);
  // The name may be asked for with a trailing dot or other case; the upstream may change case.
  EXPECT_TRUE(parseAResponse(r, 0x1111, "Example.COM.").ok());
  Bytes shouted = response(0x1111, "EXAMPLE.com", {aRecord(name("example.COM"), ip(1, 2, 3, 4))});
  parsed = parseAResponse(shouted, 0x1111, "example.com");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->ipv4, std::vector<uint32_t>{ip(1, 2, 3, 4)});
}

TEST(DnsResponse, MismatchesAreRefused) {
  Bytes r = response(0x1111, "example.com", {aRecord(kPointerToQuestion, ip(1, 2, 3, 4))});
  EXPECT_FALSE(parseAResponse(r, 0x1112, "example.com").ok());  // wrong id
  EXPECT_FALSE(parseAResponse(r, 0x1111, "example.org").ok());  // another question
  EXPECT_FALSE(parseAResponse(r, 0x1111, "www.example.com").ok());
  Bytes as_query = r;
  as_query[2] &= 0x7f;  // QR=0
  EXPECT_FALSE(parseAResponse(as_query, 0x1111, "example.com").ok());
  Bytes aaaa = header(0x1111, 0x8180, 1, 0);
  append(aaaa, question(name("example.com"), dns::kTypeAaaa));
  EXPECT_FALSE(parseAResponse(aaaa, 0x1111, "example.com").ok());
  Bytes no_question = header(0x1111, 0x8180, 0, 0);
  EXPECT_FALSE(parseAResponse(no_question, 0x1111, "example.com").ok());
}

TEST(DnsResponse, ErrorRcodesCarryNoAddresses) {
  Bytes r = response(5, "nope.example", {}, dns::kNxDomain);
  auto parsed = parseAResponse(r, 5, "nope.example");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->rcode, dns::kNxDomain);
  EXPECT_TRUE(parsed->ipv4.empty());
  // Even if the upstream put records in.
  r = response(5, "nope.example", {aRecord(kPointerToQuestion, ip(6, 6, 6, 6))}, dns::kServFail);
  parsed = parseAResponse(r, 5, "nope.example");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->rcode, dns::kServFail);
  EXPECT_TRUE(parsed->ipv4.empty());
  // NODATA: NOERROR, nothing.
  parsed = parseAResponse(response(5, "empty.example", {}), 5, "empty.example");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->rcode, dns::kNoError);
  EXPECT_TRUE(parsed->ipv4.empty());
  EXPECT_EQ(parsed->ttl, 0u);
}

TEST(DnsResponse, CnameChainIsFollowedAndOthersIgnored) {
  Bytes r =
      response(0x2222, "www.example.com",
               {cname(kPointerToQuestion, "edge.cdn.example", 600), cname(name("edge.cdn.example"), "e1.cdn.example"),
                aRecord(name("E1.cdn.example"), ip(203, 0, 113, 10), 300),
                aRecord(name("e1.cdn.example"), ip(203, 0, 113, 11), 60),
                aRecord(name("e1.cdn.example"), ip(203, 0, 113, 10), 300),  // duplicate
                aRecord(name("evil.example"), ip(10, 0, 0, 1), 5),          // not on the chain
                aRecord(name("e1.cdn.example"), ip(10, 9, 9, 9), 1, 3),     // class CH
                record(name("e1.cdn.example"), dns::kTypeAaaa, 2, Bytes(16, 1))});
  auto parsed = parseAResponse(r, 0x2222, "www.example.com");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->ipv4, (std::vector<uint32_t>{ip(203, 0, 113, 10), ip(203, 0, 113, 11)}));
  EXPECT_EQ(parsed->ttl, 60u);

  // A records of another name only: nothing.
  r = response(1, "example.com", {aRecord(name("example.net"), ip(1, 1, 1, 1))});
  parsed = parseAResponse(r, 1, "example.com");
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->ipv4.empty());
  // A CNAME to a name with no A record here: nothing (the A for the question's own name
  // counts, as the chain starts there).
  r = response(1, "example.com",
               {cname(kPointerToQuestion, "other.example"), aRecord(kPointerToQuestion, ip(1, 1, 1, 2))});
  parsed = parseAResponse(r, 1, "example.com");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->ipv4, std::vector<uint32_t>{ip(1, 1, 1, 2)});
  // Additional-section A records for the name are not answers.
  Bytes extra = header(1, 0x8180, 1, 0, 0, 1);
  append(extra, question(name("example.com")));
  append(extra, aRecord(kPointerToQuestion, ip(6, 6, 6, 6)));
  parsed = parseAResponse(extra, 1, "example.com");
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->ipv4.empty());
}

TEST(DnsResponse, CnameLoopsAndLongChainsAreRefused) {
  Bytes loop = response(1, "a.example",
                        {cname(kPointerToQuestion, "b.example"), cname(name("b.example"), "a.example"),
                         aRecord(name("b.example"), ip(1, 2, 3, 4))});
  auto parsed = parseAResponse(loop, 1, "a.example");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.error().message.find("loop"), std::string::npos);
  Bytes self = response(1, "a.example", {cname(kPointerToQuestion, "A.example")});
  EXPECT_FALSE(parseAResponse(self, 1, "a.example").ok());

  auto chainOf = [](int hops) {
    std::vector<Bytes> answers;
    for (int i = 0; i < hops; ++i) {
      Bytes owner = i == 0 ? kPointerToQuestion : name("h" + std::to_string(i) + ".example");
      answers.push_back(cname(owner, "h" + std::to_string(i + 1) + ".example"));
    }
    answers.push_back(aRecord(name("h" + std::to_string(hops) + ".example"), ip(192, 0, 2, 1)));
    return response(1, "h0.example", answers);
  };
  parsed = parseAResponse(chainOf(8), 1, "h0.example");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->ipv4, std::vector<uint32_t>{ip(192, 0, 2, 1)});
  EXPECT_FALSE(parseAResponse(chainOf(9), 1, "h0.example").ok());

  Bytes forked =
      response(1, "a.example", {cname(kPointerToQuestion, "b.example"), cname(kPointerToQuestion, "c.example")});
  EXPECT_FALSE(parseAResponse(forked, 1, "a.example").ok());
}

TEST(DnsResponse, MalformedRecordsAndTruncationAreRefused) {
  // An A record of 5 bytes, a CNAME whose name overruns its RDLENGTH.
  Bytes five = response(1, "example.com", {record(kPointerToQuestion, dns::kTypeA, 60, {1, 2, 3, 4, 5})});
  EXPECT_FALSE(parseAResponse(five, 1, "example.com").ok());
  Bytes overrun = response(1, "example.com", {record(kPointerToQuestion, dns::kTypeCname, 60, {3, 'a', 'b'})});
  EXPECT_FALSE(parseAResponse(overrun, 1, "example.com").ok());
  // A CNAME target pointing past the end.
  Bytes past = response(1, "example.com", {record(kPointerToQuestion, dns::kTypeCname, 60, {0xc3, 0xff})});
  EXPECT_FALSE(parseAResponse(past, 1, "example.com").ok());
  // A CNAME target that is a pointer to itself (at offset 41), for ldns to give up on.
  Bytes self = response(1, "example.com", {record(kPointerToQuestion, dns::kTypeCname, 60, {0xc0, 41})});
  auto looped = parseAResponse(self, 1, "example.com");
  ASSERT_FALSE(looped.ok());
  EXPECT_NE(looped.error().message.find("malformed DNS message"), std::string::npos) << looped.error().message;
  // Every truncation of a good response.
  Bytes good = response(9, "www.example.com",
                        {cname(kPointerToQuestion, "e.example"), aRecord(name("e.example"), ip(192, 0, 2, 7))});
  ASSERT_TRUE(parseAResponse(good, 9, "www.example.com").ok());
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(parseAResponse(Bytes(good.begin(), good.begin() + static_cast<long>(n)), 9, "www.example.com").ok())
        << n;
  }
  // TTLs with the top bit set read as zero.
  Bytes negative = response(1, "example.com", {aRecord(kPointerToQuestion, ip(1, 2, 3, 4), 0x80000000)});
  auto parsed = parseAResponse(negative, 1, "example.com");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->ttl, 0u);
}

}  // namespace
}  // namespace space::net
