#include "common/bounded_json.h"

#include <string>

namespace space {

Result<nlohmann::json> parseJsonBounded(std::string_view text, const JsonLimits& limits) {
  using nlohmann::json;
  enum class Exceeded { kNone, kDepth, kValues } exceeded = Exceeded::kNone;
  size_t values = 0;
  // The callback sees every value as it is parsed, with the depth of its container. Once a bound
  // is crossed everything after it is discarded (returning false drops the value), so nothing
  // deep or large is ever built; the parse still runs to the end of the text, in linear time.
  json::parser_callback_t bound = [&](int depth, json::parse_event_t event, json&) {
    if (exceeded != Exceeded::kNone) return false;
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth + 1 > limits.max_depth) {
          exceeded = Exceeded::kDepth;
          return false;
        }
        [[fallthrough]];
      case json::parse_event_t::value:
        if (++values > limits.max_values) {
          exceeded = Exceeded::kValues;
          return false;
        }
        return true;
      default:
        return true;
    }
  };
  json parsed = json::parse(text, bound, /*allow_exceptions=*/false);
  switch (exceeded) {
    case Exceeded::kDepth:
      return makeError(ErrorCode::kInvalidArgument,
                       "JSON nests deeper than " + std::to_string(limits.max_depth) + " levels");
    case Exceeded::kValues:
      return makeError(ErrorCode::kInvalidArgument,
                       "JSON has more than " + std::to_string(limits.max_values) + " values");
    case Exceeded::kNone:
      break;
  }
  if (parsed.is_discarded()) return makeError(ErrorCode::kInvalidArgument, "not valid JSON");
  return parsed;
}

}  // namespace space
