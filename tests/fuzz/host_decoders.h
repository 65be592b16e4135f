// One entry point that drives every host-side decoder of guest-controlled bytes with the same
// input: handshake scanning, Connect envelopes, QMP messages, process events. Used by the
// libFuzzer target (clang, -DSPACE_FUZZ=ON) and by a unit test that replays seeds and random
// inputs in every build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace space::fuzz {

void fuzzHostDecoders(const uint8_t* data, size_t size);

}  // namespace space::fuzz
