// Internal to the HTTP module: one request/response exchange on a server connection, the
// state behind Request and Response (body progress, what was sent, whether the connection
// may be kept alive).
#pragma once

#include <atomic>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "http/message.h"
#include "http/tcp.h"

namespace space::http::detail {

using RequestParser = boost::beast::http::request_parser<boost::beast::http::buffer_body>;

// Whether Beast rejected what the client sent (as opposed to the socket failing).
inline bool isHttpParseError(const boost::system::error_code& ec) {
  return ec && ec.category() == boost::beast::http::make_error_code(boost::beast::http::error::bad_target).category();
}

// The server's side of a ResponseStream, configured once its head went out.
class DetachedStream : public ResponseStream {
 public:
  enum class Framing {
    kChunked,         // HTTP/1.1: each write a chunk, end() the last chunk
    kCloseDelimited,  // HTTP/1.0: raw bytes, the end of the connection ends the body
    kNoBody,          // a HEAD request: writes are dropped
  };
  virtual void setFraming(Framing framing, bool keep_alive) = 0;
};

class Exchange {
 public:
  // Makes the stream object for Response::detach, counted against the server's stream limits,
  // or says why not (unavailable).
  using StreamReserver = std::function<Result<std::shared_ptr<DetachedStream>>()>;
  // Counts a relay for the connection (Response::relay) against the same limits, or says why not.
  using RelayReserver = std::function<Status()>;

  // `parser` has read the request's header; `stopping` turns off keep-alive once set.
  Exchange(SocketStream& stream, boost::beast::flat_buffer& buffer, RequestParser& parser,
           const std::atomic<bool>& stopping);

  // Fills the Request from the parsed header; an error is the client's (a 400).
  Status parseRequest(const std::string& remote_address);

  Request& request() { return request_; }
  Response& response() { return response_; }

  // For Request.
  Result<size_t> readBodySome(char* buf, size_t max);
  bool bodyComplete() const { return parser_.is_done(); }
  void failBody(int status, Error error);
  // The request was unusable (bad target): answer it, but do not trust the connection after.
  void closeAfterResponse() { close_after_response_ = true; }

  // For Response.
  Status writeComplete(int status, std::string_view content_type, std::string_view body);
  Status writeStreamHead(int status, std::string_view content_type);
  Status writeChunk(std::string_view chunk);
  Status writeStreamEnd();
  Result<TakenConnection> takeOver();
  void setStreamReserver(StreamReserver reserver) { stream_reserver_ = std::move(reserver); }
  Result<std::shared_ptr<ResponseStream>> detach(int status, std::string_view content_type);
  // The stream Response::detach made (its head may have failed: see ioFailed()); null if none.
  const std::shared_ptr<DetachedStream>& detached() const { return detached_; }
  bool takenOver() const { return taken_over_; }
  void setRelayReserver(RelayReserver reserver) { relay_reserver_ = std::move(reserver); }
  Status relay(RelayPlan plan);
  // The relay Response::relay counted, with the client's early bytes in `early`; the server takes
  // it once the handler returned (and must then start or count it out).
  std::optional<RelayPlan>& relayPlan() { return relay_; }
  std::string& relayEarlyBytes() { return relay_early_; }
  int abortFd() const { return stream_.abortFd(); }
  // The client hung up (or the server is stopping): see Response::clientGone.
  bool clientGone() const;

  // For the server once the handler returned.
  // The response the server sends when the handler did not: set when reading the body failed
  // for a reason the client should hear about (too large, malformed).
  const std::optional<std::pair<int, Error>>& bodyFailure() const { return body_failure_; }
  bool ioFailed() const { return io_failed_; }
  // Whether the next request may follow on this connection.
  bool keepAlive() const { return response_keep_alive_ && response_complete_ && !io_failed_; }
  bool responseComplete() const { return response_complete_; }
  // The server's own error response when the handler sent none; drops the headers the handler
  // set, which may be what made its response fail.
  void sendServerError(int status, const Error& error);

 private:
  Error ioFailure(std::string_view doing, boost::system::error_code ec);
  Status sendContinueIfExpected();
  bool decideKeepAlive(int status);

  SocketStream& stream_;
  boost::beast::flat_buffer& buffer_;
  RequestParser& parser_;
  const std::atomic<bool>& stopping_;
  Request request_;
  Response response_;
  bool head_request_ = false;
  bool expects_continue_ = false;
  bool io_failed_ = false;
  Error io_error_{ErrorCode::kUnavailable, ""};
  bool response_keep_alive_ = false;
  bool response_complete_ = false;
  bool close_after_response_ = false;
  bool taken_over_ = false;
  bool close_delimited_ = false;  // an HTTP/1.0 client gets a streamed body without chunking
  std::optional<std::pair<int, Error>> body_failure_;
  StreamReserver stream_reserver_;
  std::shared_ptr<DetachedStream> detached_;
  RelayReserver relay_reserver_;
  std::optional<RelayPlan> relay_;
  std::string relay_early_;
};

}  // namespace space::http::detail
