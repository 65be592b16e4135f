#include "net/policy.h"

#include <array>
#include <set>
#include <span>

namespace space::net {
namespace {

// Error messages quote what the tenant sent, and go to API responses and logs: a 1 MB rule or a
// rule with a newline must not come back whole or forge a log line.
std::string quoteForMessage(std::string_view text) {
  constexpr size_t kShown = 64;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kShown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte >= 0x7f || byte == '"' || byte == '\\') {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += static_cast<char>(byte);
    }
  }
  if (text.size() > kShown) out += "...";
  out += "\"";
  return out;
}

Error invalid(std::string message) { return makeError(ErrorCode::kInvalidArgument, std::move(message)); }

bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isHexDigit(char c) { return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
char toLower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Decimal digits only, no sign, no leading zero (an octal-looking "010" means 8 to inet_aton and
// 10 to us: refusing it leaves no doubt), at most max_digits of them.
std::optional<uint32_t> parseStrictDecimal(std::string_view text, size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return std::nullopt;
  if (text.size() > 1 && text[0] == '0') return std::nullopt;
  uint32_t value = 0;
  for (char c : text) {
    if (!isDigit(c)) return std::nullopt;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  return value;
}

uint32_t prefixMask(int prefix_length) {
  // A shift by 32 is undefined: /0 is special.
  return prefix_length == 0 ? 0 : ~uint32_t{0} << (32 - prefix_length);
}

bool cidrCovers(uint32_t network, int prefix_length, uint32_t ipv4) {
  return (ipv4 & prefixMask(prefix_length)) == network;
}

// The "ends in a number" test of the WHATWG URL standard: a final label that is decimal or 0x-hex
// makes browsers and inet_aton read the whole name as an IPv4 address ("0x7f.1", "2130706433").
bool looksLikeIpv4Literal(std::string_view last_label) {
  if (last_label.empty()) return false;
  bool all_digits = true;
  for (char c : last_label) all_digits = all_digits && isDigit(c);
  if (all_digits) return true;
  if (last_label.size() < 2 || last_label[0] != '0' || toLower(last_label[1]) != 'x') return false;
  for (char c : last_label.substr(2)) {
    if (!isHexDigit(c)) return false;
  }
  return true;
}

// Callers pass normalized names; comparing case-insensitively and without a trailing dot anyway
// costs nothing and keeps a deny rule from being dodged by a caller that forgot to normalize.
std::string_view withoutTrailingDot(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  return name;
}

bool sameName(std::string_view a, std::string_view b) {
  a = withoutTrailingDot(a);
  b = withoutTrailingDot(b);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (toLower(a[i]) != toLower(b[i])) return false;
  }
  return true;
}

bool domainMatches(const Rule& rule, std::string_view name) {
  name = withoutTrailingDot(name);
  if (!rule.wildcard) return sameName(rule.domain, name);
  // "*.example.com" is every name strictly below example.com: "x.example.com" matches,
  // "example.com" and "badexample.com" do not.
  if (name.size() < rule.domain.size() + 2) return false;
  const size_t dot = name.size() - rule.domain.size() - 1;
  return name[dot] == '.' && sameName(name.substr(dot + 1), rule.domain);
}

bool portMatches(const Rule& rule, uint16_t port) { return !rule.port || *rule.port == port; }

bool ruleCoversAddress(const Rule& rule, uint32_t ipv4) {
  return rule.kind == Rule::Kind::kCidr && cidrCovers(rule.network, rule.prefix_length, ipv4);
}

bool ruleMatchesName(const Rule& rule, std::string_view name) {
  return rule.kind == Rule::Kind::kDomain && !name.empty() && domainMatches(rule, name);
}

// A Rule built in code rather than parsed may have no text: its canonical spelling stands in, so
// audit entries and toJson never show an empty rule.
std::string canonicalText(const Rule& rule) {
  std::string text;
  if (rule.kind == Rule::Kind::kDomain) {
    text = (rule.wildcard ? "*." : "") + rule.domain;
  } else {
    text = ipv4ToString(rule.network);
    if (rule.prefix_length != 32) text += "/" + std::to_string(rule.prefix_length);
  }
  if (rule.port) text += ":" + std::to_string(*rule.port);
  return text;
}

std::string displayText(const Rule& rule) { return rule.text.empty() ? canonicalText(rule) : rule.text; }

Decision allowedBy(const Rule& rule) { return {true, "allow:" + displayText(rule)}; }
Decision deniedBy(const Rule& rule) { return {false, "deny:" + displayText(rule)}; }
Decision credentialAllows(const CredentialRule& rule) { return {true, "credential:" + displayText(rule.host)}; }

Result<std::vector<Rule>> parseRuleList(const nlohmann::json& value, std::string_view key) {
  if (!value.is_array()) return invalid("network." + std::string(key) + " must be an array of strings");
  std::vector<Rule> rules;
  rules.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string where = "network." + std::string(key) + "[" + std::to_string(i) + "]";
    if (!value[i].is_string()) return invalid(where + " must be a string");
    auto rule = parseRule(value[i].get_ref<const std::string&>());
    if (!rule.ok()) return invalid(where + ": " + rule.error().message);
    rules.push_back(std::move(rule).value());
  }
  return rules;
}

// The syntax of a secret's name (secrets::checkSecretName is the same rule, and a test keeps
// them equal): net depends on nothing that knows secrets.
bool isSecretName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || isDigit(c); };
  if (!alnum(name[0])) return false;
  for (char c : name) {
    if (!alnum(c) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

// RFC 9110 token characters.
bool isTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || isDigit(c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool sameToken(std::string_view a, std::string_view b) { return sameName(a, b); }

// Headers the gateway's framing and routing depend on: a credential rule may not set them.
bool isReservedHeader(std::string_view name) {
  for (std::string_view reserved : {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te",
                                    "trailer", "keep-alive", "proxy-connection", "expect"}) {
    if (sameToken(name, reserved)) return true;
  }
  return false;
}

Status checkHeaderTemplate(std::string_view value, const std::string& where) {
  if (value.size() > kMaxHeaderTemplateBytes) {
    return invalid(where + " is longer than " + std::to_string(kMaxHeaderTemplateBytes) + " bytes");
  }
  for (char c : value) {
    auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\t') || byte == 0x7f) return invalid(where + " contains a control character");
  }
  std::string_view rest = value;
  while (true) {
    size_t open = rest.find("{{");
    if (open == std::string_view::npos) break;
    if (rest.substr(open, kSecretOpen.size()) != kSecretOpen) {
      return invalid(where + ": \"{{\" starts only {{secret:NAME}}");
    }
    rest.remove_prefix(open + kSecretOpen.size());
    size_t close = rest.find(kSecretClose);
    if (close == std::string_view::npos || !isSecretName(rest.substr(0, close))) {
      return invalid(where + ": {{secret:NAME}} needs a secret name (1-64 of A-Z a-z 0-9 _ . -) and \"}}\"");
    }
    rest.remove_prefix(close + kSecretClose.size());
  }
  return okStatus();
}

Result<CredentialRule> parseCredentialRule(const nlohmann::json& value, const std::string& where) {
  if (!value.is_object()) return invalid(where + " must be an object with host and headers");
  CredentialRule rule;
  bool has_host = false, has_headers = false;
  for (const auto& [key, member] : value.items()) {
    if (key == "host") {
      if (!member.is_string()) return invalid(where + ".host must be a string");
      auto host = parseRule(member.get_ref<const std::string&>());
      if (!host.ok()) return invalid(where + ".host: " + host.error().message);
      if (host->kind != Rule::Kind::kDomain) {
        return invalid(where + ".host: a credential rule names a host, not an address");
      }
      rule.host = std::move(host).value();
      has_host = true;
    } else if (key == "headers") {
      if (!member.is_object() || member.empty()) return invalid(where + ".headers must be a non-empty object");
      if (member.size() > kMaxCredentialHeaders) {
        return invalid(where + ".headers has more than " + std::to_string(kMaxCredentialHeaders) + " entries");
      }
      for (const auto& [name, header_value] : member.items()) {
        const std::string at = where + ".headers." + quoteForMessage(name);
        bool token = !name.empty() && name.size() <= 64;
        for (char c : name) token = token && isTokenChar(c);
        if (!token) return invalid(at + ": a header name is 1-64 token characters");
        if (isReservedHeader(name)) return invalid(at + ": the gateway sets this header itself");
        if (!header_value.is_string()) return invalid(at + " must be a string");
        const auto& text = header_value.get_ref<const std::string&>();
        SPACE_TRY(checkHeaderTemplate(text, at));
        for (const auto& [seen, ignored] : rule.headers) {
          if (sameToken(seen, name)) return invalid(at + ": the header is named twice");
        }
        rule.headers.emplace_back(name, text);
      }
      has_headers = true;
    } else if (key == "plain_http") {
      if (!member.is_boolean()) return invalid(where + ".plain_http must be true or false");
      rule.plain_http = member.get<bool>();
    } else {
      return invalid(where + " has an unknown key " + quoteForMessage(key));
    }
  }
  if (!has_host) return invalid(where + ".host is required");
  if (!has_headers) return invalid(where + ".headers is required");
  return rule;
}

}  // namespace

Policy defaultPolicy() { return Policy{}; }

const CredentialRule* credentialFor(const Policy& policy, std::string_view name, uint16_t port) {
  for (const CredentialRule& rule : policy.credentials) {
    // A rule without a port is for the web ports only: every other port of the host may run a
    // service that would echo a header back (or log it), and the rule opens no more than it uses.
    bool port_matches = rule.host.port ? *rule.host.port == port : port == 80 || port == 443;
    if (port_matches && ruleMatchesName(rule.host, name)) return &rule;
  }
  return nullptr;
}

std::vector<std::string> credentialSecretNames(const Policy& policy) {
  std::set<std::string> names;
  for (const CredentialRule& rule : policy.credentials) {
    for (const auto& [header, value_template] : rule.headers) {
      std::string_view rest = value_template;
      for (size_t open; (open = rest.find(kSecretOpen)) != std::string_view::npos;) {
        rest.remove_prefix(open + kSecretOpen.size());
        size_t close = rest.find(kSecretClose);
        if (close == std::string_view::npos) break;
        names.emplace(rest.substr(0, close));
        rest.remove_prefix(close + kSecretClose.size());
      }
    }
  }
  for (const auto& [env, secret] : policy.placeholders) {
    names.emplace(secret);
  }
  return {names.begin(), names.end()};
}

const char* modeName(EgressMode mode) {
  switch (mode) {
    case EgressMode::kAllow: return "allow";
    case EgressMode::kDeny: return "deny";
    case EgressMode::kPolicy: return "policy";
  }
  return "allow";
}

std::string ipv4ToString(uint32_t ipv4) {
  return std::to_string(ipv4 >> 24) + "." + std::to_string((ipv4 >> 16) & 0xff) + "." +
         std::to_string((ipv4 >> 8) & 0xff) + "." + std::to_string(ipv4 & 0xff);
}

std::optional<uint32_t> parseIpv4(std::string_view text) {
  if (text.size() > 15) return std::nullopt;
  uint32_t address = 0;
  for (int octet_index = 0; octet_index < 4; ++octet_index) {
    const size_t dot = text.find('.');
    const bool last = octet_index == 3;
    if (last != (dot == std::string_view::npos)) return std::nullopt;
    auto octet = parseStrictDecimal(text.substr(0, dot), 3);
    if (!octet || *octet > 255) return std::nullopt;
    address = (address << 8) | *octet;
    if (!last) text.remove_prefix(dot + 1);
  }
  return address;
}

// Whether the node lets tenant rules open this forbidden-range address at all.
static bool operatorOpens(const Policy& policy, uint32_t ipv4) {
  for (const Rule& rule : policy.openable) {
    if (ruleCoversAddress(rule, ipv4)) return true;
  }
  return false;
}

std::span<const Ipv4Range> neverReachableRanges() {
  static constexpr std::array<Ipv4Range, 5> kNever = {{
      {0x00000000, 8},   // 0/8: connecting to 0.0.0.0 reaches the gateway's own host
      {0x7f000000, 8},   // loopback: the host's (or upstream namespace's) own services
      {0xa9fe0000, 16},  // link-local: cloud metadata, and the slot's own link
      {0xe0000000, 4},   // multicast
      {0xf0000000, 4},   // reserved and broadcast
  }};
  return kNever;
}

std::span<const Ipv4Range> forbiddenRanges() {
  // The documentation ranges (192.0.2/24, 198.51.100/24, 203.0.113/24) are deliberately absent:
  // nothing routes them, and tests use them as the fake internet's public addresses.
  static constexpr std::array<Ipv4Range, 12> kForbidden = {{
      {0x00000000, 8},   // 0.0.0.0/8 "this network"; connecting to 0.0.0.0 reaches the local host
      {0x0a000000, 8},   // 10/8
      {0xa83f8110, 32},  // 168.63.129.16: Azure's host service (WireServer), public-looking
      {0x64400000, 10},  // 100.64/10 CGNAT
      {0x7f000000, 8},   // 127/8 loopback
      {0xa9fe0000, 16},  // 169.254/16 link-local: cloud metadata, and the slot's own link
      {0xac100000, 12},  // 172.16/12
      {0xc0000000, 24},  // 192.0.0.0/24 IETF protocol assignments
      {0xc0a80000, 16},  // 192.168/16
      {0xc6120000, 15},  // 198.18/15 benchmarking
      {0xe0000000, 4},   // 224/4 multicast
      {0xf0000000, 4},   // 240/4 reserved, 255.255.255.255 included
  }};
  return kForbidden;
}

static bool inAny(std::span<const Ipv4Range> ranges, uint32_t ipv4) {
  for (const Ipv4Range& range : ranges) {
    if (cidrCovers(range.network, range.prefix_length, ipv4)) return true;
  }
  return false;
}

std::string formatIpv4(uint32_t ipv4) {
  return std::to_string(ipv4 >> 24) + "." + std::to_string((ipv4 >> 16) & 0xff) + "." +
         std::to_string((ipv4 >> 8) & 0xff) + "." + std::to_string(ipv4 & 0xff);
}

std::string formatCidr(const Ipv4Range& range) {
  return formatIpv4(range.network) + "/" + std::to_string(range.prefix_length);
}

bool isNeverReachable(uint32_t ipv4) { return inAny(neverReachableRanges(), ipv4); }

bool isForbiddenRange(uint32_t ipv4) { return inAny(forbiddenRanges(), ipv4); }

std::optional<std::string> normalizeHostName(std::string_view name) {
  name = withoutTrailingDot(name);
  if (name.empty() || name.size() > 253) return std::nullopt;
  std::string normalized;
  normalized.reserve(name.size());
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      const size_t label_length = i - label_start;
      if (label_length == 0 || label_length > 63) return std::nullopt;
      if (name[label_start] == '-' || name[i - 1] == '-') return std::nullopt;
      if (i < name.size()) normalized += '.';
      label_start = i + 1;
      continue;
    }
    const char c = toLower(name[i]);
    // Underscores appear in real DNS names (_dmarc, _acme-challenge); letting them through
    // widens nothing, since policy matches whole labels.
    if (!((c >= 'a' && c <= 'z') || isDigit(c) || c == '-' || c == '_')) return std::nullopt;
    normalized += c;
  }
  const size_t last_dot = normalized.rfind('.');
  const std::string_view last_label =
      last_dot == std::string::npos ? std::string_view(normalized) : std::string_view(normalized).substr(last_dot + 1);
  if (looksLikeIpv4Literal(last_label)) return std::nullopt;
  return normalized;
}

