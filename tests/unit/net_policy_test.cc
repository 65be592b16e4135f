// The egress policy: what a tenant may write, and what the gateway decides for every DNS
// question, every answer and every connection. Deny must beat allow on every path, forbidden
// ranges (metadata above all) must stay shut unless a CIDR opens them, and nothing a guest or a
// tenant sends may be read as something else (an IP literal as a name, an IPv6 form as IPv4).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "net/policy.h"

namespace space::net {
namespace {

using nlohmann::json;

uint32_t ip(const char* text) {
  auto parsed = parseIpv4(text);
  EXPECT_TRUE(parsed.has_value()) << text;
  return parsed.value_or(0);
}

Policy policyOf(const json& value) {
  auto parsed = parsePolicy(value);
  if (!parsed.ok()) {
    ADD_FAILURE() << value.dump() << ": " << parsed.error().message;
    return {};
  }
  return parsed.value();
}

Policy policyOf(const char* text) { return policyOf(json::parse(text)); }

// The node lets tenants open `cidr` (spaced --tenant-openable-cidrs).
Policy openableTo(Policy policy, const char* cidr) {
  auto rule = parseRule(cidr);
  EXPECT_TRUE(rule.ok());
  if (rule.ok()) policy.openable.push_back(rule.value());
  return policy;
}

std::string parseError(const json& value) {
  auto parsed = parsePolicy(value);
  if (parsed.ok()) {
    ADD_FAILURE() << value.dump().substr(0, 200) << " parsed, expected an error";
    return {};
  }
  EXPECT_EQ(parsed.error().code, ErrorCode::kInvalidArgument);
  return parsed.error().message;
}

std::string ruleError(std::string_view text) {
  auto parsed = parseRule(text);
  if (parsed.ok()) {
    ADD_FAILURE() << "rule " << std::string(text.substr(0, 200)) << " parsed, expected an error";
    return {};
  }
  EXPECT_EQ(parsed.error().code, ErrorCode::kInvalidArgument);
  return parsed.error().message;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

ConnectionFacts connection(const char* destination, uint16_t port, std::string name = {},
                           std::vector<std::string> pinned_names = {}) {
  return ConnectionFacts{ip(destination), port, std::move(name), std::move(pinned_names)};
}

void expectSameRules(const std::vector<Rule>& a, const std::vector<Rule>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].kind, b[i].kind) << i;
    EXPECT_EQ(a[i].domain, b[i].domain) << i;
    EXPECT_EQ(a[i].wildcard, b[i].wildcard) << i;
    EXPECT_EQ(a[i].network, b[i].network) << i;
    EXPECT_EQ(a[i].prefix_length, b[i].prefix_length) << i;
    EXPECT_EQ(a[i].port, b[i].port) << i;
    EXPECT_EQ(a[i].text, b[i].text) << i;
  }
}

void expectSamePolicy(const Policy& a, const Policy& b) {
  EXPECT_EQ(a.mode, b.mode);
  expectSameRules(a.allow, b.allow);
  expectSameRules(a.deny, b.deny);
  EXPECT_EQ(a.public_ports, b.public_ports);
  ASSERT_EQ(a.credentials.size(), b.credentials.size());
  for (size_t i = 0; i < a.credentials.size(); ++i) {
    expectSameRules({a.credentials[i].host}, {b.credentials[i].host});
    EXPECT_EQ(a.credentials[i].headers, b.credentials[i].headers) << i;
    EXPECT_EQ(a.credentials[i].plain_http, b.credentials[i].plain_http) << i;
  }
}

// Forms that some resolver, inet_aton or browser reads as an IPv4 address, or that are IPv6:
// never a host name, never a strict IPv4 literal, never a rule.
const std::vector<std::string> kWeirdAddressForms = {
    "0x7f.0.0.1",
    "0x7f000001",
    "2130706433",
    "127.1",
    "127.0.1",
    "0177.0.0.1",
    "127.0.0.1.",
    "169.254.169.254.",
    "0xa9.0xfe.0xa9.0xfe",
    "0X7F.1",
    "017700000001",
    "1.2.3.0x10",
    "1.2.3.4.5",
    "::1",
    "[::1]",
    "::ffff:169.254.169.254",
    "::ffff:a9fe:a9fe",
    "[::ffff:127.0.0.1]",
    "fe80::1",
    "0:0:0:0:0:0:0:1",
};

// --- IPv4 literals --------------------------------------------------------------------------

TEST(PolicyIpv4, ParsesAndPrintsDottedQuads) {
  EXPECT_EQ(parseIpv4("1.2.3.4"), 0x01020304u);
  EXPECT_EQ(parseIpv4("0.0.0.0"), 0u);
  EXPECT_EQ(parseIpv4("255.255.255.255"), 0xffffffffu);
  EXPECT_EQ(parseIpv4("169.254.169.254"), 0xa9fea9feu);
  for (const char* text : {"0.0.0.0", "1.2.3.4", "10.0.0.255", "203.0.113.7", "255.255.255.255", "100.64.0.0"}) {
    EXPECT_EQ(ipv4ToString(ip(text)), text);
  }
  EXPECT_EQ(ipv4ToString(0xc0000201u), "192.0.2.1");
}

TEST(PolicyIpv4, RefusesEverythingButStrictDottedQuads) {
  const std::vector<std::string> refused = {
      "",         "1.2.3",     "1.2.3.",     ".1.2.3.4",   "1..2.3",      "1.2.3.4.",     "01.2.3.4",
      "1.2.3.04", "1.2.3.00",  "000.0.0.0",  "1.2.3.256",  "1.2.3.-1",    "+1.2.3.4",     " 1.2.3.4",
      "1.2.3.4 ", "1.2.3.4\n", "1000.2.3.4", "1.2.3.4/32", "1.2.3.4:80",  "a.b.c.d",      "1.2.3.4a",
      "１.2.3.4", "1,2,3,4",   "1.2.3.4\t",  "4294967296", "1.2.3.99999", "1.2.3.4.5.6.7"};
  for (const std::string& text : refused) EXPECT_FALSE(parseIpv4(text).has_value()) << text;
  for (const std::string& text : kWeirdAddressForms) EXPECT_FALSE(parseIpv4(text).has_value()) << text;
  EXPECT_FALSE(parseIpv4(std::string("1.2.3.4\0", 8)).has_value());
  EXPECT_FALSE(parseIpv4(std::string("1.2\0.3.4", 8)).has_value());
  EXPECT_FALSE(parseIpv4(std::string(1 << 20, '1')).has_value());
}

// --- Forbidden ranges -----------------------------------------------------------------------

