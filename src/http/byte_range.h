#pragma once
// The Range request header (RFC 9110 section 14.2), for a resource of known size: the one range
// it asks for, or the cases where the whole resource (200) or a 416 is the answer.
//
// Hand-written because Beast parses messages, not this header, and the grammar is small.

#include <cstdint>
#include <string_view>

namespace space::http {

struct ByteRange {
  enum class Kind {
    kWhole,          // no usable Range header: serve everything (200)
    kPartial,        // serve bytes [first, last] (206, Content-Range: bytes first-last/size)
    kUnsatisfiable,  // 416, Content-Range: bytes */size
  } kind = Kind::kWhole;
  uint64_t first = 0;
  uint64_t last = 0;  // inclusive

  uint64_t length() const { return kind == Kind::kPartial ? last - first + 1 : 0; }
};

// A header that does not parse, names another unit or asks for several ranges is ignored, as
// the RFC allows (the whole resource is served). `last` beyond the end is clamped to it.
ByteRange parseByteRange(std::string_view header, uint64_t size);

}  // namespace space::http
