// The web console's server side: assets, sessions and the cookie check, on a real HTTP server
// with raw requests (what a browser sends, and what a hostile page would send instead).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "../support/raw_http.h"
#include "api/console.h"
#include "api/ingress.h"
#include "common/fs.h"
#include "http/server.h"
#include "store/state_store.h"

namespace space::api {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string roundTrip(uint16_t port, const std::string& request) {
  auto fd = testsupport::connectRaw(port);
  testsupport::sendRaw(fd.get(), request);
  return testsupport::readUntilClosed(fd.get());
}

int statusOf(const std::string& answer) { return answer.size() > 12 ? std::stoi(answer.substr(9, 3)) : 0; }

std::string bodyOf(const std::string& answer) {
  size_t at = answer.find("\r\n\r\n");
  return at == std::string::npos ? "" : answer.substr(at + 4);
}

// The value of a response header (first one), or "".
std::string headerOf(const std::string& answer, const std::string& name) {
  std::string lowered = answer.substr(0, answer.find("\r\n\r\n"));
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t at = lowered.find("\r\n" + name + ":");
  if (at == std::string::npos) return "";
  at += name.size() + 3;
  size_t end = answer.find("\r\n", at);
  std::string value = answer.substr(at, end - at);
  return value.substr(value.find_first_not_of(' '));
}

class ConsoleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create(testing::TempDir(), "console-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    std::filesystem::create_directories(dir_->path() + "/ui/fonts");
    std::ofstream(dir_->path() + "/ui/index.html") << "<!doctype html><title>SPACE</title>";
    std::ofstream(dir_->path() + "/ui/app.js") << "console.log(1)";
    std::ofstream(dir_->path() + "/ui/fonts/a.woff2") << "font";
    std::filesystem::create_symlink("/etc/passwd", dir_->path() + "/ui/passwd");
    auto db = store::StateStore::open(dir_->path() + "/state.db");
    ASSERT_TRUE(db.ok()) << db.error().message;
    db_ = std::move(db.value());
    key_ = generateApiKey();
    ASSERT_TRUE(db_->addApiKey({"alice", apiKeyDigest(key_), "", 0}).ok());
    keys_ = std::make_unique<KeyRing>(*db_);
    ASSERT_TRUE(keys_->load().ok());
    auto assets = ConsoleAssets::load(dir_->path() + "/ui");
    ASSERT_TRUE(assets.ok()) << assets.error().message;
    assets_ = std::move(assets.value());
    ConsoleSessions::Limits limits;
    limits.max_sessions = 8;
    limits.max_per_tenant = 3;
    console_ = std::make_unique<Console>(*keys_, &assets_, ConsoleOptions{false, "", "default", limits});
    console_->setRateCheck([this](const std::string&, int& retry_after_s) {
      retry_after_s = 7;
      return !rate_limited_;
    });
    // /ui/... to the console; /api answers with the tenant the cookie check found.
    auto server = http::Server::start("127.0.0.1:0", [this](http::Request& request, http::Response& response) {
      if (Console::isConsolePath(request.path())) return console_->handle(request, response);
      response.closeConnection();
      auto auth = console_->authenticate(request);
      if (!auth) return (void)response.sendError(401, "unauthenticated", "no cookie");
      if (auth->refusal)
        return (void)response.sendError(auth->refusal->status, auth->refusal->code, auth->refusal->message);
      (void)response.sendJson(200, json{{"tenant", auth->tenant}});
    });
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(server.value());
    port_ = server_->port();
    host_ = "127.0.0.1:" + std::to_string(port_);
  }

