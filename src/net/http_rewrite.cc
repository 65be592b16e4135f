#include "net/http_rewrite.h"

#include <algorithm>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/write.hpp>
#include <cctype>
#include <cstring>
#include <sstream>
#include <string_view>

#include "net/sniff.h"

namespace space::net {

namespace http = boost::beast::http;

namespace {

bool tokenEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// "" when the request's body ends where every reader agrees, else why not.
std::string checkUnambiguousFraming(const http::request<http::empty_body>& request) {
  size_t encodings = 0, lengths = 0;
  std::string_view encoding, length;
  for (const auto& field : request) {
    if (field.name() == http::field::transfer_encoding) {
      ++encodings;
      encoding = field.value();
    } else if (field.name() == http::field::content_length) {
      ++lengths;
      length = field.value();
    }
  }
  if (encodings > 0) {
    if (request.version() < 11) return "Transfer-Encoding in an HTTP/1.0 request";
    if (encodings > 1 || !tokenEquals(encoding, "chunked")) return "a Transfer-Encoding other than one \"chunked\"";
    if (lengths > 0) return "both Transfer-Encoding and Content-Length";
  }
  if (lengths > 1) return "more than one Content-Length";
  if (lengths == 1 && (length.empty() || length.find_first_not_of("0123456789") != std::string_view::npos)) {
    return "a Content-Length that is not one number";
  }
  return "";
}

}  // namespace

Result<RewrittenHead> rewriteRequestHead(std::span<const uint8_t> bytes,
                                         const std::vector<std::pair<std::string, std::string>>& set_headers,
                                         const std::vector<std::pair<std::string, std::string>>& replace,
                                         std::vector<size_t>* replaced) {
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
  // The framing the server will use to find this request's end must be the one every server
  // reads the same way (RFC 9112 6.1, 6.3): a request that could end at two places lets what
  // follows it on the connection be read as a request of its own, or as the body of one.
  if (auto framing = checkUnambiguousFraming(request); !framing.empty()) {
    return makeError(ErrorCode::kInvalidArgument, framing);
  }
  RewrittenHead rewritten;
  try {
    for (const char* hop : {"Connection", "Keep-Alive", "Proxy-Connection"}) request.erase(hop);
    if (!replace.empty()) {
      // Beast's fields cannot be changed in place: all of them are taken out and put back in
      // their order, each with its replacements made.
      std::vector<std::pair<std::string, std::string>> fields;
      bool changed = false;
      for (const auto& field : request) {
        std::string value(field.value());
        for (size_t i = 0; i < replace.size(); ++i) {
          const auto& [text, replacement] = replace[i];
          for (size_t at = value.find(text); at != std::string::npos; at = value.find(text, at + replacement.size())) {
            value.replace(at, text.size(), replacement);
            changed = true;
            if (replaced && std::find(replaced->begin(), replaced->end(), i) == replaced->end()) replaced->push_back(i);
          }
        }
        fields.emplace_back(std::string(field.name_string()), std::move(value));
      }
      if (changed) {
        for (const auto& [name, value] : fields) request.erase(name);
        for (const auto& [name, value] : fields) request.insert(name, value);
      }
      for (auto& [name, value] : fields) explicit_bzero(value.data(), value.size());
    }
    // Beast refuses (throws on) a field value over 64 KiB; callers keep values far smaller.
    for (const auto& [name, value] : set_headers) request.set(name, value);
    request.set(http::field::connection, "close");
    // The answer must be readable for masking (net::Redactor): not compressed, and whole (a
    // range would cut an echoed value where the guest chose, leaving a prefix unmasked).
    request.set(http::field::accept_encoding, "identity");
    request.erase(http::field::range);
    request.erase(http::field::if_range);
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