TEST(PolicyForbiddenRange, CoversEachRangeExactlyToItsEdges) {
  struct Edge {
    const char* first;
    const char* last;
    const char* before;  // nullptr: the range starts at 0.0.0.0
    const char* after;   // nullptr: the next address is forbidden too (adjacent range)
  };
  const std::vector<Edge> edges = {
      {"0.0.0.0", "0.255.255.255", nullptr, "1.0.0.0"},
      {"10.0.0.0", "10.255.255.255", "9.255.255.255", "11.0.0.0"},
      {"100.64.0.0", "100.127.255.255", "100.63.255.255", "100.128.0.0"},
      {"127.0.0.0", "127.255.255.255", "126.255.255.255", "128.0.0.0"},
      {"169.254.0.0", "169.254.255.255", "169.253.255.255", "169.255.0.0"},
      {"172.16.0.0", "172.31.255.255", "172.15.255.255", "172.32.0.0"},
      {"192.0.0.0", "192.0.0.255", "191.255.255.255", "192.0.1.0"},
      {"192.168.0.0", "192.168.255.255", "192.167.255.255", "192.169.0.0"},
      {"198.18.0.0", "198.19.255.255", "198.17.255.255", "198.20.0.0"},
      {"224.0.0.0", "239.255.255.255", "223.255.255.255", nullptr},
      {"240.0.0.0", "255.255.255.255", nullptr, nullptr},
  };
  for (const Edge& edge : edges) {
    EXPECT_TRUE(isForbiddenRange(ip(edge.first))) << edge.first;
    EXPECT_TRUE(isForbiddenRange(ip(edge.last))) << edge.last;
    if (edge.before) {
      EXPECT_FALSE(isForbiddenRange(ip(edge.before))) << edge.before;
    }
    if (edge.after) {
      EXPECT_FALSE(isForbiddenRange(ip(edge.after))) << edge.after;
    }
  }
  for (const char* text : {"169.254.169.254", "127.0.0.1", "255.255.255.255", "169.254.0.1", "169.254.0.2"}) {
    EXPECT_TRUE(isForbiddenRange(ip(text))) << text;
  }
}

TEST(PolicyForbiddenRange, LeavesThePublicAndDocumentationRangesOpen) {
  // The fake internet of the integration tests lives in the documentation ranges.
  for (const char* text : {"192.0.2.0", "192.0.2.255", "198.51.100.1", "203.0.113.7", "8.8.8.8", "1.1.1.1",
                           "140.82.112.3", "223.255.255.255", "100.63.0.1"}) {
    EXPECT_FALSE(isForbiddenRange(ip(text))) << text;
  }
}

// --- Host names -----------------------------------------------------------------------------

TEST(PolicyHostName, LowercasesAndStripsOneTrailingDot) {
  EXPECT_EQ(normalizeHostName("Example.COM."), "example.com");
  EXPECT_EQ(normalizeHostName("example.com"), "example.com");
  EXPECT_EQ(normalizeHostName("localhost"), "localhost");
  EXPECT_EQ(normalizeHostName("a"), "a");
  EXPECT_EQ(normalizeHostName("_dmarc.Example.com"), "_dmarc.example.com");
  EXPECT_EQ(normalizeHostName("xn--bcher-kva.de"), "xn--bcher-kva.de");
  EXPECT_EQ(normalizeHostName("a-b.c-d.e"), "a-b.c-d.e");
  EXPECT_EQ(normalizeHostName("123.example"), "123.example");
  EXPECT_EQ(normalizeHostName("1e100.net"), "1e100.net");
  EXPECT_EQ(normalizeHostName("0xdead.com"), "0xdead.com");
  EXPECT_EQ(normalizeHostName("cafe"), "cafe");  // hex digits, but no 0x: a name
  EXPECT_EQ(normalizeHostName("0xg"), "0xg");
}

TEST(PolicyHostName, EnforcesLabelAndNameLengths) {
  const std::string label63(63, 'a');
  EXPECT_EQ(normalizeHostName(label63 + ".com"), label63 + ".com");
  EXPECT_FALSE(normalizeHostName(std::string(64, 'a') + ".com").has_value());
  // 4 labels of 63 + 3 dots = 255; trim to exactly 253 and 254.
  std::string name253 = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(name253.size(), 253u);
  EXPECT_EQ(normalizeHostName(name253), name253);
  EXPECT_EQ(normalizeHostName(name253 + "."), name253);  // the trailing dot does not count
  EXPECT_FALSE(normalizeHostName(name253 + "b").has_value());
  EXPECT_FALSE(normalizeHostName(name253 + "..").has_value());
}

TEST(PolicyHostName, RefusesMalformedNames) {
  const std::vector<std::string> refused = {"",
                                            ".",
                                            "..",
                                            "a..b",
                                            "example.com..",
                                            ".example.com",
                                            "-a.com",
                                            "a-.com",
                                            "a.-b.com",
                                            "a.b-",
                                            "exa mple.com",
                                            "exa\tmple.com",
                                            "a/b",
                                            "a:443",
                                            "a\nb.com",
                                            "*.a.com",
                                            "a@b.com",
                                            " example.com",
                                            "example.com ",
                                            "a.com/",
                                            "a%2e.com",
                                            "bücher.de",
                                            "example。com",
                                            "ｅｘａｍｐｌｅ.com",
                                            "\xff.com",
                                            "a\\.com"};
  for (const std::string& name : refused) EXPECT_FALSE(normalizeHostName(name).has_value()) << name;
  EXPECT_FALSE(normalizeHostName(std::string("example.com\0.evil", 17)).has_value());
  EXPECT_FALSE(normalizeHostName(std::string(1 << 20, 'a')).has_value());
}

TEST(PolicyHostName, NeverTakesAnIpLiteralForAName) {
  for (const char* literal : {"1.2.3.4", "127.0.0.1", "169.254.169.254", "0x", "a.0x1f", "host.123", "2130706433"}) {
    EXPECT_FALSE(normalizeHostName(literal).has_value()) << literal;
  }
  for (const std::string& form : kWeirdAddressForms) EXPECT_FALSE(normalizeHostName(form).has_value()) << form;
}

TEST(PolicyHostName, IsIdempotentOnWhatItAccepts) {
  for (const char* name : {"Example.COM.", "_Dmarc.X.y", "XN--BCHER-KVA.DE", "a"}) {
    auto once = normalizeHostName(name);
    ASSERT_TRUE(once.has_value()) << name;
    EXPECT_EQ(normalizeHostName(*once), once);
  }
}

// --- Rules ----------------------------------------------------------------------------------

TEST(PolicyRule, ParsesDomainRules) {
  auto exact = parseRule("example.com");
  ASSERT_TRUE(exact.ok()) << exact.error().message;
  EXPECT_EQ(exact->kind, Rule::Kind::kDomain);
  EXPECT_EQ(exact->domain, "example.com");
  EXPECT_FALSE(exact->wildcard);
  EXPECT_FALSE(exact->port.has_value());
  EXPECT_EQ(exact->text, "example.com");

  auto wildcard = parseRule("*.pypi.org:443");
  ASSERT_TRUE(wildcard.ok()) << wildcard.error().message;
  EXPECT_EQ(wildcard->domain, "pypi.org");
  EXPECT_TRUE(wildcard->wildcard);
  EXPECT_EQ(wildcard->port, 443);

  // Normalized for matching, kept as written for audit entries and the API.
  auto upper = parseRule("GitHub.COM.:22");
  ASSERT_TRUE(upper.ok()) << upper.error().message;
  EXPECT_EQ(upper->domain, "github.com");
  EXPECT_EQ(upper->text, "GitHub.COM.:22");
  EXPECT_EQ(upper->port, 22);

  auto tld = parseRule("*.com");  // broad, but the tenant's own choice
  ASSERT_TRUE(tld.ok());
  EXPECT_EQ(tld->domain, "com");
  EXPECT_TRUE(parseRule("localhost").ok());
  EXPECT_TRUE(parseRule("xn--bcher-kva.de").ok());
  EXPECT_TRUE(parseRule("a.com:1").ok());
  EXPECT_TRUE(parseRule("a.com:65535").ok());
}

TEST(PolicyRule, ParsesAddressRules) {
  auto cidr = parseRule("10.1.2.0/24:5432");
  ASSERT_TRUE(cidr.ok()) << cidr.error().message;
  EXPECT_EQ(cidr->kind, Rule::Kind::kCidr);
  EXPECT_EQ(cidr->network, 0x0a010200u);
  EXPECT_EQ(cidr->prefix_length, 24);
  EXPECT_EQ(cidr->port, 5432);

  auto single = parseRule("203.0.113.7");
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->network, ip("203.0.113.7"));
  EXPECT_EQ(single->prefix_length, 32);
  EXPECT_FALSE(single->port.has_value());

  auto everything = parseRule("0.0.0.0/0");
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->prefix_length, 0);
  EXPECT_TRUE(parseRule("1.2.3.4/32").ok());
  EXPECT_TRUE(parseRule("128.0.0.0/1:80").ok());
}

