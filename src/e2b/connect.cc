#include "e2b/connect.h"

#include <cctype>

#include "agentproto/base64.h"

namespace space::e2b {

Result<std::string> unwrapRequestEnvelope(std::string_view body, size_t max_payload) {
  if (body.size() < 5) return makeError(ErrorCode::kInvalidArgument, "the request is not a Connect envelope");
  const auto flags = static_cast<uint8_t>(body[0]);
  if (flags != kEnvelopeData) {
    return makeError(ErrorCode::kInvalidArgument, flags & kEnvelopeCompressed
                                                      ? "compressed Connect messages are not supported"
                                                      : "the request envelope has unexpected flags");
  }
  uint64_t n = 0;
  for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<unsigned char>(body[i]);
  if (n > max_payload) {
    return makeError(ErrorCode::kInvalidArgument,
                     "the request message is over " + std::to_string(max_payload) + " bytes");
  }
  if (body.size() - 5 != n) {
    return makeError(ErrorCode::kInvalidArgument, "the request envelope says " + std::to_string(n) + " bytes but " +
                                                      std::to_string(body.size() - 5) +
                                                      " follow (one message per server-streaming call)");
  }
  return std::string(body.substr(5));
}

nlohmann::json connectError(const Error& error) {
  return nlohmann::json{{"code", errorCodeName(error.code)}, {"message", error.message}};
}

std::string endStream(const std::optional<Error>& error) {
  nlohmann::json body = nlohmann::json::object();
  if (error) body["error"] = connectError(*error);
  return envelope(kEnvelopeEndStream, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

int connectHttpStatus(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return 400;
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kAlreadyExists: return 409;
    case ErrorCode::kPermissionDenied: return 403;
    case ErrorCode::kFailedPrecondition: return 400;
    case ErrorCode::kResourceExhausted: return 429;
    case ErrorCode::kDeadlineExceeded: return 504;
    case ErrorCode::kUnavailable: return 503;
    case ErrorCode::kUnimplemented: return 501;
    case ErrorCode::kCanceled: return 499;
    case ErrorCode::kInternal: return 500;
  }
  return 500;
}

Result<std::optional<std::string>> basicAuthUser(std::string_view authorization) {
  constexpr std::string_view kBasic = "Basic ";
  if (authorization.size() < kBasic.size()) return std::optional<std::string>();
  for (size_t i = 0; i < kBasic.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) !=
        std::tolower(static_cast<unsigned char>(kBasic[i]))) {
      return std::optional<std::string>();
    }
  }
  std::string_view encoded = authorization.substr(kBasic.size());
  while (!encoded.empty() && encoded.front() == ' ') encoded.remove_prefix(1);
  while (!encoded.empty() && encoded.back() == ' ') encoded.remove_suffix(1);
  if (encoded.size() > 256) return makeError(ErrorCode::kInvalidArgument, "Authorization: Basic credentials too long");
  auto decoded = agentproto::base64Decode(encoded);
  if (!decoded) return makeError(ErrorCode::kInvalidArgument, "Authorization: Basic credentials are not base64");
  const std::string user = decoded->substr(0, decoded->find(':'));
  bool valid = !user.empty() && user.size() <= 64;
  for (char ch : user) valid = valid && static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f;
  if (!valid) return makeError(ErrorCode::kInvalidArgument, "Authorization: Basic names no valid user");
  return std::optional<std::string>(user);
}

}  // namespace space::e2b
