#include "apiclient/api_client.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "common/bounded_json.h"
#include "common/fs.h"
#include "http/url.h"

namespace space::apiclient {

namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr const char* kDefaultDataDir = "/var/lib/space";
constexpr const char* kFallbackUrl = "http://127.0.0.1:8080";
// An error answer is only read for its message; a daemon that sends more gets it cut.
constexpr size_t kMaxErrorBody = 64 * 1024;

// Strings the daemon sent need not be UTF-8 (command output, guest file names); sending them
// back must not throw.
std::string dumpJson(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

// A value as the person reading the error sees it.
std::string text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return dumpJson(value);
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  return s.substr(start);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The url spaced wrote once it listened: `spaced --listen 127.0.0.1:0` then needs no
// configuration; with TLS, the certificate it serves too.
struct DaemonFile {
  std::string url;
  std::string tls_cert;
};
std::optional<DaemonFile> readDaemonFile(const std::string& file) {
  auto content = readSmallFile(file, 64 * 1024);
  if (!content.ok()) return std::nullopt;
  auto doc = parseJsonBounded(content.value());
  if (!doc.ok() || !field(*doc, "url").is_string()) return std::nullopt;
  DaemonFile out{field(*doc, "url").get<std::string>(), ""};
  if (field(*doc, "tls_cert").is_string()) out.tls_cert = field(*doc, "tls_cert").get<std::string>();
  return out;
}

}  // namespace

const json& field(const json& object, const char* name) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(name);
  return it == object.end() ? kNull : *it;
}

Result<Endpoint> resolveEndpoint(EndpointFlags flags) {
  if (flags.data_dir.empty()) flags.data_dir = env("SPACE_DATA_DIR") ? env("SPACE_DATA_DIR") : kDefaultDataDir;
  Endpoint e;
  if (!flags.api.empty()) {
    e.url = flags.api;
  } else if (const char* v = env("SPACE_API")) {
    e.url = v, e.url_source = "from SPACE_API";
  } else {
    const std::string file = flags.data_dir + "/spaced.json";
    if (auto daemon = readDaemonFile(file))
      e.url = daemon->url, e.url_source = "from " + file, e.ca_file = daemon->tls_cert;
    if (e.url.empty()) e.url = kFallbackUrl, e.url_source = "the default: " + file + " is missing or unreadable";
  }
  if (!flags.ca_file.empty()) {
    e.ca_file = flags.ca_file;
  } else if (const char* v = env("SPACE_CA_FILE")) {
    e.ca_file = v;
  }
  if (!flags.api_key_file.empty()) {
    auto content = readSmallFile(flags.api_key_file, 4096);
    if (!content.ok()) return makeError(ErrorCode::kInvalidArgument, "--api-key-file: " + content.error().message);
    e.key = trimmed(content.value()), e.key_source = flags.api_key_file;
    if (e.key.empty())
      return makeError(ErrorCode::kInvalidArgument, "--api-key-file: " + flags.api_key_file + " is empty");
  } else if (const char* v = env("SPACE_API_KEY")) {
    e.key = v, e.key_source = "SPACE_API_KEY";
  } else {
    const std::string file = flags.data_dir + "/api-key";
    auto content = readSmallFile(file, 4096);
    if (content.ok()) e.key = trimmed(content.value()), e.key_source = file;
    if (e.key.empty()) {
      std::string why = content.ok() ? file + " is empty" : content.error().message;
      // spaced makes the file readable by its own user only.
      if (!content.ok() && access(file.c_str(), R_OK) != 0 && errno == EACCES) {
        why += "; only the user running spaced may read it: try sudo";
      } else if (!content.ok() && access(flags.data_dir.c_str(), F_OK) != 0) {
        why += "; spaced has never run with this data directory: `make run` starts it";
      }
      return makeError(ErrorCode::kInvalidArgument,
                       "no API key: looked at --api-key-file, SPACE_API_KEY and " + file + " (" + why +
                           "). Give the key, or name spaced's data directory with --data-dir or SPACE_DATA_DIR");
    }
  }
  return e;
}

Result<Endpoint> endpointOfDataDir(const std::string& data_dir) {
  const std::string url_file = data_dir + "/spaced.json";
  auto daemon = readDaemonFile(url_file);
  if (!daemon) return makeError(ErrorCode::kNotFound, url_file + " is missing or has no url: spaced is not listening");
  const std::string key_file = data_dir + "/api-key";
  auto content = readSmallFile(key_file, 4096);
  if (!content.ok()) return content.error();
  Endpoint e{daemon->url, "from " + url_file, trimmed(content.value()), key_file, daemon->tls_cert};
  if (e.key.empty()) return makeError(ErrorCode::kNotFound, key_file + " is empty");
  return e;
}

std::string sandboxPath(const std::string& id) { return "/v1/sandboxes/" + http::urlEncode(id); }

std::string snapshotPath(const std::string& id) { return "/v1/snapshots/" + http::urlEncode(id); }
std::string secretPath(const std::string& name) { return "/v1/secrets/" + http::urlEncode(name); }

Query& Query::add(const std::string& name, const std::string& value) {
  text_ += (text_.empty() ? "?" : "&") + name + "=" + http::urlEncode(value);
  return *this;
}

Result<Client> Client::create(Endpoint endpoint) {
  auto http = http::Client::create(endpoint.url, endpoint.ca_file);
  if (!http.ok()) {
    const std::string& source = endpoint.url_source;
    return makeError(
        ErrorCode::kInvalidArgument,
        "bad daemon URL " + endpoint.url + (source.empty() ? "" : " (" + source + ")") + ": " + http.error().message);
  }
  return Client(std::move(http.value()), std::move(endpoint));
}

