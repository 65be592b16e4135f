// What the HTTP APIs (SPACE's and the E2B front ends) write: JSON text that survives invalid
// UTF-8 from guests, and times as RFC 3339.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/result.h"

namespace space::api {

// JSON text that tolerates invalid UTF-8 in strings (command output, guest file names): such
// bytes become U+FFFD instead of failing the whole response.
std::string dumpJson(const nlohmann::json& value);

// "2026-12-02T08:00:00.123Z" for ms since the epoch; "" for 0 or less (never set).
std::string rfc3339(int64_t ms);

// The HTTP status an API error goes out with: its reason first (quotas 429, capacity 503, ...),
// then its code (not_found 404, unavailable 502: the sandbox failed us, ...).
int httpStatus(const Error& e);

}  // namespace space::api
