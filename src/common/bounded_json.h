// Parsing JSON that an untrusted peer wrote (the guest agent, QEMU, an API client).
// nlohmann's parser itself is iterative, but copying, comparing and dumping a value recurse once
// per nesting level: a 400 KB document of 200,000 nested arrays parses fine and then overflows
// the stack of whoever copies it. Its DOM also costs tens of bytes per element, so a few MB of
// `[[],[],...]` becomes hundreds of MB. Every parse of bytes from outside the process goes
// through here, with a bound on both.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/result.h"

namespace space {

struct JsonLimits {
  // Nesting levels of arrays and objects; the outermost value is level 1. Our documents nest
  // a handful of levels, so 64 leaves room for callers' own values (metadata, QMP returns).
  int max_depth = 64;
  // Values of any kind (scalars, arrays, objects; object keys not counted), bounding the DOM's
  // memory independently of the text's size. Counted from the text as an upper bound: the first
  // value, plus one per comma and one per opening bracket outside strings (a container's first
  // element follows no comma, and `[[[...]]]` members would otherwise cost one comma each).
  size_t max_values = size_t{1} << 20;
};

// The bounds check of parseJsonBounded, fed piece by piece as bytes arrive: a reader of a
// request body stops at the first bound crossed instead of buffering the whole body first.
// Allocates nothing; the pieces may split a string or an escape anywhere.
class JsonBoundsScanner {
 public:
  explicit JsonBoundsScanner(const JsonLimits& limits = {}) : limits_(limits) {}
  // kInvalidArgument naming the bound once one is crossed (and for every later piece).
  Status feed(std::string_view piece);

 private:
  JsonLimits limits_;
  int depth_ = 0;
  size_t values_ = 1;
  bool in_string_ = false;
  bool escaped_ = false;  // the previous byte was a backslash inside a string
  int exceeded_ = 0;      // 0: no bound crossed; 1: depth; 2: values
};

// Parses `text` as one JSON document within `limits`. Errors are kInvalidArgument and say which
// bound was hit (or that the text is not JSON); callers re-code them for their peer.
Result<nlohmann::json> parseJsonBounded(std::string_view text, const JsonLimits& limits = {});

}  // namespace space
