// Standard base64 (RFC 4648, with padding), as proto3-JSON uses for bytes fields. Written here
// rather than taken from OpenSSL so the statically linked guest agent does not carry libcrypto
// for it; decoding is strict (guest and host both feed it untrusted text).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace space::agentproto {

std::string base64Encode(std::string_view in);
// nullopt for anything that is not canonical padded base64.
std::optional<std::string> base64Decode(std::string_view in);
// What base64Decode(in) would accept, without decoding: the decoded size, or nullopt. For
// passing guest-sent base64 through unchanged once it is known to be canonical.
std::optional<size_t> base64DecodedSize(std::string_view in);

}  // namespace space::agentproto
