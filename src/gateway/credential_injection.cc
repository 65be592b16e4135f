#include "gateway/credential_injection.h"

#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "net/http_rewrite.h"
#include "net/redactor.h"
#include "net/request_end.h"

namespace space::gateway {

namespace {

// A rendered credential header (a template with its secrets in place) at most: servers refuse
// longer headers anyway, and Beast cannot hold a field over 64 KiB.
constexpr size_t kMaxCredentialHeaderBytes = 16 * 1024;

void wipe(std::vector<std::pair<std::string, std::string>>& headers) {
  for (auto& [name, value] : headers) explicit_bzero(value.data(), value.size());
}

}  // namespace

int answerStatus(std::span<const uint8_t> b) {
  if (b.size() < 12 || std::memcmp(b.data(), "HTTP/1.", 7) != 0 || b[8] != ' ' || !std::isdigit(b[9]) ||
      !std::isdigit(b[10]) || !std::isdigit(b[11])) {
    return 0;
  }
  return (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
}

std::string gatewayAnswer(int status, const std::string& message) {
  const char* phrase = status == 400   ? "Bad Request"
                       : status == 421 ? "Misdirected Request"
                       : status == 504 ? "Gateway Timeout"
                                       : "Bad Gateway";
  const std::string body = "space-gateway: " + message + "\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + phrase +
         "\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

std::variant<Injection, Refusal> injectCredential(GatewayCore& core, const net::CredentialRule& rule,
                                                  std::span<const uint8_t> request, const std::string& host,
                                                  uint32_t destination) {
  auto pinned = core.pins.namesFor(destination, DnsPins::Clock::now());
  if (std::find(pinned.begin(), pinned.end(), host) == pinned.end()) {
    return Refusal{502, "credential-not-pinned",
                   "a credential for " + host +
                       " is sent only to the addresses its DNS answers gave this sandbox, and " +
                       net::ipv4ToString(destination) + " is not one; nothing was sent"};
  }
  // Methods a server answers by reflecting the request (TRACE, TRACK) or that open a tunnel
  // would hand the header back to the guest: only the usual ones carry a credential.
  // sniff() accepted the head, so it starts with a method token and a space.
  const auto space = std::find(request.begin(), request.end(), ' ');
  const std::string method(request.begin(), space);
  static constexpr std::string_view kMethods[] = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"};
  if (std::find(std::begin(kMethods), std::end(kMethods), method) == std::end(kMethods)) {
    return Refusal{502, "credential-method-refused",
                   "a credential is not sent with method " + method.substr(0, 32) + "; nothing was sent"};
  }
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [header, value_template] : rule.headers) {
    std::string missing;
    auto lookup = [&](std::string_view secret_name) { return core.secret(secret_name); };
    auto value = net::renderCredential(value_template, lookup, &missing);
    if (!value) {
      wipe(headers);
      return Refusal{502, "credential-missing",
                     "the secret " + missing + " of a credential rule for " + host + " is not set; nothing was sent"};
    }
    if (value->size() > kMaxCredentialHeaderBytes) {
      explicit_bzero(value->data(), value->size());
      wipe(headers);
      return Refusal{502, "credential-too-large",
                     "the header " + header + " of a credential rule for " + host + " would exceed " +
                         std::to_string(kMaxCredentialHeaderBytes) + " bytes; nothing was sent"};
    }
    headers.emplace_back(header, std::move(*value));
  }
  // Placeholders the guest put in its own headers become their secrets' values, here only, and
  // only those of secrets this rule itself sends: another rule's host may be one the guest can
  // read what it receives at (a wildcard's subdomain), which would hand it any secret.
  const std::vector<std::string> rule_secrets = net::credentialSecretNames(net::Policy{.credentials = {rule}});
  std::vector<std::pair<std::string, std::string>> replace;
  std::vector<std::string> replace_names;
  const std::string_view head_text(reinterpret_cast<const char*>(request.data()), request.size());
  for (const auto& [seen, secret_name] : core.placeholders()) {
    if (head_text.find(seen) == std::string_view::npos) continue;
    if (std::find(rule_secrets.begin(), rule_secrets.end(), secret_name) == rule_secrets.end()) continue;
    const std::string* value = core.secret(secret_name);
    if (value == nullptr) {
      wipe(headers);
      wipe(replace);
      return Refusal{
          502, "credential-missing",
          "the secret " + secret_name + " of a placeholder sent to " + host + " is not set; nothing was sent"};
    }
    replace.emplace_back(seen, *value);
    replace_names.push_back(secret_name);
  }
  // Every secret that goes must be maskable in the answer (net::Redactor): a short one in an
  // echoed header would come back as it is.
  for (const std::string& name : rule_secrets) {
    const std::string* value = core.secret(name);
    if (value != nullptr && value->size() < net::Redactor::kMinValueBytes) {
      wipe(headers);
      wipe(replace);
      return Refusal{502, "credential-too-short",
                     "the secret " + name + " is shorter than " + std::to_string(net::Redactor::kMinValueBytes) +
                         " bytes: too short to be masked in answers, so it is not sent; nothing was sent"};
    }
  }
  std::vector<size_t> replaced;
  auto rewritten = net::rewriteRequestHead(request, headers, replace, &replaced);
  std::vector<std::string> redact;
  if (rewritten.ok()) {
    for (auto& [name, value] : headers) redact.push_back(value);
  }
  wipe(headers);
  wipe(replace);
  if (!rewritten.ok()) return Refusal{400, "malformed", rewritten.error().message};
  if (rewritten->head.size() > net::RequestEnd::kMaxHeadBytes) {
    explicit_bzero(rewritten->head.data(), rewritten->head.size());
    return Refusal{502, "credential-too-large",
                   "the request head with its credentials would exceed " +
                       std::to_string(net::RequestEnd::kMaxHeadBytes) + " bytes; nothing was sent"};
  }
  Injection out;
  out.bytes.reserve(rewritten->head.size() + (request.size() - rewritten->consumed));  // no regrowth, no stray copy
  out.bytes.assign(rewritten->head.begin(), rewritten->head.end());
  out.bytes.insert(out.bytes.end(), request.begin() + static_cast<std::ptrdiff_t>(rewritten->consumed), request.end());
  explicit_bzero(rewritten->head.data(), rewritten->head.size());
  out.method = rewritten->method;
  out.path = rewritten->target.substr(0, 256);
  out.secrets = rule_secrets;
  for (size_t i : replaced) {
    if (std::find(out.secrets.begin(), out.secrets.end(), replace_names[i]) == out.secrets.end()) {
      out.secrets.push_back(replace_names[i]);
    }
  }
  for (const std::string& name : out.secrets) {
    if (const std::string* value = core.secret(name)) redact.push_back(*value);
  }
  out.redact = std::move(redact);
  return out;
}

}  // namespace space::gateway
