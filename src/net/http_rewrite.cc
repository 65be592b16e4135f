#include "net/http_rewrite.h"

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/write.hpp>
#include <sstream>

#include "net/sniff.h"

namespace space::net {

namespace http = boost::beast::http;

Result<RewrittenHead> rewriteRequestHead(std::span<const uint8_t> bytes,
                                         const std::vector<std::pair<std::string, std::string>>& set_headers) {
  http::request_parser<http::empty_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(kMaxSniffBytes));
  parser.eager(false);             // the head only: the body is relayed as it is, never parsed here
  parser.body_limit(boost::none);  // as sniff() reads it: a large upload's head is a head
  boost::system::error_code ec;
  size_t consumed = parser.put(boost::asio::buffer(bytes.data(), bytes.size()), ec);
  if (ec || !parser.is_header_done()) {
    return makeError(ErrorCode::kInvalidArgument,
                     "not a complete HTTP request head" + (ec ? ": " + ec.message() : std::string()));
  }
  http::request<http::empty_body>& request = parser.get();
  RewrittenHead rewritten;
  try {
    for (const char* hop : {"Connection", "Keep-Alive", "Proxy-Connection"}) request.erase(hop);
    // Beast refuses (throws on) a field value over 64 KiB; callers keep values far smaller.
    for (const auto& [name, value] : set_headers) request.set(name, value);
    request.set(http::field::connection, "close");
    std::ostringstream out;
    out << request.base();
    rewritten.head = out.str();
  } catch (const std::exception& e) {
    return makeError(ErrorCode::kInvalidArgument, std::string("cannot rewrite the request head: ") + e.what());
  }
  rewritten.consumed = consumed;
  rewritten.method = std::string(request.method_string());
  rewritten.target = std::string(request.target());
  return rewritten;
}

}  // namespace space::net
