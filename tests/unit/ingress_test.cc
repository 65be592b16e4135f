// Ingress (api/ingress.h): preview URL parsing, access tokens, the heads the guest and the
// client get, and the proxy itself between a real HTTP server and a scripted "guest" on
// loopback (the daemon's tests reach a real guest in a VM).
#include "api/ingress.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <thread>

#include "../support/raw_http.h"
#include "http/server.h"
#include "net/sandbox_network.h"

namespace space::api {
namespace {

using namespace std::chrono_literals;
using testsupport::connectRaw;
using testsupport::readUntilClosed;
using testsupport::sendRaw;

const std::string kId = "sb_0123456789abcdefghij";
// What a page served on the API's origin (the path form) gets added.
const std::string kSandboxed =
    "Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads\r\n";

IngressTarget pathTarget(std::string_view raw) {
  auto found = ingressFromPath(raw);
  EXPECT_TRUE(found.has_value()) << raw;
  if (!found) return {};
  EXPECT_TRUE(found->ok()) << raw << ": " << found->error().message;
  return found->ok() ? found->value() : IngressTarget{};
}

TEST(IngressPath, TakesTheSandboxPortAndTheRestOfTheTarget) {
  IngressTarget t = pathTarget("/v1/sandboxes/" + kId + "/ports/8080/app/x%2Fy?q=1&r=/");
  EXPECT_EQ(t.sandbox_id, kId);
  EXPECT_EQ(t.port, 8080);
  EXPECT_EQ(t.target, "/app/x%2Fy?q=1&r=/");
  EXPECT_EQ(t.prefix, "/v1/sandboxes/" + kId + "/ports/8080");
  EXPECT_FALSE(t.needs_slash);
  EXPECT_EQ(pathTarget("/v1/sandboxes/" + kId + "/ports/1/").target, "/");
  IngressTarget bare = pathTarget("/v1/sandboxes/" + kId + "/ports/65535?x=1");
  EXPECT_TRUE(bare.needs_slash);
  EXPECT_EQ(bare.target, "/?x=1");
}

TEST(IngressPath, OtherApiPathsAreNotIngress) {
  for (const std::string& raw : std::vector<std::string>{
           "/v1/sandboxes", "/v1/sandboxes/" + kId, "/v1/sandboxes/" + kId + "/files?path=/ports/1",
           "/v1/sandboxes/" + kId + "/portsx/1", "/v1/snapshots/x/ports/1", "/healthz"}) {
    EXPECT_FALSE(ingressFromPath(raw).has_value()) << raw;
  }
}

TEST(IngressPath, RefusesBadIdsAndPorts) {
  for (const std::string& raw :
       std::vector<std::string>{"/v1/sandboxes/sb_short/ports/80/", "/v1/sandboxes/sb_0123456789ABCDEFGHIJ/ports/80/",
                                "/v1/sandboxes/..%2f..%2fetc/ports/80/", "/v1/sandboxes/" + kId + "/ports/0/",
                                "/v1/sandboxes/" + kId + "/ports/65536/", "/v1/sandboxes/" + kId + "/ports/080/",
                                "/v1/sandboxes/" + kId + "/ports/-1/", "/v1/sandboxes/" + kId + "/ports//",
                                "/v1/sandboxes/" + kId + "/ports/99999999999999999999/"}) {
    auto found = ingressFromPath(raw);
    ASSERT_TRUE(found.has_value()) << raw;
    EXPECT_FALSE(found->ok()) << raw;
  }
}

TEST(IngressHost, ParsesPortAndIdUnderTheDomain) {
  const std::string host = ingressHost(kId, 3000, "preview.test");
  EXPECT_EQ(host, "3000-sb-0123456789abcdefghij.preview.test");
  for (const std::string& form :
       std::vector<std::string>{host, host + ":8080", host + ".", "3000-SB-0123456789ABCDEFGHIJ.Preview.TEST",
                                "3000-sb_0123456789abcdefghij.preview.test"}) {
    auto found = ingressFromHost(form, "preview.test", "/a?b");
    ASSERT_TRUE(found.has_value()) << form;
    ASSERT_TRUE(found->ok()) << form << ": " << found->error().message;
    EXPECT_EQ(found->value().sandbox_id, kId);
    EXPECT_EQ(found->value().port, 3000);
    EXPECT_EQ(found->value().target, "/a?b");
    EXPECT_TRUE(found->value().prefix.empty());
  }
  for (const std::string& other : std::vector<std::string>{
           std::string("preview.test"), std::string("127.0.0.1:8080"), "3000-sb-0123456789abcdefghij.preview.test.evil",
           "x.3000-sb-0123456789abcdefghij.preview.test", "3000-sb-0123456789abcdefghijpreview.test"}) {
    EXPECT_FALSE(ingressFromHost(other, "preview.test", "/").has_value()) << other;
  }
  EXPECT_FALSE(ingressFromHost(host, "", "/").has_value()) << "no domain: no host form";
  // Other names under the domain are not previews (spaced's own API may live at one).
  for (const std::string& other :
       std::vector<std::string>{"0-sb-0123456789abcdefghij.preview.test", "80-sb-x.preview.test",
                                "space-api.preview.test", "web-sb-0123456789abcdefghij.preview.test"}) {
    EXPECT_FALSE(ingressFromHost(other, "preview.test", "/").has_value()) << other;
  }
}

TEST(IngressToken, IsPerSandboxAndPerKeyAndComparedWhole) {
  const std::string key(64, 'k');
  const std::string token = accessToken(key, kId);
  EXPECT_EQ(token.size(), 64u);
  EXPECT_EQ(token, accessToken(key, kId));
  EXPECT_NE(token, accessToken(key, "sb_0123456789abcdefghik"));
  EXPECT_NE(token, accessToken(std::string(64, 'j'), kId));
  EXPECT_TRUE(accessTokenMatches(key, kId, token));
  EXPECT_FALSE(accessTokenMatches(key, kId, token.substr(0, 63)));
  EXPECT_FALSE(accessTokenMatches(key, kId, token + "0"));
  EXPECT_FALSE(accessTokenMatches(key, kId, ""));
}

TEST(IngressResponseHead, EndsTheConnectionUnlessSwitching) {
  auto head = rewriteResponseHead(
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nX-App: 1\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.error().message;
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->head, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-App: 1\r\nConnection: close\r\n\r\n");
  const std::string switching = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
  auto upgraded = rewriteResponseHead(switching);
  ASSERT_TRUE(upgraded.ok());
  EXPECT_EQ(upgraded->status, 101);
  EXPECT_EQ(upgraded->head, switching);
  EXPECT_EQ(rewriteResponseHead("HTTP/1.0 404\r\n\r\n")->status, 404);
  // Anything a browser might read differently from us: a bare LF or CR, NUL, a folded line, a
  // line that is no field; and no status line.
  for (const char* bad :
       {"HTTP/1.1 200 OK\r\nContent-Type: text/html\n\n<script>x</script>\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\nSet-Cookie: s=1\r\n\r\n", "HTTP/1.1 200 OK\r\nX: a\rSet-Cookie: s=1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\r\n Set-Cookie: s=1\r\n\r\n", "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        "HTTP/1.1 200 OK\r\n: empty name\r\n\r\n", "HTTP/1.1 200 OK\nX: 1\r\n\r\n", "HTTP/1.1 200 O\x01K\r\n\r\n"}) {
    EXPECT_FALSE(rewriteResponseHead(bad, true).ok()) << bad;
  }
  EXPECT_FALSE(rewriteResponseHead(std::string("HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n", 28)).ok());
  for (const char* bad : {"SSH-2.0-x\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n", "HTTP/1.1 20x OK\r\n\r\n",
                          "HTTP/2 200\r\n\r\n", "HTTP/1.1 099 x\r\n\r\n", "HTTP/1.1 200\r\n"}) {
    EXPECT_FALSE(rewriteResponseHead(bad).ok()) << bad;
  }
}

TEST(IngressResponseHead, OnTheApisOriginAPageGetsNoCookiesAndAnOriginOfItsOwn) {
  auto head = rewriteResponseHead(
      "HTTP/1.1 200 OK\r\nSet-Cookie: session=evil; Path=/\r\nset-cookie2: x=1\r\nContent-Type: text/html\r\n\r\n",
      true);
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->head.find("ookie"), std::string::npos) << head->head;
  EXPECT_NE(head->head.find("Content-Type: text/html\r\n"), std::string::npos);
  EXPECT_NE(head->head.find("\r\nContent-Security-Policy: sandbox allow-scripts"), std::string::npos) << head->head;
  // Switching protocols keeps its connection fields but sets no cookie there either; interim
  // answers get nothing added.
  auto switching = rewriteResponseHead(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      "Set-Cookie: s=1\r\n\r\n",
      true);
  ASSERT_TRUE(switching.ok());
  EXPECT_EQ(switching->head, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
  EXPECT_EQ(rewriteResponseHead("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", true)->head,
            "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n");
  // Nor any other field that acts on the whole origin: the console's storage, transport, workers.
  auto wide = rewriteResponseHead(
      "HTTP/1.1 200 OK\r\nClear-Site-Data: \"cookies\", \"storage\"\r\nStrict-Transport-Security: max-age=0\r\n"
      "Alt-Svc: h3=\":443\"\r\nService-Worker-Allowed: /\r\nNEL: {}\r\nReport-To: {}\r\n"
      "Reporting-Endpoints: a=\"/r\"\r\nOrigin-Agent-Cluster: ?1\r\nX-Kept: 1\r\n\r\n",
      true);
  ASSERT_TRUE(wide.ok());
  for (const char* gone :
       {"Clear-Site", "Strict-Transport", "Alt-Svc", "Service-Worker", "NEL", "Report", "Origin-Agent"}) {
    EXPECT_EQ(wide->head.find(gone), std::string::npos) << gone << " in\n" << wide->head;
  }
  EXPECT_NE(wide->head.find("X-Kept: 1\r\n"), std::string::npos);
  // On its own host (the host form) the page keeps its cookies.
  auto own = rewriteResponseHead("HTTP/1.1 200 OK\r\nSet-Cookie: a=b\r\n\r\n", false);
  ASSERT_TRUE(own.ok());
  EXPECT_NE(own->head.find("Set-Cookie: a=b\r\n"), std::string::npos);
  EXPECT_EQ(own->head.find("Content-Security-Policy"), std::string::npos);
}

// The registry behind "a sandbox's connections end with it": capped, and ending them all shuts
// every registered socket down so its owner sees the end.
TEST(GuestConnections, AreCappedAndAllShutDownWhenTheSandboxEnds) {
  auto registry = std::make_shared<net::GuestConnections>(2);
  int pairs[3][2];
  for (auto& pair : pairs) ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  {
    ASSERT_TRUE(registry->add(pairs[0][0]));  // as connectToGuest does before handing it out
    net::GuestConnection a(registry, UniqueFd(pairs[0][0]));
    EXPECT_TRUE(registry->add(pairs[1][0]));
    EXPECT_FALSE(registry->add(pairs[2][0])) << "over the cap";
    registry->remove(pairs[1][0]);
    EXPECT_TRUE(registry->add(pairs[2][0]));
    registry->endAll();
    char byte;
    EXPECT_EQ(recv(a.fd(), &byte, 1, MSG_DONTWAIT), 0) << "shut down: its reader sees the end";
    EXPECT_EQ(send(pairs[2][0], "x", 1, MSG_NOSIGNAL), -1);
    EXPECT_FALSE(registry->add(pairs[1][0])) << "no new ones once ended";
  }
  for (int fd : {pairs[0][1], pairs[1][0], pairs[1][1], pairs[2][0], pairs[2][1]}) close(fd);
}

// --- the proxy between a real server and a scripted guest ------------------------------------

// A "guest" port on loopback: each accepted connection runs `script` on its own thread.
class FakeGuest {
 public:
  explicit FakeGuest(std::function<void(int)> script) : script_(std::move(script)) {
    listener_ = UniqueFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(listener_.get(), 16), 0);
    socklen_t len = sizeof addr;
    getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] {
      while (true) {
        int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        ++accepted_;
        workers_.emplace_back([this, fd] {
          timeval limit{5, 0};
          setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
          script_(fd);
          close(fd);
        });
      }
    });
  }
  ~FakeGuest() {
    shutdown(listener_.get(), SHUT_RDWR);
    acceptor_.join();
    for (auto& w : workers_) w.join();
  }
  UniqueFd connect() const { return connectRaw(port_); }
  int accepted() const { return accepted_; }