TEST(PolicyRule, RefusesHostBitsWithASuggestion) {
  EXPECT_TRUE(contains(ruleError("10.1.2.3/24"), "has host bits set; did you mean 10.1.2.0/24?"));
  EXPECT_TRUE(contains(ruleError("10.1.2.3/24:5432"), "did you mean 10.1.2.0/24:5432?"));
  EXPECT_TRUE(contains(ruleError("10.1.2.3/8"), "did you mean 10.0.0.0/8?"));
  EXPECT_TRUE(contains(ruleError("0.0.0.1/0"), "did you mean 0.0.0.0/0?"));
}

TEST(PolicyRule, RefusesBadPortsAndPrefixes) {
  for (const char* text :
       {"example.com:0", "example.com:65536", "example.com:99999", "example.com:", "example.com:0443",
        "example.com:+443", "example.com:1e3", "example.com:-1", "example.com:443 ", "example.com:4 43",
        "example.com:http", "1.2.3.4:0", "1.2.3.4:1000000"}) {
    EXPECT_TRUE(contains(ruleError(text), "port") || contains(ruleError(text), "whitespace")) << text;
  }
  for (const char* text : {"1.2.3.0/33", "1.2.3.0/-1", "1.2.3.0/", "1.2.3.0/024", "1.2.3.0/24/24", "1.2.3.0/x"}) {
    EXPECT_TRUE(contains(ruleError(text), "prefix length")) << text;
  }
  EXPECT_TRUE(contains(ruleError(":443"), "no name or address"));
  EXPECT_TRUE(contains(ruleError("example.com/24"), "dotted-quad"));
  EXPECT_TRUE(contains(ruleError("127.1/8"), "dotted-quad"));
}

TEST(PolicyRule, RefusesBadWildcards) {
  for (const char* text : {"*", "*.", "*:443", "*.:443", "*..", "*.*"}) {
    EXPECT_TRUE(contains(ruleError(text), "a wildcard needs a domain")) << text;
  }
  for (const char* text : {"**.com", "*example.com", "a.*.com", "example.*", "*.*.example.com", "ex*ample.com"}) {
    EXPECT_TRUE(contains(ruleError(text), "'*' is allowed only as a leading")) << text;
  }
}

TEST(PolicyRule, RefusesIpv6AndWeirdAddressForms) {
  for (const char* text : {"::1", "[::1]", "[::1]:443", "::ffff:169.254.169.254", "fe80::/10", "2001:db8::1",
                           "::", "[2001:db8::1]/64", "a.com:443:443"}) {
    EXPECT_TRUE(contains(ruleError(text), "IPv6")) << text;
  }
  for (const std::string& form : kWeirdAddressForms) {
    EXPECT_FALSE(parseRule(form).ok()) << form;
    EXPECT_FALSE(parseRule("*." + form).ok()) << form;
  }
  EXPECT_TRUE(contains(ruleError("127.1"), "neither a host name"));
  EXPECT_TRUE(contains(ruleError("169.254.169.254."), "neither a host name"));
}

TEST(PolicyRule, RefusesWhitespaceUnicodeAndEmptiness) {
  EXPECT_TRUE(contains(ruleError(""), "empty rule"));
  for (const char* text : {" example.com", "example.com ", "\texample.com", "example.com\n", " 1.2.3.4"}) {
    EXPECT_TRUE(contains(ruleError(text), "leading or trailing whitespace")) << text;
  }
  for (const char* text : {"exa mple.com", "bücher.de", "example。com", "a..com", "-a.com", "a/b"}) {
    EXPECT_FALSE(parseRule(text).ok()) << text;
  }
  EXPECT_FALSE(parseRule(std::string("example.com\0", 12)).ok());
}

TEST(PolicyRule, BoundsLengthAndQuotesSafely) {
  const std::string longest_name =
      std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." + std::string(61, 'd');
  auto at_limit = parseRule(longest_name + ":65535");  // 259 characters
  EXPECT_TRUE(at_limit.ok());
  EXPECT_TRUE(contains(ruleError(std::string(301, 'a')), "longer than 300 characters"));
  // A 1 MB rule: refused with a short message; a newline in a rule cannot forge a log line.
  const std::string huge = ruleError(std::string(1 << 20, 'a'));
  EXPECT_LT(huge.size(), 200u);
  const std::string forged = ruleError("a.com\nERROR fake log line");
  EXPECT_FALSE(contains(forged, "\n"));
  EXPECT_TRUE(contains(forged, "\\x0a"));
}

// --- Policies as JSON -----------------------------------------------------------------------

TEST(PolicyParse, EmptyObjectIsTheDefaultPolicy) {
  const Policy empty = policyOf("{}");
  EXPECT_EQ(empty.mode, EgressMode::kAllow);
  EXPECT_TRUE(empty.allow.empty());
  EXPECT_TRUE(empty.deny.empty());
  expectSamePolicy(empty, defaultPolicy());
  EXPECT_STREQ(modeName(EgressMode::kAllow), "allow");
  EXPECT_STREQ(modeName(EgressMode::kDeny), "deny");
  EXPECT_STREQ(modeName(EgressMode::kPolicy), "policy");
}

TEST(PolicyParse, ParsesTheDocumentedShape) {
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["*.pypi.org", "github.com:443",
      "10.1.2.0/24:5432", "203.0.113.7"], "deny": ["evil.example", "198.51.100.0/24"]})");
  EXPECT_EQ(policy.mode, EgressMode::kPolicy);
  ASSERT_EQ(policy.allow.size(), 4u);
  ASSERT_EQ(policy.deny.size(), 2u);
  EXPECT_EQ(policy.allow[1].text, "github.com:443");
  EXPECT_EQ(policy.allow[2].kind, Rule::Kind::kCidr);
  EXPECT_EQ(policy.deny[1].prefix_length, 24);
  EXPECT_EQ(policyOf(R"({"egress": "deny"})").mode, EgressMode::kDeny);
  EXPECT_EQ(policyOf(R"({"egress": "deny", "allow": [], "deny": ["a.com"]})").mode, EgressMode::kDeny);
  EXPECT_EQ(policyOf(R"({"egress": "allow", "allow": ["10.0.0.0/8"]})").allow.size(), 1u);
}

TEST(PolicyParse, RoundTripsThroughJson) {
  for (const char* text : {
           R"({})",
           R"({"egress": "deny", "deny": ["x.example"]})",
           R"({"egress": "policy", "allow": ["*.pypi.org", "GitHub.com.:443", "10.1.2.0/24:5432", "0.0.0.0/0"],
               "deny": ["evil.example:25", "198.51.100.0/24", "*.Bad.example"]})",
           R"({"egress": "allow", "allow": ["169.254.169.254:80"], "deny": ["203.0.113.7"]})",
           R"({"egress": "deny", "public_ports": true})",
           R"({"egress": "policy", "credentials": [{"host": "api.github.com", "headers": {"Authorization":
               "Bearer {{secret:gh}}", "X-Org": "acme"}}, {"host": "*.example.org:8080", "plain_http": true,
               "headers": {"X-Key": "{{secret:a}}-{{secret:b.2}}"}}]})",
       }) {
    const Policy policy = policyOf(text);
    const json dumped = toJson(policy);
    expectSamePolicy(policyOf(dumped), policy);
    EXPECT_EQ(toJson(policyOf(dumped)), dumped);
  }
  EXPECT_EQ(
      toJson(defaultPolicy()),
      json::parse(
          R"({"egress": "allow", "allow": [], "deny": [], "public_ports": false, "credentials": [], "placeholders": {}})"));
  EXPECT_TRUE(policyOf(R"({"public_ports": true})").public_ports);
  EXPECT_FALSE(policyOf(R"({"egress": "allow"})").public_ports);
}

