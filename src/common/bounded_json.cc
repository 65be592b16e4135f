#include "common/bounded_json.h"

#include <string>

namespace space {

namespace {

enum class Exceeded { kNone, kDepth, kValues };

// One linear pass over the text, before any DOM exists: nesting depth, and an upper bound on the
// number of values (each value is the first in its document or container, or follows a comma).
// Stops at the first bound crossed, allocates nothing. Strings are skipped with their escapes;
// everything else about validity is left to the parser.
//
// Not nlohmann's parser callback, though it sees depths too: in 3.11.2 the callback parser
// rescans the enclosing container each time an object closes, which makes `[{},{},...]`
// quadratic (100,000 members: 11 s instead of 9 ms), and it keeps a pointer per open bracket
// even for discarded values. Neither holds for a pre-scan followed by the plain parser.
Exceeded scan(std::string_view text, const JsonLimits& limits) {
  int depth = 0;
  size_t values = 1;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > limits.max_depth) return Exceeded::kDepth;
        break;
      case ']':
      case '}': --depth; break;
      case ',':
        if (++values > limits.max_values) return Exceeded::kValues;
        break;
      default: break;
    }
  }
  return Exceeded::kNone;
}

}  // namespace

Result<nlohmann::json> parseJsonBounded(std::string_view text, const JsonLimits& limits) {
  switch (scan(text, limits)) {
    case Exceeded::kDepth:
      return makeError(ErrorCode::kInvalidArgument,
                       "JSON nests deeper than " + std::to_string(limits.max_depth) + " levels");
    case Exceeded::kValues:
      return makeError(ErrorCode::kInvalidArgument,
                       "JSON has more than " + std::to_string(limits.max_values) + " values");
    case Exceeded::kNone: break;
  }
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return makeError(ErrorCode::kInvalidArgument, "not valid JSON");
  return parsed;
}

}  // namespace space
