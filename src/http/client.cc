#include "http/client.h"

#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <cctype>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/bounded_json.h"
#include "http/tcp.h"
#include "http/tls_relay.h"

namespace space::http {

namespace beast_http = boost::beast::http;

namespace {

constexpr size_t kChunkSize = 64 * 1024;
constexpr uint32_t kMaxResponseHeader = 64 * 1024;

std::string lowerCase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool hasLineBreak(std::string_view text) {
  return text.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

}  // namespace

RequestBody RequestBody::fromSource(BodySource source, std::optional<uint64_t> length) {
  RequestBody body;
  body.source_ = std::move(source);
  body.source_length_ = length;
  return body;
}

Client::Client(std::string host, uint16_t port, std::string base_path, std::shared_ptr<boost::asio::ssl::context> tls)
    : host_(std::move(host)),
      port_(port),
      authority_(detail::formatHostPort(host_, port_)),
      base_path_(std::move(base_path)),
      tls_(std::move(tls)) {}

Result<Client> Client::create(const std::string& base_url, const std::string& ca_file) {
  std::string_view rest = base_url;
  const bool https = rest.starts_with("https://");
  if (https) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return makeError(ErrorCode::kInvalidArgument,
                     "unsupported URL scheme in \"" + base_url + "\"; use http://host:port or https://host:port");
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string base_path(slash == std::string_view::npos ? std::string_view() : rest.substr(slash));
  while (!base_path.empty() && base_path.back() == '/') base_path.pop_back();
  auto where = detail::parseHostPort(authority, false, https ? 443 : 80);
  if (!where.ok()) return where.error();
  std::shared_ptr<boost::asio::ssl::context> tls;
  if (https) {
    auto context = clientTlsContext(ca_file);
    if (!context.ok()) return context.error();
    tls = std::move(context.value());
  }
  return Client(std::move(where->host), where->port, std::move(base_path), std::move(tls));
}

Result<UniqueFd> Client::open(Clock::time_point deadline) const {
  auto connected = detail::connectTcp(detail::HostPort{host_, port_}, deadline);
  if (!connected.ok() || !tls_) return connected;
  return connectTls(std::move(connected.value()), host_, tls_, deadline);
}

Result<UniqueFd> Client::connect(std::chrono::milliseconds timeout) const { return open(Clock::now() + timeout); }

Result<ClientResponse> Client::request(const std::string& method, const std::string& target,
                                       const std::map<std::string, std::string>& headers, RequestBody body,
                                       std::chrono::milliseconds timeout) const {
  return perform(method, target, headers, body, nullptr, nullptr, timeout, true);
}

Result<ClientResponse> Client::requestStreaming(const std::string& method, const std::string& target,
                                                const std::map<std::string, std::string>& headers, RequestBody body,
                                                const HeadCallback& on_head, const ChunkCallback& on_chunk,
                                                std::chrono::milliseconds timeout) const {
  return perform(method, target, headers, body, &on_head, &on_chunk, timeout, false);
}

Result<ClientResponse> Client::perform(const std::string& method, const std::string& target,
                                       const std::map<std::string, std::string>& headers, RequestBody& body,
                                       const HeadCallback* on_head, const ChunkCallback* on_chunk,
                                       std::chrono::milliseconds timeout, bool whole_deadline) const {
  if (method.empty() || hasLineBreak(method) || method.find(' ') != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "invalid HTTP method \"" + method + "\"");
  }
  if (target.empty() || target[0] != '/' || hasLineBreak(target) || target.find(' ') != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument,
                     "invalid request target \"" + target + "\" (encode it with urlEncode)");
  }
  for (const auto& [name, value] : headers) {
    if (name.empty() || hasLineBreak(name) || hasLineBreak(value) || name.find(':') != std::string::npos) {
      return makeError(ErrorCode::kInvalidArgument, "invalid request header \"" + name + "\"");
    }
  }

  bool has_timeout = timeout.count() > 0;
  auto deadline = whole_deadline && has_timeout ? Clock::now() + timeout : Clock::time_point::max();
  auto connect_deadline = has_timeout ? Clock::now() + timeout : Clock::time_point::max();
  auto connected = open(std::min(deadline, connect_deadline));
  if (!connected.ok()) return connected.error();
  detail::SocketStream stream(std::move(connected.value()));
  auto per_operation = whole_deadline ? std::chrono::milliseconds(0) : timeout;
  stream.setTimeouts(per_operation, per_operation);
  stream.setReadDeadline(deadline);
  stream.setWriteDeadline(deadline);

  auto transportError = [&](std::string_view doing, const boost::system::error_code& ec) {
    if (ec == boost::asio::error::timed_out) {
      return makeError(ErrorCode::kDeadlineExceeded, "timed out " + std::string(doing) + " " + authority_);
    }
    return makeError(ErrorCode::kUnavailable, std::string(doing) + " " + authority_ + ": " + ec.message());
  };

  beast_http::request<beast_http::empty_body> head;
  head.version(11);
  head.method_string(method);
  head.target(base_path_ + target);
  head.set(beast_http::field::host, authority_);
  head.set(beast_http::field::user_agent, "space-http-client");
  for (const auto& [name, value] : headers) head.set(name, value);
  // One request per connection: saying so lets the server release its thread right away.
  head.keep_alive(false);
  bool chunked_body = false;
  if (body.source_) {
    if (body.source_length_) {
      head.content_length(*body.source_length_);
    } else {
      head.chunked(true);
      chunked_body = true;
    }
  } else if (!body.data_.empty() || (method != "GET" && method != "HEAD" && method != "DELETE")) {
    head.content_length(body.data_.size());
  }

