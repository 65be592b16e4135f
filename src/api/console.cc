#include "api/console.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <system_error>

#include "api/json_input.h"
#include "common/digest.h"

namespace space::api {
namespace {

using json = nlohmann::json;

// What the console's pages may do: their own scripts and connections only (the terminal's
// WebSocket is 'self' too), no framing by another site. Inline styles are allowed because the
// terminal library sizes its rows with them; inline scripts are not.
constexpr std::string_view kContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) abort();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : raw) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

void setCommonHeaders(http::Response& response) {
  response.setHeader("X-Content-Type-Options", "nosniff");
  response.setHeader("Referrer-Policy", "no-referrer");
  response.setHeader("Cache-Control", "no-store");
}

}  // namespace

std::string contentTypeFor(std::string_view name) {
  static const std::pair<std::string_view, std::string_view> kTypes[] = {
      {".html", "text/html; charset=utf-8"},
      {".js", "text/javascript; charset=utf-8"},
      {".mjs", "text/javascript; charset=utf-8"},
      {".css", "text/css; charset=utf-8"},
      {".json", "application/json"},
      {".svg", "image/svg+xml"},
      {".png", "image/png"},
      {".ico", "image/x-icon"},
      {".woff2", "font/woff2"},
      {".txt", "text/plain; charset=utf-8"},
  };
  for (const auto& [ext, type] : kTypes) {
    if (name.size() > ext.size() && name.substr(name.size() - ext.size()) == ext) return std::string(type);
  }
  return "application/octet-stream";
}

Result<ConsoleAssets> ConsoleAssets::load(const std::string& dir, size_t max_files, size_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return makeError(ErrorCode::kNotFound,
                     "the web console's directory " + dir + " does not exist (make ui builds it)");
  }
  ConsoleAssets out;
  size_t total = 0;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot read " + dir + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return makeError(ErrorCode::kInternal, "cannot read " + dir + ": " + ec.message());
    // A link is not followed: what is served is what the build wrote, nothing it points at.
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    if (out.assets_.size() >= max_files) {
      return makeError(ErrorCode::kResourceExhausted, dir + " holds more than " + std::to_string(max_files) +
                                                          " files; is --ui-dir the console's build?");
    }
    std::ifstream in(it->path(), std::ios::binary);
    std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) return makeError(ErrorCode::kInternal, "cannot read " + it->path().string());
    total += body.size();
    if (total > max_bytes) {
      return makeError(ErrorCode::kResourceExhausted, dir + " holds more than " + std::to_string(max_bytes >> 20) +
                                                          " MiB; is --ui-dir the console's build?");
    }
    const std::string relative = fs::relative(it->path(), dir, ec).generic_string();
    if (ec) return makeError(ErrorCode::kInternal, "cannot name " + it->path().string() + ": " + ec.message());
    Asset asset;
    asset.content_type = contentTypeFor(relative);
    asset.etag = "\"" + sha256Hex(body).substr(0, 32) + "\"";
    asset.body = std::move(body);
    out.assets_.emplace(relative, std::move(asset));
  }
  if (!out.find(""))
    return makeError(ErrorCode::kNotFound, dir + " has no index.html; is --ui-dir the console's build?");
  return out;
}

const ConsoleAssets::Asset* ConsoleAssets::find(std::string_view relative) const {
  auto it = assets_.find(relative.empty() ? std::string_view("index.html") : relative);
  return it == assets_.end() ? nullptr : &it->second;
}

std::optional<std::string> cookieValue(const http::Request& request, std::string_view name) {
  for (const auto& [field, value] : request.headers()) {
    if (!equalsIgnoreCase(field, "cookie")) continue;
    std::string_view rest = value;
    while (!rest.empty()) {
      size_t semi = rest.find(';');
      std::string_view pair = trim(rest.substr(0, semi));
      rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
      size_t eq = pair.find('=');
      if (eq == std::string_view::npos || trim(pair.substr(0, eq)) != name) continue;
      return std::string(trim(pair.substr(eq + 1)));
    }
  }
  return std::nullopt;
}

