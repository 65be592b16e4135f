#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "../support/raw_http.h"
#include "common/unix_socket.h"
#include "http/client.h"
#include "http/router.h"
#include "http/server.h"

namespace space::http {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testsupport::connectRaw;
using testsupport::readUntilClosed;
using testsupport::sendRaw;

std::unique_ptr<Server> startServer(Handler handler, ServerLimits limits = {}) {
  auto server = Server::start("127.0.0.1:0", std::move(handler), limits);
  if (!server.ok()) {
    ADD_FAILURE() << server.error().message;
    return nullptr;
  }
  return std::move(server.value());
}

Client clientFor(const Server& server) { return Client::create("http://" + server.address()).value(); }

// One Content-Length response; bytes after it stay in `pending`.
std::string readResponse(int fd, std::string& pending) {
  char buf[4096];
  auto fill = [&] {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    pending.append(buf, static_cast<size_t>(n));
    return true;
  };
  size_t header_end;
  while ((header_end = pending.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return "";
  }
  size_t length_at = pending.find("Content-Length: ");
  size_t length = length_at < header_end ? std::stoul(pending.substr(length_at + 16)) : 0;
  while (pending.size() < header_end + 4 + length) {
    if (!fill()) return "";
  }
  std::string response = pending.substr(0, header_end + 4 + length);
  pending.erase(0, response.size());
  return response;
}

Json jsonBody(const ClientResponse& response) { return Json::parse(response.body, nullptr, false); }

TEST(HttpServer, RoutesWithParametersAndAnswers404And405) {
  Router router;
  router.add("GET", "/v1/sandboxes/{id}", [](Request& request, Response& response) {
    (void)response.sendJson(200, {{"id", request.pathParam("id")}, {"path", request.path()}});
  });
  router.add("DELETE", "/v1/sandboxes/{id}", [](Request&, Response& response) { (void)response.send(204, "", ""); });
  router.add("POST", "/v1/sandboxes", [](Request&, Response& response) { (void)response.sendJson(201, {}); });
  auto server = startServer(router.handler());
  ASSERT_TRUE(server);
  auto client = clientFor(*server);

  auto found = client.request("GET", "/v1/sandboxes/sb%201");
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(found->status, 200);
  EXPECT_EQ(found->headers["content-type"], "application/json");
  EXPECT_EQ(jsonBody(*found), Json({{"id", "sb 1"}, {"path", "/v1/sandboxes/sb 1"}}));

  auto deleted = client.request("DELETE", "/v1/sandboxes/x");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted->status, 204);
  EXPECT_EQ(deleted->headers.count("content-length"), 0u);

  auto missing = client.request("GET", "/v1/nothing");
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(jsonBody(*missing)["error"]["code"], "not_found");

  auto wrong_method = client.request("PUT", "/v1/sandboxes/x");
  ASSERT_TRUE(wrong_method.ok());
  EXPECT_EQ(wrong_method->status, 405);
  EXPECT_EQ(wrong_method->headers["allow"], "DELETE, GET");
  EXPECT_TRUE(jsonBody(*wrong_method)["error"]["message"].is_string());
  Error error = responseError(*wrong_method);
  EXPECT_EQ(error.code, ErrorCode::kUnimplemented);
}

TEST(HttpServer, DecodesQueryParametersAndHeaders) {
  auto server = startServer([](Request& request, Response& response) {
    Json xs = Json::array();
    for (auto [it, end] = request.queryParams().equal_range("x"); it != end; ++it) xs.push_back(it->second);
    response.setHeader("X-Echo", request.header("x-custom").value_or("none"));
    (void)response.sendJson(200, {{"name", request.query("name").value_or("?")},
                                  {"x", xs},
                                  {"flag", request.query("flag").has_value()},
                                  {"absent", request.query("absent").has_value()},
                                  {"target", request.target()},
                                  {"remote", request.remoteAddress()}});
  });
  ASSERT_TRUE(server);
  auto response =
      clientFor(*server).request("GET", "/q?name=" + urlEncode("a b&c=d") + "&x=1+2&x=3&flag", {{"X-Custom", "hello"}});
  ASSERT_TRUE(response.ok()) << response.error().message;
  Json body = jsonBody(*response);
  EXPECT_EQ(body["name"], "a b&c=d");
  EXPECT_EQ(body["x"], Json({"1 2", "3"}));
  EXPECT_EQ(body["flag"], true);
  EXPECT_EQ(body["absent"], false);
  EXPECT_EQ(body["target"], "/q?name=a%20b%26c%3Dd&x=1+2&x=3&flag");
  EXPECT_TRUE(body["remote"].get<std::string>().starts_with("127.0.0.1:"));
  EXPECT_EQ(response->headers["x-echo"], "hello");
}

TEST(HttpServer, JsonRoundTrip) {
  auto server = startServer([](Request& request, Response& response) {
    auto body = request.readBody(1 << 20);
    ASSERT_TRUE(body.ok());
    Json parsed = Json::parse(body.value(), nullptr, false);
    if (parsed.is_discarded()) {
      (void)response.sendError(400, "invalid_argument", "not JSON");
      return;
    }
    (void)response.sendJson(201, {{"got", parsed}});
  });
  ASSERT_TRUE(server);
  Json sent = {{"image", "python"}, {"cpus", 2}, {"env", {{"A", "\xc3\xa9"}}}};
  auto response = clientFor(*server).request("POST", "/echo", {{"Content-Type", "application/json"}}, sent.dump());
  ASSERT_TRUE(response.ok()) << response.error().message;
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(jsonBody(*response)["got"], sent);
}

// Echoes the body's size and content, read with readBody (the limit comes from ?max=).
Handler echoBodyHandler() {
  return [](Request& request, Response& response) {
    size_t max = std::stoul(request.query("max").value_or("10000000"));
    auto body = request.readBody(max);
    if (!body.ok()) return;  // the server answers 413
    (void)response.sendJson(200, {{"size", body->size()},
                                  {"chunked", !request.contentLength().has_value()},
                                  {"same", body.value() == std::string(body->size(), 'b')}});
  };
}

BodySource repeatedBytes(size_t total, size_t piece) {
  auto left = std::make_shared<size_t>(total);
  return [left, piece](char* buf, size_t max) -> Result<size_t> {
    size_t n = std::min({*left, piece, max});
    std::fill(buf, buf + n, 'b');
    *left -= n;
    return n;
  };
}

TEST(HttpServer, ReadBodyWithContentLengthAndChunked) {
  auto server = startServer(echoBodyHandler());
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  constexpr size_t kSize = 300 * 1000;

  auto fixed = client.request("POST", "/body", {}, std::string(kSize, 'b'));
  ASSERT_TRUE(fixed.ok()) << fixed.error().message;
  EXPECT_EQ(jsonBody(*fixed), Json({{"size", kSize}, {"chunked", false}, {"same", true}}));

  auto chunked = client.request("POST", "/body", {}, RequestBody::fromSource(repeatedBytes(kSize, 1000)));
  ASSERT_TRUE(chunked.ok()) << chunked.error().message;
  EXPECT_EQ(jsonBody(*chunked), Json({{"size", kSize}, {"chunked", true}, {"same", true}}));

  auto exact = client.request("POST", "/body?max=5", {}, "bbbbb");
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->status, 200);
}