Result<Rule> parseRule(std::string_view text) {
  if (text.empty()) return invalid("empty rule");
  if (text.size() > kMaxRuleLength) {
    return invalid(quoteForMessage(text) + " is longer than " + std::to_string(kMaxRuleLength) + " characters");
  }
  if (isSpace(text.front()) || isSpace(text.back())) {
    return invalid(quoteForMessage(text) + " has leading or trailing whitespace");
  }
  Rule rule;
  rule.text = std::string(text);
  if (text.find('[') != std::string_view::npos || text.find(':') != text.rfind(':')) {
    return invalid(quoteForMessage(text) + ": IPv6 rules are refused; sandboxes have no IPv6");
  }

  std::string_view host = text;
  const size_t colon = text.find(':');
  if (colon != std::string_view::npos) {
    host = text.substr(0, colon);
    auto port = parseStrictDecimal(text.substr(colon + 1), 5);
    if (!port || *port < 1 || *port > 65535) return invalid(quoteForMessage(text) + ": the port must be 1-65535");
    rule.port = static_cast<uint16_t>(*port);
  }
  if (host.empty()) return invalid(quoteForMessage(text) + ": no name or address before the port");

  const size_t slash = host.find('/');
  const std::string_view address_text = host.substr(0, slash);
  if (auto address = parseIpv4(address_text)) {
    rule.kind = Rule::Kind::kCidr;
    if (slash != std::string_view::npos) {
      auto prefix_length = parseStrictDecimal(host.substr(slash + 1), 2);
      if (!prefix_length || *prefix_length > 32)
        return invalid(quoteForMessage(text) + ": the prefix length must be 0-32");
      rule.prefix_length = static_cast<int>(*prefix_length);
    }
    rule.network = *address & prefixMask(rule.prefix_length);
    if (rule.network != *address) {
      // Masking silently could open more than the tenant meant (10.1.2.3/8 is all of 10/8).
      const std::string port_suffix = rule.port ? ":" + std::to_string(*rule.port) : "";
      return invalid(quoteForMessage(text) + " has host bits set; did you mean " + ipv4ToString(rule.network) + "/" +
                     std::to_string(rule.prefix_length) + port_suffix + "?");
    }
    return rule;
  }
  if (slash != std::string_view::npos) {
    return invalid(quoteForMessage(text) + ": a CIDR needs a dotted-quad IPv4 address (a.b.c.d/n)");
  }

  std::string_view domain = host;
  if (domain.starts_with("*.")) {
    rule.wildcard = true;
    domain.remove_prefix(2);
  }
  if (domain == "*" || (rule.wildcard && withoutTrailingDot(domain).empty())) {
    return invalid(quoteForMessage(text) +
                   ": a wildcard needs a domain after \"*.\"; for every name use egress \"allow\"");
  }
  if (domain.find('*') != std::string_view::npos) {
    return invalid(quoteForMessage(text) + ": '*' is allowed only as a leading \"*.\"");
  }
  auto normalized = normalizeHostName(domain);
  if (!normalized) {
    return invalid(quoteForMessage(text) +
                   " is neither a host name (labels of letters, digits, '-' and '_'; IDNs as xn-- punycode)"
                   " nor an IPv4 address or CIDR in dotted-quad form");
  }
  rule.kind = Rule::Kind::kDomain;
  rule.domain = std::move(*normalized);
  return rule;
}