ConsoleSessions::Opened ConsoleSessions::open(std::string api_key, std::string tenant, Clock::time_point now) {
  Opened opened{randomHex(32), randomHex(16)};
  std::lock_guard lock(mu_);
  // Expired sessions go first; over the cap, the least recently used one.
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const bool expired = now - it->second.last_used > limits_.idle || now - it->second.created > limits_.lifetime;
    it = expired ? sessions_.erase(it) : std::next(it);
  }
  while (!sessions_.empty() && sessions_.size() >= limits_.max_sessions) {
    auto oldest = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    }
    sessions_.erase(oldest);
  }
  sessions_.emplace(sha256Hex(opened.token),
                    Entry{Session{std::move(api_key), std::move(tenant), opened.csrf_token}, now, now});
  return opened;
}

std::optional<ConsoleSessions::Session> ConsoleSessions::use(std::string_view token, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(sha256Hex(token));
  if (it == sessions_.end()) return std::nullopt;
  if (now - it->second.last_used > limits_.idle || now - it->second.created > limits_.lifetime) {
    sessions_.erase(it);
    return std::nullopt;
  }
  it->second.last_used = std::max(it->second.last_used, now);
  return it->second.session;
}

void ConsoleSessions::close(std::string_view token) {
  std::lock_guard lock(mu_);
  sessions_.erase(sha256Hex(token));
}