TEST(HttpServer, BodyOverTheLimitIs413) {
  auto server = startServer(echoBodyHandler());
  ASSERT_TRUE(server);
  auto client = clientFor(*server);

  auto fixed = client.request("POST", "/body?max=1024", {}, std::string(64 * 1024, 'b'));
  ASSERT_TRUE(fixed.ok()) << fixed.error().message;
  EXPECT_EQ(fixed->status, 413);
  EXPECT_EQ(jsonBody(*fixed)["error"]["code"], "resource_exhausted");
  EXPECT_NE(jsonBody(*fixed)["error"]["message"].get<std::string>().find("1024"), std::string::npos);

  auto chunked = client.request("POST", "/body?max=1024", {}, RequestBody::fromSource(repeatedBytes(1025, 100)));
  ASSERT_TRUE(chunked.ok()) << chunked.error().message;
  EXPECT_EQ(chunked->status, 413);
  Error error = responseError(*chunked);
  EXPECT_EQ(error.code, ErrorCode::kResourceExhausted);
  EXPECT_NE(error.message.find("1024"), std::string::npos);
}

TEST(HttpServer, LargeRefusedUploadStillGetsTheAnswer) {
  auto server = startServer(echoBodyHandler());
  ASSERT_TRUE(server);
  // Far more than the server drains before closing: the client's write fails, yet the 413
  // already sent is what it reports.
  auto response = clientFor(*server).request("POST", "/body?max=1024", {},
                                             RequestBody::fromSource(repeatedBytes(64 << 20, 1 << 16)));
  ASSERT_TRUE(response.ok()) << response.error().message;
  EXPECT_EQ(response->status, 413);
}

TEST(HttpServer, HeaderOverTheLimitIs431) {
  ServerLimits limits;
  limits.max_header_bytes = 1024;
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  auto small = client.request("GET", "/", {{"X-Small", std::string(100, 'a')}});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->status, 200);

  auto big = client.request("GET", "/", {{"X-Big", std::string(4000, 'a')}});
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->status, 431);
  EXPECT_EQ(jsonBody(*big)["error"]["code"], "resource_exhausted");
}

