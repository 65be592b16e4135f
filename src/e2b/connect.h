// The Connect protocol as E2B's SDK speaks it to envd (HTTP/1.1, JSON codec): the envelopes of
// server-streaming calls, the error shapes, and the status codes an error travels with. Pure
// functions; the envd front end uses them to route a client's calls to a guest agent that
// already speaks the same RPCs (see docs/e2b.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "agentproto/wire.h"
#include "common/result.h"

namespace space::e2b {

// The envelope itself (flags, big-endian length, payload) is the agent's own wire format:
// agentproto::encodeEnvelope and its flag constants.
inline constexpr uint8_t kEnvelopeData = 0x00;
using agentproto::kEnvelopeCompressed;
using agentproto::kEnvelopeEndStream;
inline std::string envelope(uint8_t flags, std::string_view payload) {
  return agentproto::encodeEnvelope(flags, payload);
}

// The payload of the single envelope a server-streaming request body holds. Errors
// (invalid_argument): a short or truncated envelope, bytes after it, a compressed or end-stream
// flag, a payload over `max_payload`.
Result<std::string> unwrapRequestEnvelope(std::string_view body, size_t max_payload);

// {"code": "not_found", "message": "..."}: Connect's error JSON, for unary answers and inside
// an EndStream envelope.
nlohmann::json connectError(const Error& error);

// The EndStream envelope: `{}` when the call succeeded, else {"error": connectError(error)}.
std::string endStream(const std::optional<Error>& error);

// The HTTP status a unary Connect error goes out with (Connect's table: not_found 404,
// invalid_argument 400, ...). The client reads the code from the body first; the status matters
// to proxies and logs.
int connectHttpStatus(ErrorCode code);

// The user named by `Authorization: Basic base64("<user>:")`, as E2B's SDK sends it. nullopt
// when the header is not Basic; an error when it is Basic but malformed or names no user (1-64
// bytes, no control characters; whether it exists is the guest's to say).
Result<std::optional<std::string>> basicAuthUser(std::string_view authorization);

}  // namespace space::e2b