Result<Policy> parsePolicy(const nlohmann::json& value) {
  if (!value.is_object()) return invalid("network must be a JSON object");
  Policy policy;
  size_t rule_count = 0;
  for (const auto& [key, member] : value.items()) {
    if (key == "egress") {
      if (member == "allow") {
        policy.mode = EgressMode::kAllow;
      } else if (member == "deny") {
        policy.mode = EgressMode::kDeny;
      } else if (member == "policy") {
        policy.mode = EgressMode::kPolicy;
      } else {
        return invalid("network.egress must be \"allow\", \"deny\" or \"policy\"");
      }
    } else if (key == "allow" || key == "deny") {
      if (member.is_array()) rule_count += member.size();
    } else if (key == "credentials") {
      if (!member.is_array()) return invalid("network.credentials must be an array of rules");
      if (member.size() > kMaxCredentialRules) {
        return invalid("network.credentials has more than " + std::to_string(kMaxCredentialRules) + " rules");
      }
    } else if (key == "public_ports") {
      if (!member.is_boolean()) return invalid("network.public_ports must be true or false");
      policy.public_ports = member.get<bool>();
    } else if (key == "placeholders") {
      if (!member.is_object()) return invalid("network.placeholders must be an object of ENV_NAME: secret name");
      if (member.size() > kMaxPlaceholders) {
        return invalid("network.placeholders has more than " + std::to_string(kMaxPlaceholders) + " entries");
      }
      for (const auto& [env, secret] : member.items()) {
        const std::string at = "network.placeholders." + quoteForMessage(env);
        bool name_ok = !env.empty() && env.size() <= 64 && !(env[0] >= '0' && env[0] <= '9');
        for (char c : env) {
          name_ok = name_ok && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
        }
        if (!name_ok) return invalid(at + ": an env var name is 1-64 of A-Z a-z 0-9 _, not starting with a digit");
        if (!secret.is_string() || !isSecretName(secret.get_ref<const std::string&>())) {
          return invalid(at + " must be a secret name (1-64 of A-Z a-z 0-9 _ . -)");
        }
        policy.placeholders.emplace(env, secret.get<std::string>());
      }
    } else {
      return invalid("network has an unknown key " + quoteForMessage(key));
    }
  }
  // Counted before any rule is parsed, so a 10,000-rule array costs no parsing.
  if (rule_count > kMaxRules) {
    return invalid("network has more than " + std::to_string(kMaxRules) + " rules (allow and deny together)");
  }
  if (value.contains("allow")) {
    auto rules = parseRuleList(value.at("allow"), "allow");
    if (!rules.ok()) return rules.error();
    policy.allow = std::move(rules).value();
  }
  if (value.contains("deny")) {
    auto rules = parseRuleList(value.at("deny"), "deny");
    if (!rules.ok()) return rules.error();
    policy.deny = std::move(rules).value();
  }
  if (value.contains("credentials")) {
    const auto& rules = value.at("credentials");
    for (size_t i = 0; i < rules.size(); ++i) {
      auto rule = parseCredentialRule(rules[i], "network.credentials[" + std::to_string(i) + "]");
      if (!rule.ok()) return rule.error();
      policy.credentials.push_back(std::move(rule).value());
    }
  }
  if (!policy.placeholders.empty() && policy.credentials.empty()) {
    return invalid("network.placeholders are replaced only for credential rules' hosts, and there are none");
  }
  if (policy.mode == EgressMode::kDeny && !policy.credentials.empty()) {
    return invalid("network.egress \"deny\" reaches no host, so credential rules would be ignored");
  }
  if (policy.mode == EgressMode::kDeny && !policy.allow.empty()) {
    return invalid("network.egress \"deny\" allows nothing, so allow rules would be ignored; use egress \"policy\"");
  }
  return policy;
}