size_t ConsoleSessions::size() {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

Console::Console(KeyRing& keys, const ConsoleAssets* assets, std::string missing_why, bool https,
                 std::string operator_tenant, ConsoleSessions::Limits limits)
    : keys_(keys),
      assets_(assets),
      missing_why_(std::move(missing_why)),
      https_(https),
      operator_tenant_(std::move(operator_tenant)),
      sessions_(limits) {}

bool Console::isConsolePath(std::string_view path) { return path == "/ui" || path.rfind("/ui/", 0) == 0; }

bool Console::sameOrigin(const http::Request& request) const {
  auto origin = request.header("origin");
  if (!origin) return true;  // not sent by a browser's cross-origin machinery (or a top-level GET)
  auto host = request.header("host");
  if (!host) return false;
  return *origin == std::string(https_ ? "https://" : "http://") + *host;
}

std::string Console::cookieHeader(std::string_view value, bool expire) const {
  std::string cookie = std::string(kCookie) + "=" + std::string(value) + "; Path=/; HttpOnly; SameSite=Strict";
  if (https_) cookie += "; Secure";
  if (expire) cookie += "; Max-Age=0";
  return cookie;
}

std::optional<Console::CookieAuth> Console::authenticate(const http::Request& request) {
  auto token = cookieValue(request, kCookie);
  if (!token) return std::nullopt;
  auto refuse = [](int status, std::string code, std::string message) {
    return CookieAuth{"", Refusal{status, std::move(code), std::move(message)}};
  };
  auto session = sessions_.use(*token);
  if (!session) return refuse(401, "unauthenticated", "the console session has ended; log in again");
  auto tenant = keys_.authenticate(session->api_key);
  if (!tenant || *tenant != session->tenant) {
    sessions_.close(*token);
    return refuse(401, "unauthenticated", "the API key of this console session was removed; log in again");
  }
  if (!sameOrigin(request)) {
    return refuse(403, "permission_denied", "a console session is only good for requests from the console's own pages");
  }
  const std::string& method = request.method();
  if (method != "GET" && method != "HEAD") {
    auto presented = request.header(kCsrfHeader);
    if (!presented || !constantTimeEquals(*presented, session->csrf_token)) {
      return refuse(403, "permission_denied",
                    "a request with a console session that changes something needs the session's X-CSRF-Token header");
    }
  }
  return CookieAuth{*tenant, std::nullopt};
}

void Console::handle(http::Request& request, http::Response& response) {
  const std::string& path = request.path();
  // Nothing here needs a tenant's ticket: the connection closes after each answer, like every
  // other answer given before a key is checked.
  response.closeConnection();
  setCommonHeaders(response);
  if (path == "/ui") {
    response.setHeader("Location", "/ui/");
    (void)response.send(308, "text/plain", "");
    return;
  }
  if (path == "/ui/session") {
    if (request.method() == "GET") return sessionInfo(request, response);
    if (request.method() == "POST") return login(request, response);
    if (request.method() == "DELETE") return logout(request, response);
    response.setHeader("Allow", "GET, POST, DELETE");
    (void)response.sendError(405, "method_not_allowed",
                             "method " + request.method() + " is not allowed on /ui/session");
    return;
  }
  if (request.method() != "GET" && request.method() != "HEAD") {
    response.setHeader("Allow", "GET, HEAD");
    (void)response.sendError(405, "method_not_allowed", "the console's pages are only read (GET)");
    return;
  }
  serveAsset(request, response, std::string_view(path).substr(4));
}

void Console::serveAsset(http::Request& request, http::Response& response, std::string_view relative) {
  if (!assets_) {
    (void)response.sendError(503, "unavailable", missing_why_);
    return;
  }
  const ConsoleAssets::Asset* asset = assets_->find(relative);
  if (!asset) {
    (void)response.sendError(404, "not_found", "the console has no page " + request.path());
    return;
  }
  response.setHeader("Content-Security-Policy", kContentSecurityPolicy);
  // A page of the console never shares a browsing context group with a page of another origin,
  // nor with a guest's page served on this origin (those are sandboxed, see api/ingress.h).
  response.setHeader("Cross-Origin-Opener-Policy", "same-origin");
  response.setHeader("X-Frame-Options", "DENY");
  // Revalidated on each load (a rebuilt console shows at once), answered 304 when unchanged.
  response.setHeader("Cache-Control", "no-cache");
  response.setHeader("ETag", asset->etag);
  if (auto match = request.header("if-none-match"); match && *match == asset->etag) {
    (void)response.send(304, asset->content_type, "");
    return;
  }
  (void)response.send(200, asset->content_type, request.method() == "HEAD" ? std::string_view() : asset->body);
}

void Console::sessionInfo(http::Request& request, http::Response& response) {
  auto token = cookieValue(request, kCookie);
  auto session = token ? sessions_.use(*token) : std::nullopt;
  if (session && keys_.authenticate(session->api_key) != session->tenant) {
    sessions_.close(*token);
    session.reset();
  }
  if (!session) {
    (void)response.sendError(401, "unauthenticated", "no console session: log in with an API key");
    return;
  }
  if (!sameOrigin(request)) {
    (void)response.sendError(403, "permission_denied", "the console's session is only told to its own pages");
    return;
  }
  (void)response.sendJson(200, json{{"tenant", session->tenant},
                                    {"operator", session->tenant == operator_tenant_},
                                    {"csrf_token", session->csrf_token}});
}

void Console::login(http::Request& request, http::Response& response) {
  if (!sameOrigin(request)) {
    (void)response.sendError(403, "permission_denied", "log in from the console's own page");
    return;
  }
  auto body = readJsonBody(request, 4096);
  if (!body.ok()) {
    (void)response.sendError(
        body.error().code == ErrorCode::kResourceExhausted ? 413 : 400,
        body.error().code == ErrorCode::kResourceExhausted ? "payload_too_large" : "invalid_argument",
        body.error().message);
    return;
  }
  ObjectReader reader(body.value());
  auto key = reader.string("api_key", 256);
  Status done = key.ok() ? reader.finish() : Status(key.error());
  if (!done.ok() || !key.value()) {
    (void)response.sendError(400, "invalid_argument", done.ok() ? "api_key: required" : done.error().message);
    return;
  }
  auto tenant = keys_.authenticate(**key);
  if (!tenant) {
    (void)response.sendError(401, "unauthenticated", "the API key is not valid");
    return;
  }
  auto opened = sessions_.open(**key, *tenant);
  spdlog::info("console: tenant {} logged in from {}", *tenant, request.remoteAddress());
  response.setHeader("Set-Cookie", cookieHeader(opened.token, false));
  (void)response.sendJson(
      200, json{{"tenant", *tenant}, {"operator", *tenant == operator_tenant_}, {"csrf_token", opened.csrf_token}});
}

void Console::logout(http::Request& request, http::Response& response) {
  auto token = cookieValue(request, kCookie);
  if (token) {
    auto auth = authenticate(request);
    if (auth && auth->refusal && auth->refusal->status == 403) {
      (void)response.sendError(403, auth->refusal->code, auth->refusal->message);
      return;
    }
    sessions_.close(*token);
  }
  response.setHeader("Set-Cookie", cookieHeader("", true));
  (void)response.send(204, "text/plain", "");
}

}  // namespace space::api