// Credential rules: bounded, strict templates, never a header the gateway's framing needs.
TEST(PolicyCredentials, RulesAreCheckedStrictly) {
  auto error = [](const char* rules) {
    return parseError(json::parse(std::string(R"({"egress": "policy", "credentials": )") + rules + "}"));
  };
  EXPECT_TRUE(contains(error(R"({})"), "network.credentials must be an array"));
  EXPECT_TRUE(contains(error(R"([1])"), "network.credentials[0] must be an object"));
  EXPECT_TRUE(contains(error(R"([{"headers": {"A": "b"}}])"), ".host is required"));
  EXPECT_TRUE(contains(error(R"([{"host": "x.example"}])"), ".headers is required"));
  EXPECT_TRUE(contains(error(R"([{"host": "x.example", "headers": {}}])"), "non-empty object"));
  EXPECT_TRUE(contains(error(R"([{"host": "203.0.113.7", "headers": {"A": "b"}}])"), "not an address"));
  EXPECT_TRUE(contains(error(R"([{"host": "10.0.0.0/8", "headers": {"A": "b"}}])"), "not an address"));
  EXPECT_TRUE(contains(error(R"([{"host": "x..example", "headers": {"A": "b"}}])"), ".host:"));
  EXPECT_TRUE(contains(error(R"([{"host": "x.example", "headers": {"A": "b"}, "extra": 1}])"), "unknown key"));
  EXPECT_TRUE(contains(error(R"([{"host": "x.example", "headers": {"A": "b"}, "plain_http": "yes"}])"),
                       "plain_http must be true or false"));
  for (const char* name : {"Host", "content-length", "Transfer-Encoding", "CONNECTION", "Upgrade", "TE", "Expect"}) {
    std::string rules = std::string(R"([{"host": "x.example", "headers": {")") + name + R"(": "v"}}])";
    EXPECT_TRUE(contains(error(rules.c_str()), "the gateway sets this header itself")) << name;
  }
  for (const char* name : {"", "Bad Name", "A:B", "Ä", "a\\r\\nb"}) {
    std::string rules = std::string(R"([{"host": "x.example", "headers": {")") + name + R"(": "v"}}])";
    EXPECT_TRUE(contains(error(rules.c_str()), "token characters")) << name;
  }
  EXPECT_TRUE(contains(error(R"([{"host": "x.example", "headers": {"A": 1}}])"), "must be a string"));
  EXPECT_TRUE(contains(error(R"([{"host": "x.example", "headers": {"A": "a", "a": "b"}}])"), "named twice"));
  for (const char* value : {"x\\r\\nInjected: 1", "tab\\u0000", "{{secret:}}", "{{secret:gh", "{{env:HOME}}",
                            "{{secret:_x}}", "{{secret:a b}}", "{{ secret:gh }}"}) {
    std::string rules = std::string(R"([{"host": "x.example", "headers": {"A": ")") + value + R"("}}])";
    EXPECT_FALSE(parsePolicy(json::parse(std::string(R"({"credentials": )") + rules + "}")).ok()) << value;
  }
  json many_headers = json::object();
  for (size_t i = 0; i <= kMaxCredentialHeaders; ++i) many_headers["H" + std::to_string(i)] = "v";
  EXPECT_TRUE(
      contains(parseError(json{{"credentials", {{{"host", "x.example"}, {"headers", many_headers}}}}}), "more than"));
  json many_rules = json::array();
  for (size_t i = 0; i <= kMaxCredentialRules; ++i)
    many_rules.push_back({{"host", "x.example"}, {"headers", {{"A", "b"}}}});
  EXPECT_TRUE(contains(parseError(json{{"credentials", many_rules}}), "more than"));
  EXPECT_TRUE(contains(parseError(json::parse(R"({"egress": "deny", "credentials": [{"host": "x.example",
      "headers": {"A": "b"}}]})")),
                       "credential rules would be ignored"));
  EXPECT_TRUE(contains(
      error((R"([{"host": "x.example", "headers": {"A": ")" + std::string(kMaxHeaderTemplateBytes + 1, 'v') + R"("}}])")
                .c_str()),
      "longer than"));
}

TEST(PolicyCredentials, ARuleAllowsItsHostAndIsFoundByNameAndPort) {
  const Policy policy = policyOf(R"({"egress": "policy", "deny": ["blocked.example.org"], "credentials": [
      {"host": "api.github.com", "headers": {"Authorization": "Bearer {{secret:gh}}"}},
      {"host": "*.example.org:8443", "headers": {"X-Key": "{{secret:org_key}}"}},
      {"host": "blocked.example.org", "headers": {"X-Key": "{{secret:org_key}}"}}]})");
  EXPECT_EQ(decideName(policy, "api.github.com").reason, "credential:api.github.com");
  EXPECT_FALSE(decideName(policy, "github.com").allowed);
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.5", 443, "api.github.com", {"api.github.com"})).reason,
            "credential:api.github.com");
  // Still pinned: the rule's name must have resolved to the destination for this guest.
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.5", 443, "api.github.com")).reason, "not-pinned");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.5", 443, "", {"api.github.com"})).reason,
            "credential:api.github.com");
  EXPECT_TRUE(decideConnection(policy, connection("203.0.113.6", 8443, "a.example.org", {"a.example.org"})).allowed);
  EXPECT_FALSE(decideConnection(policy, connection("203.0.113.6", 443, "a.example.org", {"a.example.org"})).allowed);
  // Deny still beats it.
  EXPECT_FALSE(decideName(policy, "blocked.example.org").allowed);
  EXPECT_FALSE(decideConnection(policy, connection("203.0.113.6", 8443, "blocked.example.org", {"blocked.example.org"}))
                   .allowed);
  ASSERT_NE(credentialFor(policy, "api.github.com", 443), nullptr);
  EXPECT_EQ(credentialFor(policy, "api.github.com", 443)->host.domain, "api.github.com");
  EXPECT_EQ(credentialFor(policy, "API.GitHub.com.", 80), credentialFor(policy, "api.github.com", 443));
  EXPECT_EQ(credentialFor(policy, "x.api.github.com", 443), nullptr);
  // Without a port a rule is for the web ports only, and opens no other.
  EXPECT_EQ(credentialFor(policy, "api.github.com", 8080), nullptr);
  EXPECT_EQ(credentialFor(policy, "api.github.com", 22), nullptr);
  EXPECT_FALSE(decideConnection(policy, connection("203.0.113.5", 22, "", {"api.github.com"})).allowed);
  EXPECT_EQ(credentialFor(policy, "a.example.org", 443), nullptr);
  EXPECT_EQ(credentialFor(policy, "a.example.org", 8443)->headers[0].first, "X-Key");
  EXPECT_EQ(credentialSecretNames(policy), (std::vector<std::string>{"gh", "org_key"}));
}