  // A failed write is remembered, not returned at once: the server may have answered early
  // (413 for a body it refuses) and closed, and that answer is the better error.
  boost::system::error_code write_error;
  beast_http::request_serializer<beast_http::empty_body> serializer(head);
  beast_http::write_header(stream, serializer, write_error);
  if (!write_error && body.source_) {
    std::vector<char> chunk(kChunkSize);
    uint64_t sent = 0;
    while (!write_error) {
      auto n = body.source_(chunk.data(), chunk.size());
      if (!n.ok()) return n.error();
      if (*n == 0) break;
      sent += *n;
      if (body.source_length_ && sent > *body.source_length_) {
        return makeError(ErrorCode::kInvalidArgument, "the request body source produced more than its " +
                                                          std::to_string(*body.source_length_) + " bytes");
      }
      auto data = boost::asio::const_buffer(chunk.data(), *n);
      if (chunked_body) {
        boost::asio::write(stream, beast_http::make_chunk(data), write_error);
      } else {
        boost::asio::write(stream, data, write_error);
      }
    }
    if (!write_error && body.source_length_ && sent != *body.source_length_) {
      return makeError(ErrorCode::kInvalidArgument, "the request body source ended after " + std::to_string(sent) +
                                                        " of its " + std::to_string(*body.source_length_) + " bytes");
    }
    if (!write_error && chunked_body) boost::asio::write(stream, beast_http::make_chunk_last(), write_error);
  } else if (!write_error && !body.data_.empty()) {
    boost::asio::write(stream, boost::asio::buffer(body.data_), write_error);
  }

  boost::beast::flat_buffer buffer;
  std::optional<beast_http::response_parser<beast_http::buffer_body>> parser;
  while (true) {
    parser.emplace();
    parser->header_limit(kMaxResponseHeader);
    parser->body_limit(boost::none);
    if (method == "HEAD") parser->skip(true);
    boost::system::error_code ec;
    beast_http::read_header(stream, buffer, *parser, ec);
    if (ec) {
      if (write_error) return transportError("sending the request to", write_error);
      return transportError("reading the response from", ec);
    }
    unsigned status = parser->get().result_int();
    if (status < 100 || status >= 200) break;  // interim responses (100 Continue) precede the real one
  }

  ClientResponse response;
  response.status = static_cast<int>(parser->get().result_int());
  for (const auto& field : parser->get()) {
    std::string name = lowerCase(field.name_string());
    auto [it, inserted] = response.headers.emplace(name, std::string(field.value()));
    if (!inserted) it->second += ", " + std::string(field.value());
  }
  if (on_head != nullptr && *on_head) SPACE_TRY((*on_head)(response));

  std::vector<char> chunk(kChunkSize);
  while (!parser->is_done()) {
    auto& piece = parser->get().body();
    piece.data = chunk.data();
    piece.size = chunk.size();
    boost::system::error_code ec;
    beast_http::read_some(stream, buffer, *parser, ec);
    if (ec == beast_http::error::need_buffer) ec = {};
    if (ec) return transportError("reading the response body from", ec);
    size_t n = chunk.size() - parser->get().body().size;
    if (n == 0) continue;
    if (on_chunk != nullptr) {
      if (*on_chunk) SPACE_TRY((*on_chunk)(std::string_view(chunk.data(), n)));
    } else {
      response.body.append(chunk.data(), n);
    }
  }
  return response;
}

namespace {

std::optional<ErrorCode> errorCodeFromName(std::string_view name) {
  // kInternal is the last code.
  for (int i = 0; i <= static_cast<int>(ErrorCode::kInternal); ++i) {
    auto code = static_cast<ErrorCode>(i);
    if (name == errorCodeName(code)) return code;
  }
  return std::nullopt;
}

ErrorCode errorCodeForStatus(int status) {
  switch (status) {
    case 400: return ErrorCode::kInvalidArgument;
    case 403: return ErrorCode::kPermissionDenied;
    case 404: return ErrorCode::kNotFound;
    case 405:
    case 501: return ErrorCode::kUnimplemented;
    case 409: return ErrorCode::kAlreadyExists;
    case 412: return ErrorCode::kFailedPrecondition;
    case 413:
    case 429:
    case 431: return ErrorCode::kResourceExhausted;
    case 503: return ErrorCode::kUnavailable;
    case 504: return ErrorCode::kDeadlineExceeded;
    default: return status >= 400 && status < 500 ? ErrorCode::kInvalidArgument : ErrorCode::kInternal;
  }
}

}  // namespace

Error responseError(const ClientResponse& response) {
  auto parsed = parseJsonBounded(response.body);
  const nlohmann::json json = parsed.ok() ? std::move(parsed.value()) : nlohmann::json();
  if (json.is_object() && json.contains("error") && json["error"].is_object()) {
    const auto& error = json["error"];
    auto code = error.contains("code") && error["code"].is_string()
                    ? errorCodeFromName(error["code"].get<std::string>())
                    : std::nullopt;
    if (error.contains("message") && error["message"].is_string()) {
      return makeError(code.value_or(errorCodeForStatus(response.status)), error["message"].get<std::string>());
    }
  }
  std::string reason(beast_http::obsolete_reason(static_cast<beast_http::status>(response.status)));
  return makeError(errorCodeForStatus(response.status), "HTTP " + std::to_string(response.status) + " " + reason);
}

}  // namespace space::http
