#include "common/result.h"

namespace space {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kAlreadyExists: return "already_exists";
    case ErrorCode::kPermissionDenied: return "permission_denied";
    case ErrorCode::kFailedPrecondition: return "failed_precondition";
    case ErrorCode::kUnimplemented: return "unimplemented";
    case ErrorCode::kCanceled: return "canceled";
    case ErrorCode::kResourceExhausted: return "resource_exhausted";
    case ErrorCode::kDeadlineExceeded: return "deadline_exceeded";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

}  // namespace space
