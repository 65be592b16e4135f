// The request and response a Server hands to its handler. Both are views of one exchange on a
// connection and are only valid during the handler call. No method throws: failures are
// Results, and an I/O failure (the client went away, a timeout) is sticky, so a handler
// streaming output can stop at the first failed write.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"

namespace space::http {

class Request;
class Response;
namespace detail {
class Exchange;
}

using Handler = std::function<void(Request&, Response&)>;

// A connection a handler took over (Response::takeOver): raw bytes both ways, no more HTTP
// from the server. Valid while the handler runs; the server closes the socket afterwards.
struct TakenConnection {
  int fd = -1;        // the client's socket, non-blocking
  int abort_fd = -1;  // readable once the server gives up on its connections (stop): end then
  // What the client sent after the request, already read into the server's buffer: for an
  // upgrade, the first bytes of the new protocol.
  std::string early_bytes;
};

// A taken-over connection that the server's event loop relays to another socket after the
// handler returned (Response::relay): a proxied connection that lasts hours holds no thread.
struct RelayPlan {
  int peer = -1;  // a connected, non-blocking socket, owned by `keep`
  // Both ways (an accepted upgrade), or only peer -> client (an answer that ends the connection).
  bool both_ways = false;
  // No byte either way for this long ends the relay.
  std::chrono::milliseconds idle_timeout{600000};
  std::string to_client;  // written to the client first (the peer's answer as far as it was read)
  // Released on the event loop once the relay ended: the peer socket's owner and whatever counts
  // the relay (it must not block: it runs on the loop).
  std::shared_ptr<void> keep;
};

// A streamed response that outlives its handler (Response::detach): the handler returns, and
// with it its thread, while the server's event loop writes what producers push from any thread.
// For streams that last minutes or days (a process's output, a file watch), which would
// otherwise hold one thread each. No method blocks or throws; each is safe from any thread,
// including an agent client's I/O thread.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Queues `chunk` (one chunk of the body) for the client. False once the stream is closed or
  // ended: the producer stops then. Nothing bounds the queue here: a producer bounds it by
  // pending() (a client that reads slower than its output loses the stream, not the node's
  // memory).
  virtual bool write(std::string chunk) = 0;
  // Ends the body after everything queued; the connection then serves its next request (or
  // closes, as HTTP requires).
  virtual void end() = 0;
  // Cuts the connection without ending the body (what is still queued is dropped): the client
  // sees a truncated response.
  virtual void abort() = 0;
  // Bytes queued or being written, not yet taken by the socket.
  virtual size_t pending() const = 0;
  virtual bool closed() const = 0;
  // Runs once the stream is over, on the event loop (or at once, on this thread, if it already
  // is): `completed` when the whole body reached the socket, false when the client left, a
  // write timed out, abort() was called or the server stopped. Keep it short and non-blocking;
  // what needs to block goes to runBlocking(). Set before the handler returns.
  virtual void onClose(std::function<void(bool completed)> fn) = 0;
  // While nothing was written for `idle`, writes `chunk` (a protocol's keep-alive message), so
  // a departed client is noticed and proxies keep the connection. Set before the handler returns.
  virtual void keepAlive(std::chrono::milliseconds idle, std::string chunk) = 0;
  // Runs `task` on one of the server's stream-step threads (ServerLimits::max_stream_step_threads),
  // now or, when all are busy, once one frees: for the steps of a stream that block (an agent
  // call, a lock another request may hold). False, and `task` is dropped, when the stream is
  // closed, the server stops, or as many steps as streams already wait. Never throws.
  virtual bool runBlocking(std::function<void()> task) = 0;
  // Whose share of the step threads (ServerLimits::max_stream_steps_per_client) this stream's
  // steps count against: its client's address unless the handler names the party (a tenant),
  // which it should where many parties share an address (loopback, a proxy). Set before the
  // first runBlocking().
  virtual void shareStepsWith(std::string party) = 0;
};

// {"error":{"code":code,"message":message}}: the body of every error the API and the server
// itself send. Codes are errorCodeName()'s vocabulary ("not_found", "invalid_argument"...).
nlohmann::json errorBody(std::string_view code, std::string_view message);

class Request {
 public:
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  const std::string& method() const { return method_; }
  // The target as sent: percent-encoded path and query.
  const std::string& target() const { return target_; }
  // The percent-decoded path, without the query.
  const std::string& path() const { return path_; }
  // The path as sent (still percent-encoded): what the router splits into segments, so an
  // encoded '/' stays inside its segment.
  const std::string& rawPath() const { return raw_path_; }
  // The first value of a query parameter, decoded ('+' is a space).
  std::optional<std::string> query(std::string_view name) const;
  const std::multimap<std::string, std::string>& queryParams() const { return query_; }
  // Case-insensitive; repeated fields are joined with ", " as HTTP defines.
  std::optional<std::string> header(std::string_view name) const;
  // Every field as sent, in order (names as the client spelled them).
  const std::vector<std::pair<std::string, std::string>>& headers() const { return headers_; }
  // Absent for a chunked body; 0 for a request without a body.
  std::optional<uint64_t> contentLength() const { return content_length_; }
  // Set by the router from the {name} segments of the matched pattern (decoded, never empty);
  // empty for a name the pattern does not have.
  const std::string& pathParam(std::string_view name) const;
  void setPathParams(std::map<std::string, std::string, std::less<>> params) { path_params_ = std::move(params); }
  // "ip:port" of the client.
  const std::string& remoteAddress() const { return remote_address_; }