TEST(HttpServer, MalformedRequestIs400) {
  bool handler_ran = false;
  auto server = startServer([&](Request&, Response& response) {
    handler_ran = true;
    (void)response.send(200, "text/plain", "ok");
  });
  ASSERT_TRUE(server);
  for (std::string request : {"NOT HTTP AT ALL\r\n\r\n", "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                              "GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n", "GET nopath HTTP/1.1\r\nHost: x\r\n\r\n"}) {
    auto fd = connectRaw(server->port());
    sendRaw(fd.get(), request);
    std::string response = readUntilClosed(fd.get());
    EXPECT_TRUE(response.starts_with("HTTP/1.1 400 ")) << request << " -> " << response;
    EXPECT_NE(response.find("\"invalid_argument\""), std::string::npos) << response;
  }
  EXPECT_FALSE(handler_ran);
}

TEST(HttpServer, HandlerThrowingOrNotRespondingIs500) {
  auto server = startServer([](Request& request, Response&) {
    if (request.path() == "/throw") throw std::runtime_error("boom");
  });
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  for (const char* path : {"/throw", "/silent"}) {
    auto response = client.request("GET", path);
    ASSERT_TRUE(response.ok()) << response.error().message;
    EXPECT_EQ(response->status, 500) << path;
    EXPECT_EQ(jsonBody(*response)["error"]["code"], "internal") << path;
  }
}

TEST(HttpServer, StreamedChunksReachTheClientWhileTheHandlerRuns) {
  std::promise<void> first_seen;
  auto first_seen_future = first_seen.get_future();
  std::atomic<bool> handler_finished{false};
  auto server = startServer([&](Request&, Response& response) {
    ASSERT_TRUE(response.begin(200, "application/x-ndjson").ok());
    ASSERT_TRUE(response.write("{\"n\":1}\n").ok());
    // Blocks until the client saw the first line: without flushing, this would time out.
    bool seen = first_seen_future.wait_for(5s) == std::future_status::ready;
    ASSERT_TRUE(response.write(seen ? "{\"n\":2}\n" : "{\"timeout\":true}\n").ok());
    handler_finished = true;
    ASSERT_TRUE(response.end().ok());
  });
  ASSERT_TRUE(server);

  int status = 0;
  std::string content_type;
  std::string received;
  bool first_chunk_before_handler_finished = false;
  auto result = clientFor(*server).requestStreaming(
      "GET", "/stream", {}, {},
      [&](const ClientResponse& head) {
        status = head.status;
        content_type = head.headers.at("content-type");
        EXPECT_EQ(head.headers.at("transfer-encoding"), "chunked");
        return okStatus();
      },
      [&](std::string_view chunk) {
        if (received.empty()) {
          first_chunk_before_handler_finished = !handler_finished;
          first_seen.set_value();
        }
        received += chunk;
        return okStatus();
      },
      5s);
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(status, 200);
  EXPECT_EQ(content_type, "application/x-ndjson");
  EXPECT_TRUE(first_chunk_before_handler_finished);
  EXPECT_EQ(received, "{\"n\":1}\n{\"n\":2}\n");
  EXPECT_TRUE(result->body.empty());
}

TEST(HttpServer, WritesFailOnceTheClientIsGone) {
  std::promise<Status> last_write;
  auto last_write_future = last_write.get_future();
  auto server = startServer([&](Request&, Response& response) {
    Status status = response.begin(200, "text/plain");
    for (int i = 0; i < 400 && status.ok(); ++i) {
      status = response.write(std::string(1024, 'x'));
      std::this_thread::sleep_for(5ms);
    }
    last_write.set_value(status);
  });
  ASSERT_TRUE(server);
  auto result = clientFor(*server).requestStreaming(
      "GET", "/", {}, {}, nullptr, [](std::string_view) { return Status(makeError(ErrorCode::kCanceled, "enough")); },
      5s);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::kCanceled);

  ASSERT_EQ(last_write_future.wait_for(5s), std::future_status::ready);
  Status status = last_write_future.get();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.error().code, ErrorCode::kUnavailable);
}