nlohmann::json toJson(const Policy& policy) {
  auto texts = [](const std::vector<Rule>& rules) {
    nlohmann::json array = nlohmann::json::array();
    for (const Rule& rule : rules) array.push_back(displayText(rule));
    return array;
  };
  nlohmann::json credentials = nlohmann::json::array();
  for (const CredentialRule& rule : policy.credentials) {
    nlohmann::json headers = nlohmann::json::object();
    for (const auto& [name, value_template] : rule.headers) headers[name] = value_template;
    credentials.push_back({{"host", displayText(rule.host)}, {"headers", headers}, {"plain_http", rule.plain_http}});
  }
  return {{"egress", modeName(policy.mode)},     {"allow", texts(policy.allow)}, {"deny", texts(policy.deny)},
          {"public_ports", policy.public_ports}, {"credentials", credentials},   {"placeholders", policy.placeholders}};
}

Decision decideName(const Policy& policy, std::string_view name) {
  if (policy.mode == EgressMode::kDeny) return {false, "mode:deny"};
  // Only a portless deny rule denies the name: "evil.example:25" still leaves its port 443 open.
  for (const Rule& rule : policy.deny) {
    if (!rule.port && ruleMatchesName(rule, name)) return deniedBy(rule);
  }
  if (policy.mode == EgressMode::kAllow) return {true, "mode:allow"};
  for (const Rule& rule : policy.allow) {
    if (ruleMatchesName(rule, name)) return allowedBy(rule);
  }
  for (const CredentialRule& rule : policy.credentials) {
    if (ruleMatchesName(rule.host, name)) return credentialAllows(rule);
  }
  return {false, "not-allowed"};
}