Result<json> Client::call(const std::string& method, const std::string& target, const std::optional<json>& body,
                          milliseconds timeout) const {
  auto response = send(method, target, body ? http::RequestBody(dumpJson(*body)) : http::RequestBody(),
                       body ? "application/json" : "", timeout);
  if (!response.ok()) return response.error();
  if (response->body.empty()) return json();
  auto parsed = parseJsonBounded(response->body);
  if (!parsed.ok()) {
    return makeError(ErrorCode::kInternal,
                     "spaced sent an unusable answer to " + method + " " + target + ": " + parsed.error().message);
  }
  return std::move(parsed.value());
}

Result<http::ClientResponse> Client::send(const std::string& method, const std::string& target, http::RequestBody body,
                                          const std::string& content_type, milliseconds timeout) const {
  auto response = exchange(method, target, std::move(body), content_type, timeout);
  if (!response.ok()) return response.error();
  if (response->status < 200 || response->status >= 300) return apiError(response->status, response->body);
  return response;
}

Result<http::ClientResponse> Client::exchange(const std::string& method, const std::string& target,
                                              http::RequestBody body, const std::string& content_type,
                                              milliseconds timeout) const {
  auto response = http_.request(method, target, headers(content_type, {}), std::move(body), timeout);
  if (!response.ok()) return transportError(response.error());
  return response;
}

Status Client::stream(const std::string& method, const std::string& target, const std::string& content_type,
                      std::map<std::string, std::string> extra_headers, http::RequestBody body,
                      const BodyCallback& on_body, milliseconds timeout) const {
  int status = 0;
  std::string error_body;
  std::optional<Error> callback_error;
  auto done = http_.requestStreaming(
      method, target, headers(content_type, std::move(extra_headers)), std::move(body),
      [&](const http::ClientResponse& head) {
        status = head.status;
        return okStatus();
      },
      [&](std::string_view chunk) -> Status {
        if (status < 200 || status >= 300) {
          error_body.append(chunk.substr(0, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
          return okStatus();
        }
        auto ok = on_body(chunk);
        if (!ok.ok()) callback_error = ok.error();
        return ok;
      },
      timeout);
  // The callback's own error, not the transport's report of the abort it caused.
  if (callback_error) return *callback_error;
  if (!done.ok()) return transportError(done.error());
  if (status < 200 || status >= 300) return apiError(status, error_body);
  return okStatus();
}

Status Client::streamLines(const std::string& method, const std::string& target, const json& body,
                           const LineCallback& on_line, milliseconds timeout) const {
  std::string partial;
  auto onLine = [&](std::string_view line) -> Status {
    if (line.empty()) return okStatus();
    auto parsed = parseJsonBounded(line);
    if (!parsed.ok())
      return makeError(ErrorCode::kInternal, "spaced sent an unusable stream line: " + parsed.error().message);
    return on_line(*parsed);
  };
  return stream(
      method, target, "application/json", {{"Accept", "application/x-ndjson"}}, dumpJson(body),
      [&](std::string_view chunk) -> Status {
        partial.append(chunk);
        size_t start = 0;
        for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
          SPACE_TRY(onLine(std::string_view(partial).substr(start, nl - start)));
        }
        partial.erase(0, start);
        if (partial.size() > kMaxStreamLine) {
          return makeError(ErrorCode::kInternal,
                           "spaced sent a stream line longer than " + std::to_string(kMaxStreamLine >> 20) + " MiB");
        }
        return okStatus();
      },
      timeout);
}

Error Client::transportError(const Error& e) const {
  std::string where = endpoint_.url + (endpoint_.url_source.empty() ? "" : " (" + endpoint_.url_source + ")");
  if (e.message.starts_with("cannot connect")) {
    return makeError(e.code, "cannot reach spaced at " + where + ": " + e.message + " (is it running? make run)");
  }
  if (e.message.starts_with("cannot resolve")) {
    return makeError(e.code, "cannot reach spaced at " + where + ": " + e.message);
  }
  if (e.code == ErrorCode::kInvalidArgument) return e;  // a request we could not even form
  return makeError(e.code, "talking to spaced at " + where + ": " + e.message);
}

Error Client::apiError(int status, const std::string& body) const {
  http::ClientResponse response;
  response.status = status;
  response.body = body;
  Error e = http::responseError(response);
  auto parsed = parseJsonBounded(body);
  const json doc = parsed.ok() ? std::move(parsed.value()) : json();
  const json& error = field(doc, "error");
  if (!field(error, "message").is_string()) {
    e.message = "spaced at " + endpoint_.url + " answered " + e.message;
    return e;
  }
  e.reason = text(field(error, "code"));
  std::string state = text(field(error, "state"));
  if (!state.empty() && e.message.find(state) == std::string::npos) e.message += " (the sandbox is " + state + ")";
  if (status == 401) e.message += "; the key came from " + endpoint_.key_source;
  return e;
}

std::map<std::string, std::string> Client::headers(const std::string& content_type,
                                                   std::map<std::string, std::string> extra) const {
  if (!endpoint_.key.empty()) extra["Authorization"] = "Bearer " + endpoint_.key;
  if (!content_type.empty()) extra["Content-Type"] = content_type;
  return extra;
}

}  // namespace space::apiclient
