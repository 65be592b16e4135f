// The client side of spaced's REST API (docs/openapi.json), for programs that talk to a daemon:
// spacectl and the benchmarks. One place decides how such a program finds the daemon, proves
// who it is, reads the answers and words the failures, so each program does it the same way.
//
// Finding the daemon (resolveEndpoint): the URL given (spacectl --api), else env SPACE_API,
// else the "url" spaced wrote to <data-dir>/spaced.json when it started listening, else
// http://127.0.0.1:8080. The key: the file given (--api-key-file), else env SPACE_API_KEY, else the
// file <data-dir>/api-key. The data dir: the one given (--data-dir), else env SPACE_DATA_DIR,
// else /var/lib/space. A program that started spaced itself on a data dir of its own asks only
// that dir (endpointOfDataDir), so nothing in its environment can point it elsewhere.
//
// Calls (Client): `call` sends and receives JSON; `send` gives the whole answer (logs, metrics);
// `stream` hands the answer's body over as it arrives and may send a body read as it goes
// (files); `streamLines` is the NDJSON form (exec with its output as it runs). Every request
// carries the key as `Authorization: Bearer <key>`.
//
// Errors: any status but 2xx is the API's error, its message and `reason` (the API's error code,
// e.g. "not_found") taken from the body; a daemon that cannot be reached gets an error that says
// where we looked and why, worded for the person who has to start it. Messages are meant to be
// printed as they are.
//
// The daemon is trusted less than fully: every answer is parsed within parseJsonBounded's
// limits and every streamed line is bounded, so a hostile or broken daemon costs an error, not
// the client's stack or memory. Answers are trusted for their shape only; read fields with
// `field`, which gives null for what is missing.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "http/client.h"

namespace space::apiclient {

// What a call waits for unless told otherwise: answers that need no VM work come in milliseconds.
inline constexpr std::chrono::milliseconds kRequestTimeout = std::chrono::seconds(60);

// The daemon's lines carry at most one read of a process's output (64 KiB, base64-encoded), so
// this only stops a daemon that never ends a line from filling our memory.
inline constexpr size_t kMaxStreamLine = size_t{16} << 20;

// What the user named explicitly (spacectl's --api, --api-key-file, --data-dir); empty: not named.
// A key itself is never a flag: every local user reads a process's arguments in /proc/*/cmdline.
struct EndpointFlags {
  std::string api;
  std::string api_key_file;
  std::string data_dir;
  std::string ca_file;
};

// Where the daemon is and how we authenticate, each with where it came from, so an error can
// say which setting to fix.
struct Endpoint {
  std::string url;
  std::string url_source;  // e.g. "from SPACE_API"; empty when named explicitly
  std::string key;         // empty: no Authorization header (the open routes, /healthz)
  std::string key_source;  // e.g. "SPACE_API_KEY"
  // For https: the CA certificates (PEM) the daemon's certificate must chain to; empty: the
  // system's. --ca-file, SPACE_CA_FILE, else the certificate spaced named in its spaced.json
  // when the url came from there (a node's own self-signed certificate works as it is).
  std::string ca_file;
};

// The flags, then the environment, then the data dir's files. Without a key the error says
// every place looked at and, if the key file exists but is not ours to read, that sudo may help.
Result<Endpoint> resolveEndpoint(EndpointFlags flags);

// Only <data_dir>/spaced.json and <data_dir>/api-key. An error (kNotFound among others) until
// spaced has written both, so a program that just started spaced polls this.
Result<Endpoint> endpointOfDataDir(const std::string& data_dir);

// Targets with the user's ids URL-encoded into them.
std::string sandboxPath(const std::string& id);
std::string snapshotPath(const std::string& id);
std::string secretPath(const std::string& name);

// A query string: names are ours, values come from the user and are encoded.
class Query {
 public:
  Query& add(const std::string& name, const std::string& value);
  std::string on(const std::string& path) const { return path + text_; }

 private:
  std::string text_;
};

// A field of an object, or null: for reading the daemon's answers, whose fields may be absent.
const nlohmann::json& field(const nlohmann::json& object, const char* name);

class Client {
 public:
  using BodyCallback = std::function<Status(std::string_view chunk)>;
  using LineCallback = std::function<Status(const nlohmann::json& line)>;

  // Fails (kInvalidArgument) if the URL is not one we can use, naming where it came from.
  static Result<Client> create(Endpoint endpoint);

  // A JSON request; the parsed answer (null for an empty one) or the error. `body` goes out as
  // application/json; none: no body.
  Result<nlohmann::json> call(const std::string& method, const std::string& target,
                              const std::optional<nlohmann::json>& body = {},
                              std::chrono::milliseconds timeout = kRequestTimeout) const;

  // The whole answer to a request if its status is 2xx, else the API's error. `timeout` bounds
  // the whole exchange.
  Result<http::ClientResponse> send(const std::string& method, const std::string& target, http::RequestBody body,
                                    const std::string& content_type, std::chrono::milliseconds timeout) const;

  // The whole answer whatever its status; only a failure to talk to the daemon is an error.
  // For callers that judge the status themselves.
  Result<http::ClientResponse> exchange(const std::string& method, const std::string& target, http::RequestBody body,
                                        const std::string& content_type, std::chrono::milliseconds timeout) const;

  // The body of a 2xx answer goes to on_body as it arrives; any other status is the API's error.
  // An error of on_body ends the request and is returned as it is. `timeout` bounds each wait
  // for the daemon, not the whole exchange (zero: none), so a long transfer never times out.
  Status stream(const std::string& method, const std::string& target, const std::string& content_type,
                std::map<std::string, std::string> extra_headers, http::RequestBody body, const BodyCallback& on_body,
                std::chrono::milliseconds timeout) const;

  // A JSON request answered with NDJSON: each non-empty line, parsed, goes to on_line as it
  // arrives. A line that is not JSON within the bounds, or longer than kMaxStreamLine, ends the
  // request with an error; so does an error of on_line, returned as it is.
  Status streamLines(const std::string& method, const std::string& target, const nlohmann::json& body,
                     const LineCallback& on_line, std::chrono::milliseconds timeout) const;

  const Endpoint& endpoint() const { return endpoint_; }
  const http::Client& http() const { return http_; }
  // The error an answer of this status and body stands for, worded as every call words it.
  Error apiError(int status, const std::string& body) const;
  // A failure to talk to the daemon, worded for the person who has to start it.
  Error transportError(const Error& e) const;

 private:
  Client(http::Client http, Endpoint endpoint) : http_(std::move(http)), endpoint_(std::move(endpoint)) {}

  std::map<std::string, std::string> headers(const std::string& content_type,
                                             std::map<std::string, std::string> extra) const;

  http::Client http_;
  Endpoint endpoint_;
};

}  // namespace space::apiclient