Decision decideAnswer(const Policy& policy, uint32_t ipv4) {
  if (policy.mode == EgressMode::kDeny) return {false, "mode:deny"};
  if (isNeverReachable(ipv4)) return {false, "never-reachable"};
  // A deny CIDR with a port denies only connections to that port; the address stays usable.
  for (const Rule& rule : policy.deny) {
    if (!rule.port && ruleCoversAddress(rule, ipv4)) return deniedBy(rule);
  }
  if (isForbiddenRange(ipv4)) {
    // Without this, any public name could resolve to a private address (DNS rebinding).
    if (operatorOpens(policy, ipv4)) {
      for (const Rule& rule : policy.allow) {
        if (ruleCoversAddress(rule, ipv4)) return allowedBy(rule);
      }
    }
    return {false, "forbidden-range"};
  }
  return {true, "public"};
}

Decision decideConnection(const Policy& policy, const ConnectionFacts& facts) {
  for (const Rule& rule : policy.deny) {
    if (!portMatches(rule, facts.port)) continue;
    if (ruleCoversAddress(rule, facts.destination) || ruleMatchesName(rule, facts.name)) return deniedBy(rule);
    for (const std::string& pinned : facts.pinned_names) {
      if (ruleMatchesName(rule, pinned)) return deniedBy(rule);
    }
  }
  if (policy.mode == EgressMode::kDeny) return {false, "mode:deny"};
  if (isNeverReachable(facts.destination)) return {false, "never-reachable"};

  // An allow CIDR is the tenant vouching for the address itself, whatever name the connection
  // claims: in mode policy it needs no pinned name, and it opens a forbidden range only where
  // the node lets tenants open one.
  const bool forbidden = isForbiddenRange(facts.destination);
  if (!forbidden || operatorOpens(policy, facts.destination)) {
    for (const Rule& rule : policy.allow) {
      if (portMatches(rule, facts.port) && ruleCoversAddress(rule, facts.destination)) return allowedBy(rule);
    }
  }
  if (forbidden) return {false, "forbidden-range"};
  // Mode allow admits any public address, so a name pinned elsewhere fronts nothing it could not
  // reach directly; the deny rules above already saw the claimed name.
  if (policy.mode == EgressMode::kAllow) return {true, "mode:allow"};

  if (!facts.name.empty()) {
    bool pinned = false;
    for (const std::string& pinned_name : facts.pinned_names) pinned = pinned || sameName(pinned_name, facts.name);
    // Otherwise an allowed SNI could front for any address (domain fronting).
    if (!pinned) return {false, "not-pinned"};
    for (const Rule& rule : policy.allow) {
      if (portMatches(rule, facts.port) && ruleMatchesName(rule, facts.name)) return allowedBy(rule);
    }
    if (const CredentialRule* rule = credentialFor(policy, facts.name, facts.port)) return credentialAllows(*rule);
    return {false, "not-allowed"};
  }
  for (const Rule& rule : policy.allow) {
    if (!portMatches(rule, facts.port)) continue;
    for (const std::string& pinned_name : facts.pinned_names) {
      if (ruleMatchesName(rule, pinned_name)) return allowedBy(rule);
    }
  }
  for (const std::string& pinned_name : facts.pinned_names) {
    if (const CredentialRule* rule = credentialFor(policy, pinned_name, facts.port)) return credentialAllows(*rule);
  }
  return {false, "not-allowed"};
}

}  // namespace space::net