  // The whole body, if it is at most max_bytes (else kResourceExhausted naming the limit; a
  // handler that returns without responding then gets a 413 from the server). The body can be
  // consumed once: by readBody, or by readSome calls.
  Result<std::string> readBody(size_t max_bytes);
  // The same, with `check` called on each piece as it arrives: its first error stops the read
  // (the server answers 400 with it if the handler does not answer), so a body that is wrong
  // from its first bytes is refused without buffering the rest.
  using BodyCheck = std::function<Status(std::string_view piece)>;
  Result<std::string> readBody(size_t max_bytes, const BodyCheck& check);
  // Up to `max` (> 0) bytes of the body as they arrive; 0 at the end of the body. Each call
  // waits at most the server's read_timeout for the client.
  Result<size_t> readSome(char* buf, size_t max);
  // Whether the body was read to its end (always true without a body).
  bool bodyComplete() const;

 private:
  friend class detail::Exchange;
  Request() = default;

  detail::Exchange* exchange_ = nullptr;
  std::string method_;
  std::string target_;
  std::string path_;
  std::string raw_path_;
  std::multimap<std::string, std::string> query_;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::optional<uint64_t> content_length_;
  std::map<std::string, std::string, std::less<>> path_params_;
  std::string remote_address_;
  enum class BodyUse { kNone, kWhole, kStream } body_use_ = BodyUse::kNone;
};

class Response {
 public:
  Response(const Response&) = delete;
  Response& operator=(const Response&) = delete;

  // Adds a header to the response not yet started (replacing one of the same name).
  // Content-Length, Transfer-Encoding and Connection belong to the server; setting them, or a
  // name or value that is not valid HTTP, makes the next send()/begin() fail.
  void setHeader(std::string_view name, std::string_view value);

  // A complete response with a Content-Length body.
  Status send(int status, std::string_view content_type, std::string_view body);
  Status sendJson(int status, const nlohmann::json& body);
  // send() of errorBody(code, message).
  Status sendError(int status, std::string_view code, std::string_view message);

  // A streamed response (chunked transfer encoding): each write() goes to the client at once,
  // so the client sees output while the handler still runs.
  Status begin(int status, std::string_view content_type);
  Status write(std::string_view chunk);
  Status end();

  // True once the client has hung up or the server is stopping, without writing anything: for
  // handlers that wait on something else (a silent process, a long command) and would only
  // notice a departed client at their next write. A client that half-closes its sending side
  // counts as gone.
  bool clientGone() const;

  // The connection closes after this response (call before send/begin). For answers given
  // without an authenticated tenant: a client must not keep a connection, and the thread behind
  // it, busy with a stream of cheap requests it reads slowly.
  void closeConnection();

  // Hands the raw connection to the handler, which then writes the whole response itself
  // (a proxy relaying another server's bytes, a protocol upgrade). The request body must have
  // been read to its end. `status` is only what the server logs. The connection is never kept
  // for another request.
  Result<TakenConnection> takeOver(int status);
  // Hands the connection to the server's event loop, which writes `plan.to_client` and then
  // relays between the client and `plan.peer` (what the client sent after the request goes to
  // the peer first when both ways) until both directions ended (each end of stream passed on as
  // a half-close), either side fails, the peer's socket is shut down both ways (its owner ended
  // it), nothing moved for the idle timeout, or the server stops; one way, also when the client
  // hangs up or half-closes (gone, as clientGone() counts it). While a write to a slow client
  // waits, or both ways after the peer's end of stream, a peer shut down both ways is noticed
  // within a second (a socket pair's other end closed; a TCP peer's close after its FIN shows
  // only when the client sends again). The request body must have
  // been read to its end. `unavailable` when ServerLimits::max_relays are open, and nothing was
  // sent.
  // `status` is only what the server logs. The plan's `keep` goes with the relay's end.
  Status relay(int status, RelayPlan plan);
  // An eventfd that becomes readable once the server gives up on its connections (stop, after
  // the grace period): for a handler waiting on something other than the client.
  int abortFd() const;

  // Starts a streamed response (as begin()) whose body producers write after the handler has
  // returned (ResponseStream). Fails before anything is sent, so the handler can still answer:
  // `unavailable` when the server's stream limits are reached (a 503), `failed_precondition`
  // when the response was started. The Response itself takes no more writes.
  Result<std::shared_ptr<ResponseStream>> detach(int status, std::string_view content_type);

  // Whether the status line went out (by send or begin): afterwards only write/end make sense.
  bool started() const { return started_; }
  // The status sent, 0 before.
  int status() const { return status_; }

 private:
  friend class detail::Exchange;
  Response() = default;
  Status checkHeaders(int status) const;

  detail::Exchange* exchange_ = nullptr;
  std::vector<std::pair<std::string, std::string>> headers_;
  std::string header_error_;
  bool started_ = false;
  bool streaming_ = false;
  bool ended_ = false;
  int status_ = 0;
};

}  // namespace space::http