TEST(PolicyCredentials, TemplatesRenderEverySecretOrNothing) {
  std::map<std::string, std::string, std::less<>> secrets{{"gh", "ghp_x"}, {"b.2", "two"}};
  auto lookup = [&](std::string_view name) -> const std::string* {
    auto it = secrets.find(name);
    return it == secrets.end() ? nullptr : &it->second;
  };
  std::string missing;
  EXPECT_EQ(renderCredential("Bearer {{secret:gh}}", lookup, &missing), "Bearer ghp_x");
  EXPECT_EQ(renderCredential("{{secret:gh}}:{{secret:b.2}}", lookup, &missing), "ghp_x:two");
  EXPECT_EQ(renderCredential("static", lookup, &missing), "static");
  EXPECT_EQ(renderCredential("", lookup, &missing), "");
  EXPECT_EQ(renderCredential("Bearer {{secret:gone}}", lookup, &missing), std::nullopt);
  EXPECT_EQ(missing, "gone");
  // A value is inserted as it is, never read as a template itself.
  secrets["gh"] = "{{secret:b.2}}";
  EXPECT_EQ(renderCredential("{{secret:gh}}", lookup, &missing), "{{secret:b.2}}");
}

TEST(PolicyParse, RulesBuiltInCodeGetTheirCanonicalText) {
  Policy policy;
  policy.mode = EgressMode::kPolicy;
  policy.allow.push_back(Rule{.kind = Rule::Kind::kDomain, .domain = "pypi.org", .wildcard = true, .port = 443});
  policy.allow.push_back(Rule{.kind = Rule::Kind::kCidr, .network = 0x0a000000, .prefix_length = 8});
  policy.deny.push_back(Rule{.kind = Rule::Kind::kCidr, .network = ip("203.0.113.7"), .port = 25});
  EXPECT_EQ(
      toJson(policy),
      json::parse(
          R"({"egress": "policy", "allow": ["*.pypi.org:443", "10.0.0.0/8"], "deny": ["203.0.113.7:25"], "public_ports": false, "credentials": [], "placeholders": {}})"));
  EXPECT_EQ(decideConnection(policy, connection("10.1.1.1", 80)).reason, "forbidden-range");
  EXPECT_EQ(decideConnection(openableTo(policy, "10.0.0.0/8"), connection("10.1.1.1", 80)).reason, "allow:10.0.0.0/8");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 25)).reason, "deny:203.0.113.7:25");
}

TEST(PolicyParse, RefusesWrongShapes) {
  for (const char* text : {R"([])", R"("allow")", R"(null)", R"(42)", R"(true)"}) {
    EXPECT_TRUE(contains(parseError(json::parse(text)), "must be a JSON object")) << text;
  }
  const std::string unknown = parseError(json::parse(R"({"egress": "allow", "credential": []})"));
  EXPECT_TRUE(contains(unknown, "unknown key \"credential\"")) << unknown;
  for (const json& not_bool : {json("true"), json(1), json(nullptr)}) {
    EXPECT_TRUE(contains(parseError(json{{"public_ports", not_bool}}), "network.public_ports must be true or false"));
  }
  EXPECT_TRUE(contains(parseError(json::parse(R"({"Egress": "allow"})")), "\"Egress\""));
  for (const char* egress : {R"("ALLOW")", R"("")", R"(1)", R"(null)", R"({"x": 1})", R"(["allow"])", R"(true)"}) {
    const std::string message = parseError(json::parse(std::string(R"({"egress": )") + egress + "}"));
    EXPECT_TRUE(contains(message, "network.egress must be")) << egress << ": " << message;
  }
  for (const char* list : {R"("example.com")", R"({"a": "b"})", R"(null)", R"(1)"}) {
    EXPECT_TRUE(contains(parseError(json::parse(std::string(R"({"allow": )") + list + "}")), "network.allow must be"))
        << list;
    EXPECT_TRUE(contains(parseError(json::parse(std::string(R"({"deny": )") + list + "}")), "network.deny must be"))
        << list;
  }
}

TEST(PolicyParse, NamesTheOffendingEntry) {
  const std::string bad_rule = parseError(json::parse(R"({"allow": ["ok.example", "10.1.2.3/24"]})"));
  EXPECT_TRUE(contains(bad_rule, "network.allow[1]")) << bad_rule;
  EXPECT_TRUE(contains(bad_rule, "10.1.2.0/24")) << bad_rule;
  for (const char* entry : {R"(["a.com"])", R"({"a": "a.com"})", R"(443)", R"(null)", R"(true)", R"([[[["x"]]]])"}) {
    const std::string message = parseError(json::parse(std::string(R"({"deny": ["a.com", "b.com", )") + entry + "]}"));
    EXPECT_TRUE(contains(message, "network.deny[2] must be a string")) << entry << ": " << message;
  }
}

TEST(PolicyParse, ModeDenyRefusesAllowRules) {
  const std::string message = parseError(json::parse(R"({"egress": "deny", "allow": ["github.com"]})"));
  EXPECT_TRUE(contains(message, "\"policy\"")) << message;
  // The order of the keys does not matter.
  EXPECT_FALSE(parsePolicy(json::parse(R"({"allow": ["github.com"], "egress": "deny"})")).ok());
}

TEST(PolicyParse, BoundsTheNumberOfRules) {
  auto rules = [](size_t count, const char* prefix) {
    json array = json::array();
    for (size_t i = 0; i < count; ++i) array.push_back(prefix + std::to_string(i) + ".example");
    return array;
  };
  EXPECT_EQ(policyOf(json{{"allow", rules(128, "a")}, {"deny", rules(128, "d")}}).allow.size(), 128u);
  EXPECT_EQ(policyOf(json{{"deny", rules(kMaxRules, "d")}}).deny.size(), kMaxRules);
  EXPECT_TRUE(contains(parseError(json{{"allow", rules(129, "a")}, {"deny", rules(128, "d")}}), "more than 256 rules"));
  EXPECT_TRUE(contains(parseError(json{{"deny", rules(kMaxRules + 1, "d")}}), "more than 256 rules"));
}

// --- Hostile input --------------------------------------------------------------------------

TEST(PolicyHostile, HugeDocumentsAreRefusedCheaplyAndBriefly) {
  // 10,000 rules, each a 1 KB valid-looking name: refused on the count, before any is parsed.
  json many = json::array();
  for (int i = 0; i < 10000; ++i) many.push_back(std::string(1000, 'a'));
  const json documents[] = {json{{"egress", "policy"}, {"allow", many}}, json{{"deny", many}}};
  const auto start = std::chrono::steady_clock::now();
  for (const json& document : documents) {
    const std::string message = parseError(document);
    EXPECT_TRUE(contains(message, "more than 256 rules")) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));

  const std::string megabyte(1 << 20, 'x');
  for (const json& document : {json{{"allow", {megabyte}}}, json{{megabyte, "allow"}}, json{{"egress", megabyte}},
                               json{{"deny", {"a.com", megabyte + ".com"}}}}) {
    EXPECT_LT(parseError(document).size(), 300u);
  }
  // Nesting where a string belongs.
  json nested = "a.com";
  for (int i = 0; i < 1000; ++i) nested = json::array({nested});
  EXPECT_TRUE(contains(parseError(json{{"allow", {nested}}}), "must be a string"));
  EXPECT_TRUE(contains(parseError(json{{"egress", nested}}), "network.egress must be"));
  EXPECT_TRUE(contains(parseError(json{{"deny", nested}}), "network.deny[0] must be a string"));
}

