// Adding a credential rule's headers to a guest's request head, on either path that carries one:
// plain HTTP (the rule's plain_http) and TLS the gateway terminates. Everything that decides
// whether a secret may go is here, so both paths refuse the same requests the same way.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "gateway/gateway_core.h"

namespace space::gateway {

struct Injection {
  std::vector<uint8_t> bytes;  // the rewritten head, then whatever followed the original one
  std::string method;
  std::string path;                  // the request target, at most 256 characters (for the audit)
  std::vector<std::string> secrets;  // the names of the secrets it carries, never their values
  // The values to mask in the answer: each header as sent, and each secret's value.
  std::vector<std::string> redact;
};

// Nothing was sent: the guest gets `status` with `message`, audited under `reason`.
struct Refusal {
  int status = 502;
  std::string reason;
  std::string message;
};

// The status code of an answer from its first bytes ("HTTP/1.1 200 ..."), or 0 when they are
// not an HTTP/1.x status line (for the audit only).
int answerStatus(std::span<const uint8_t> first_bytes);

// The gateway's own HTTP answer (a complete response with Connection: close), for refusals.
std::string gatewayAnswer(int status, const std::string& message);

// `request` starts with a complete request head (net::sniff said kHttp and `host` is its Host),
// bound for `destination`. The secret goes only when the destination is among the answers this
// guest's resolver gave for `host` (a Host header, or a --resolve, names any host the guest
// likes), with a method that does not reflect the request, and with every secret present. The
// rendered values are wiped from every buffer but the result's, which the caller wipes once sent.
std::variant<Injection, Refusal> injectCredential(GatewayCore& core, const net::CredentialRule& rule,
                                                  std::span<const uint8_t> request, const std::string& host,
                                                  uint32_t destination);

}  // namespace space::gateway
