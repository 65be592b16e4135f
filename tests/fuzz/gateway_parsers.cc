#include "gateway_parsers.h"

namespace space::fuzz {
void fuzzGatewayParsers(const uint8_t*, size_t) {}
}  // namespace space::fuzz