TEST(PolicyHostile, RandomRulesKeepTheInvariants) {
  // Whatever parses round-trips; whatever normalizes is a fixed point that is not an address.
  const std::string alphabet = "ab0179xX.-_*:/[] \t\xc3\xbc";
  std::mt19937 random(20240611);
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text;
    const size_t length = random() % 24;
    for (size_t j = 0; j < length; ++j) text += alphabet[random() % alphabet.size()];
    if (auto rule = parseRule(text); rule.ok()) {
      ++parsed;
      auto again = parseRule(rule->text);
      ASSERT_TRUE(again.ok()) << text;
      expectSameRules({rule.value()}, {again.value()});
      if (rule->kind == Rule::Kind::kDomain) {
        EXPECT_EQ(normalizeHostName(rule->domain), rule->domain) << text;
      } else {
        EXPECT_EQ(rule->network & ~(rule->prefix_length == 0 ? 0u : ~0u << (32 - rule->prefix_length)), 0u) << text;
      }
    }
    if (auto name = normalizeHostName(text)) {
      EXPECT_EQ(normalizeHostName(*name), name) << text;
      EXPECT_FALSE(parseIpv4(*name).has_value()) << text;
      EXPECT_EQ(name->find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_."), std::string::npos) << text;
    }
  }
  EXPECT_GT(parsed, 100);  // the generator does reach the accepting paths
}

// --- DNS questions --------------------------------------------------------------------------

TEST(PolicyName, ModeAllowAnswersAllButDeniedNames) {
  const Policy policy = policyOf(R"({"deny": ["evil.example", "*.tracker.example", "mail.example:25"]})");
  EXPECT_EQ(decideName(policy, "github.com").reason, "mode:allow");
  EXPECT_TRUE(decideName(policy, "github.com").allowed);
  EXPECT_TRUE(decideName(policy, "localhost").allowed);  // its answer is filtered instead
  const Decision evil = decideName(policy, "evil.example");
  EXPECT_FALSE(evil.allowed);
  EXPECT_EQ(evil.reason, "deny:evil.example");
  EXPECT_TRUE(decideName(policy, "www.evil.example").allowed);  // the exact rule names one name
  EXPECT_EQ(decideName(policy, "a.b.tracker.example").reason, "deny:*.tracker.example");
  EXPECT_TRUE(decideName(policy, "tracker.example").allowed);  // a wildcard excludes its apex
  // A deny rule with a port leaves the name's other ports reachable.
  EXPECT_TRUE(decideName(policy, "mail.example").allowed);
}

TEST(PolicyName, ModePolicyAnswersOnlyAllowedNames) {
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["*.pypi.org", "github.com:443",
      "*.example.com", "203.0.113.7", "0.0.0.0/0"], "deny": ["bad.example.com", "*.evil.example.com:443"]})");
  EXPECT_EQ(decideName(policy, "files.pypi.org").reason, "allow:*.pypi.org");
  EXPECT_EQ(decideName(policy, "pypi.org").reason, "not-allowed");
  EXPECT_EQ(decideName(policy, "github.com").reason, "allow:github.com:443");  // any port will do
  EXPECT_FALSE(decideName(policy, "api.github.com").allowed);
  EXPECT_FALSE(decideName(policy, "unlisted.org").allowed);  // CIDR rules answer no names
  EXPECT_EQ(decideName(policy, "bad.example.com").reason, "deny:bad.example.com");
  EXPECT_TRUE(decideName(policy, "x.evil.example.com").allowed);  // its deny rule has a port
  EXPECT_FALSE(decideName(policy, "").allowed);
}

TEST(PolicyName, ModeDenyAnswersNothing) {
  const Policy policy = policyOf(R"({"egress": "deny", "deny": ["evil.example"]})");
  EXPECT_EQ(decideName(policy, "github.com").reason, "mode:deny");
  EXPECT_FALSE(decideName(policy, "evil.example").allowed);
}

TEST(PolicyName, WildcardsMatchWholeLabelsOnly) {
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["*.example.com", "exact.org", "*.COM"]})");
  for (const char* name : {"a.example.com", "a.b.example.com", "x.exact.org.example.com", "anything.com"}) {
    EXPECT_TRUE(decideName(policy, name).allowed) << name;
  }
  for (const char* name : {"example.com.evil", "example.org", "exact.org.evil", "www.exact.org", "com", "org",
                           "example.co", "xexact.org", "com.evil"}) {
    EXPECT_FALSE(decideName(policy, name).allowed) << name;
  }
  EXPECT_EQ(decideName(policy, "badexample.com").reason, "allow:*.COM");  // not via *.example.com
  const Policy narrow = policyOf(R"({"egress": "policy", "allow": ["*.example.com"]})");
  EXPECT_FALSE(decideName(narrow, "badexample.com").allowed);
  EXPECT_FALSE(decideName(narrow, "example.com").allowed);
  EXPECT_FALSE(decideName(narrow, ".example.com").allowed);
}

// --- DNS answers ----------------------------------------------------------------------------

TEST(PolicyAnswer, ForbiddenRangesNeedAnAllowCidr) {
  for (const char* mode : {"allow", "policy"}) {
    const Policy open = policyOf(json{{"egress", mode}, {"allow", {"github.com", "*.internal"}}});
    EXPECT_EQ(decideAnswer(open, ip("203.0.113.7")).reason, "public") << mode;
    EXPECT_TRUE(decideAnswer(open, ip("203.0.113.7")).allowed) << mode;
    // Rebinding: a public name answering a private address gets no answer; a domain rule
    // (even one naming the metadata server) never opens a forbidden range.
    EXPECT_EQ(decideAnswer(open, ip("10.0.0.1")).reason, "forbidden-range") << mode;
    for (const char* never : {"127.0.0.1", "0.0.0.0", "255.255.255.255", "169.254.169.254"}) {
      EXPECT_EQ(decideAnswer(open, ip(never)).reason, "never-reachable") << mode << " " << never;
    }
    const Policy asked = policyOf(json{{"egress", mode}, {"allow", {"169.254.169.254", "10.1.2.0/24:5432"}}});
    // A tenant's allow CIDR alone opens no forbidden range: the node must let tenants open it.
    EXPECT_EQ(decideAnswer(asked, ip("10.1.2.9")).reason, "forbidden-range");
    const Policy opened = openableTo(asked, "10.0.0.0/8");
    EXPECT_EQ(decideAnswer(opened, ip("169.254.169.254")).reason, "never-reachable");
    // The port of an allow CIDR applies to connections; the address may be answered.
    EXPECT_EQ(decideAnswer(opened, ip("10.1.2.9")).reason, "allow:10.1.2.0/24:5432");
    EXPECT_FALSE(decideAnswer(opened, ip("10.1.3.9")).allowed);
  }
}

TEST(PolicyAnswer, DenyCidrsWithoutPortRemoveAnswers) {
  const Policy policy = openableTo(policyOf(R"({"egress": "policy", "allow": ["10.0.0.0/8", "*.example"],
      "deny": ["10.9.0.0/16", "203.0.113.0/24", "198.51.100.7:25"]})"),
                                   "10.0.0.0/8");
  EXPECT_EQ(decideAnswer(policy, ip("10.9.1.1")).reason, "deny:10.9.0.0/16");  // deny beats allow
  EXPECT_EQ(decideAnswer(policy, ip("10.1.1.1")).reason, "allow:10.0.0.0/8");
  EXPECT_EQ(decideAnswer(policy, ip("203.0.113.200")).reason, "deny:203.0.113.0/24");
  EXPECT_TRUE(decideAnswer(policy, ip("198.51.100.7")).allowed);  // only port 25 is denied
  EXPECT_EQ(decideAnswer(policyOf(R"({"egress": "deny"})"), ip("203.0.113.7")).reason, "mode:deny");
}

// --- Connections ----------------------------------------------------------------------------

