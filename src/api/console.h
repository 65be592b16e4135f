// The web console's server side (docs/api.md "Web console"): the built assets it serves at
// /ui/, and the browser sessions that stand in for an API key.
//
// A browser cannot keep an API key safe in a page, so it trades the key for a session: an
// HttpOnly, SameSite=Strict cookie whose token spaced keeps (the page's scripts never see it),
// plus a CSRF token that the page sends back in a header on every request that changes
// something. Sessions end after an hour unused, after 12 hours in all, at logout, and as soon
// as their API key is removed (the key is checked again on every request). A request that
// carries an Origin must come from the console's own origin, which also keeps other sites'
// WebSockets off a sandbox's terminal.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/auth.h"
#include "common/result.h"
#include "http/message.h"

namespace space::api {

// Files loaded once from the directory a build of ui/ wrote (ui/build.mjs), served from memory.
class ConsoleAssets {
 public:
  struct Asset {
    std::string body;
    std::string content_type;
    std::string etag;  // a quoted digest of the body
  };
  // Every regular file under `dir` (symbolic links are not followed), keyed by its path
  // relative to it. Fails when `dir` is not a directory, when it lacks index.html, or when the
  // files exceed max_files or max_bytes: the console is a handful of small bundles.
  static Result<ConsoleAssets> load(const std::string& dir, size_t max_files = 256, size_t max_bytes = 32 << 20);
  // The asset for a path relative to /ui/ ("" is index.html); null when there is none.
  const Asset* find(std::string_view relative) const;
  size_t count() const { return assets_.size(); }

 private:
  std::map<std::string, Asset, std::less<>> assets_;
};

// The Content-Type spaced sends for a file name (by extension; unknown: octet-stream).
std::string contentTypeFor(std::string_view name);

// Every value of the cookie `name` among a request's Cookie fields, in order.
std::vector<std::string> cookieValues(const http::Request& request, std::string_view name);
// A Cookie field's value without the cookies named `name` (empty when none is left): what a
// guest may be sent.
std::string withoutCookie(std::string_view cookies, std::string_view name);

class ConsoleSessions {
 public:
  struct Limits {
    std::chrono::seconds idle{3600};
    std::chrono::seconds lifetime{12 * 3600};
    // Sessions held at once. A tenant over its share ends its own least recently used one; a
    // login that finds the node's cap full is refused, so no tenant can log the others out by
    // logging in over and over.
    size_t max_sessions = 4096;
    size_t max_per_tenant = 32;
  };
  struct Opened {
    std::string token;  // the cookie's value
    std::string csrf_token;
  };
  struct Session {
    std::string api_key;  // checked again on each use, so removing a key ends its sessions
    std::string tenant;
    std::string csrf_token;
  };
  using Clock = std::chrono::steady_clock;

  explicit ConsoleSessions(Limits limits) : limits_(limits) {}
  ConsoleSessions() : ConsoleSessions(Limits{}) {}

  // nullopt when the node holds max_sessions live sessions already.
  std::optional<Opened> open(std::string api_key, std::string tenant, Clock::time_point now = Clock::now());
  // The live session of `token`; nullopt when unknown or expired (an expired one is forgotten).
  // Only touch() counts as a use: a refused request keeps nobody's session alive.
  std::optional<Session> find(std::string_view token, Clock::time_point now = Clock::now());
  void touch(std::string_view token, Clock::time_point now = Clock::now());
  void close(std::string_view token);
  size_t size();

 private:
  struct Entry {
    Session session;
    Clock::time_point created;
    Clock::time_point last_used;
  };
  bool expired(const Entry& entry, Clock::time_point now) const;
  Limits limits_;
  std::mutex mu_;
  // Keyed by the token's SHA-256, so the map's comparisons reveal nothing about a token.
  std::map<std::string, Entry, std::less<>> sessions_;
};

struct ConsoleOptions {
  // The listener speaks HTTPS: the cookie is Secure (and __Host- prefixed, which a page of
  // another host cannot plant), and an Origin must be https.
  bool https = false;
  // The origin browsers reach the console at ("https://space.example.com"), when that is not
  // what the request's Host says (behind a TLS-terminating proxy); an https one also makes the
  // cookie Secure. Empty: the scheme above and the request's Host.
  std::string public_origin;
  std::string operator_tenant = "default";
  ConsoleSessions::Limits sessions;
};

// /ui/ and the session routes, and the check of a request that comes with a session cookie.
class Console {
 public:
  // Both names, so that whichever the console uses is never passed to a guest.
  static constexpr std::string_view kCookie = "space_session";
  static constexpr std::string_view kSecureCookie = "__Host-space_session";
  static constexpr std::string_view kCsrfHeader = "x-csrf-token";
  // Spends a request of the tenant's rate (its TenantGate); false: over it, with `retry_after_s`.
  using RateCheck = std::function<bool(const std::string& tenant, int& retry_after_s)>;

  // `assets`: null when the console was not built (its pages then answer 503, and no session
  // can be opened).
  Console(KeyRing& keys, const ConsoleAssets* assets, ConsoleOptions options);
  void setRateCheck(RateCheck check) { rate_check_ = std::move(check); }

  // Whether the request is for the console: /ui and below.
  static bool isConsolePath(std::string_view path);
  // Serves /ui, /ui/... (assets) and /ui/session (GET: who is logged in, POST: log in with
  // {"api_key"}, DELETE: log out).
  void handle(http::Request& request, http::Response& response);

  struct Refusal {
    int status;  // 401 or 403
    std::string code;
    std::string message;
  };
  // For an API request without an Authorization field: the tenant of its session cookie;
  // nullopt when it has no session cookie; a refusal when the session is unknown or expired,
  // its key was removed, it came from another site (its Origin, or Sec-Fetch-Site saying
  // cross-site or same-site), it sends the cookie twice (one may be planted), or it changes
  // something (any method but GET and HEAD) without the session's CSRF token.
  struct CookieAuth {
    std::string tenant;              // set when admitted
    std::string token;               // the session's, when admitted
    std::optional<Refusal> refusal;  // set when not
  };
  std::optional<CookieAuth> authenticate(const http::Request& request);
  // Whether the session of `token` still stands for `tenant` (a long stream asks again).
  bool stillValid(std::string_view token, const std::string& tenant);

 private:
  // The request's Origin, when it has one, is this console's.
  bool sameOrigin(const http::Request& request) const;
  std::string ownOrigin(const http::Request& request) const;
  std::string_view cookieName() const { return secure_ ? kSecureCookie : kCookie; }
  void serveAsset(http::Request& request, http::Response& response, std::string_view relative);
  void sessionInfo(http::Request& request, http::Response& response);
  void login(http::Request& request, http::Response& response);
  void logout(http::Request& request, http::Response& response);
  std::string cookieHeader(std::string_view value, bool expire) const;

  KeyRing& keys_;
  const ConsoleAssets* assets_;
  ConsoleOptions options_;
  bool secure_;
  ConsoleSessions sessions_;
  RateCheck rate_check_;
};

}  // namespace space::api
