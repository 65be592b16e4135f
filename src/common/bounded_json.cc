#include "common/bounded_json.h"

#include <string>

namespace space {

// One linear pass over the text, before any DOM exists: nesting depth, and an upper bound on the
// number of values (each value is the first in its document or container, or follows a comma).
// Stops at the first bound crossed, allocates nothing. Strings are skipped with their escapes;
// everything else about validity is left to the parser.
//
// Not nlohmann's parser callback, though it sees depths too: in 3.11.2 the callback parser
// rescans the enclosing container each time an object closes, which makes `[{},{},...]`
// quadratic (100,000 members: 11 s instead of 9 ms), and it keeps a pointer per open bracket
// even for discarded values. Neither holds for a pre-scan followed by the plain parser.
Status JsonBoundsScanner::feed(std::string_view piece) {
  for (size_t i = 0; i < piece.size() && exceeded_ == 0; ++i) {
    const char c = piece[i];
    if (in_string_) {
      if (escaped_) {
        escaped_ = false;
      } else if (c == '\\') {
        escaped_ = true;
      } else if (c == '"') {
        in_string_ = false;
      }
      continue;
    }
    switch (c) {
      case '"': in_string_ = true; break;
      case '[':
      case '{':
        // A container is a value too: counting only commas let `[[[...]]]` members (one comma
        // each, 60 nodes each) past the bound eightfold (found by review: 8.3 M values, 521 MB).
        if (++depth_ > limits_.max_depth) exceeded_ = 1;
        if (++values_ > limits_.max_values) exceeded_ = 2;
        break;
      case ']':
      case '}': --depth_; break;
      case ',':
        if (++values_ > limits_.max_values) exceeded_ = 2;
        break;
      default: break;
    }
  }
  if (exceeded_ == 1) {
    return makeError(ErrorCode::kInvalidArgument,
                     "JSON nests deeper than " + std::to_string(limits_.max_depth) + " levels");
  }
  if (exceeded_ == 2) {
    return makeError(ErrorCode::kInvalidArgument,
                     "JSON has more than " + std::to_string(limits_.max_values) + " values");
  }
  return okStatus();
}

Result<nlohmann::json> parseJsonBounded(std::string_view text, const JsonLimits& limits) {
  JsonBoundsScanner scanner(limits);
  SPACE_TRY(scanner.feed(text));
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return makeError(ErrorCode::kInvalidArgument, "not valid JSON");
  return parsed;
}

}  // namespace space