TEST(PolicyConnection, ModeAllowOpensThePublicInternet) {
  const Policy policy = policyOf(R"({"deny": ["evil.example", "198.51.100.0/24", "203.0.113.9:25",
      "mail.example:25"]})");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 443)).reason, "mode:allow");
  // An unpinned public destination: the guest could reach it by address anyway.
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 443, "github.com")).reason, "mode:allow");
  EXPECT_EQ(decideConnection(policy, connection("10.0.0.1", 443)).reason, "forbidden-range");
  EXPECT_EQ(decideConnection(policy, connection("127.0.0.1", 22, "localhost", {"localhost"})).reason,
            "never-reachable");
  EXPECT_EQ(decideConnection(policy, connection("198.51.100.3", 443)).reason, "deny:198.51.100.0/24");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.9", 25)).reason, "deny:203.0.113.9:25");
  EXPECT_TRUE(decideConnection(policy, connection("203.0.113.9", 443)).allowed);
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 443, "evil.example")).reason, "deny:evil.example");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 443, "", {"evil.example"})).reason, "deny:evil.example");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 25, "", {"mail.example"})).reason,
            "deny:mail.example:25");
  EXPECT_TRUE(decideConnection(policy, connection("203.0.113.7", 587, "mail.example", {"mail.example"})).allowed);
}

TEST(PolicyConnection, ModePolicyNeedsAnAllowRule) {
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["github.com:443", "*.pypi.org",
      "198.51.100.0/24:5432"]})");
  const uint32_t github = ip("203.0.113.10");
  auto to_github = [&](uint16_t port, std::string name, std::vector<std::string> pinned) {
    return decideConnection(policy, ConnectionFacts{github, port, std::move(name), std::move(pinned)});
  };
  EXPECT_EQ(to_github(443, "github.com", {"github.com"}).reason, "allow:github.com:443");
  EXPECT_EQ(to_github(22, "github.com", {"github.com"}).reason, "not-allowed");  // wrong port
  EXPECT_EQ(to_github(443, "", {"github.com"}).reason, "allow:github.com:443");  // no SNI: the pins decide
  EXPECT_EQ(to_github(22, "", {"github.com"}).reason, "not-allowed");
  EXPECT_EQ(to_github(443, "", {}).reason, "not-allowed");
  EXPECT_EQ(to_github(443, "github.com", {}).reason, "not-pinned");
  EXPECT_EQ(to_github(443, "other.example", {"other.example"}).reason, "not-allowed");
  EXPECT_EQ(to_github(443, "", {"other.example", "files.pypi.org"}).reason, "allow:*.pypi.org");
  // With a claimed name, that name decides, not another name pinned to the same address.
  EXPECT_EQ(to_github(443, "other.example", {"other.example", "github.com"}).reason, "not-allowed");
  // An allow CIDR vouches for the address, whatever the name.
  EXPECT_EQ(decideConnection(policy, connection("198.51.100.4", 5432)).reason, "allow:198.51.100.0/24:5432");
  EXPECT_EQ(decideConnection(policy, connection("198.51.100.4", 5432, "db.example")).reason,
            "allow:198.51.100.0/24:5432");
  EXPECT_EQ(decideConnection(policy, connection("198.51.100.4", 5433)).reason, "not-allowed");
  EXPECT_EQ(decideConnection(policy, connection("10.1.1.1", 443, "github.com", {"github.com"})).reason,
            "forbidden-range");
}

TEST(PolicyConnection, ModeDenyAllowsNothing) {
  const Policy policy = policyOf(R"({"egress": "deny", "deny": ["203.0.113.7"]})");
  EXPECT_EQ(decideConnection(policy, connection("198.51.100.1", 443, "github.com", {"github.com"})).reason,
            "mode:deny");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.7", 443)).reason, "deny:203.0.113.7");
  EXPECT_FALSE(decideConnection(policy, connection("127.0.0.1", 80)).allowed);
}

TEST(PolicyConnection, DomainFrontingIsRefused) {
  for (const char* mode : {"allow", "policy"}) {
    const Policy policy = policyOf(json{{"egress", mode}, {"allow", {"allowed.example"}}, {"deny", {"evil.example"}}});
    // The SNI claims an allowed name; the address is the denied name's.
    const Decision fronted =
        decideConnection(policy, connection("203.0.113.66", 443, "allowed.example", {"evil.example"}));
    EXPECT_FALSE(fronted.allowed) << mode;
    EXPECT_EQ(fronted.reason, "deny:evil.example") << mode;
    // The reverse: a denied SNI on an allowed name's address.
    EXPECT_EQ(decideConnection(policy, connection("203.0.113.5", 443, "evil.example", {"allowed.example"})).reason,
              "deny:evil.example")
        << mode;
  }
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["allowed.example"]})");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.66", 443, "allowed.example")).reason, "not-pinned");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.66", 443, "allowed.example", {"other.example"})).reason,
            "not-pinned");
  EXPECT_TRUE(
      decideConnection(policy, connection("203.0.113.66", 443, "allowed.example", {"allowed.example"})).allowed);
}

TEST(PolicyConnection, MetadataStaysShutUnlessACidrOpensIt) {
  const std::vector<std::string> modes_and_allows[] = {
      {"allow"},  {"allow", "metadata.google.internal", "*.internal", "*.254.169.254.in-addr.arpa"},
      {"policy"}, {"policy", "metadata.google.internal", "*.internal"},
      {"deny"},
  };
  for (const auto& setup : modes_and_allows) {
    json document{{"egress", setup[0]}};
    if (setup.size() > 1) document["allow"] = std::vector<std::string>(setup.begin() + 1, setup.end());
    const Policy policy = policyOf(document);
    for (uint16_t port : {80, 443, 8080}) {
      for (const ConnectionFacts& facts :
           {connection("169.254.169.254", port), connection("169.254.169.254", port, "metadata.google.internal"),
            connection("169.254.169.254", port, "metadata.google.internal", {"metadata.google.internal"}),
            connection("169.254.169.254", port, "", {"metadata.google.internal"})}) {
        EXPECT_FALSE(decideConnection(policy, facts).allowed) << document.dump() << " port " << port;
      }
    }
    EXPECT_FALSE(decideAnswer(policy, ip("169.254.169.254")).allowed) << document.dump();
  }
  for (const char* mode : {"allow", "policy"}) {
    // Not even an explicit rule, nor a node that lets tenants open everything, reaches it.
    const Policy opened = openableTo(policyOf(json{{"egress", mode}, {"allow", {"169.254.169.254:80"}}}), "0.0.0.0/0");
    EXPECT_EQ(decideConnection(opened, connection("169.254.169.254", 80)).reason, "never-reachable");
    EXPECT_EQ(decideConnection(opened, connection("169.254.169.254", 80, "metadata.google.internal")).reason,
              "never-reachable");
    EXPECT_EQ(decideConnection(opened, connection("169.254.169.254", 443)).reason, "never-reachable");
    EXPECT_EQ(decideConnection(opened, connection("169.254.169.253", 80)).reason, "never-reachable");
    const Policy denied =
        policyOf(json{{"egress", mode}, {"allow", {"169.254.169.254:80"}}, {"deny", {"169.254.0.0/16"}}});
    EXPECT_EQ(decideConnection(denied, connection("169.254.169.254", 80)).reason, "deny:169.254.0.0/16");
    EXPECT_FALSE(decideAnswer(denied, ip("169.254.169.254")).allowed);
  }
}

