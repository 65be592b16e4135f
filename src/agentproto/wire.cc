#include "agentproto/wire.h"

#include <cerrno>

namespace space::agentproto {

std::string makeHello(const std::string& nonce) { return std::string(kHelloPrefix) + nonce + "\n"; }

std::string makeOlleh(const std::string& nonce, const std::string& info_json) {
  return std::string(kOllehPrefix) + nonce + " " + info_json + "\n";
}

Result<std::optional<HandshakeScanner::Match>> HandshakeScanner::feed(std::string_view bytes) {
  buf_.append(bytes);
  while (true) {
    size_t at = buf_.find(prefix_);
    if (at == std::string::npos) {
      // Keep only a tail that could still be the start of the prefix.
      size_t keep = std::min(buf_.size(), prefix_.size() - 1);
      discarded_ += buf_.size() - keep;
      buf_.erase(0, buf_.size() - keep);
    } else {
      discarded_ += at;
      buf_.erase(0, at);
      size_t nl = buf_.find('\n');
      if (nl == std::string::npos) {
        if (buf_.size() > kMaxHandshakeLine) {
          discarded_ += 1;  // not a real line: skip past this prefix and look again
          buf_.erase(0, 1);
          continue;
        }
      } else {
        std::string line = buf_.substr(prefix_.size(), nl - prefix_.size());
        std::string rest = buf_.substr(nl + 1);
        size_t sp = line.find(' ');
        Match m;
        m.nonce = line.substr(0, sp);
        m.payload = sp == std::string::npos ? "" : line.substr(sp + 1);
        if (nl <= kMaxHandshakeLine && !m.nonce.empty() && (nonce_.empty() || m.nonce == nonce_)) {
          m.rest = std::move(rest);
          buf_.clear();
          return std::optional<Match>(std::move(m));
        }
        discarded_ += nl + 1;  // an answer to an older hello, or garbage: skip it
        buf_ = std::move(rest);
        continue;
      }
    }
    if (discarded_ > kMaxHandshakeJunk) {
      return makeError(ErrorCode::kUnavailable,
                       "agent channel: no handshake within " + std::to_string(kMaxHandshakeJunk) + " bytes");
    }
    return std::optional<Match>();
  }
}

std::string encodeEnvelope(uint8_t flags, std::string_view payload) {
  std::string out;
  out.reserve(kEnvelopeHeader + payload.size());
  uint32_t n = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>(flags));
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out.append(payload);
  return out;
}

Status EnvelopeDecoder::checkHeader() const {
  if (buf_.size() - pos_ < kEnvelopeHeader) return okStatus();
  auto b = [&](size_t i) { return static_cast<uint8_t>(buf_[pos_ + i]); };
  if (b(0) & kEnvelopeCompressed)
    return makeError(ErrorCode::kInvalidArgument, "compressed envelopes are not supported");
  uint32_t n = (uint32_t{b(1)} << 24) | (uint32_t{b(2)} << 16) | (uint32_t{b(3)} << 8) | uint32_t{b(4)};
  if (n > max_bytes_) {
    return makeError(ErrorCode::kResourceExhausted,
                     "envelope of " + std::to_string(n) + " bytes exceeds the limit of " + std::to_string(max_bytes_));
  }
  return okStatus();
}

Status EnvelopeDecoder::feed(std::string_view bytes) {
  if (pos_ > 0) {  // drop what next() already handed out, so the buffer holds one envelope at most
    buf_.erase(0, pos_);
    pos_ = 0;
    releaseIfLarge();
  }
  buf_.append(bytes);
  SPACE_TRY(checkHeader());
  // The envelope's whole size once its header is in: reserved exactly, not grown by doubling,
  // which would give a message of 8 MiB a buffer of 16.
  if (buf_.size() >= kEnvelopeHeader) {
    auto b = [&](size_t i) { return static_cast<uint8_t>(buf_[i]); };
    const size_t n = (size_t{b(1)} << 24) | (size_t{b(2)} << 16) | (size_t{b(3)} << 8) | size_t{b(4)};
    if (buf_.capacity() < kEnvelopeHeader + n) buf_.reserve(kEnvelopeHeader + n);
  }
  return okStatus();
}

void EnvelopeDecoder::releaseIfLarge() {
  // clear() and erase() keep the allocation: a stream that once carried a large message would
  // hold its buffer for as long as it stays open, uncounted.
  if (buf_.capacity() > kKeptCapacity && buf_.size() < buf_.capacity() / 4) std::string(buf_).swap(buf_);
}

