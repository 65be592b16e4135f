#include "http/message.h"

#include <poll.h>

#include <boost/asio/write.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/span_body.hpp>
#include <boost/beast/http/write.hpp>

#include "http/exchange.h"
#include "http/url.h"

namespace space::http {

namespace beast_http = boost::beast::http;

namespace {

constexpr size_t kBodyReadStep = 64 * 1024;

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

bool isTokenChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

Error bodyTooLarge(size_t max_bytes) {
  return makeError(ErrorCode::kResourceExhausted,
                   "request body exceeds the limit of " + std::to_string(max_bytes) + " bytes");
}

// Handlers send final responses only; 1xx belong to the server and the protocol.
Status checkStatus(int status) {
  if (status < 200 || status > 599) {
    return makeError(ErrorCode::kInvalidArgument, "invalid response status " + std::to_string(status));
  }
  return okStatus();
}

bool statusForbidsBody(int status) { return status == 204 || status == 304; }

}  // namespace

nlohmann::json errorBody(std::string_view code, std::string_view message) {
  return {{"error", {{"code", code}, {"message", message}}}};
}

// ---- Request ----

std::optional<std::string> Request::query(std::string_view name) const {
  auto it = query_.find(std::string(name));
  if (it == query_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Request::header(std::string_view name) const {
  std::optional<std::string> value;
  for (const auto& [field, field_value] : headers_) {
    if (!equalsIgnoreCase(field, name)) continue;
    if (value) {
      *value += ", ";
      *value += field_value;
    } else {
      value = field_value;
    }
  }
  return value;
}

const std::string& Request::pathParam(std::string_view name) const {
  static const std::string kMissing;
  auto it = path_params_.find(name);
  return it == path_params_.end() ? kMissing : it->second;
}

void Response::closeConnection() { exchange_->closeAfterResponse(); }

Result<std::string> Request::readBody(size_t max_bytes) { return readBody(max_bytes, BodyCheck()); }

Result<std::string> Request::readBody(size_t max_bytes, const BodyCheck& check) {
  if (body_use_ != BodyUse::kNone) {
    return makeError(ErrorCode::kFailedPrecondition, "the request body was already read");
  }
  body_use_ = BodyUse::kWhole;
  if (content_length_ && *content_length_ > max_bytes) {
    Error error = bodyTooLarge(max_bytes);
    exchange_->failBody(413, error);
    return error;
  }
  std::string body;
  // What the client declares is reserved only up to a step: a body refused by `check` after
  // its first bytes must not have cost its declared size.
  if (content_length_) body.reserve(static_cast<size_t>(std::min<uint64_t>(*content_length_, kBodyReadStep)));
  while (true) {
    // One byte past the limit tells a chunked body that is too large from one that fits.
    size_t room = max_bytes - body.size();
    size_t want = room >= kBodyReadStep ? kBodyReadStep : room + 1;
    size_t old_size = body.size();
    body.resize(old_size + want);
    auto n = exchange_->readBodySome(body.data() + old_size, want);
    if (!n.ok()) return n.error();
    body.resize(old_size + *n);
    if (*n == 0) return body;
    if (check) {
      if (auto ok = check(std::string_view(body).substr(old_size)); !ok.ok()) {
        exchange_->failBody(400, ok.error());
        return ok.error();
      }
    }
    if (body.size() > max_bytes) {
      Error error = bodyTooLarge(max_bytes);
      exchange_->failBody(413, error);
      return error;
    }
  }
}

Result<size_t> Request::readSome(char* buf, size_t max) {
  if (body_use_ == BodyUse::kWhole) {
    return makeError(ErrorCode::kFailedPrecondition, "the request body was already read");
  }
  if (max == 0) return makeError(ErrorCode::kInvalidArgument, "readSome needs room for at least one byte");
  body_use_ = BodyUse::kStream;
  return exchange_->readBodySome(buf, max);
}

bool Request::bodyComplete() const { return exchange_->bodyComplete(); }

// ---- Response ----

void Response::setHeader(std::string_view name, std::string_view value) {
  if (header_error_.empty()) {
    bool valid_name = !name.empty();
    for (unsigned char c : name) valid_name = valid_name && isTokenChar(c);
    bool valid_value = value.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
    if (!valid_name || !valid_value) {
      header_error_ = "invalid response header \"" + std::string(name) + "\"";
    } else if (equalsIgnoreCase(name, "content-length") || equalsIgnoreCase(name, "transfer-encoding") ||
               equalsIgnoreCase(name, "connection")) {
      header_error_ = "response header \"" + std::string(name) + "\" is set by the server";
    }
  }
  for (auto& [field, field_value] : headers_) {
    if (equalsIgnoreCase(field, name)) {
      field_value = std::string(value);
      return;
    }
  }
  headers_.emplace_back(std::string(name), std::string(value));
}

Status Response::checkHeaders(int status) const {
  if (started_) return makeError(ErrorCode::kFailedPrecondition, "the response was already started");
  if (!header_error_.empty()) return makeError(ErrorCode::kInvalidArgument, header_error_);
  return checkStatus(status);
}

Status Response::send(int status, std::string_view content_type, std::string_view body) {
  SPACE_TRY(checkHeaders(status));
  if (statusForbidsBody(status) && !body.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "a " + std::to_string(status) + " response cannot have a body");
  }
  started_ = true;
  ended_ = true;
  status_ = status;
  return exchange_->writeComplete(status, content_type, body);
}

Status Response::sendJson(int status, const nlohmann::json& body) {
  // Replace rather than throw on invalid UTF-8 that made its way into a string.
  std::string text = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return send(status, "application/json", text);
}

Status Response::sendError(int status, std::string_view code, std::string_view message) {
  return sendJson(status, errorBody(code, message));
}

Status Response::begin(int status, std::string_view content_type) {
  SPACE_TRY(checkHeaders(status));
  if (statusForbidsBody(status)) {
    return makeError(ErrorCode::kInvalidArgument, "a " + std::to_string(status) + " response cannot have a body");
  }
  started_ = true;
  streaming_ = true;
  status_ = status;
  return exchange_->writeStreamHead(status, content_type);
}

Result<TakenConnection> Response::takeOver(int status) {
  // The handler writes the status line itself (101 included): only the state is checked.
  if (started_) return makeError(ErrorCode::kFailedPrecondition, "the response was already started");
  auto taken = exchange_->takeOver();
  if (!taken.ok()) return taken.error();
  started_ = true;
  ended_ = true;
  status_ = status;
  return taken;
}

Status Response::relay(int status, RelayPlan plan) {
  if (started_) return makeError(ErrorCode::kFailedPrecondition, "the response was already started");
  if (plan.peer < 0) return makeError(ErrorCode::kInvalidArgument, "a relay needs a peer socket");
  SPACE_TRY(exchange_->relay(std::move(plan)));
  started_ = true;
  ended_ = true;
  status_ = status;
  return okStatus();
}

Result<std::shared_ptr<ResponseStream>> Response::detach(int status, std::string_view content_type) {
  SPACE_TRY(checkHeaders(status));
  if (statusForbidsBody(status)) {
    return makeError(ErrorCode::kInvalidArgument, "a " + std::to_string(status) + " response cannot have a body");
  }
  auto stream = exchange_->detach(status, content_type);
  if (!stream.ok() && !exchange_->detached()) return stream.error();  // nothing was sent
  started_ = true;
  streaming_ = true;
  ended_ = true;  // the stream writes from here on, not this Response
  status_ = status;
  return stream;
}

int Response::abortFd() const { return exchange_ == nullptr ? -1 : exchange_->abortFd(); }

bool Response::clientGone() const { return exchange_ == nullptr || exchange_->clientGone(); }

Status Response::write(std::string_view chunk) {
  if (!streaming_ || ended_) return makeError(ErrorCode::kFailedPrecondition, "write() outside begin()..end()");
  if (chunk.empty()) return okStatus();  // an empty chunk would end the chunked body
  return exchange_->writeChunk(chunk);
}

Status Response::end() {
  if (!streaming_ || ended_) return makeError(ErrorCode::kFailedPrecondition, "end() without begin()");
  ended_ = true;
  return exchange_->writeStreamEnd();
}

// ---- Exchange ----

namespace detail {

Exchange::Exchange(SocketStream& stream, boost::beast::flat_buffer& buffer, RequestParser& parser,
                   const std::atomic<bool>& stopping)
    : stream_(stream), buffer_(buffer), parser_(parser), stopping_(stopping) {
  request_.exchange_ = this;
  response_.exchange_ = this;
}

Status Exchange::parseRequest(const std::string& remote_address) {
  const auto& msg = parser_.get();
  request_.remote_address_ = remote_address;
  request_.method_ = std::string(msg.method_string());
  request_.target_ = std::string(msg.target());
  head_request_ = msg.method() == beast_http::verb::head;
  for (const auto& field : msg) {
    request_.headers_.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  if (parser_.chunked()) {
    request_.content_length_ = std::nullopt;
  } else {
    request_.content_length_ = parser_.content_length().value_or(0);
  }
  expects_continue_ =
      msg.version() >= 11 && !parser_.is_done() && equalsIgnoreCase(msg[beast_http::field::expect], "100-continue");

  const std::string& target = request_.target_;
  if (target.empty() || target[0] != '/') {
    return makeError(ErrorCode::kInvalidArgument, "the request target must be a path starting with '/'");
  }
  size_t question = target.find('?');
  request_.raw_path_ = target.substr(0, question);
  auto path = urlDecode(request_.raw_path_, false);
  if (!path.ok()) return path.error();
  request_.path_ = std::move(path.value());
  if (question != std::string::npos) {
    auto query = parseQuery(std::string_view(target).substr(question + 1));
    if (!query.ok()) return query.error();
    request_.query_ = std::move(query.value());
  }
  return okStatus();
}

Error Exchange::ioFailure(std::string_view doing, boost::system::error_code ec) {
  io_failed_ = true;
  if (ec == boost::asio::error::timed_out) {
    io_error_ = makeError(ErrorCode::kDeadlineExceeded, "timed out " + std::string(doing) + ": the client is too slow");
  } else if (ec == boost::asio::error::operation_aborted) {
    io_error_ = makeError(ErrorCode::kUnavailable, "the server is shutting down");
  } else {
    io_error_ =
        makeError(ErrorCode::kUnavailable, "client connection lost while " + std::string(doing) + ": " + ec.message());
  }
  return io_error_;
}

void Exchange::sendServerError(int status, const Error& error) {
  response_.headers_.clear();
  response_.header_error_.clear();
  (void)response_.sendError(status, errorCodeName(error.code), error.message);
}

void Exchange::failBody(int status, Error error) { body_failure_ = std::make_pair(status, std::move(error)); }

Status Exchange::sendContinueIfExpected() {
  if (!expects_continue_ || response_.started()) return okStatus();
  expects_continue_ = false;
  static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  boost::system::error_code ec;
  boost::asio::write(stream_, boost::asio::buffer(kContinue.data(), kContinue.size()), ec);
  if (ec) return ioFailure("sending 100 Continue", ec);
  return okStatus();
}

Result<size_t> Exchange::readBodySome(char* buf, size_t max) {
  if (io_failed_) return io_error_;
  if (body_failure_) return body_failure_->second;
  if (parser_.is_done()) return size_t{0};
  SPACE_TRY(sendContinueIfExpected());
  while (true) {
    auto& body = parser_.get().body();
    body.data = buf;
    body.size = max;
    boost::system::error_code ec;
    beast_http::read_some(stream_, buffer_, parser_, ec);
    if (ec == beast_http::error::need_buffer) ec = {};
    size_t n = max - parser_.get().body().size;
    if (ec == beast_http::error::partial_message) return ioFailure("reading the request body", ec);
    if (ec == beast_http::error::buffer_overflow) {
      // A chunk header (size and extensions) or the trailer must fit the connection's buffer:
      // Beast holds each of them whole before parsing it, so without this cap a client sending
      // an endless extension or trailer grows the buffer without limit.
      failBody(413,
               makeError(ErrorCode::kResourceExhausted, "a chunk header or the trailer of the request body exceeds " +
                                                            std::to_string(buffer_.max_size()) + " bytes"));
      return body_failure_->second;
    }
    if (isHttpParseError(ec)) {
      failBody(400, makeError(ErrorCode::kInvalidArgument, "malformed request body: " + ec.message()));
      return body_failure_->second;
    }
    if (ec) return ioFailure("reading the request body", ec);
    if (n > 0) return n;
    if (parser_.is_done()) return size_t{0};
  }
}

bool Exchange::decideKeepAlive(int status) {
  // A 401 ends the connection: a client without a valid key gets one answer, not a socket it
  // can keep open for the idle timeout.
  response_keep_alive_ = parser_.get().keep_alive() && parser_.is_done() && !body_failure_ && !close_delimited_ &&
                         !close_after_response_ && !stopping_.load() && status != 401;
  return response_keep_alive_;
}

namespace {

template <class Message>
void addFields(Message& message, const std::vector<std::pair<std::string, std::string>>& headers,
               std::string_view content_type) {
  for (const auto& [name, value] : headers) message.set(name, value);
  if (!content_type.empty()) message.set(beast_http::field::content_type, content_type);
}

}  // namespace

Status Exchange::writeComplete(int status, std::string_view content_type, std::string_view body) {
  if (io_failed_) return io_error_;
  bool keep_alive = decideKeepAlive(status);
  unsigned version = parser_.get().version() >= 11 ? 11 : 10;
  boost::system::error_code ec;
  if (head_request_ || statusForbidsBody(status)) {
    beast_http::response<beast_http::empty_body> message;
    message.version(version);
    message.result(static_cast<unsigned>(status));
    addFields(message, response_.headers_, content_type);
    if (!statusForbidsBody(status)) message.content_length(body.size());
    message.keep_alive(keep_alive);
    beast_http::write(stream_, message, ec);
  } else {
    beast_http::response<beast_http::span_body<const char>> message;
    message.version(version);
    message.result(static_cast<unsigned>(status));
    addFields(message, response_.headers_, content_type);
    message.body() = boost::beast::span<const char>(body.data(), body.size());
    message.content_length(body.size());
    message.keep_alive(keep_alive);
    beast_http::write(stream_, message, ec);
  }
  if (ec) return ioFailure("sending the response", ec);
  response_complete_ = true;
  return okStatus();
}

Status Exchange::writeStreamHead(int status, std::string_view content_type) {
  if (io_failed_) return io_error_;
  unsigned version = parser_.get().version() >= 11 ? 11 : 10;
  // HTTP/1.0 has no chunked encoding: the end of the connection ends the body.
  close_delimited_ = version == 10 && !head_request_;
  bool keep_alive = decideKeepAlive(status);
  beast_http::response<beast_http::empty_body> message;
  message.version(version);
  message.result(static_cast<unsigned>(status));
  addFields(message, response_.headers_, content_type);
  if (!close_delimited_) message.chunked(true);
  message.keep_alive(keep_alive);
  beast_http::response_serializer<beast_http::empty_body> serializer(message);
  boost::system::error_code ec;
  beast_http::write_header(stream_, serializer, ec);
  if (ec) return ioFailure("sending the response", ec);
  return okStatus();
}

Status Exchange::writeChunk(std::string_view chunk) {
  if (io_failed_) return io_error_;
  if (head_request_) return okStatus();
  boost::system::error_code ec;
  auto data = boost::asio::const_buffer(chunk.data(), chunk.size());
  if (close_delimited_) {
    boost::asio::write(stream_, data, ec);
  } else {
    boost::asio::write(stream_, beast_http::make_chunk(data), ec);
  }
  if (ec) return ioFailure("streaming the response", ec);
  return okStatus();
}

Result<TakenConnection> Exchange::takeOver() {
  if (io_failed_) return io_error_;
  if (!parser_.is_done()) {
    return makeError(ErrorCode::kFailedPrecondition, "the request body must be read before the connection is taken");
  }
  TakenConnection taken;
  taken.fd = stream_.fd();
  taken.abort_fd = stream_.abortFd();
  const auto data = buffer_.data();
  taken.early_bytes.assign(static_cast<const char*>(data.data()), data.size());
  buffer_.consume(buffer_.size());
  taken_over_ = true;
  response_keep_alive_ = false;
  response_complete_ = true;
  return taken;
}

Status Exchange::relay(RelayPlan plan) {
  if (io_failed_) return io_error_;
  if (taken_over_ || relay_) return makeError(ErrorCode::kFailedPrecondition, "the connection was already taken");
  if (!parser_.is_done()) {
    return makeError(ErrorCode::kFailedPrecondition, "the request body must be read before the connection is relayed");
  }
  if (!relay_reserver_) return makeError(ErrorCode::kUnimplemented, "this server cannot relay connections");
  const auto data = buffer_.data();
  std::string early(static_cast<const char*>(data.data()), data.size());  // before the count: may throw
  SPACE_TRY(relay_reserver_());
  buffer_.consume(buffer_.size());
  relay_early_ = std::move(early);
  relay_ = std::move(plan);
  taken_over_ = true;
  response_keep_alive_ = false;
  response_complete_ = true;
  return okStatus();
}

Result<std::shared_ptr<ResponseStream>> Exchange::detach(int status, std::string_view content_type) {
  if (io_failed_) return io_error_;
  if (!stream_reserver_) return makeError(ErrorCode::kUnimplemented, "this server cannot detach responses");
  auto reserved = stream_reserver_();
  if (!reserved.ok()) return reserved.error();
  detached_ = std::move(reserved.value());
  SPACE_TRY(writeStreamHead(status, content_type));
  using Framing = DetachedStream::Framing;
  detached_->setFraming(head_request_      ? Framing::kNoBody
                        : close_delimited_ ? Framing::kCloseDelimited
                                           : Framing::kChunked,
                        response_keep_alive_);
  return std::shared_ptr<ResponseStream>(detached_);
}

bool Exchange::clientGone() const {
  if (io_failed_ || stopping_.load()) return true;
  pollfd p{stream_.fd(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

Status Exchange::writeStreamEnd() {
  if (io_failed_) return io_error_;
  if (!head_request_ && !close_delimited_) {
    boost::system::error_code ec;
    boost::asio::write(stream_, beast_http::make_chunk_last(), ec);
    if (ec) return ioFailure("ending the response", ec);
  }
  response_complete_ = true;
  return okStatus();
}

}  // namespace detail

}  // namespace space::http
