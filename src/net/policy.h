// Egress policy of one sandbox: what its guest may reach. Pure logic, no I/O: the gateway asks
// it about every DNS question and every TCP connection, and spaced validates what tenants send.
//
// JSON shape (the sandbox's `network` object, also the gateway's policy file):
//   {"egress": "allow"|"deny"|"policy", "allow": ["*.pypi.org", "github.com:443",
//    "10.1.2.0/24:5432", "203.0.113.7"], "deny": ["evil.example", "198.51.100.0/24"]}
// - allow:  the internet is allowed, forbidden ranges (isForbiddenRange) are not, deny rules
//           apply. Allow rules matter only to open a forbidden range by CIDR.
// - policy: only what an allow rule names, minus deny rules.
// - deny:   nothing at all; allow rules are refused (say "policy" instead).
// Deny beats allow, for every port and protocol. Forbidden ranges are reachable only through
// an allow rule that is a CIDR or IP covering the address: a domain rule never opens them.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace space::net {

enum class EgressMode { kAllow, kDeny, kPolicy };

// One allow or deny entry. Syntax:
//   domain:  "example.com" (that name only) or "*.example.com" (any name below it, not the
//            apex), lowercase LDH labels, at most 253 characters; optional ":port" (1-65535).
//   address: an IPv4 literal or CIDR "a.b.c.d/n"; optional ":port".
// IPv6 rules are refused: the slot carries no IPv6.
struct Rule {
  enum class Kind { kDomain, kCidr };
  Kind kind = Kind::kDomain;
  std::string domain;      // kDomain: the name without "*." and without a trailing dot
  bool wildcard = false;   // kDomain: "*.<domain>"
  uint32_t network = 0;    // kCidr: host byte order, already masked
  int prefix_length = 32;  // kCidr
  std::optional<uint16_t> port;
  std::string text;  // as the tenant wrote it, for audit entries and the API
};

// A credential rule: requests to `host` get `headers` added by the gateway, each value a
// template whose `{{secret:NAME}}` parts are the tenant's secret NAME at request time. The guest
// never holds the value. Its host counts as allowed (in mode policy too). JSON:
//   {"host": "api.github.com", "headers": {"Authorization": "Bearer {{secret:gh}}"},
//    "plain_http": false}
// `plain_http`: inject into plain-HTTP requests too (readable on the path); default only TLS.
struct CredentialRule {
  Rule host;  // a domain rule (wildcards and an optional port allowed), never an address; no port: 80 and 443
  std::vector<std::pair<std::string, std::string>> headers;  // name as given, value template
  bool plain_http = false;
};

struct Policy {
  EgressMode mode = EgressMode::kAllow;
  std::vector<Rule> allow;
  std::vector<Rule> deny;
  // The node's, never the tenant's (not part of the JSON): the forbidden-range addresses an
  // allow CIDR may open at all (spaced --tenant-openable-cidrs). Empty: none, so no tenant rule
  // reaches the host's private networks.
  std::vector<Rule> openable;
  // Ingress: whether the sandbox's ports are served to anyone who knows its preview URL, with
  // no API key or access token ("public_ports" in the JSON; default false). Not egress, but
  // part of the same network object so snapshots and branches carry it the same way.
  bool public_ports = false;
  std::vector<CredentialRule> credentials;
  // Stand-ins the guest sees for secrets ("placeholders": {"GH_TOKEN": "gh"}): the env var
  // GH_TOKEN holds space-secret-gh-<random>, which the gateway replaces with the secret's value
  // in request headers to credential rules' hosts only. Env var name -> secret name.
  std::map<std::string, std::string> placeholders;
};

// Limits on what a tenant may send (bounded input).
inline constexpr size_t kMaxRules = 256;  // allow + deny together
inline constexpr size_t kMaxRuleLength = 300;

inline constexpr size_t kMaxCredentialRules = 32;
inline constexpr size_t kMaxCredentialHeaders = 16;  // per rule
inline constexpr size_t kMaxHeaderTemplateBytes = 1024;
inline constexpr size_t kMaxPlaceholders = 32;

// The first credential rule for a connection claiming `name` (normalized) on `port` (the rule's
// port, or 80 and 443 for a rule without one); null if none.
const CredentialRule* credentialFor(const Policy& policy, std::string_view name, uint16_t port);
// Every secret name the rules refer to, sorted, without repeats.
std::vector<std::string> credentialSecretNames(const Policy& policy);
// The header value for `value_template`: each {{secret:NAME}} replaced by lookup(NAME). nullopt
// when a secret is missing (lookup gave null); `missing` then names it.
template <class Lookup>
std::optional<std::string> renderCredential(std::string_view value_template, Lookup&& lookup, std::string* missing);

// The node's default default: internet allowed, forbidden ranges denied.
Policy defaultPolicy();