TEST(HttpServer, StreamingUploadReadWithReadSome) {
  auto server = startServer([](Request& request, Response& response) {
    char buf[4096];
    size_t total = 0;
    size_t calls = 0;
    bool all_b = true;
    while (true) {
      auto n = request.readSome(buf, sizeof buf);
      if (!n.ok()) {
        (void)response.sendError(400, "invalid_argument", n.error().message);
        return;
      }
      if (*n == 0) break;
      ++calls;
      total += *n;
      all_b = all_b && std::all_of(buf, buf + *n, [](char c) { return c == 'b'; });
    }
    EXPECT_TRUE(request.bodyComplete());
    auto again = request.readSome(buf, sizeof buf);
    EXPECT_TRUE(again.ok() && *again == 0);
    EXPECT_FALSE(request.readBody(10).ok());  // the body is consumed once
    (void)response.sendJson(200, {{"total", total}, {"all_b", all_b}, {"several_reads", calls > 1}});
  });
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  constexpr size_t kSize = 1 << 20;

  auto chunked = client.request("PUT", "/upload", {}, RequestBody::fromSource(repeatedBytes(kSize, 777)));
  ASSERT_TRUE(chunked.ok()) << chunked.error().message;
  EXPECT_EQ(jsonBody(*chunked), Json({{"total", kSize}, {"all_b", true}, {"several_reads", true}}));

  auto sized = client.request("PUT", "/upload", {}, RequestBody::fromSource(repeatedBytes(kSize, 5000), kSize));
  ASSERT_TRUE(sized.ok()) << sized.error().message;
  EXPECT_EQ(jsonBody(*sized), Json({{"total", kSize}, {"all_b", true}, {"several_reads", true}}));

  auto short_source = client.request("PUT", "/upload", {}, RequestBody::fromSource(repeatedBytes(10, 5), 20));
  ASSERT_FALSE(short_source.ok());
  EXPECT_EQ(short_source.error().code, ErrorCode::kInvalidArgument);
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  std::vector<std::string> remotes;
  auto server = startServer([&](Request& request, Response& response) {
    remotes.push_back(request.remoteAddress());
    auto body = request.readBody(100);
    (void)response.send(200, "text/plain", request.path() + ":" + body.value());
  });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  std::string pending;
  sendRaw(fd.get(), "POST /one HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  std::string first = readResponse(fd.get(), pending);
  EXPECT_TRUE(first.starts_with("HTTP/1.1 200 ")) << first;
  EXPECT_TRUE(first.ends_with("\r\n\r\n/one:abc")) << first;
  EXPECT_EQ(first.find("Connection: close"), std::string::npos);
  // Pipelined: both requests in one write.
  sendRaw(fd.get(),
          "GET /two HTTP/1.1\r\nHost: x\r\n\r\n"
          "POST /three HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n0\r\n\r\n");
  EXPECT_TRUE(readResponse(fd.get(), pending).ends_with("/two:"));
  EXPECT_TRUE(readResponse(fd.get(), pending).ends_with("/three:xy"));
  ASSERT_EQ(remotes.size(), 3u);
  EXPECT_EQ(remotes[0], remotes[2]);
}

size_t threadsOfThisProcess() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++n;
  }
  return n;
}

