// The agent channel's wire pieces shared by host and guest, all pure and bounded:
//  - the session handshake that resynchronises a fresh byte stream on the virtio-serial port
//    (a port keeps no framing across host reconnects, and stale bytes of an old session may
//    still arrive), and doubles as the host's "agent ready" signal;
//  - Connect-protocol envelopes (flags + uint32 length + JSON) for streaming RPCs;
//  - Connect error codes and their HTTP statuses.
// After the handshake the stream carries HTTP/2 (h2c, prior knowledge): host = client.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::agentproto {

// ---- handshake
//   host -> guest: "SPACE-HELLO <nonce>\n"          (repeated with a new nonce until answered)
//   guest -> host: "SPACE-OLLEH <nonce> <info>\n"   <info>: JSON object without newlines
// Each side discards whatever precedes the line it waits for (bounded by kMaxHandshakeJunk).
// The host then sends the HTTP/2 client preface; the guest starts its HTTP/2 server session.
inline constexpr std::string_view kHelloPrefix = "SPACE-HELLO ";
inline constexpr std::string_view kOllehPrefix = "SPACE-OLLEH ";
inline constexpr size_t kMaxHandshakeJunk = 4 << 20;
// The host opens every connection with this many zero bytes before its first hello. A guest
// still inside an HTTP/2 session of a previous host (the detach went unseen) is then forced to
// finish any partial frame (at most 9 + 16384 bytes) and fail on what follows, so it returns to
// scanning for the hello instead of swallowing it as frame payload.
inline constexpr size_t kHelloFiller = 32 << 10;
inline constexpr size_t kMaxHandshakeLine = 4096;

std::string makeHello(const std::string& nonce);
std::string makeOlleh(const std::string& nonce, const std::string& info_json);

// Incremental scanner for one handshake line. feed() consumes bytes and reports when a line
// with the wanted prefix (and, for OLLEH, the wanted nonce) is complete; bytes after that line
// are returned in `rest` (they belong to the next protocol).
class HandshakeScanner {
 public:
  // prefix: kHelloPrefix or kOllehPrefix; nonce: required nonce (empty: any).
  HandshakeScanner(std::string_view prefix, std::string nonce) : prefix_(prefix), nonce_(std::move(nonce)) {}
  void expectNonce(std::string nonce) { nonce_ = std::move(nonce); }

  struct Match {
    std::string nonce;
    std::string payload;  // text after the nonce (OLLEH info), may be empty
    std::string rest;     // bytes after the line
  };
  // Returns a match once found; an error once more than kMaxHandshakeJunk bytes went by without one.
  Result<std::optional<Match>> feed(std::string_view bytes);

 private:
  std::string prefix_;
  std::string nonce_;
  std::string buf_;
  size_t discarded_ = 0;
};

// ---- Connect envelopes
inline constexpr uint8_t kEnvelopeEndStream = 0x02;
inline constexpr uint8_t kEnvelopeCompressed = 0x01;
inline constexpr size_t kEnvelopeHeader = 5;
inline constexpr size_t kMaxEnvelopeBytes = 8 << 20;

std::string encodeEnvelope(uint8_t flags, std::string_view payload);

struct Envelope {
  uint8_t flags = 0;
  std::string payload;
};

// Splits a byte stream into envelopes: feed() bytes, then take next() until it yields nothing.
// Refuses compressed envelopes and lengths over the bound as soon as the header is seen, before
// buffering the body.
class EnvelopeDecoder {
 public:
  explicit EnvelopeDecoder(size_t max_bytes = kMaxEnvelopeBytes) : max_bytes_(max_bytes) {}
  Status feed(std::string_view bytes);
  Result<std::optional<Envelope>> next();
  bool midMessage() const { return pos_ < buf_.size(); }
  // The memory it holds for a message under way: its buffer's allocation while it holds bytes.
  // An empty one keeps at most kKeptCapacity.
  size_t bufferedBytes() const { return buf_.empty() ? 0 : buf_.capacity(); }
  static constexpr size_t kKeptCapacity = 64 << 10;

 private:
  Status checkHeader() const;
  void releaseIfLarge();
  size_t max_bytes_;
  std::string buf_;
  size_t pos_ = 0;  // start of the first envelope not yet taken
};

// ---- errors
// Connect's error codes (snake_case) for the agent's error kinds.
enum class RpcCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kDeadlineExceeded,
  kUnavailable,
  kUnimplemented,
  kCanceled,
  kInternal,
  kUnknown,
};
const char* rpcCodeName(RpcCode code);
RpcCode rpcCodeFromName(std::string_view name);
int httpStatusFor(RpcCode code);
RpcCode rpcCodeFromHttpStatus(int status);
// The stable error code an errno maps to (ENOENT -> not_found, ENOSPC -> resource_exhausted, ...).
RpcCode rpcCodeFromErrno(int err);

struct RpcError {
  RpcCode code = RpcCode::kUnknown;
  std::string message;
};

}  // namespace space::agentproto