  std::string request(const std::string& method, const std::string& path, const std::string& extra_headers = "",
                      const std::string& body = "") {
    return roundTrip(port_, method + " " + path + " HTTP/1.1\r\nHost: " + host_ + "\r\n" + extra_headers +
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }

  std::string loginHeaders() { return "Content-Type: application/json\r\nOrigin: http://" + host_ + "\r\n"; }

  // Logs in; returns the cookie field to send and the CSRF token.
  std::pair<std::string, std::string> login() {
    auto answer = request("POST", "/ui/session", loginHeaders(), json{{"api_key", key_}}.dump());
    EXPECT_EQ(statusOf(answer), 200) << answer;
    std::string cookie = headerOf(answer, "set-cookie");
    EXPECT_NE(cookie.find("HttpOnly"), std::string::npos) << cookie;
    EXPECT_NE(cookie.find("SameSite=Strict"), std::string::npos) << cookie;
    auto parsed = json::parse(bodyOf(answer));
    EXPECT_EQ(parsed["tenant"], "alice");
    EXPECT_EQ(parsed["operator"], false);
    return {"Cookie: theme=dark; " + cookie.substr(0, cookie.find(';')) + "\r\n", parsed["csrf_token"]};
  }

  std::optional<TempDir> dir_;
  std::unique_ptr<store::StateStore> db_;
  std::string key_;
  std::unique_ptr<KeyRing> keys_;
  ConsoleAssets assets_;
  std::unique_ptr<Console> console_;
  bool rate_limited_ = false;
  std::unique_ptr<http::Server> server_;
  uint16_t port_ = 0;
  std::string host_;
};

TEST_F(ConsoleTest, ServesItsBuildWithAStrictPolicyAndNothingElse) {
  EXPECT_EQ(assets_.count(), 3u);  // the link to /etc/passwd is not followed
  auto index = request("GET", "/ui/");
  ASSERT_EQ(statusOf(index), 200) << index;
  EXPECT_EQ(bodyOf(index), "<!doctype html><title>SPACE</title>");
  EXPECT_EQ(headerOf(index, "content-type"), "text/html; charset=utf-8");
  // Scripts from /ui/ only: a guest's port is reached by path on this same origin.
  EXPECT_NE(headerOf(index, "content-security-policy").find("script-src http://" + host_ + "/ui/;"), std::string::npos)
      << headerOf(index, "content-security-policy");
  EXPECT_NE(headerOf(index, "content-security-policy").find("worker-src 'none'"), std::string::npos);
  EXPECT_NE(headerOf(index, "content-security-policy").find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_EQ(headerOf(index, "x-frame-options"), "DENY");
  EXPECT_EQ(headerOf(index, "x-content-type-options"), "nosniff");
  EXPECT_EQ(headerOf(request("GET", "/ui/fonts/a.woff2"), "content-type"), "font/woff2");
  // Unchanged: 304 against its ETag.
  const std::string etag = headerOf(index, "etag");
  EXPECT_EQ(statusOf(request("GET", "/ui/app.js",
                             "If-None-Match: " + headerOf(request("GET", "/ui/app.js"), "etag") + "\r\n")),
            304);
  EXPECT_FALSE(etag.empty());
  EXPECT_EQ(statusOf(request("GET", "/ui")), 308);
  for (const char* path : {"/ui/passwd", "/ui/../state.db", "/ui/%2e%2e/state.db", "/ui/nothing.js", "/ui/fonts"}) {
    EXPECT_EQ(statusOf(request("GET", path)), 404) << path;
  }
  EXPECT_EQ(statusOf(request("POST", "/ui/app.js")), 405);
}

TEST_F(ConsoleTest, AKeyBuysASessionThatAuthenticatesUntilLogout) {
  EXPECT_EQ(statusOf(request("GET", "/ui/session")), 401);
  EXPECT_EQ(statusOf(request("GET", "/api")), 401);
  auto wrong = request("POST", "/ui/session", loginHeaders(), json{{"api_key", "e2b_" + std::string(40, '0')}}.dump());
  EXPECT_EQ(statusOf(wrong), 401);
  EXPECT_TRUE(headerOf(wrong, "set-cookie").empty());
  EXPECT_EQ(statusOf(request("POST", "/ui/session", loginHeaders(), "{\"api_key\":1}")), 400);
  EXPECT_EQ(statusOf(request("POST", "/ui/session", loginHeaders(), "{\"api_key\":\"x\",\"extra\":1}")), 400);
  EXPECT_EQ(statusOf(request("POST", "/ui/session", loginHeaders(), "[[[[")), 400);
  // A login comes from the console's page: with its Origin, as JSON, not from a form elsewhere.
  const std::string good = json{{"api_key", key_}}.dump();
  EXPECT_EQ(statusOf(request("POST", "/ui/session", "Content-Type: application/json\r\n", good)), 403);
  EXPECT_EQ(
      statusOf(request("POST", "/ui/session", "Content-Type: text/plain\r\nOrigin: http://" + host_ + "\r\n", good)),
      415);
  EXPECT_EQ(statusOf(request("POST", "/ui/session", loginHeaders() + "Sec-Fetch-Site: same-site\r\n", good)), 403);
  // It spends a request of the tenant's rate.
  rate_limited_ = true;
  auto limited = request("POST", "/ui/session", loginHeaders(), good);
  EXPECT_EQ(statusOf(limited), 429);
  EXPECT_EQ(headerOf(limited, "retry-after"), "7");
  rate_limited_ = false;

  auto [cookie, csrf] = login();
  auto info = request("GET", "/ui/session", cookie);
  ASSERT_EQ(statusOf(info), 200) << info;
  EXPECT_EQ(json::parse(bodyOf(info))["csrf_token"], csrf);
  auto read = request("GET", "/api", cookie + "Origin: http://" + host_ + "\r\n");
  ASSERT_EQ(statusOf(read), 200) << read;
  EXPECT_EQ(json::parse(bodyOf(read))["tenant"], "alice");
  // A change needs the CSRF token, and the right one.
  EXPECT_EQ(statusOf(request("POST", "/api", cookie)), 403);
  EXPECT_EQ(statusOf(request("POST", "/api", cookie + "X-CSRF-Token: " + std::string(csrf.size(), '0') + "\r\n")), 403);
  EXPECT_EQ(statusOf(request("POST", "/api", cookie + "X-CSRF-Token: " + csrf + "\r\n")), 200);
  // Another origin (a page elsewhere, a guest's page on a preview host, a sandboxed page: "null")
  // gets nothing, not even a read, nor a terminal's WebSocket.
  for (const char* origin : {"http://evil.example", "null", "https://127.0.0.1"}) {
    EXPECT_EQ(statusOf(request("GET", "/api", cookie + "Origin: " + origin + "\r\n")), 403) << origin;
    EXPECT_EQ(statusOf(request("GET", "/ui/session", cookie + "Origin: " + origin + "\r\n")), 403) << origin;
  }
  // Fetch metadata of another site, or of a sibling host, is refused too.
  EXPECT_EQ(statusOf(request("GET", "/api", cookie + "Sec-Fetch-Site: same-site\r\n")), 403);
  EXPECT_EQ(statusOf(request("GET", "/api", cookie + "Sec-Fetch-Site: cross-site\r\n")), 403);
  EXPECT_EQ(statusOf(request("GET", "/api", cookie + "Sec-Fetch-Site: same-origin\r\n")), 200);
  // A second session cookie (planted by a sibling host's page for a longer path) makes both
  // worthless, whichever comes first.
  auto [other_cookie, other_csrf] = login();
  const std::string other_token = other_cookie.substr(other_cookie.find("space_session=") + 14, 64);
  EXPECT_EQ(statusOf(request("GET", "/api", cookie + "Cookie: space_session=" + other_token + "\r\n")), 401);
  EXPECT_EQ(statusOf(request("GET", "/ui/session", "Cookie: space_session=" + other_token + "; " + cookie.substr(8))),
            401);
  // Logout needs the token too; afterwards the cookie is worth nothing.
  EXPECT_EQ(statusOf(request("DELETE", "/ui/session", cookie + "Origin: http://evil.example\r\n")), 403);
  auto out = request("DELETE", "/ui/session", cookie + "X-CSRF-Token: " + csrf + "\r\n");
  EXPECT_EQ(statusOf(out), 204) << out;
  EXPECT_NE(headerOf(out, "set-cookie").find("Max-Age=0"), std::string::npos);
  EXPECT_EQ(statusOf(request("GET", "/api", cookie)), 401);
  EXPECT_EQ(statusOf(request("GET", "/ui/session", cookie)), 401);
}

TEST_F(ConsoleTest, RemovingTheKeyEndsItsSessions) {
  auto [cookie, csrf] = login();
  ASSERT_EQ(statusOf(request("GET", "/api", cookie)), 200);
  ASSERT_TRUE(db_->removeApiKeys("alice").ok());
  std::this_thread::sleep_for(KeyRing::kRefresh + 200ms);
  EXPECT_EQ(statusOf(request("GET", "/api", cookie)), 401);
  EXPECT_EQ(statusOf(request("GET", "/ui/session", cookie)), 401);
}

TEST(ConsoleSessions, ExpireWhenIdleOrOld) {
  using Clock = ConsoleSessions::Clock;
  ConsoleSessions sessions(ConsoleSessions::Limits{60s, 300s, 8, 4});
  const auto t0 = Clock::now();
  auto a = sessions.open("ka", "alice", t0).value();
  EXPECT_NE(a.token, a.csrf_token);
  EXPECT_EQ(a.token.size(), 64u);
  EXPECT_TRUE(sessions.find(a.token, t0 + 50s));
  sessions.touch(a.token, t0 + 50s);
  EXPECT_TRUE(sessions.find(a.token, t0 + 100s));  // used at 50 s: the idle clock restarted
  EXPECT_FALSE(sessions.find(a.token.substr(1), t0 + 100s));
  EXPECT_FALSE(sessions.find(a.token, t0 + 111s));  // found (refused requests) is not used
  auto b = sessions.open("kb", "bob", t0).value();
  for (int i = 1; i <= 5; ++i) sessions.touch(b.token, t0 + i * 55s);
  EXPECT_FALSE(sessions.find(b.token, t0 + 301s));  // past its lifetime, however used
  EXPECT_EQ(sessions.size(), 0u);
}

// One tenant logging in over and over ends only its own sessions; at the node's cap a login is
// refused rather than ending another tenant's.
TEST(ConsoleSessions, ATenantCannotLogOthersOut) {
  using Clock = ConsoleSessions::Clock;
  ConsoleSessions sessions(ConsoleSessions::Limits{3600s, 7200s, 4, 2});
  const auto t0 = Clock::now();
  auto victim = sessions.open("kv", "victim", t0).value();
  auto first = sessions.open("km", "mallory", t0 + 1s).value();
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(sessions.open("km", "mallory", t0 + 2s));
  EXPECT_TRUE(sessions.find(victim.token, t0 + 3s));
  EXPECT_FALSE(sessions.find(first.token, t0 + 3s));  // its own oldest went
  EXPECT_EQ(sessions.size(), 3u);
  ASSERT_TRUE(sessions.open("kc", "carol", t0 + 4s));
  EXPECT_FALSE(sessions.open("kd", "dave", t0 + 5s));  // the node is full: refused
  EXPECT_TRUE(sessions.find(victim.token, t0 + 6s));
}

TEST_F(ConsoleTest, WithoutABuildNothingIsServedAndNoSessionOpens) {
  Console bare(*keys_, nullptr, ConsoleOptions{});
  auto server = http::Server::start("127.0.0.1:0", [&](http::Request& q, http::Response& r) { bare.handle(q, r); });
  ASSERT_TRUE(server.ok());
  const std::string host = "127.0.0.1:" + std::to_string(server.value()->port());
  auto page = roundTrip(server.value()->port(), "GET /ui/ HTTP/1.1\r\nHost: " + host + "\r\n\r\n");
  EXPECT_EQ(statusOf(page), 503);
  EXPECT_EQ(bodyOf(page).find(dir_->path()), std::string::npos);  // no path of the node in it
  const std::string body = json{{"api_key", key_}}.dump();
  auto login = roundTrip(server.value()->port(), "POST /ui/session HTTP/1.1\r\nHost: " + host + "\r\nOrigin: http://" +
                                                     host + "\r\nContent-Type: application/json\r\nContent-Length: " +
                                                     std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(statusOf(login), 503);
}

// Behind HTTPS (or a proxy that terminates it, named by its public origin) the cookie is
// Secure and __Host- prefixed, and the Origin must be that one.
TEST_F(ConsoleTest, APublicHttpsOriginMakesTheCookieSecure) {
  ConsoleAssets assets = ConsoleAssets::load(dir_->path() + "/ui").value();
  Console behind(*keys_, &assets, ConsoleOptions{false, "https://space.example", "default", {}});
  auto server = http::Server::start("127.0.0.1:0", [&](http::Request& q, http::Response& r) {
    if (Console::isConsolePath(q.path())) return behind.handle(q, r);
    auto auth = behind.authenticate(q);
    (void)r.send(auth && !auth->refusal ? 200 : 401, "text/plain", "");
  });
  ASSERT_TRUE(server.ok());
  const uint16_t port = server.value()->port();
  const std::string body = json{{"api_key", key_}}.dump();
  auto post = [&](const std::string& origin) {
    return roundTrip(port, "POST /ui/session HTTP/1.1\r\nHost: internal:8080\r\nOrigin: " + origin +
                               "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\n\r\n" + body);
  };
  EXPECT_EQ(statusOf(post("http://internal:8080")), 403);
  auto in = post("https://space.example");
  ASSERT_EQ(statusOf(in), 200) << in;
  const std::string cookie = headerOf(in, "set-cookie");
  EXPECT_EQ(cookie.rfind("__Host-space_session=", 0), 0u) << cookie;
  EXPECT_NE(cookie.find("; Secure"), std::string::npos) << cookie;
  const std::string pair = cookie.substr(0, cookie.find(';'));
  EXPECT_EQ(
      statusOf(roundTrip(port, "GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\nCookie: " + pair + "\r\n\r\n")),
      200);
  // The plain name is not this console's cookie.
  EXPECT_EQ(statusOf(roundTrip(port, "GET /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\nCookie: space_session=" +
                                         pair.substr(pair.find('=') + 1) + "\r\n\r\n")),
            401);
  EXPECT_NE(headerOf(roundTrip(port, "GET /ui/ HTTP/1.1\r\nHost: internal\r\n\r\n"), "content-security-policy")
                .find("script-src https://space.example/ui/;"),
            std::string::npos);
}

TEST(ConsoleCookies, ParsedAndKeptFromTheGuest) {
  EXPECT_EQ(withoutCookie("a=1; space_session=abc; b=2", "space_session"), "a=1; b=2");
  EXPECT_EQ(withoutCookie("space_session=abc", "space_session"), "");
  EXPECT_EQ(withoutCookie(" space_session = x ;space_session=y;c=3", "space_session"), "c=3");
  EXPECT_EQ(withoutCookie("space_sessionx=1; a", "space_session"), "space_sessionx=1; a");
  EXPECT_EQ(contentTypeFor("x.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(contentTypeFor("js"), "application/octet-stream");
}

TEST(ConsoleAssets, RefusesWhatIsNotABuild) {
  auto dir = TempDir::create(testing::TempDir(), "console-bad-");
  ASSERT_TRUE(dir.ok());
  EXPECT_FALSE(ConsoleAssets::load(dir->path() + "/absent").ok());
  std::ofstream(dir->path() + "/a.js") << "x";
  auto no_index = ConsoleAssets::load(dir->path());
  ASSERT_FALSE(no_index.ok());
  EXPECT_NE(no_index.error().message.find("index.html"), std::string::npos);
  std::ofstream(dir->path() + "/index.html") << std::string(2000, 'x');
  EXPECT_TRUE(ConsoleAssets::load(dir->path()).ok());
  EXPECT_FALSE(ConsoleAssets::load(dir->path(), 1).ok());
  EXPECT_FALSE(ConsoleAssets::load(dir->path(), 10, 1000).ok());
}

}  // namespace
}  // namespace space::api
