// The gateway's rewrite of a guest's plain-HTTP request head for a credential rule: the rule's
// headers are set (replacing any the guest sent under the same names), the connection headers
// go, and `Connection: close` makes the server end the connection after this one request, so
// a credential is added to exactly the request whose Host the gateway checked. Guest bytes:
// bounded by kMaxSniffBytes, parsed with Boost.Beast, never trusted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace space::net {

struct RewrittenHead {
  std::string head;     // the request line and header fields to send, ending in CRLF CRLF
  size_t consumed = 0;  // how many of the input bytes the original head took (the body follows)
  std::string method;
  std::string target;
};

// `bytes` starts with a complete request head (as net::sniff accepted it). kInvalidArgument for
// anything Beast does not parse as one.
// `replace`: (text, replacement) pairs applied to every field value the guest sent (a
// placeholder in place of a secret); `replaced` (if given) gets the indexes of those that occurred.
Result<RewrittenHead> rewriteRequestHead(std::span<const uint8_t> bytes,
                                         const std::vector<std::pair<std::string, std::string>>& set_headers,
                                         const std::vector<std::pair<std::string, std::string>>& replace = {},
                                         std::vector<size_t>* replaced = nullptr);

}  // namespace space::net