// Connections between requests wait on the server's event loop, not on threads: a thousand
// keep-alive connections that each made a request leave the thread count where it was.
TEST(HttpServer, IdleKeepAliveConnectionsHoldNoThread) {
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 8192);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &nofile), 0);
  // Both ends of every connection live in this process.
  const size_t count = std::min<size_t>(1000, (nofile.rlim_cur - 200) / 2);
  ASSERT_GE(count, 400u) << "the hard descriptor limit is too low for this test";
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server);
  // One request first, so the server's worker exists before the baseline is taken.
  auto warm = connectRaw(server->port());
  std::string pending;
  sendRaw(warm.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(readResponse(warm.get(), pending).ends_with("ok"));
  const size_t baseline = threadsOfThisProcess();

  std::vector<UniqueFd> open;
  for (size_t i = 0; i < count; ++i) {
    open.push_back(connectRaw(server->port()));
    sendRaw(open.back().get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string rest;
    ASSERT_TRUE(readResponse(open.back().get(), rest).ends_with("ok")) << "connection " << i;
  }
  // A few more at most: a request can arrive before the previous one's thread counts as idle
  // again (the client reads the answer first), and then takes a new one (seen under load).
  EXPECT_LE(threadsOfThisProcess(), baseline + 4) << count << " idle connections";
  // Every one of them is still open and served on its next request.
  for (size_t i = 0; i < count; i += count / 10) {
    sendRaw(open[i].get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string rest;
    EXPECT_TRUE(readResponse(open[i].get(), rest).ends_with("ok")) << "connection " << i;
  }
}

// Running requests are what takes threads, and they are bounded: one over the limit gets 503
// while idle connections do not count.
// Two requests from one client run and wait; a third from the same client is refused with 503
// and `message` while they run, and served once they are done. `idle_connections` are opened
// first and never used.
// A client reads a response before its handler has returned; a test that means "the thread is
// free now" waits for the server to count it out first.
bool waitUntilNoRequestRuns(Server& server) {
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server.runningRequests() != 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

void expectAThirdRequestRefusedWhileTwoRun(ServerLimits limits, const std::string& message, int idle_connections = 0) {
  std::atomic<int> entered{0};
  std::promise<void> release;
  auto release_future = release.get_future().share();
  auto server = startServer(
      [&](Request& request, Response& response) {
        if (request.path() == "/slow") {
          ++entered;
          (void)release_future.wait_for(30s);
        }
        (void)response.send(200, "text/plain", "done");
      },
      limits);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < idle_connections; ++i) idle.push_back(connectRaw(server->port()));
  auto client = clientFor(*server);
  auto first = std::async(std::launch::async, [&] { return client.request("GET", "/slow"); });
  auto second = std::async(std::launch::async, [&] { return client.request("GET", "/slow"); });
  while (entered.load() < 2) std::this_thread::sleep_for(5ms);
  auto rejected = client.request("GET", "/fast");
  release.set_value();
  ASSERT_TRUE(rejected.ok()) << rejected.error().message;
  EXPECT_EQ(rejected->status, 503);
  EXPECT_NE(jsonBody(*rejected)["error"]["message"].get<std::string>().find(message), std::string::npos)
      << rejected->body;
  EXPECT_EQ(first.get()->status, 200);
  EXPECT_EQ(second.get()->status, 200);
  ASSERT_TRUE(waitUntilNoRequestRuns(*server));
  auto after = client.request("GET", "/fast");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_EQ(after->status, 200);
}

TEST(HttpServer, RunningRequestsOverTheLimitAre503) {
  ServerLimits limits;
  limits.max_running_requests = 2;
  expectAThirdRequestRefusedWhileTwoRun(limits, "the server is running 2 requests", /*idle_connections=*/20);
}

// A single address cannot take every request thread, even with connections to spare.
TEST(HttpServer, OneClientsRunningRequestsAreCappedBelowThePool) {
  ServerLimits limits;
  limits.max_running_requests_per_client = 2;
  expectAThirdRequestRefusedWhileTwoRun(limits, "this client is running 2 requests");
}

// A response that closes its connection while the client still sends (an unread body) drains
// on the event loop: the request's thread is free at once.
TEST(HttpServer, AClosingConnectionLingersWithoutAThread) {
  ServerLimits limits;
  limits.max_running_requests = 1;
  auto server = startServer(
      [](Request&, Response& response) {
        response.closeConnection();
        (void)response.sendError(401, "unauthenticated", "no key");
      },
      limits);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> lingering;
  for (int i = 0; i < 5; ++i) {
    lingering.push_back(connectRaw(server->port()));
    sendRaw(lingering.back().get(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nsome");
    std::string pending;
    EXPECT_TRUE(readResponse(lingering.back().get(), pending).starts_with("HTTP/1.1 401 ")) << i;
    // Counted out while its connection still lingers: lingering takes no request slot.
    ASSERT_TRUE(waitUntilNoRequestRuns(*server)) << i;
  }
  // The clients keep their sockets open and silent; another request still gets the one thread.
  auto r = clientFor(*server).request("GET", "/", {}, {}, 5s);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 401);
}

// Connections still sending their header when the server stops are closed at once, not
// served out to their read timeout.
TEST(HttpServer, StopDoesNotWaitForHeadersStillArriving) {
  ServerLimits limits;
  limits.read_timeout = 20s;
  limits.first_request_timeout = 20s;
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> trickling;
  for (int i = 0; i < 50; ++i) {
    trickling.push_back(connectRaw(server->port()));
    sendRaw(trickling.back().get(), "GET / HTTP/1.1\r\n");
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    while (!done) {
      for (auto& fd : trickling) (void)send(fd.get(), "X-A: b\r\n", 8, MSG_NOSIGNAL | MSG_DONTWAIT);
      std::this_thread::sleep_for(2ms);
    }
  });
  std::this_thread::sleep_for(100ms);
  auto started = std::chrono::steady_clock::now();
  server->stop(0ms);
  auto took = std::chrono::steady_clock::now() - started;
  done = true;
  trickle.join();
  EXPECT_LT(took, 3s);
}

TEST(HttpServer, AcceptedSocketsAreNotInheritedByChildren) {
  int flags = -1;
  auto server = startServer([&](Request&, Response& response) {
    auto taken = response.takeOver(200);
    if (!taken.ok()) return;
    flags = fcntl(taken->fd, F_GETFD);
    const char reply[] = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
    (void)send(taken->fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
  });
  ASSERT_TRUE(server);
  auto r = clientFor(*server).request("GET", "/");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_NE(flags, -1);
  EXPECT_TRUE(flags & FD_CLOEXEC);
}

TEST(HttpServer, HeadResponsesHaveNoBody) {
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "hello"); });
  ASSERT_TRUE(server);
  auto response = clientFor(*server).request("HEAD", "/");
  ASSERT_TRUE(response.ok()) << response.error().message;
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->headers["content-length"], "5");
  EXPECT_EQ(response->body, "");
}

TEST(HttpServer, UnreadBodyClosesTheConnection) {
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ignored"); });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  sendRaw(fd.get(), "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
  std::string response = readUntilClosed(fd.get());
  EXPECT_TRUE(response.starts_with("HTTP/1.1 200 ")) << response;
  EXPECT_NE(response.find("Connection: close"), std::string::npos) << response;
  EXPECT_TRUE(response.ends_with("ignored")) << response;
}