// Validates and parses; a clear kInvalidArgument error names the offending entry.
Result<Policy> parsePolicy(const nlohmann::json& value);
Result<Rule> parseRule(std::string_view text);
nlohmann::json toJson(const Policy& policy);
const char* modeName(EgressMode mode);

// An IPv4 network, host byte order.
struct Ipv4Range {
  uint32_t network;
  int prefix_length;
};
// What isForbiddenRange and isNeverReachable cover, for rules outside this code that must hold
// the same ranges (the nftables table of gateways' upstream sockets).
std::span<const Ipv4Range> forbiddenRanges();
std::span<const Ipv4Range> neverReachableRanges();
std::string formatIpv4(uint32_t ipv4);
std::string formatCidr(const Ipv4Range& range);

// Loopback, 0/8, RFC 1918 private, CGNAT 100.64/10, link-local 169.254/16 (metadata
// included), 192.0.0.0/24, benchmarking 198.18/15, multicast, 240/4 and broadcast.
bool isForbiddenRange(uint32_t ipv4);
// Addresses no rule opens, not even an allow CIDR such as 0.0.0.0/0: the gateway's own host
// (0/8, loopback), link-local 169.254/16 (cloud metadata, the slot's own link), multicast,
// 240/4 and broadcast.
bool isNeverReachable(uint32_t ipv4);

// Lowercases and checks a host name as it arrives from a guest (SNI, Host, DNS question):
// LDH labels of 1-63 characters, at most 253 in all, one optional trailing dot removed.
// nullopt for anything else, IP literals included.
std::optional<std::string> normalizeHostName(std::string_view name);

struct Decision {
  bool allowed = false;
  // The rule that decided ("deny:evil.example", "allow:*.pypi.org") or why
  // ("mode:allow", "mode:deny", "forbidden-range", "not-allowed", "not-pinned"; "public" for
  // an answer outside the forbidden ranges).
  std::string reason;
};

// A DNS question for `name` (normalized): answered only if some connection to it could be
// allowed. A deny rule with a port does not deny the name itself.
Decision decideName(const Policy& policy, std::string_view name);

// Whether a resolved answer may be given to the guest: forbidden ranges only if an allow
// CIDR covers the address (rebinding protection), and never an address a deny rule covers.
Decision decideAnswer(const Policy& policy, uint32_t ipv4);

struct ConnectionFacts {
  uint32_t destination = 0;  // the guest's original destination, host byte order
  uint16_t port = 0;
  // The name the connection claims (TLS SNI, HTTP Host), normalized; empty when none.
  std::string name;
  // Names whose pinned DNS answers (given to this guest) include `destination`.
  std::vector<std::string> pinned_names;
};

// One TCP connection:
// 1. Denied if a deny rule matches the destination (CIDR, port), the claimed name or any
//    pinned name (with the port).
// 2. A forbidden-range destination needs an allow CIDR rule covering it (and its port).
// 3. With a claimed name, the destination must be among that name's pinned answers
//    (`name` in pinned_names), else "not-pinned" (no domain fronting); mode allow lets an
//    unpinned public destination through only if no deny rule matches the name.
// 4. mode policy: an allow rule must match the claimed name (with the port), or a pinned name,
//    or the destination by CIDR. mode deny: nothing.
Decision decideConnection(const Policy& policy, const ConnectionFacts& facts);

std::string ipv4ToString(uint32_t ipv4);
std::optional<uint32_t> parseIpv4(std::string_view text);  // strict dotted quad only

inline constexpr std::string_view kSecretOpen = "{{secret:";
inline constexpr std::string_view kSecretClose = "}}";

template <class Lookup>
std::optional<std::string> renderCredential(std::string_view value_template, Lookup&& lookup, std::string* missing) {
  std::string out;
  // Sized once (a template is at most 1 KiB, a secret 16 KiB): growing would free copies of
  // secret bytes unwiped.
  out.reserve(value_template.size() + 64 * 1024);
  auto drop = [&out] {
    explicit_bzero(out.data(), out.size());
    return std::nullopt;
  };
  while (!value_template.empty()) {
    size_t open = value_template.find(kSecretOpen);
    out += value_template.substr(0, open);
    if (open == std::string_view::npos) break;
    value_template.remove_prefix(open + kSecretOpen.size());
    size_t close = value_template.find(kSecretClose);
    if (close == std::string_view::npos) return drop();  // parsePolicy refuses such templates
    std::string_view name = value_template.substr(0, close);
    const std::string* value = lookup(name);
    if (value == nullptr) {
      if (missing) *missing = std::string(name);
      return drop();
    }
    out += *value;
    value_template.remove_prefix(close + kSecretClose.size());
  }
  return out;
}

}  // namespace space::net