// Every way a connection can be allowed, crossed with every way a deny rule can match it.
TEST(PolicyConnection, DenyBeatsAllowOnEveryPath) {
  struct AllowPath {
    const char* mode;
    const char* allow_rule;  // nullptr: the mode itself allows
    const char* destination;
  };
  const std::vector<AllowPath> allow_paths = {
      {"allow", nullptr, "203.0.113.7"},
      {"allow", "203.0.113.0/24", "203.0.113.7"},
      {"allow", "10.0.0.0/8:443", "10.0.0.7"},
      {"policy", "203.0.113.7:443", "203.0.113.7"},
      {"policy", "0.0.0.0/0", "203.0.113.7"},
      {"policy", "10.0.0.7", "10.0.0.7"},
      {"policy", "target.example", "203.0.113.7"},
      {"policy", "*.example", "203.0.113.7"},
      {"policy", "target.example:443", "203.0.113.7"},
  };
  struct DenyPath {
    std::string rule;
    bool claim_name;  // the connection claims target.example (else only pins it)
  };
  for (const AllowPath& path : allow_paths) {
    const std::string destination = path.destination;
    const std::vector<DenyPath> deny_paths = {
        {destination, true},      {destination + ":443", false}, {"0.0.0.0/0", true},
        {"target.example", true}, {"target.example", false},     {"target.example:443", true},
        {"*.example:443", false}, {"*.example", true},           {destination + "/32:443", true},
    };
    for (const DenyPath& deny : deny_paths) {
      json document{{"egress", path.mode}, {"deny", {deny.rule}}};
      if (path.allow_rule) document["allow"] = {path.allow_rule};
      // The node lets tenants open 10/8, so the private paths are paths at all.
      const Policy policy = openableTo(policyOf(document), "10.0.0.0/8");
      const ConnectionFacts facts{
          ip(path.destination), 443, deny.claim_name ? "target.example" : "", {"target.example"}};
      const Policy without_deny = openableTo(
          policyOf(json{{"egress", path.mode}, {"allow", document.value("allow", json::array())}}), "10.0.0.0/8");
      ASSERT_TRUE(decideConnection(without_deny, facts).allowed) << document.dump();
      const Decision decision = decideConnection(policy, facts);
      EXPECT_FALSE(decision.allowed) << document.dump();
      EXPECT_EQ(decision.reason, "deny:" + deny.rule) << document.dump();
    }
  }
}

TEST(PolicyConnection, DenyRulesWithAPortDenyOnlyThatPort) {
  const Policy policy = policyOf(R"({"egress": "policy", "allow": ["*.example", "203.0.113.0/24"],
      "deny": ["target.example:22", "203.0.113.8:25"]})");
  EXPECT_EQ(decideConnection(policy, connection("192.0.2.7", 22, "target.example", {"target.example"})).reason,
            "deny:target.example:22");
  EXPECT_EQ(decideConnection(policy, connection("192.0.2.7", 443, "target.example", {"target.example"})).reason,
            "allow:*.example");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.8", 25)).reason, "deny:203.0.113.8:25");
  EXPECT_EQ(decideConnection(policy, connection("203.0.113.8", 26)).reason, "allow:203.0.113.0/24");
}

TEST(PolicyConnection, UnnormalizedNamesFromACallerStillMeetDenyRules) {
  const Policy policy = policyOf(R"({"egress": "allow", "deny": ["evil.example"]})");
  EXPECT_FALSE(decideConnection(policy, connection("203.0.113.7", 443, "EVIL.Example.")).allowed);
  EXPECT_FALSE(decideConnection(policy, connection("203.0.113.7", 443, "", {"Evil.EXAMPLE"})).allowed);
  EXPECT_FALSE(decideName(policy, "evil.EXAMPLE.").allowed);
  const Policy strict = policyOf(R"({"egress": "policy", "allow": ["ok.example"]})");
  EXPECT_TRUE(decideConnection(strict, connection("203.0.113.7", 443, "OK.example", {"ok.example."})).allowed);
}

}  // namespace

// Loopback, 0/8, the slot's own link, multicast and broadcast stay closed even to the widest
// allow CIDR a tenant can write: the gateway dials from the host's side.
TEST(PolicyNeverReachable, NoAllowRuleOpensTheHostOrTheSlotLink) {
  auto policy = parsePolicy(nlohmann::json{{"egress", "policy"}, {"allow", {"0.0.0.0/0", "127.0.0.1"}}});
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  for (const char* ip :
       {"127.0.0.1", "0.0.0.0", "169.254.0.1", "169.254.0.2", "169.254.169.254", "224.0.0.1", "255.255.255.255"}) {
    ConnectionFacts facts;
    facts.destination = *parseIpv4(ip);
    facts.port = 80;
    auto d = decideConnection(policy.value(), facts);
    EXPECT_FALSE(d.allowed) << ip;
    EXPECT_EQ(d.reason, "never-reachable") << ip;
    EXPECT_FALSE(decideAnswer(policy.value(), facts.destination).allowed) << ip;
  }
}

// A tenant's allow CIDR opens a private range only where the node lets tenants open it, and
// Azure's host service address counts as private.
TEST(PolicyNeverReachable, PrivateRangesOpenOnlyWhereTheNodeSays) {
  const Policy wide = policyOf(json{{"egress", "policy"}, {"allow", {"0.0.0.0/0"}}});
  for (const char* address : {"10.9.9.9", "192.168.1.1", "172.16.0.1", "100.64.0.1", "168.63.129.16"}) {
    EXPECT_EQ(decideConnection(wide, connection(address, 5432)).reason, "forbidden-range") << address;
  }
  const Policy opened = openableTo(wide, "10.9.0.0/16");
  EXPECT_EQ(decideConnection(opened, connection("10.9.9.9", 5432)).reason, "allow:0.0.0.0/0");
  EXPECT_EQ(decideConnection(opened, connection("10.8.9.9", 5432)).reason, "forbidden-range");
  EXPECT_TRUE(toJson(opened) == toJson(wide)) << "the node's list is never part of the tenant's policy";
}

namespace {
// Placeholders: env var names for secrets the guest sees stand-ins of; they need a rule.
TEST(PolicyCredentials, PlaceholdersNameSecretsAndNeedARule) {
  const nlohmann::json rule = {{"host", "api.github.com"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}};
  auto ok = parsePolicy({{"credentials", {rule}}, {"placeholders", {{"GH_TOKEN", "org_key"}}}});
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->placeholders.at("GH_TOKEN"), "org_key");
  EXPECT_EQ(credentialSecretNames(ok.value()), (std::vector<std::string>{"gh", "org_key"}));
  EXPECT_EQ(toJson(ok.value())["placeholders"], nlohmann::json({{"GH_TOKEN", "org_key"}}));
  auto again = parsePolicy(toJson(ok.value()));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->placeholders, ok->placeholders);
  for (const nlohmann::json& bad : {
           nlohmann::json{{"placeholders", {{"GH_TOKEN", "gh"}}}},
           nlohmann::json{{"credentials", {rule}}, {"placeholders", {{"1X", "gh"}}}},
           nlohmann::json{{"credentials", {rule}}, {"placeholders", {{"A=B", "gh"}}}},
           nlohmann::json{{"credentials", {rule}}, {"placeholders", {{"GH", "no spaces"}}}},
           nlohmann::json{{"credentials", {rule}}, {"placeholders", {{"GH", 1}}}},
           nlohmann::json{{"credentials", {rule}}, {"placeholders", nlohmann::json::array()}},
       }) {
    EXPECT_FALSE(parsePolicy(bad).ok()) << bad.dump();
  }
  nlohmann::json many = nlohmann::json::object();
  for (size_t i = 0; i <= kMaxPlaceholders; ++i) many["V" + std::to_string(i)] = "gh";
  EXPECT_FALSE(parsePolicy({{"credentials", {rule}}, {"placeholders", many}}).ok());
}
}  // namespace

}  // namespace space::net
