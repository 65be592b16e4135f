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
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

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

// The value of the cookie `name` among a request's Cookie fields; nullopt when absent.
std::optional<std::string> cookieValue(const http::Request& request, std::string_view name);

class ConsoleSessions {
 public:
  struct Limits {
    std::chrono::seconds idle{3600};
    std::chrono::seconds lifetime{12 * 3600};
    size_t max_sessions = 4096;  // more: the least recently used one ends
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

  Opened open(std::string api_key, std::string tenant, Clock::time_point now = Clock::now());
  // The live session of `token`, marked as used at `now`; nullopt when unknown or expired (an
  // expired one is forgotten).
  std::optional<Session> use(std::string_view token, Clock::time_point now = Clock::now());
  void close(std::string_view token);
  size_t size();

 private:
  struct Entry {
    Session session;
    Clock::time_point created;
    Clock::time_point last_used;
  };
  Limits limits_;
  std::mutex mu_;
  // Keyed by the token's SHA-256, so the map's comparisons reveal nothing about a token.
  std::map<std::string, Entry, std::less<>> sessions_;
};

// /ui/ and the session routes, and the check of a request that comes with a session cookie.
class Console {
 public:
  static constexpr std::string_view kCookie = "space_session";
  static constexpr std::string_view kCsrfHeader = "x-csrf-token";

  // `assets`: null when the console was not built or is turned off (its pages then answer
  // 503 with the reason in `missing_why`). `secure_cookies`: the listener speaks HTTPS, so the
  // cookie is marked Secure. `https`: the scheme an Origin must carry.
  Console(KeyRing& keys, const ConsoleAssets* assets, std::string missing_why, bool https, std::string operator_tenant,
          ConsoleSessions::Limits limits = {});

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
  // its key was removed, its Origin is another site's, or it changes something (any method but
  // GET and HEAD) without the session's CSRF token.
  struct CookieAuth {
    std::string tenant;              // set when admitted
    std::optional<Refusal> refusal;  // set when not
  };
  std::optional<CookieAuth> authenticate(const http::Request& request);

 private:
  // The request's Origin, when it has one, is this console's.
  bool sameOrigin(const http::Request& request) const;
  void serveAsset(http::Request& request, http::Response& response, std::string_view relative);
  void sessionInfo(http::Request& request, http::Response& response);
  void login(http::Request& request, http::Response& response);
  void logout(http::Request& request, http::Response& response);
  std::string cookieHeader(std::string_view value, bool expire) const;

  KeyRing& keys_;
  const ConsoleAssets* assets_;
  std::string missing_why_;
  bool https_;
  std::string operator_tenant_;
  ConsoleSessions sessions_;
};

}  // namespace space::api
