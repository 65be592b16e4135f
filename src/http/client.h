// Synchronous HTTP/1.1 client for spacectl and the integration tests. Each request uses a
// fresh connection: simpler than pooling, and a local daemon makes connecting cheap. https://
// goes through a TLS relay (http/tls_relay.h) that verifies the server's certificate.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace boost::asio::ssl {
class context;
}

#include "common/result.h"
#include "common/unix_socket.h"
#include "http/url.h"

namespace space::http {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names; repeated fields joined with ", "
  std::string body;                            // empty for requestStreaming()
};

// Fills buf with up to max bytes of a request body; returns 0 at the end.
using BodySource = std::function<Result<size_t>(char* buf, size_t max)>;

// A request body: a string, or a source read as the request is sent. A source of known length
// goes out with Content-Length (producing another length is an error), otherwise chunked.
class RequestBody {
 public:
  RequestBody() = default;
  RequestBody(std::string data) : data_(std::move(data)) {}  // NOLINT: implicit by design
  RequestBody(const char* data) : data_(data) {}             // NOLINT
  static RequestBody fromSource(BodySource source, std::optional<uint64_t> length = std::nullopt);

 private:
  friend class Client;
  std::string data_;
  BodySource source_;
  std::optional<uint64_t> source_length_;
};

// Called once the status and headers arrived, before any body; an error aborts the request.
using HeadCallback = std::function<Status(const ClientResponse& head)>;
// Called with each piece of the response body as it arrives; an error aborts the request.
using ChunkCallback = std::function<Status(std::string_view chunk)>;

class Client {
 public:
  // "http://127.0.0.1:8080", "127.0.0.1:8080", "http://[::1]:8080/prefix" (prefix prepended to
  // every target), "https://node.example:8443": the certificate must be signed by a CA in
  // `ca_file` (PEM), or in the system's trust store when it is empty, and name the host.
  static Result<Client> create(const std::string& base_url, const std::string& ca_file = "");

  // The whole response. `timeout` bounds the whole exchange, connecting included (zero: none).
  // Any status is a successful Result; errors are about the transport.
  Result<ClientResponse> request(const std::string& method, const std::string& target,
                                 const std::map<std::string, std::string>& headers = {}, RequestBody body = {},
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // The response body goes to on_chunk as it arrives and is not kept. `timeout` bounds each
  // wait for the server (connecting, each write, each read), not the whole exchange, so a
  // long stream with steady output never times out (zero: none).
  Result<ClientResponse> requestStreaming(const std::string& method, const std::string& target,
                                          const std::map<std::string, std::string>& headers, RequestBody body,
                                          const HeadCallback& on_head, const ChunkCallback& on_chunk,
                                          std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // "host:port" of the server.
  const std::string& authority() const { return authority_; }
  // What every target is prefixed with ("" or "/prefix").
  const std::string& basePath() const { return base_path_; }
  // A new connection to the server, for a protocol a request upgrades to (a WebSocket): a
  // connected non-blocking socket, within `timeout`.
  Result<UniqueFd> connect(std::chrono::milliseconds timeout) const;

 private:
  Client(std::string host, uint16_t port, std::string base_path, std::shared_ptr<boost::asio::ssl::context> tls);
  // A connected non-blocking socket (over TLS: the plaintext end of the relay) by `deadline`.
  Result<UniqueFd> open(Clock::time_point deadline) const;
  Result<ClientResponse> perform(const std::string& method, const std::string& target,
                                 const std::map<std::string, std::string>& headers, RequestBody& body,
                                 const HeadCallback* on_head, const ChunkCallback* on_chunk,
                                 std::chrono::milliseconds timeout, bool whole_deadline) const;

  std::string host_;  // without the brackets of an IPv6 literal
  uint16_t port_;
  std::string authority_;
  std::string base_path_;
  std::shared_ptr<boost::asio::ssl::context> tls_;  // null: plain HTTP
};

// The Error an error response stands for: the code and message of its errorBody, or the
// status line if the body is not one (a proxy's page, say).
Error responseError(const ClientResponse& response);

}  // namespace space::http
