#include "api/json_input.h"

#include "common/bounded_json.h"

namespace space::api {

namespace {

Error invalid(const std::string& name, const std::string& what) {
  return makeError(ErrorCode::kInvalidArgument, name + ": " + what);
}

// Request bodies nest a few levels and hold at most thousands of values (env, metadata, argv).
constexpr JsonLimits kBodyLimits{.max_depth = 32, .max_values = 100000};

Error notJson(const Error& why) {
  return makeError(ErrorCode::kInvalidArgument, "request body is not valid JSON: " + why.message);
}

}  // namespace

Result<nlohmann::json> readJsonBody(http::Request& request, size_t max_bytes) {
  JsonBoundsScanner scanner(kBodyLimits);
  auto body = request.readBody(max_bytes, [&](std::string_view piece) -> Status {
    auto ok = scanner.feed(piece);
    if (!ok.ok()) return notJson(ok.error());
    return okStatus();
  });
  if (!body.ok()) {
    if (body.error().code == ErrorCode::kResourceExhausted) {
      return makeError(ErrorCode::kResourceExhausted, body.error().message, "payload_too_large");
    }
    return body.error();
  }
  return parseJsonBody(body.value());
}

Result<nlohmann::json> parseJsonBody(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return nlohmann::json::object();
  auto bounded = parseJsonBounded(body, kBodyLimits);
  if (!bounded.ok()) return notJson(bounded.error());
  nlohmann::json parsed = std::move(bounded.value());
  if (!parsed.is_object()) return makeError(ErrorCode::kInvalidArgument, "request body must be a JSON object");
  return parsed;
}

const nlohmann::json* ObjectReader::field(const std::string& name) {
  known_.insert(name);
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::optional<std::string>> ObjectReader::string(const std::string& name, size_t max_bytes) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) return invalid(name, "must be a string");
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_bytes) return invalid(name, "longer than " + std::to_string(max_bytes) + " bytes");
  return std::optional<std::string>(s);
}

Result<std::optional<int64_t>> ObjectReader::integer(const std::string& name, int64_t min, int64_t max) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<int64_t>();
  std::string range = "must be an integer in " + std::to_string(min) + ".." + std::to_string(max);
  if (!v->is_number_integer()) return invalid(name, range);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return invalid(name, range);
  int64_t n = v->get<int64_t>();
  if (n < min || n > max) return invalid(name, range);
  return std::optional<int64_t>(n);
}

Result<std::optional<bool>> ObjectReader::boolean(const std::string& name) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return invalid(name, "must be true or false");
  return std::optional<bool>(v->get<bool>());
}

Result<std::optional<const nlohmann::json*>> ObjectReader::object(const std::string& name) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<const nlohmann::json*>();
  if (!v->is_object()) return invalid(name, "must be an object");
  return std::optional<const nlohmann::json*>(v);
}

Result<std::optional<std::map<std::string, std::string>>> ObjectReader::stringMap(const std::string& name,
                                                                                  size_t max_entries,
                                                                                  size_t max_bytes) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<std::map<std::string, std::string>>();
  if (!v->is_object()) return invalid(name, "must be an object of strings");
  if (v->size() > max_entries) return invalid(name, "more than " + std::to_string(max_entries) + " entries");
  std::map<std::string, std::string> out;
  size_t bytes = 0;
  for (const auto& [key, value] : v->items()) {
    if (!value.is_string()) return invalid(name + "." + key, "must be a string");
    if (key.empty()) return invalid(name, "empty key");
    if (key.find('\0') != std::string::npos || value.get_ref<const std::string&>().find('\0') != std::string::npos) {
      return invalid(name + "." + key, "contains a NUL byte");
    }
    bytes += key.size() + value.get_ref<const std::string&>().size();
    out[key] = value.get<std::string>();
  }
  if (bytes > max_bytes) return invalid(name, "larger than " + std::to_string(max_bytes) + " bytes");
  return std::optional<std::map<std::string, std::string>>(std::move(out));
}

Result<std::optional<std::vector<std::string>>> ObjectReader::stringArray(const std::string& name, size_t max_entries,
                                                                          size_t max_bytes) {
  const nlohmann::json* v = field(name);
  if (!v) return std::optional<std::vector<std::string>>();
  if (!v->is_array()) return invalid(name, "must be an array of strings");
  if (v->size() > max_entries) return invalid(name, "more than " + std::to_string(max_entries) + " entries");
  std::vector<std::string> out;
  size_t bytes = 0;
  for (const auto& item : *v) {
    if (!item.is_string()) return invalid(name, "must be an array of strings");
    if (item.get_ref<const std::string&>().find('\0') != std::string::npos) {
      return invalid(name, "contains a NUL byte");
    }
    bytes += item.get_ref<const std::string&>().size();
    out.push_back(item.get<std::string>());
  }
  if (bytes > max_bytes) return invalid(name, "larger than " + std::to_string(max_bytes) + " bytes");
  return std::optional<std::vector<std::string>>(std::move(out));
}

Status ObjectReader::finish() const {
  for (const auto& [key, value] : object_.items()) {
    if (!known_.count(key)) return makeError(ErrorCode::kInvalidArgument, "unknown field \"" + key + "\"");
  }
  return okStatus();
}

Status checkPath(std::string_view path, std::string_view field) {
  const std::string name(field);
  if (path.empty()) return invalid(name, "must not be empty");
  if (path.size() > 4096) return invalid(name, "longer than 4096 bytes");
  if (path.find('\0') != std::string_view::npos) return invalid(name, "contains a NUL byte");
  return okStatus();
}

Result<std::optional<std::map<std::string, std::string>>> ObjectReader::envMap(const std::string& name,
                                                                               size_t max_entries) {
  auto map = stringMap(name, max_entries);
  if (!map.ok() || !map.value()) return map;
  for (const auto& [key, value] : **map) {
    if (key.find('=') != std::string::npos) return invalid(name + "." + key, "a variable's name cannot contain '='");
  }
  return map;
}

}  // namespace space::api