TEST(HttpServer, AnswersExpectContinueWhenTheHandlerReads) {
  auto server = startServer([](Request& request, Response& response) {
    auto body = request.readBody(100);
    (void)response.send(200, "text/plain", body.ok() ? body.value() : "error");
  });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  std::string pending;
  sendRaw(fd.get(), "PUT /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  EXPECT_EQ(readResponse(fd.get(), pending), "HTTP/1.1 100 Continue\r\n\r\n");
  sendRaw(fd.get(), "data");
  EXPECT_TRUE(readResponse(fd.get(), pending).ends_with("\r\n\r\ndata"));
}

TEST(HttpServer, OverMaxConnectionsIs503) {
  ServerLimits limits;
  limits.max_connections = 1;
  std::promise<void> entered;
  std::promise<void> release;
  auto release_future = release.get_future().share();
  auto server = startServer(
      [&](Request&, Response& response) {
        entered.set_value();
        (void)release_future.wait_for(30s);
        (void)response.send(200, "text/plain", "done");
      },
      limits);
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  auto busy = std::async(std::launch::async, [&] { return client.request("GET", "/slow"); });
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready) << "entered never came";

  auto rejected = client.request("GET", "/other");
  release.set_value();
  ASSERT_TRUE(rejected.ok()) << rejected.error().message;
  EXPECT_EQ(rejected->status, 503);
  EXPECT_EQ(jsonBody(*rejected)["error"]["code"], "unavailable");
  auto first = busy.get();
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->body, "done");
}

// Beast holds a chunk header (size and extensions) and the trailer whole before parsing them,
// so without a cap on the connection's buffer either one grows it without limit.
TEST(HttpServer, EndlessTrailerOrChunkExtensionIsRefusedWithBoundedMemory) {
  std::atomic<int> body_errors{0};
  auto server = startServer([&](Request& request, Response& response) {
    auto body = request.readBody(1 << 20);
    if (!body.ok()) {
      ++body_errors;
      return;  // the server answers the body failure itself
    }
    (void)response.send(200, "text/plain", "read");
  });
  ASSERT_TRUE(server);
  const size_t kGigabyte = size_t{1} << 30;
  const std::string filler(64 * 1024, 'a');
  const std::string head = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  struct Case {
    const char* name;
    std::string prefix;
    std::string filler;
  };
  std::string trailer_line = "X-Trailer: " + filler + "\r\n";
  const Case cases[] = {
      {"trailer", head + "3\r\nabc\r\n0\r\n", trailer_line},
      {"chunk extension", head + "3;ext=", filler},
  };
  for (const Case& c : cases) {
    testsupport::resetPeakResident();
    size_t before = testsupport::peakResidentBytes();
    auto [sent, answer] = testsupport::flood(server->port(), c.prefix, c.filler, kGigabyte);
    EXPECT_LT(sent, kGigabyte) << c.name << ": the server kept reading";
    EXPECT_LT(testsupport::peakGrowth(before), size_t{64} << 20) << c.name;
    // The answer races with the reset that closing an unread socket causes; when it arrives it
    // names the limit.
    if (!answer.empty()) {
      EXPECT_NE(answer.find("413"), std::string::npos) << c.name << ": " << answer.substr(0, 200);
    }
  }
  EXPECT_EQ(body_errors.load(), 2);
  // The server still serves.
  auto ok = clientFor(*server).request("POST", "/", {}, std::string("{}"));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->status, 200);
}

// A client's idle sockets (nothing sent, or a header still arriving) cannot lock out a request:
// a new connection over the limits takes the place of the longest-waiting idle one.
TEST(HttpServer, IdleSocketsDoNotLockOutARequest) {
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server);
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 256; ++i) {
    idle.push_back(connectRaw(server->port()));
    if (i % 2 == 1) sendRaw(idle.back().get(), "GET / HTTP/1.1\r\nHost: x\r\n");  // never finished
  }
  for (int i = 0; i < 5; ++i) {
    auto r = clientFor(*server).request("GET", "/", {}, {}, 5s);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "ok");
  }
}

// Requests that are running are never evicted: one client running its limit gets 503 for more,
// and another client is still served.
TEST(HttpServer, OneClientsRunningRequestsAreCappedPerClient) {
  ServerLimits limits;
  limits.max_connections_per_client = 2;
  expectAThirdRequestRefusedWhileTwoRun(limits, "this client has 2 connections");
}