Result<std::optional<Envelope>> EnvelopeDecoder::next() {
  SPACE_TRY(checkHeader());
  if (buf_.size() - pos_ < kEnvelopeHeader) return std::optional<Envelope>();
  auto b = [&](size_t i) { return static_cast<uint8_t>(buf_[pos_ + i]); };
  uint32_t n = (uint32_t{b(1)} << 24) | (uint32_t{b(2)} << 16) | (uint32_t{b(3)} << 8) | uint32_t{b(4)};
  if (buf_.size() - pos_ - kEnvelopeHeader < n) return std::optional<Envelope>();
  Envelope e;
  e.flags = b(0);
  e.payload = buf_.substr(pos_ + kEnvelopeHeader, n);
  pos_ += kEnvelopeHeader + n;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
    releaseIfLarge();
  }
  return std::optional<Envelope>(std::move(e));
}

const char* rpcCodeName(RpcCode code) {
  switch (code) {
    case RpcCode::kOk: return "ok";
    case RpcCode::kInvalidArgument: return "invalid_argument";
    case RpcCode::kNotFound: return "not_found";
    case RpcCode::kAlreadyExists: return "already_exists";
    case RpcCode::kPermissionDenied: return "permission_denied";
    case RpcCode::kResourceExhausted: return "resource_exhausted";
    case RpcCode::kFailedPrecondition: return "failed_precondition";
    case RpcCode::kDeadlineExceeded: return "deadline_exceeded";
    case RpcCode::kUnavailable: return "unavailable";
    case RpcCode::kUnimplemented: return "unimplemented";
    case RpcCode::kCanceled: return "canceled";
    case RpcCode::kInternal: return "internal";
    case RpcCode::kUnknown: return "unknown";
  }
  return "unknown";
}

RpcCode rpcCodeFromName(std::string_view name) {
  for (RpcCode c : {RpcCode::kOk, RpcCode::kInvalidArgument, RpcCode::kNotFound, RpcCode::kAlreadyExists,
                    RpcCode::kPermissionDenied, RpcCode::kResourceExhausted, RpcCode::kFailedPrecondition,
                    RpcCode::kDeadlineExceeded, RpcCode::kUnavailable, RpcCode::kUnimplemented, RpcCode::kCanceled,
                    RpcCode::kInternal}) {
    if (name == rpcCodeName(c)) return c;
  }
  return RpcCode::kUnknown;
}

int httpStatusFor(RpcCode code) {
  switch (code) {
    case RpcCode::kOk: return 200;
    case RpcCode::kInvalidArgument: return 400;
    case RpcCode::kNotFound: return 404;
    case RpcCode::kAlreadyExists: return 409;
    case RpcCode::kPermissionDenied: return 403;
    case RpcCode::kResourceExhausted: return 429;
    case RpcCode::kFailedPrecondition: return 412;
    case RpcCode::kDeadlineExceeded: return 504;
    case RpcCode::kUnavailable: return 503;
    case RpcCode::kUnimplemented: return 501;
    case RpcCode::kCanceled: return 499;
    case RpcCode::kInternal: return 500;
    case RpcCode::kUnknown: return 500;
  }
  return 500;
}

RpcCode rpcCodeFromHttpStatus(int status) {
  switch (status) {
    case 200: return RpcCode::kOk;
    case 400: return RpcCode::kInvalidArgument;
    case 404: return RpcCode::kNotFound;
    case 409: return RpcCode::kAlreadyExists;
    case 403: return RpcCode::kPermissionDenied;
    case 429: return RpcCode::kResourceExhausted;
    case 504: return RpcCode::kDeadlineExceeded;
    case 503: return RpcCode::kUnavailable;
    default: return RpcCode::kUnknown;
  }
}

RpcCode rpcCodeFromErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return RpcCode::kNotFound;
    case EEXIST:
    case ENOTEMPTY: return RpcCode::kAlreadyExists;
    case EACCES:
    case EPERM:
    case EROFS: return RpcCode::kPermissionDenied;
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
    case ENOMEM: return RpcCode::kResourceExhausted;
    case EINVAL:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case EXDEV: return RpcCode::kInvalidArgument;
    case ETIMEDOUT: return RpcCode::kDeadlineExceeded;
    default: return RpcCode::kInternal;
  }
}

}  // namespace space::agentproto