 private:
  std::function<void(int)> script_;
  UniqueFd listener_;
  uint16_t port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

// Reads until `end` has arrived (or the peer closes or goes silent for the socket's limit).
std::string readUntil(int fd, std::string_view end) {
  std::string got;
  char buf[4096];
  while (got.find(end) == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

class IngressProxyTest : public testing::Test {
 protected:
  // A server whose every request is proxied to `guest` as the path form asks.
  void serve(FakeGuest& guest, http::ServerLimits limits = {}, std::chrono::milliseconds response_timeout = 500ms) {
    options_.response_timeout = response_timeout;
    options_.idle_timeout = 2s;
    auto server = http::Server::start(
        "127.0.0.1:0",
        [this, &guest](http::Request& req, http::Response& res) {
          auto target = ingressFromPath(req.target());
          if (!target || !target->ok()) {
            (void)res.sendError(400, "invalid_argument", "not a port path");
            return;
          }
          auto fd = std::make_shared<UniqueFd>(guest.connect());
          fcntl(fd->get(), F_SETFL, fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
          auto waiting = std::make_shared<int>(0);  // a place among those waiting for an answer
          {
            std::lock_guard lock(waiting_mu_);
            waiting_.push_back(waiting);
            kept_.push_back(fd);
          }
          const int guest_fd = fd->get();  // before the move: arguments have no order
          proxyToGuest(req, res, guest_fd, std::move(fd), std::move(waiting), target->value(), true, options_);
        },
        limits);
    ASSERT_TRUE(server.ok()) << server.error().message;
    server_ = std::move(server.value());
  }
  std::string prefix() const { return "/v1/sandboxes/" + kId + "/ports/8080"; }

  // How many requests the handler has begun proxying (it connects to the guest first).
  size_t proxied() {
    std::lock_guard lock(waiting_mu_);
    return waiting_.size();
  }
  // Whether request i's place among those waiting for an answer, and its guest socket, are held.
  bool waiting(size_t i) {
    std::lock_guard lock(waiting_mu_);
    return !waiting_.at(i).expired();
  }
  bool kept(size_t i) {
    std::lock_guard lock(waiting_mu_);
    return !kept_.at(i).expired();
  }

  IngressOptions options_;
  std::mutex waiting_mu_;
  std::vector<std::weak_ptr<int>> waiting_;
  std::vector<std::weak_ptr<UniqueFd>> kept_;
  std::unique_ptr<http::Server> server_;
};

TEST_F(IngressProxyTest, TheGuestGetsTheRequestWithoutTheKeysAndOnlyThatRequest) {
  std::promise<std::string> seen;
  FakeGuest guest([&](int fd) {
    std::string request = readUntil(fd, "\r\n\r\n");
    sendRaw(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello");
    shutdown(fd, SHUT_WR);
    request += readUntilClosed(fd);  // anything that follows (it must not: the proxy sends one request)
    seen.set_value(request);
  });
  serve(guest);
  UniqueFd client = connectRaw(server_->port());
  // Two pipelined requests: the second carries a key and must never reach the guest.
  sendRaw(client.get(),
          "GET " + prefix() +
              "/index.html?a=1 HTTP/1.1\r\nHost: spaced.test\r\nAuthorization: Bearer secret-key\r\n"
              "X-Space-Access-Token: secret-token\r\nKeep-Alive: 5\r\nConnection: keep-alive, X-Drop\r\n"
              "Cookie: a=1; space_session=secret-session; b=2\r\ncookie: __Host-space_session=secret-host\r\n"
              "X-Drop: 1\r\nX-Keep: 2\r\n\r\n"
              "GET /v1/sandboxes HTTP/1.1\r\nHost: spaced.test\r\nAuthorization: Bearer second-key\r\n\r\n");
  std::string answer = readUntilClosed(client.get());
  EXPECT_EQ(answer, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n" + kSandboxed + "Connection: close\r\n\r\nhello");
  auto seen_future = seen.get_future();
  ASSERT_EQ(seen_future.wait_for(10s), std::future_status::ready) << "the peer saw no request";
  std::string request = seen_future.get();
  EXPECT_EQ(request.rfind("GET /index.html?a=1 HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find("Host: spaced.test\r\n"), std::string::npos) << request;
  EXPECT_NE(request.find("X-Keep: 2\r\n"), std::string::npos) << request;
  EXPECT_NE(request.find("Cookie: a=1; b=2\r\n"), std::string::npos) << request;
  EXPECT_NE(request.find("Connection: close\r\n"), std::string::npos) << request;
  EXPECT_NE(request.find("X-Forwarded-Prefix: " + prefix() + "\r\n"), std::string::npos) << request;
  EXPECT_NE(request.find("X-Forwarded-For: 127.0.0.1\r\n"), std::string::npos) << request;
  for (const char* gone : {"secret-key", "secret-token", "X-Drop", "Keep-Alive", "second-key", "GET /v1/sandboxes HTTP",
                           "secret-session", "secret-host", "cookie:"}) {
    EXPECT_EQ(request.find(gone), std::string::npos) << gone << " reached the guest:\n" << request;
  }
  EXPECT_EQ(guest.accepted(), 1);
}

// On spaced's origin, what only a page of that origin (the console) would ask for is refused:
// a guest's service worker script, a guest's script or data loaded by the console's pages. A
// navigation, a guest page's own requests (cross-site: its origin is sandboxed) and clients
// without fetch metadata pass.
TEST(IngressApiOrigin, RefusesServiceWorkersAndSubresourcesOfTheConsolesPages) {
  auto server = http::Server::start("127.0.0.1:0", [](http::Request& req, http::Response& res) {
    auto refused = refusedOnApiOrigin(req);
    (void)res.send(refused ? 403 : 200, "text/plain", refused.value_or("ok"));
  });
  ASSERT_TRUE(server.ok()) << server.error().message;
  auto status = [&](const std::string& fields) {
    UniqueFd fd = connectRaw(server.value()->port());
    sendRaw(fd.get(), "GET /v1/sandboxes/" + kId + "/ports/80/x.js HTTP/1.1\r\nHost: h\r\n" + fields +
                          "Connection: close\r\n\r\n");
    std::string answer = readUntilClosed(fd.get());
    return answer.size() > 12 ? std::stoi(answer.substr(9, 3)) : 0;
  };
  EXPECT_EQ(status(""), 200);
  EXPECT_EQ(status("Sec-Fetch-Site: same-origin\r\nSec-Fetch-Dest: document\r\n"), 200);
  EXPECT_EQ(status("Sec-Fetch-Site: cross-site\r\nSec-Fetch-Dest: script\r\n"), 200);
  EXPECT_EQ(status("Sec-Fetch-Site: none\r\nSec-Fetch-Dest: document\r\n"), 200);
  EXPECT_EQ(status("Sec-Fetch-Site: same-origin\r\nSec-Fetch-Dest: script\r\n"), 403);
  EXPECT_EQ(status("Sec-Fetch-Site: same-origin\r\nSec-Fetch-Dest: empty\r\n"), 403);
  EXPECT_EQ(status("Service-Worker: script\r\n"), 403);
}

TEST_F(IngressProxyTest, BodiesArriveFramedAsTheClientSentThem) {
  std::promise<std::string> seen;
  FakeGuest guest([&](int fd) {
    // Up to the last chunk, which the head's own last line may resemble ("...8080\r\n\r\n").
    std::string request = readUntil(fd, "\r\n\r\n");
    auto complete = [&] {
      size_t head_end = request.find("\r\n\r\n") + 2;
      return request.find("\r\n0\r\n\r\n", head_end) != std::string::npos;
    };
    char buf[4096];
    for (ssize_t n = 1; !complete() && n > 0;) {
      n = recv(fd, buf, sizeof buf, 0);
      if (n > 0) request.append(buf, static_cast<size_t>(n));
    }
    seen.set_value(request);
    sendRaw(fd, "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  });
  serve(guest);
  UniqueFd client = connectRaw(server_->port());
  sendRaw(client.get(),
          "POST " + prefix() +
              "/up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n");
  std::string answer = readUntilClosed(client.get());
  EXPECT_EQ(answer, "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n" + kSandboxed +
                        "Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
  auto seen_future = seen.get_future();
  ASSERT_EQ(seen_future.wait_for(10s), std::future_status::ready) << "the peer saw no request";
  std::string request = seen_future.get();
  EXPECT_NE(request.find("Transfer-Encoding: chunked\r\n"), std::string::npos) << request;
  size_t body_at = request.find("\r\n\r\n") + 4;
  // Re-chunked as it arrived; what counts is the decoded body.
  std::string body = request.substr(body_at);
  std::string decoded;
  for (size_t at = 0; at < body.size();) {
    size_t line = body.find("\r\n", at);
    size_t n = std::stoul(body.substr(at, line - at), nullptr, 16);
    if (n == 0) break;
    decoded += body.substr(line + 2, n);
    at = line + 2 + n + 2;
  }
  EXPECT_EQ(decoded, "wikipedia");
}

TEST_F(IngressProxyTest, AnUpgradeRelaysBothWaysUntilEitherEnds) {
  FakeGuest guest([&](int fd) {
    std::string request = readUntil(fd, "\r\n\r\n");
    if (request.find("Upgrade: websocket\r\n") == std::string::npos ||
        request.find("Connection: Upgrade\r\n") == std::string::npos) {
      sendRaw(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
      return;
    }
    sendRaw(fd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    std::string echoed = request.substr(request.find("\r\n\r\n") + 4);  // early bytes
    char buf[256];
    ssize_t n;
    while (true) {
      if (!echoed.empty()) {
        sendRaw(fd, "echo:" + echoed);
        echoed.clear();
      }
      if ((n = recv(fd, buf, sizeof buf, 0)) <= 0) break;
      echoed.assign(buf, static_cast<size_t>(n));
    }
    sendRaw(fd, "bye");  // after the client's half-close, the guest still talks
  });
  serve(guest);
  UniqueFd client = connectRaw(server_->port());
  sendRaw(client.get(), "GET " + prefix() +
                            "/ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"
                            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nearly");
  std::string got = readUntil(client.get(), "echo:early");
  EXPECT_EQ(got.rfind("HTTP/1.1 101 Switching Protocols\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("echo:early"), std::string::npos) << got;
  sendRaw(client.get(), "ping");
  EXPECT_EQ(readUntil(client.get(), "echo:ping"), "echo:ping");
  shutdown(client.get(), SHUT_WR);
  EXPECT_EQ(readUntilClosed(client.get()), "bye");
}

// Once the guest answered, the server's event loop relays: open WebSockets hold no request
// thread (before, each held one for its whole life), and the API answers beside them.
TEST_F(IngressProxyTest, ConnectionsTheGuestAnsweredHoldNoThread) {
  FakeGuest guest([&](int fd) {
    readUntil(fd, "\r\n\r\n");
    sendRaw(fd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    char buf[256];
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) sendRaw(fd, std::string(buf, static_cast<size_t>(n)));
  });
  http::ServerLimits limits;
  limits.max_running_requests = 1;
  serve(guest, limits);
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(connectRaw(server_->port()));
    sendRaw(clients.back().get(),
            "GET " + prefix() +
                "/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    std::string got = readUntil(clients.back().get(), "\r\n\r\n");
    ASSERT_EQ(got.rfind("HTTP/1.1 101 ", 0), 0u) << i << ": " << got;
  }
  for (int i = 0; i < 3; ++i) {
    const std::string message = "m" + std::to_string(i);
    sendRaw(clients[static_cast<size_t>(i)].get(), message);
    EXPECT_EQ(readUntil(clients[static_cast<size_t>(i)].get(), message), message);
  }
  EXPECT_EQ(server_->runningRequests(), 0u);
  EXPECT_EQ(server_->openRelays(), 3u);
}

// A connection holds its place among those waiting for their guest's answer (and so hold a
// thread) until the answer's head came; its guest socket (and its place among all proxied
// connections) until the relay ends.
TEST_F(IngressProxyTest, APlaceAmongTheWaitingGoesWithTheAnswerAndTheGuestSocketWithTheRelay) {
  std::promise<void> answer;
  std::shared_future<void> answer_now = answer.get_future().share();
  FakeGuest guest([&](int fd) {
    readUntil(fd, "\r\n\r\n");
    // Bounded, so that a test that failed before answering still ends.
    if (answer_now.wait_for(10s) != std::future_status::ready) return;
    sendRaw(fd, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    char buf[256];
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
  });
  serve(guest, {}, 10s);  // the answer waits on the test, which a loaded machine may slow
  UniqueFd client = connectRaw(server_->port());
  sendRaw(client.get(), "GET " + prefix() +
                            "/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
  // The guest may accept before the handler has recorded the request's places.
  for (int i = 0; i < 500 && (guest.accepted() == 0 || proxied() == 0); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(guest.accepted(), 1);
  ASSERT_EQ(proxied(), 1u);
  EXPECT_TRUE(waiting(0)) << "the guest has not answered";
  answer.set_value();
  std::string got = readUntil(client.get(), "\r\n\r\n");
  ASSERT_EQ(got.rfind("HTTP/1.1 101 ", 0), 0u) << got;
  for (int i = 0; i < 500 && waiting(0); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(waiting(0)) << "the guest answered";
  EXPECT_TRUE(kept(0)) << "the relay goes on";
  client = UniqueFd();
  for (int i = 0; i < 500 && kept(0); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(kept(0)) << "the relay ended";
}

TEST_F(IngressProxyTest, AGuestThatFailsBeforeAnsweringGetsA502OrA504) {
  std::atomic<int> mode{0};
  FakeGuest guest([&](int fd) {
    readUntil(fd, "\r\n\r\n");
    if (mode == 0) return;                               // closes without an answer
    if (mode == 1) sendRaw(fd, "SSH-2.0-x\r\n\r\n");     // not HTTP
    if (mode == 2) std::this_thread::sleep_for(1500ms);  // silent past the response timeout
    if (mode == 3) sendRaw(fd, "HTTP/1.1 200 OK\r\nX: " + std::string(70 * 1024, 'a'));  // endless head
    if (mode == 5) sendRaw(fd, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n");
    const std::string hint = "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n";
    for (int i = 0; mode == 4 && i < 100 && send(fd, hint.data(), hint.size(), MSG_NOSIGNAL) > 0; ++i) {
    }
    if (mode == 3) std::this_thread::sleep_for(1000ms);
  });
  serve(guest);
  const std::vector<std::pair<int, std::string>> expected = {{502, "closed the connection without an answer"},
                                                             {502, "not a valid HTTP/1.x response head"},
                                                             {504, "did not answer within"},
                                                             {502, "response head over"},
                                                             {502, "more than 8 interim (1xx) answers"},
                                                             {502, "although the client asked for no upgrade"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    mode = static_cast<int>(i);
    UniqueFd client = connectRaw(server_->port());
    sendRaw(client.get(), "GET " + prefix() + "/ HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string answer = readUntil(client.get(), "}}");
    EXPECT_EQ(answer.rfind("HTTP/1.1 " + std::to_string(expected[i].first), 0), 0u) << i << ": " << answer;
    EXPECT_NE(answer.find(expected[i].second), std::string::npos) << i << ": " << answer;
  }
}

}  // namespace
}  // namespace space::api
