// Where one HTTP/1.1 request ends in a stream of guest bytes: its head, then its body as its
// framing says (Content-Length, or chunked up to the last chunk and trailer). The gateway sends
// exactly one request with a credential and nothing after it on that connection: a pipelined
// second request, or bytes meant to be read as one by a server that frames differently, would
// otherwise reach the server on the credentialed connection. Parsed with Boost.Beast; guest
// bytes: a chunk line or trailer is held at most kMaxPendingBytes while incomplete.
#pragma once

#include <array>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace space::net {

class RequestEnd {
 public:
  static constexpr size_t kMaxPendingBytes = 16 * 1024;
  static constexpr std::uint32_t kMaxHeadBytes = 1 << 20;
  RequestEnd();

  // Of `bytes`, the next ones of the stream (which starts with the request head), how many
  // belong to the request: all of them until its end is in them, none after.
  size_t take(std::span<const uint8_t> bytes);
  bool ended() const { return ended_; }
  // The framing is broken (or a pending line too long): nothing more should be sent.
  bool failed() const { return failed_; }

 private:
  boost::beast::http::request_parser<boost::beast::http::buffer_body> parser_;
  std::array<char, 8192> scratch_{};  // body bytes land here and are dropped: only the end matters
  std::vector<uint8_t> pending_;      // bytes the parser needs more of before it consumes them
  uint64_t fed_ = 0;                  // bytes given to take() so far
  uint64_t consumed_ = 0;             // bytes the parser consumed so far
  bool ended_ = false;
  bool failed_ = false;
};

}  // namespace space::net
