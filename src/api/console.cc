#include "api/console.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <cctype>
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

// What the console's pages may do: run scripts from /ui/ only (not 'self': a guest's port is
// reached by path on this origin too, see api/ingress.h), connect to their own origin (the
// terminal's WebSocket too), no workers, plugins or framing by another site. Inline styles are
// allowed because the terminal library sizes its rows with them; inline scripts are not.
std::string contentSecurityPolicy(const std::string& origin) {
  return "default-src 'self'; script-src " + origin + "/ui/; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
         "connect-src 'self'; worker-src 'none'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; " +
         "form-action 'self'";
}

// A Host field fit to be part of an origin: a name or address and a port, nothing that could
// end a CSP directive or a URL.
bool plainHost(std::string_view host) {
  if (host.empty() || host.size() > 255) return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '[' || c == ']';
  });
}

std::string randomHex(size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  if (RAND_bytes(raw.data(), static_cast<int>(bytes)) != 1) abort();  // no entropy: nothing safe to do
  return hexEncode(raw.data(), raw.size());
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Calls `each(name, value, pair)` for every "name=value" pair of a Cookie field's value, each
// part trimmed; a pair without '=' has an empty value.
template <class Each>
void forEachCookie(std::string_view cookies, Each each) {
  while (!cookies.empty()) {
    size_t semi = cookies.find(';');
    std::string_view pair = trim(cookies.substr(0, semi));
    cookies = semi == std::string_view::npos ? std::string_view() : cookies.substr(semi + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    each(trim(pair.substr(0, eq)), eq == std::string_view::npos ? std::string_view() : trim(pair.substr(eq + 1)), pair);
  }
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

std::vector<std::string> cookieValues(const http::Request& request, std::string_view name) {
  std::vector<std::string> out;
  for (const auto& [field, value] : request.headers()) {
    if (!boost::beast::iequals(field, "cookie")) continue;
    forEachCookie(value, [&](std::string_view pair_name, std::string_view pair_value, std::string_view pair) {
      if (pair_name == name && pair.find('=') != std::string_view::npos) out.emplace_back(pair_value);
    });
  }
  return out;
}

std::string withoutCookie(std::string_view cookies, std::string_view name) {
  std::string kept;
  forEachCookie(cookies, [&](std::string_view pair_name, std::string_view, std::string_view pair) {
    if (pair_name == name) return;
    if (!kept.empty()) kept += "; ";
    kept += pair;
  });
  return kept;
}

bool ConsoleSessions::expired(const Entry& entry, Clock::time_point now) const {
  return now - entry.last_used > limits_.idle || now - entry.created > limits_.lifetime;
}

std::optional<ConsoleSessions::Opened> ConsoleSessions::open(std::string api_key, std::string tenant,
                                                             Clock::time_point now) {
  Opened opened{randomHex(32), randomHex(16)};
  std::lock_guard lock(mu_);
  size_t own = 0;
  auto own_oldest = sessions_.end();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (expired(it->second, now)) {
      it = sessions_.erase(it);
      continue;
    }
    if (it->second.session.tenant == tenant) {
      ++own;
      if (own_oldest == sessions_.end() || it->second.last_used < own_oldest->second.last_used) own_oldest = it;
    }
    ++it;
  }
  if (own >= limits_.max_per_tenant && own_oldest != sessions_.end()) {
    sessions_.erase(own_oldest);
  } else if (sessions_.size() >= limits_.max_sessions) {
    return std::nullopt;
  }
  sessions_.emplace(sha256Hex(opened.token),
                    Entry{Session{std::move(api_key), std::move(tenant), opened.csrf_token}, now, now});
  return opened;
}

std::optional<ConsoleSessions::Session> ConsoleSessions::find(std::string_view token, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(sha256Hex(token));
  if (it == sessions_.end()) return std::nullopt;
  if (expired(it->second, now)) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second.session;
}

void ConsoleSessions::touch(std::string_view token, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(sha256Hex(token));
  if (it != sessions_.end()) it->second.last_used = std::max(it->second.last_used, now);
}

void ConsoleSessions::close(std::string_view token) {
  std::lock_guard lock(mu_);
  sessions_.erase(sha256Hex(token));
}

size_t ConsoleSessions::size() {
  std::lock_guard lock(mu_);
  return sessions_.size();
}

Console::Console(KeyRing& keys, const ConsoleAssets* assets, ConsoleOptions options)
    : keys_(keys),
      assets_(assets),
      options_(std::move(options)),
      secure_(options_.https || options_.public_origin.rfind("https://", 0) == 0),
      sessions_(options_.sessions) {}

bool Console::isConsolePath(std::string_view path) { return path == "/ui" || path.rfind("/ui/", 0) == 0; }

std::string Console::ownOrigin(const http::Request& request) const {
  if (!options_.public_origin.empty()) return options_.public_origin;
  auto host = request.header("host");
  if (!host || !plainHost(*host)) return "";
  return std::string(options_.https ? "https://" : "http://") + *host;
}

bool Console::sameOrigin(const http::Request& request) const {
  auto origin = request.header("origin");
  if (!origin) return true;  // not sent by a browser's cross-origin machinery (or a top-level GET)
  const std::string own = ownOrigin(request);
  return !own.empty() && *origin == own;
}

std::string Console::cookieHeader(std::string_view value, bool expire) const {
  std::string cookie = std::string(cookieName()) + "=" + std::string(value) + "; Path=/; HttpOnly; SameSite=Strict";
  if (secure_) cookie += "; Secure";
  if (expire) cookie += "; Max-Age=0";
  return cookie;
}

std::optional<Console::CookieAuth> Console::authenticate(const http::Request& request) {
  auto tokens = cookieValues(request, cookieName());
  if (tokens.empty()) return std::nullopt;
  auto refuse = [](int status, std::string code, std::string message) {
    return CookieAuth{"", "", Refusal{status, std::move(code), std::move(message)}};
  };
  // Two of them: one was planted (by a page of a sibling host, for a longer path), and which
  // one a browser lists first is its choice. Neither is trusted.
  if (tokens.size() > 1) {
    return refuse(401, "unauthenticated", "the request carries more than one console session cookie; log in again");
  }
  const std::string& token = tokens.front();
  auto session = sessions_.find(token);
  if (!session) return refuse(401, "unauthenticated", "the console session has ended; log in again");
  auto tenant = keys_.authenticate(session->api_key);
  if (!tenant || *tenant != session->tenant) {
    sessions_.close(token);
    return refuse(401, "unauthenticated", "the API key of this console session was removed; log in again");
  }
  // Fetch metadata, where the browser sends it: a request made by a page of another site, or
  // of a sibling host (same-site: it still gets SameSite=Strict cookies), is not the console's.
  auto site = request.header("sec-fetch-site");
  if (!sameOrigin(request) || (site && *site != "same-origin" && *site != "none")) {
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
  sessions_.touch(token);
  return CookieAuth{*tenant, token, std::nullopt};
}

bool Console::stillValid(std::string_view token, const std::string& tenant) {
  auto session = sessions_.find(token);
  return session && session->tenant == tenant && keys_.authenticate(session->api_key) == tenant;
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
    (void)response.sendError(503, "unavailable",
                             "the web console is not built on this node (its operator builds it with `make ui`)");
    return;
  }
  const ConsoleAssets::Asset* asset = assets_->find(relative);
  if (!asset) {
    (void)response.sendError(404, "not_found", "the console has no page " + request.path());
    return;
  }
  const std::string origin = ownOrigin(request);
  response.setHeader("Content-Security-Policy", contentSecurityPolicy(origin.empty() ? "'none'" : origin));
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
  auto auth = authenticate(request);
  if (!auth || auth->refusal) {
    if (auth && auth->refusal->status == 401) response.setHeader("Set-Cookie", cookieHeader("", true));
    (void)response.sendError(auth ? auth->refusal->status : 401, auth ? auth->refusal->code : "unauthenticated",
                             auth ? auth->refusal->message : "no console session: log in with an API key");
    return;
  }
  auto session = sessions_.find(auth->token);
  if (!session) {
    (void)response.sendError(401, "unauthenticated", "the console session has ended; log in again");
    return;
  }
  (void)response.sendJson(200, json{{"tenant", session->tenant},
                                    {"operator", session->tenant == options_.operator_tenant},
                                    {"csrf_token", session->csrf_token}});
}

void Console::login(http::Request& request, http::Response& response) {
  if (!assets_) {
    (void)response.sendError(503, "unavailable", "the web console is not built on this node, so it has no sessions");
    return;
  }
  // A login comes from the console's page: a browser's fetch sends its Origin and a JSON type.
  // A form of another site (text/plain, or a browser that leaves Origin out) cannot log a
  // victim into the attacker's tenant.
  auto origin = request.header("origin");
  auto site = request.header("sec-fetch-site");
  if (!origin || !sameOrigin(request) || (site && *site != "same-origin")) {
    (void)response.sendError(403, "permission_denied", "log in from the console's own page");
    return;
  }
  auto type = request.header("content-type");
  if (!type || type->rfind("application/json", 0) != 0) {
    (void)response.sendError(415, "invalid_argument", "a login is a JSON body (Content-Type: application/json)");
    return;
  }
  auto body = readJsonBody(request, 4096);
  if (!body.ok()) {
    const bool too_large = body.error().code == ErrorCode::kResourceExhausted;
    (void)response.sendError(too_large ? 413 : 400, too_large ? "payload_too_large" : "invalid_argument",
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
  if (int retry_after_s = 1; rate_check_ && !rate_check_(*tenant, retry_after_s)) {
    response.setHeader("Retry-After", std::to_string(std::max(1, retry_after_s)));
    (void)response.sendError(429, "too_many_requests", "this tenant is over its request rate; retry later");
    return;
  }
  auto opened = sessions_.open(**key, *tenant);
  if (!opened) {
    response.setHeader("Retry-After", "60");
    (void)response.sendError(503, "unavailable",
                             "the node holds as many console sessions as it may; retry when some have ended");
    return;
  }
  spdlog::info("console: tenant {} logged in from {}", *tenant, request.remoteAddress());
  response.setHeader("Set-Cookie", cookieHeader(opened->token, false));
  (void)response.sendJson(
      200,
      json{{"tenant", *tenant}, {"operator", *tenant == options_.operator_tenant}, {"csrf_token", opened->csrf_token}});
}

void Console::logout(http::Request& request, http::Response& response) {
  auto auth = authenticate(request);
  if (auth && auth->refusal && auth->refusal->status == 403) {
    (void)response.sendError(403, auth->refusal->code, auth->refusal->message);
    return;
  }
  if (auth && !auth->refusal) sessions_.close(auth->token);
  response.setHeader("Set-Cookie", cookieHeader("", true));
  (void)response.send(204, "text/plain", "");
}

}  // namespace space::api
