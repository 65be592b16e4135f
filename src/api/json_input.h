// Strict reading of JSON request bodies: the body must be an object, every field must have
// the expected type and range, and a field the endpoint does not know is an error naming it
// (a misspelt "timeout" must not silently become the default). Errors are kInvalidArgument
// with messages that name the field, e.g. `cpus: must be an integer in 1..256`.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "http/message.h"

namespace space::api {

// Parses a request body; an empty body is an empty object.
Result<nlohmann::json> parseJsonBody(std::string_view body);

// Reads the request's body (at most max_bytes: else kResourceExhausted, reason
// "payload_too_large") and parses it as parseJsonBody does. The nesting and value bounds are
// checked while the bytes arrive, so a body nested past them is refused after its first bytes,
// never buffered whole.
Result<nlohmann::json> readJsonBody(http::Request& request, size_t max_bytes);

class ObjectReader {
 public:
  explicit ObjectReader(const nlohmann::json& object) : object_(object) {}

  // Each returns nullopt when the field is absent (or null), an error when it has the wrong type.
  Result<std::optional<std::string>> string(const std::string& name, size_t max_bytes = 4096);
  Result<std::optional<int64_t>> integer(const std::string& name, int64_t min, int64_t max);
  Result<std::optional<bool>> boolean(const std::string& name);
  // An object of string values, e.g. env and metadata.
  Result<std::optional<std::map<std::string, std::string>>> stringMap(const std::string& name, size_t max_entries,
                                                                      size_t max_bytes = 64 * 1024);
  // Environment variables: a string map whose names contain no '=' (the guest refuses those;
  // refused here, before a sandbox is made or a pooled guest spent).
  Result<std::optional<std::map<std::string, std::string>>> envMap(const std::string& name, size_t max_entries);
  Result<std::optional<std::vector<std::string>>> stringArray(const std::string& name, size_t max_entries,
                                                              size_t max_bytes = 64 * 1024);
  // Fails on the first field that no accessor above asked for.
  Status finish() const;
  // A JSON object, as given (its reader checks it).
  Result<std::optional<const nlohmann::json*>> object(const std::string& name);

 private:
  const nlohmann::json* field(const std::string& name);
  const nlohmann::json& object_;
  std::set<std::string> known_;
};

// A path as given by a client: no NUL bytes, not empty, at most 4096 bytes (PATH_MAX).
Status checkPath(std::string_view path, std::string_view field);

}  // namespace space::api
