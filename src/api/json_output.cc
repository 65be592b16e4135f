#include "api/json_output.h"

#include <cstdio>
#include <ctime>

namespace space::api {

std::string dumpJson(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string rfc3339(int64_t ms) {
  if (ms <= 0) return "";
  time_t secs = static_cast<time_t>(ms / 1000);
  struct tm utc {};
  gmtime_r(&secs, &utc);
  char buf[40];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &utc);
  char out[48];
  snprintf(out, sizeof out, "%s.%03dZ", buf, static_cast<int>(ms % 1000));
  return out;
}

int httpStatus(const Error& e) {
  if (e.reason == "too_many_sandboxes" || e.reason == "tenant_quota" || e.reason == "too_many_connections") {
    return 429;
  }
  if (e.reason == "insufficient_capacity" || e.reason == "shutting_down") return 503;
  if (e.reason == "payload_too_large") return 413;
  if (e.reason == "output_too_large") return 422;
  switch (e.code) {
    case ErrorCode::kInvalidArgument: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kAlreadyExists: return 409;
    case ErrorCode::kPermissionDenied: return 403;
    case ErrorCode::kFailedPrecondition: return 409;
    case ErrorCode::kResourceExhausted: return 507;  // the guest's disk or memory is full
    case ErrorCode::kDeadlineExceeded: return 504;
    case ErrorCode::kUnavailable: return 502;  // the sandbox (its VM or agent) failed us
    case ErrorCode::kUnimplemented: return 501;
    case ErrorCode::kCanceled: return 400;
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

}  // namespace space::api
