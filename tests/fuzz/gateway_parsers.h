// One entry point that drives every gateway parser of guest or upstream bytes (TLS ClientHello
// and HTTP head sniffing, DNS queries and responses) with the same input. Used by the libFuzzer
// target (clang, -DSPACE_FUZZ=ON) and by a unit test that replays seeds in every build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace space::fuzz {

void fuzzGatewayParsers(const uint8_t* data, size_t size);

}  // namespace space::fuzz