// Every loopback address is one client: a local user may bind any of 127.0.0.0/8.
TEST(HttpServer, AllOfLoopbackCountsAsOneClient) {
  ServerLimits limits;
  limits.max_connections_per_client = 1;
  std::promise<void> entered;
  std::promise<void> release;
  auto release_future = release.get_future().share();
  auto server = startServer(
      [&](Request&, Response& response) {
        entered.set_value();
        (void)release_future.wait_for(30s);
        (void)response.send(200, "text/plain", "done");
      },
      limits);
  ASSERT_TRUE(server);
  auto busy = std::async(std::launch::async, [&] { return clientFor(*server).request("GET", "/slow"); });
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready) << "entered never came";
  UniqueFd other(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000002);  // 127.0.0.2
  ASSERT_EQ(bind(other.get(), reinterpret_cast<sockaddr*>(&from), sizeof from), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(server->port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(other.get(), reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  timeval limit{5, 0};
  setsockopt(other.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sendRaw(other.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string answer = readUntilClosed(other.get());
  release.set_value();
  EXPECT_NE(answer.find("503"), std::string::npos) << answer;
  EXPECT_EQ(busy.get()->status, 200);
}

// A handler may end the connection after its answer (spaced does for answers without a key).
TEST(HttpServer, HandlerCanCloseTheConnection) {
  auto server = startServer([](Request&, Response& response) {
    response.closeConnection();
    (void)response.send(200, "text/plain", "bye");
  });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  sendRaw(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string all = readUntilClosed(fd.get());
  EXPECT_NE(all.find("Connection: close"), std::string::npos) << all;
  size_t first = all.find("bye");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(all.find("bye", first + 3), std::string::npos) << "the pipelined second request was served";
}

// An answer of 401 ends the connection: a client without a key gets no socket to keep.
TEST(HttpServer, UnauthorizedClosesTheConnection) {
  auto server =
      startServer([](Request&, Response& response) { (void)response.sendError(401, "unauthenticated", "no"); });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  sendRaw(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string all = readUntilClosed(fd.get());
  EXPECT_NE(all.find("401"), std::string::npos);
  EXPECT_NE(all.find("Connection: close"), std::string::npos) << all;
}

// A new connection gets first_request_timeout for its first header, however long read_timeout is.
TEST(HttpServer, FirstRequestMustArriveWithinItsTimeout) {
  ServerLimits limits;
  limits.first_request_timeout = 300ms;
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  auto start = Clock::now();
  auto fd = connectRaw(server->port());
  sendRaw(fd.get(), "GET / HTTP/1.1\r\n");  // and nothing more
  EXPECT_EQ(readUntilClosed(fd.get()), "");
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_LT(Clock::now() - start, 3s);
}

TEST(HttpServer, SilentClientIsDroppedAfterReadTimeout) {
  ServerLimits limits;
  limits.read_timeout = 200ms;
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  auto start = Clock::now();
  auto silent = connectRaw(server->port());
  EXPECT_EQ(readUntilClosed(silent.get()), "");
  auto waited = Clock::now() - start;
  EXPECT_GE(waited, 150ms);
  EXPECT_LT(waited, 3s);

  // A header trickling in, each byte well within read_timeout, is dropped when the whole
  // header took longer than read_timeout.
  auto trickle = connectRaw(server->port());
  start = Clock::now();
  bool closed = false;
  for (int i = 0; i < 40 && !closed; ++i) {
    (void)send(trickle.get(), "G", 1, MSG_NOSIGNAL);  // fails once the server has closed
    std::this_thread::sleep_for(25ms);
    char byte;
    ssize_t n = recv(trickle.get(), &byte, 1, MSG_DONTWAIT);
    closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, 800ms);
}

TEST(HttpServer, StopClosesIdleKeepAliveConnectionsPromptly) {
  auto server = startServer([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server);
  auto fd = connectRaw(server->port());
  std::string pending;
  sendRaw(fd.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(readResponse(fd.get(), pending).ends_with("ok"));

  auto start = Clock::now();
  server->stop(5s);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_EQ(readUntilClosed(fd.get()), "");
  EXPECT_FALSE(clientFor(*server).request("GET", "/", {}, {}, 1s).ok());
}

TEST(HttpServer, StopLetsARunningHandlerFinish) {
  std::promise<void> entered;
  auto server = startServer([&](Request&, Response& response) {
    entered.set_value();
    std::this_thread::sleep_for(200ms);
    (void)response.send(200, "text/plain", "finished");
  });
  ASSERT_TRUE(server);
  auto client = clientFor(*server);
  auto running = std::async(std::launch::async, [&] { return client.request("GET", "/"); });
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready) << "entered never came";
  server->stop(5s);
  auto response = running.get();
  ASSERT_TRUE(response.ok()) << response.error().message;
  EXPECT_EQ(response->body, "finished");
  EXPECT_EQ(response->headers["connection"], "close");
}

TEST(HttpServer, RejectsBadListenAddresses) {
  for (const char* listen : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:80x", "::1:80", "[::1",
                             "[::1]", "localhost:8080", "1.2.3:80", ":8080"}) {
    auto server = Server::start(listen, [](Request&, Response&) {});
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.error().code, ErrorCode::kInvalidArgument) << listen << ": " << server.error().message;
  }
}

TEST(HttpServer, BusyPortIsAnErrorNamingTheAddress) {
  auto first = startServer([](Request&, Response&) {});
  ASSERT_TRUE(first);
  auto second = Server::start(first->address(), [](Request&, Response&) {});
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find(first->address()), std::string::npos) << second.error().message;
}

TEST(HttpServer, ServesIpv6Loopback) {
  // Skipped only where the machine itself has no IPv6 loopback (a plain bind(::1) fails); where
  // it has one, the server must serve on it.
  {
    int probe = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_loopback;
    const bool has_v6 = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) close(probe);
    if (!has_v6) GTEST_SKIP() << "this machine has no IPv6 loopback (bind(::1) fails)";
  }
  auto server = Server::start("[::1]:0", [](Request&, Response& response) { (void)response.send(200, "", "v6"); });
  ASSERT_TRUE(server.ok()) << "bind(::1) works here, but the server did not start: " << server.error().message;
  EXPECT_TRUE((*server)->address().starts_with("[::1]:")) << (*server)->address();
  auto client = Client::create((*server)->address());
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto response = client->request("GET", "/");
  ASSERT_TRUE(response.ok()) << response.error().message;
  EXPECT_EQ(response->body, "v6");
}

TEST(HttpServer, InvalidResponsesAreHandlerErrors) {
  auto server = startServer([](Request& request, Response& response) {
    if (request.path() == "/status") {
      EXPECT_FALSE(response.send(99, "text/plain", "").ok());
      EXPECT_FALSE(response.send(204, "text/plain", "body").ok());
      EXPECT_FALSE(response.write("no begin").ok());
      EXPECT_FALSE(response.end().ok());
    } else {
      response.setHeader(request.path() == "/header" ? "Bad\r\nHeader" : "Content-Length", "5");
      EXPECT_FALSE(response.send(200, "text/plain", "x").ok());
    }
    EXPECT_FALSE(response.started());
  });
  ASSERT_TRUE(server);
  for (const char* path : {"/header", "/managed", "/status"}) {
    auto response = clientFor(*server).request("GET", path);
    ASSERT_TRUE(response.ok()) << path << ": " << response.error().message;
    EXPECT_EQ(response->status, 500) << path;
  }
}

TEST(HttpClient, ParsesBaseUrls) {
  EXPECT_EQ(Client::create("http://127.0.0.1:8080").value().authority(), "127.0.0.1:8080");
  EXPECT_EQ(Client::create("127.0.0.1:8080").value().authority(), "127.0.0.1:8080");
  EXPECT_EQ(Client::create("http://[::1]:9/api/").value().authority(), "[::1]:9");
  EXPECT_EQ(Client::create("http://localhost").value().authority(), "localhost:80");
  EXPECT_EQ(Client::create("https://127.0.0.1:8443").value().authority(), "127.0.0.1:8443");
  EXPECT_EQ(Client::create("https://node.example").value().authority(), "node.example:443");
  EXPECT_FALSE(Client::create("https://127.0.0.1:8443", "/nonexistent/ca.pem").ok());
  EXPECT_FALSE(Client::create("ftp://x:1").ok());
  EXPECT_FALSE(Client::create("http://x:99999").ok());
}

TEST(HttpClient, BasePathPrefixesTargets) {
  auto server = startServer([](Request& request, Response& response) { (void)response.send(200, "", request.path()); });
  ASSERT_TRUE(server);
  auto response = Client::create("http://" + server->address() + "/api/").value().request("GET", "/v1/x");
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->body, "/api/v1/x");
}

TEST(HttpClient, ConnectionRefusedIsUnavailable) {
  uint16_t port;
  {
    auto server = startServer([](Request&, Response&) {});
    ASSERT_TRUE(server);
    port = server->port();
  }
  auto response = Client::create("127.0.0.1:" + std::to_string(port)).value().request("GET", "/", {}, {}, 2s);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(response.error().message.find(std::to_string(port)), std::string::npos);
}

TEST(HttpClient, ResponseErrorReadsTheErrorBody) {
  ClientResponse api{404, {}, errorBody("not_found", "no sandbox sb-1").dump()};
  Error error = responseError(api);
  EXPECT_EQ(error.code, ErrorCode::kNotFound);
  EXPECT_EQ(error.message, "no sandbox sb-1");

  ClientResponse proxy{502, {}, "<html>bad gateway</html>"};
  error = responseError(proxy);
  EXPECT_EQ(error.code, ErrorCode::kInternal);
  EXPECT_EQ(error.message, "HTTP 502 Bad Gateway");
}

}  // namespace
}  // namespace space::http
