// Detached streamed responses (Response::detach): the handler returns and its thread with it,
// while producers on other threads write; the server's limits, timeouts and keep-alive hold.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "../support/raw_http.h"
#include "common/unix_socket.h"
#include "http/client.h"
#include "http/server.h"
#include "http/stream_drain.h"

namespace space::http {
namespace {

using namespace std::chrono_literals;
using testsupport::connectRaw;
using testsupport::readUntilClosed;
using testsupport::sendRaw;
using testsupport::waitUntil;

// The streams handlers detached, in order.
struct Detached {
  std::mutex m;
  std::vector<std::shared_ptr<ResponseStream>> streams;

  size_t count() {
    std::lock_guard lock(m);
    return streams.size();
  }
  std::shared_ptr<ResponseStream> at(size_t i) {
    std::lock_guard lock(m);
    return streams.at(i);
  }
  bool waitFor(size_t n, std::chrono::milliseconds limit = 5s) {
    for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
      if (count() >= n) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
};

// /stream detaches (and calls `setup` on the stream before returning); anything else is a
// plain 200 "plain".
std::unique_ptr<Server> startStreamServer(Detached& detached, ServerLimits limits = {},
                                          std::function<void(ResponseStream&)> setup = nullptr) {
  auto server = Server::start(
      "127.0.0.1:0",
      [&detached, setup](Request& request, Response& response) {
        if (request.path() != "/stream") {
          (void)response.send(200, "text/plain", "plain");
          return;
        }
        auto stream = response.detach(200, "text/plain");
        if (!stream.ok()) {
          (void)response.sendError(503, errorCodeName(stream.error().code), stream.error().message);
          return;
        }
        if (setup) setup(*stream.value());
        std::lock_guard lock(detached.m);
        detached.streams.push_back(std::move(stream.value()));
      },
      limits);
  if (!server.ok()) {
    ADD_FAILURE() << server.error().message;
    return nullptr;
  }
  return std::move(server.value());
}

// A setup for startStreamServer: the stream's close fulfils `closed` with `completed`.
std::function<void(ResponseStream&)> reportCloseTo(std::promise<bool>& closed) {
  return
      [&closed](ResponseStream& stream) { stream.onClose([&closed](bool completed) { closed.set_value(completed); }); };
}

// Reads until `marker` arrived (or the socket's read limit passed).
std::string readUntil(int fd, std::string_view marker, std::string& got) {
  char buf[4096];
  while (got.find(marker) == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(HttpStream, DetachedStreamsHoldNoThreadAndTheConnectionServesTheNextRequest) {
  Detached detached;
  ServerLimits limits;
  limits.max_running_requests = 2;  // eight streams at once: possible only without a thread each
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> clients;
  for (size_t i = 0; i < 8; ++i) {
    clients.push_back(connectRaw(server->port()));
    sendRaw(clients.back().get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(detached.waitFor(i + 1));
    // Its handler has returned, or is about to: then it counts no more.
    ASSERT_TRUE(waitUntil([&] { return server->runningRequests() == 0; })) << server->runningRequests();
  }
  EXPECT_EQ(server->runningRequests(), 0u);
  EXPECT_EQ(server->openStreams(), 8u);

  // Producers on other threads write after the handlers returned.
  std::vector<std::thread> producers;
  for (size_t i = 0; i < 8; ++i) {
    producers.emplace_back([&, i] {
      auto stream = detached.at(i);
      EXPECT_TRUE(stream->write("hello " + std::to_string(i) + "\n"));
      EXPECT_TRUE(stream->write(""));  // nothing, and not the end of the body
      EXPECT_TRUE(stream->write("bye\n"));
      stream->end();
      EXPECT_FALSE(stream->write("too late"));
    });
  }
  for (auto& t : producers) t.join();
  for (size_t i = 0; i < 8; ++i) {
    std::string got;
    readUntil(clients[i].get(), "0\r\n\r\n", got);
    EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
    EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got;
    std::string body_lines = "hello " + std::to_string(i) + "\n";
    EXPECT_NE(got.find(body_lines), std::string::npos) << got;
    EXPECT_NE(got.find("4\r\nbye\n\r\n0\r\n\r\n"), std::string::npos) << got;
    // The same connection serves the next request once the stream ended. The previous plain
    // request counts among the two running until its thread is back from writing the answer
    // (a loaded machine may take a while): only then is the server surely under its limit.
    ASSERT_TRUE(waitUntil([&] { return server->runningRequests() == 0; })) << server->runningRequests();
    sendRaw(clients[i].get(), "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string next;
    readUntil(clients[i].get(), "plain", next);
    EXPECT_NE(next.find("HTTP/1.1 200"), std::string::npos) << next;
  }
  EXPECT_EQ(server->openStreams(), 0u);
}

TEST(HttpStream, AClientThatLeavesClosesItsStreamAndTheProducerHearsIt) {
  Detached detached;
  std::promise<bool> closed;
  auto server = startStreamServer(detached, {}, reportCloseTo(closed));
  ASSERT_TRUE(server);
  {
    UniqueFd client = connectRaw(server->port());
    sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(detached.waitFor(1));
    ASSERT_TRUE(detached.at(0)->write("first\n"));
    std::string got;
    readUntil(client.get(), "first", got);
  }  // the client hangs up while the producer has nothing to say
  auto done = closed.get_future();
  ASSERT_EQ(done.wait_for(3s), std::future_status::ready);
  EXPECT_FALSE(done.get());
  EXPECT_TRUE(detached.at(0)->closed());
  EXPECT_FALSE(detached.at(0)->write("nobody reads this"));
  EXPECT_FALSE(detached.at(0)->runBlocking([] {}));
  EXPECT_EQ(server->openStreams(), 0u);
  // A callback set after the close runs at once.
  bool late = true;
  detached.at(0)->onClose([&](bool completed) { late = completed; });
  EXPECT_FALSE(late);
}

TEST(HttpStream, AClientThatSentMoreBytesAndLeftIsStillNoticed) {
  Detached detached;
  std::promise<bool> closed;
  auto server = startStreamServer(detached, {}, reportCloseTo(closed));
  ASSERT_TRUE(server);
  {
    UniqueFd client = connectRaw(server->port());
    // A stray byte after the request stays unread in the socket, readable for good: the hang-up
    // behind it must still be seen while the producer is silent.
    sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\nG");
    ASSERT_TRUE(detached.waitFor(1));
    std::this_thread::sleep_for(200ms);
  }
  auto done = closed.get_future();
  ASSERT_EQ(done.wait_for(4s), std::future_status::ready);
  EXPECT_FALSE(done.get());
  EXPECT_EQ(server->openStreams(), 0u);
}

TEST(HttpStream, AClientThatStopsReadingLosesTheStreamAfterTheWriteTimeout) {
  Detached detached;
  std::promise<bool> closed;
  ServerLimits limits;
  limits.write_timeout = 300ms;
  auto server = startStreamServer(detached, limits, reportCloseTo(closed));
  ASSERT_TRUE(server);
  UniqueFd client = connectRaw(server->port());
  int small = 4096;
  setsockopt(client.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(1));
  auto stream = detached.at(0);
  // The producer bounds what waits, as a real one does, by pending().
  auto started = std::chrono::steady_clock::now();
  size_t written = 0;
  while (stream->pending() < (8u << 20) && stream->write(std::string(64 << 10, 'x'))) written += 64 << 10;
  auto done = closed.get_future();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(done.get());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 4s);
  EXPECT_GT(written, 0u);
  EXPECT_EQ(stream->pending(), 0u);  // what was queued is freed with the stream
}

TEST(HttpStream, OverTheStreamLimitsDetachFailsAndTheHandlerAnswers) {
  Detached detached;
  ServerLimits limits;
  limits.max_streams_per_client = 2;
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  UniqueFd a = connectRaw(server->port()), b = connectRaw(server->port()), c = connectRaw(server->port());
  sendRaw(a.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  sendRaw(b.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(2));
  sendRaw(c.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string got;
  readUntil(c.get(), "limit", got);
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_NE(got.find("this client has 2 streams open (the limit is 2)"), std::string::npos) << got;
  // One ends: there is room again.
  detached.at(0)->end();
  std::string ended;
  readUntil(a.get(), "0\r\n\r\n", ended);
  sendRaw(c.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(detached.waitFor(3));
}

TEST(HttpStream, KeepAliveChunksGoOutWhileTheProducerIsSilent) {
  Detached detached;
  auto server =
      startStreamServer(detached, {}, [](ResponseStream& stream) { stream.keepAlive(100ms, std::string("ka\n")); });
  ASSERT_TRUE(server);
  UniqueFd client = connectRaw(server->port());
  sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(1));
  auto silent_from = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(450ms);
  ASSERT_TRUE(detached.at(0)->write("data\n"));
  // A loaded machine may oversleep: the upper bound follows the silence this run really had.
  auto silent_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - silent_from).count();
  detached.at(0)->end();
  std::string got;
  readUntil(client.get(), "0\r\n\r\n", got);
  size_t keepalives = 0;
  for (size_t at = got.find("3\r\nka\n"); at != std::string::npos; at = got.find("3\r\nka\n", at + 1)) ++keepalives;
  EXPECT_GE(keepalives, 2u) << got;
  EXPECT_LE(keepalives, static_cast<size_t>(silent_ms / 100 + 1)) << got;
  EXPECT_NE(got.find("5\r\ndata\n\r\n0\r\n\r\n"), std::string::npos) << got;
}

TEST(HttpStream, AbortCutsTheBodyAndHttp10EndsWithTheConnection) {
  Detached detached;
  std::promise<bool> closed;
  auto server = startStreamServer(detached);
  ASSERT_TRUE(server);
  UniqueFd cut = connectRaw(server->port());
  sendRaw(cut.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(1));
  detached.at(0)->onClose([&](bool completed) { closed.set_value(completed); });
  ASSERT_TRUE(detached.at(0)->write("partial\n"));
  std::string got;
  readUntil(cut.get(), "partial", got);
  ASSERT_TRUE(detached.at(0)->write("dropped\n"));  // still queued when the abort comes, or not
  detached.at(0)->abort();
  got += readUntilClosed(cut.get());
  EXPECT_NE(got.find("partial"), std::string::npos) << got;
  EXPECT_EQ(got.find("0\r\n\r\n"), std::string::npos) << got;  // no last chunk: the client sees a cut body
  auto done = closed.get_future();
  ASSERT_EQ(done.wait_for(3s), std::future_status::ready);
  EXPECT_FALSE(done.get());

  UniqueFd old = connectRaw(server->port());
  sendRaw(old.get(), "GET /stream HTTP/1.0\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(2));
  ASSERT_TRUE(detached.at(1)->write("raw bytes"));
  detached.at(1)->end();
  std::string body = readUntilClosed(old.get());
  ASSERT_NE(body.find("\r\n\r\n"), std::string::npos) << body;
  EXPECT_EQ(body.substr(body.find("\r\n\r\n") + 4), "raw bytes");
}

TEST(HttpStream, BlockingStepsRunOnAHandlerThread) {
  Detached detached;
  auto server = startStreamServer(detached);
  ASSERT_TRUE(server);
  UniqueFd client = connectRaw(server->port());
  sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(1));
  auto stream = detached.at(0);
  std::promise<std::thread::id> ran_on;
  ASSERT_TRUE(stream->runBlocking([&, stream] {
    std::this_thread::sleep_for(50ms);  // blocking is what the step is for
    ran_on.set_value(std::this_thread::get_id());
    stream->write("from a step\n");
    stream->end();
  }));
  auto id = ran_on.get_future();
  ASSERT_EQ(id.wait_for(3s), std::future_status::ready);
  EXPECT_NE(id.get(), std::this_thread::get_id());
  std::string got;
  readUntil(client.get(), "0\r\n\r\n", got);
  EXPECT_NE(got.find("from a step"), std::string::npos) << got;
}

TEST(HttpStream, StepsWaitForAStepThreadAndNeedNoRequestThread) {
  Detached detached;
  ServerLimits limits;
  limits.max_running_requests = 1;  // its pool has 33 threads: more steps than that wait below
  limits.max_stream_step_threads = 2;
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  constexpr size_t kStreams = 40;
  std::vector<UniqueFd> clients;
  for (size_t i = 0; i < kStreams; ++i) {
    clients.push_back(connectRaw(server->port()));
    sendRaw(clients.back().get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(detached.waitFor(i + 1));
    // At the limit of one, the next request waits until this one's thread counts no more.
    ASSERT_TRUE(waitUntil([&] { return server->runningRequests() == 0; })) << server->runningRequests();
  }
  // Two steps hold both step threads; the other streams' steps wait for them, none is refused
  // (before, steps shared the request threads, and one that found none aborted its stream).
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<int> steps_done{0};
  for (size_t i = 0; i < kStreams; ++i) {
    auto stream = detached.at(i);
    ASSERT_TRUE(stream->runBlocking([stream, released, i, &steps_done] {
      if (i < 2) (void)released.wait_for(30s);
      stream->write("step " + std::to_string(i) + "\n");
      stream->end();
      ++steps_done;
    }));
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(steps_done.load(), 0);
  // Meanwhile plain requests have their own thread.
  UniqueFd plain = connectRaw(server->port());
  sendRaw(plain.get(), "GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(readUntilClosed(plain.get()).find("plain"), std::string::npos);
  release.set_value();
  for (size_t i = 0; i < kStreams; ++i) {
    std::string got;
    readUntil(clients[i].get(), "0\r\n\r\n", got);
    EXPECT_NE(got.find("step " + std::to_string(i) + "\n"), std::string::npos) << got;
  }
  // A step counts itself after its stream's end went out: the last count may follow the read.
  EXPECT_TRUE(waitUntil([&] { return steps_done.load() == static_cast<int>(kStreams); })) << steps_done.load();
}

// Opens `n` streams from this (loopback) client, one after another.
std::vector<UniqueFd> openStreams(Server& server, Detached& detached, size_t n) {
  std::vector<UniqueFd> clients;
  size_t before = detached.count();
  for (size_t i = 0; i < n; ++i) {
    clients.push_back(connectRaw(server.port()));
    sendRaw(clients.back().get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_TRUE(detached.waitFor(before + i + 1));
  }
  return clients;
}

// One client address holds at most max_stream_steps_per_client step threads, however many are
// idle: its further steps wait for its own to finish, and then run in the order they came.
TEST(HttpStream, OneClientsStepsHoldOnlyItsShareOfTheStepThreadsAndTakeTurns) {
  Detached detached;
  ServerLimits limits;
  limits.max_stream_step_threads = 8;
  limits.max_stream_steps_per_client = 1;  // one at a time: the order they ran is the order taken
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  constexpr size_t kStreams = 6;
  auto clients = openStreams(*server, detached, kStreams);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::mutex m;
  std::vector<size_t> order;
  for (size_t i = 0; i < kStreams; ++i) {
    auto stream = detached.at(i);
    ASSERT_TRUE(stream->runBlocking([stream, released, i, &m, &order] {
      if (i == 0) (void)released.wait_for(30s);
      {
        std::lock_guard lock(m);
        order.push_back(i);
      }
      stream->write("step " + std::to_string(i) + "\n");
      stream->end();
    }));
  }
  // Seven step threads are free, but this client's one is busy: nothing else of it runs.
  std::this_thread::sleep_for(150ms);
  {
    std::lock_guard lock(m);
    EXPECT_TRUE(order.empty());
  }
  release.set_value();
  for (size_t i = 0; i < kStreams; ++i) {
    std::string got;
    readUntil(clients[i].get(), "0\r\n\r\n", got);
    EXPECT_NE(got.find("step " + std::to_string(i) + "\n"), std::string::npos) << got;
  }
  std::lock_guard lock(m);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

// A step that the step threads' queue has no place for is refused (runBlocking says so to its
// producer) and its party's place goes back: the party's next steps find the same room as if
// the refused one had never been asked for.
TEST(HttpStream, AStepTheFullQueueRefusesGivesItsPartysPlaceBack) {
  Detached detached;
  ServerLimits limits;
  limits.max_streams = 2;  // also the step threads' queue: two places
  limits.max_stream_step_threads = 1;
  limits.max_stream_steps_per_client = 4;
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  auto clients = openStreams(*server, detached, 1);
  auto stream = detached.at(0);
  std::atomic<int> ran{0};
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::promise<void> release;
    auto released = release.get_future().share();
    std::atomic<bool> holding{false};
    // One step holds the thread; two wait in the queue's two places; a fourth finds none.
    ASSERT_TRUE(stream->runBlocking([released, &holding, &ran] {
      holding = true;
      (void)released.wait_for(30s);
      ++ran;
    }));
    ASSERT_TRUE(waitUntil([&] { return holding.load(); }));
    EXPECT_TRUE(stream->runBlocking([&ran] { ++ran; }));
    EXPECT_TRUE(stream->runBlocking([&ran] { ++ran; }));
    // With its place kept (3 + 1 of the party's 4 counted), this one would wait in the party's
    // line instead, and be taken.
    EXPECT_FALSE(stream->runBlocking([&ran] { ran += 100; }));
    release.set_value();
    ASSERT_TRUE(waitUntil([&] { return ran.load() == 3 * (round + 1); })) << ran.load();
    // A step's place goes back just after its task returned (nothing here can see when).
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(ran.load(), 6);  // the refused steps never ran
  ASSERT_TRUE(stream->runBlocking([stream] {
    stream->write("done\n");
    stream->end();
  }));
  std::string got;
  readUntil(clients[0].get(), "0\r\n\r\n", got);
  EXPECT_NE(got.find("done\n"), std::string::npos) << got;
}

// Parties that share an address (tenants behind loopback or a proxy) have a share each when the
// handler names them: one party's blocked steps do not hold another's.
TEST(HttpStream, NamedPartiesOnOneAddressHaveAShareEach) {
  Detached detached;
  ServerLimits limits;
  limits.max_stream_step_threads = 8;
  limits.max_stream_steps_per_client = 1;
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  auto clients = openStreams(*server, detached, 3);
  detached.at(0)->shareStepsWith("tenant a");
  detached.at(1)->shareStepsWith("tenant a");
  detached.at(2)->shareStepsWith("tenant b");
  std::promise<void> release;
  auto released = release.get_future().share();
  std::atomic<bool> a_second{false};
  std::promise<void> b_ran;
  ASSERT_TRUE(detached.at(0)->runBlocking([released] { (void)released.wait_for(30s); }));
  ASSERT_TRUE(detached.at(1)->runBlocking([&a_second] { a_second = true; }));
  ASSERT_TRUE(detached.at(2)->runBlocking([&b_ran] { b_ran.set_value(); }));
  EXPECT_EQ(b_ran.get_future().wait_for(5s), std::future_status::ready);  // b is not behind a
  EXPECT_FALSE(a_second.load());                                          // a's second waits for its first
  release.set_value();
  EXPECT_TRUE(waitUntil([&] { return a_second.load(); }));
}

// A step that waits for its client's share holds no place once its stream closed: a client that
// opens streams, queues steps and leaves, again and again, cannot fill its queue. Such a step
// never runs.
TEST(HttpStream, StepsOfStreamsThatClosedWhileWaitingHoldNoPlaceAndNeverRun) {
  Detached detached;
  ServerLimits limits;
  limits.max_stream_step_threads = 4;
  limits.max_stream_steps_per_client = 1;
  limits.max_streams_per_client = 4;  // the client's queue holds as many
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  auto holder = openStreams(*server, detached, 1);
  std::promise<void> release;
  auto released = release.get_future().share();
  std::promise<void> entered;
  ASSERT_TRUE(detached.at(0)->runBlocking([released, &entered] {
    entered.set_value();
    (void)released.wait_for(30s);
  }));
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready) << "entered never came";
  std::atomic<int> ran_for_closed{0};
  for (int round = 0; round < 3; ++round) {
    auto left = openStreams(*server, detached, 3);
    for (size_t i = detached.count() - 3; i < detached.count(); ++i) {
      ASSERT_TRUE(detached.at(i)->runBlocking([&ran_for_closed] { ++ran_for_closed; })) << round;
    }
    left.clear();  // the clients leave; their steps still wait
    ASSERT_TRUE(waitUntil([&] { return server->openStreams() == 1; })) << server->openStreams();
  }
  // Nine steps of closed streams came; the queue holds four: without dropping those, these fail.
  auto staying = openStreams(*server, detached, 3);
  std::atomic<int> ran{0};
  for (size_t i = detached.count() - 3; i < detached.count(); ++i) {
    auto stream = detached.at(i);
    ASSERT_TRUE(stream->runBlocking([stream, &ran] {
      ++ran;
      stream->end();
    }));
  }
  release.set_value();
  EXPECT_TRUE(waitUntil([&] { return ran.load() == 3; })) << ran.load();
  EXPECT_EQ(ran_for_closed.load(), 0);
}

TEST(HttpStream, StopEndsOpenStreamsWithoutWaitingForTheGrace) {
  Detached detached;
  std::promise<bool> closed;
  auto server = startStreamServer(detached, {}, reportCloseTo(closed));
  ASSERT_TRUE(server);
  UniqueFd client = connectRaw(server->port());
  sendRaw(client.get(), "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(detached.waitFor(1));
  auto started = std::chrono::steady_clock::now();
  server->stop(10s);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 2s);
  auto done = closed.get_future();
  ASSERT_EQ(done.wait_for(1s), std::future_status::ready);
  EXPECT_FALSE(done.get());
  // The stream outlives the server: every call is refused, none touches it.
  server.reset();
  auto stream = detached.at(0);
  EXPECT_FALSE(stream->write("x"));
  EXPECT_FALSE(stream->runBlocking([] {}));
  stream->end();
  stream->abort();
}

// A producer that never stops (a process writing without end) keeps waking its drain: after
// the drain's turn of drains in a row its step goes back in line, and the stream of its party
// that waited behind it runs, then the drain goes on.
TEST(StreamDrain, AProducerThatNeverStopsGivesItsPartysOtherStreamsATurn) {
  Detached detached;
  ServerLimits limits;
  limits.max_stream_step_threads = 4;
  limits.max_stream_steps_per_client = 1;  // one client: one step at a time
  auto server = startStreamServer(detached, limits);
  ASSERT_TRUE(server);
  auto clients = openStreams(*server, detached, 2);
  auto a = detached.at(0);
  auto b = detached.at(1);
  constexpr int kTurn = 5;
  std::promise<void> b_queued;
  auto queued = b_queued.get_future().share();
  std::atomic<int> drains{0};
  std::atomic<bool> stop{false};
  std::weak_ptr<StreamDrain> self;
  auto drain = StreamDrain::make(
      a,
      [&, queued] {
        if (drains.fetch_add(1) == 0) (void)queued.wait_for(30s);
        if (stop.load()) {
          a->write("a done\n");
          a->end();
          return true;
        }
        // More came while it drained.
        if (auto me = self.lock()) me->kick();
        return false;
      },
      kTurn);
  self = drain;
  drain->kick();
  ASSERT_TRUE(waitUntil([&] { return drains.load() == 1; }));
  std::atomic<int> seen_by_b{-1};
  ASSERT_TRUE(b->runBlocking([&] {
    seen_by_b = drains.load();
    b->write("b ran\n");
    b->end();
  }));
  b_queued.set_value();
  std::string got_b;
  readUntil(clients[1].get(), "0\r\n\r\n", got_b);
  EXPECT_NE(got_b.find("b ran\n"), std::string::npos) << got_b;
  EXPECT_EQ(seen_by_b.load(), kTurn) << "b ran after the drain's turn, not before and not never";
  // And the drain goes on after b's turn.
  ASSERT_TRUE(waitUntil([&] { return drains.load() > kTurn + 1; })) << drains.load();
  stop = true;
  std::string got_a;
  readUntil(clients[0].get(), "0\r\n\r\n", got_a);
  EXPECT_NE(got_a.find("a done\n"), std::string::npos) << got_a;
}

// Kicks from a producer thread as fast as it can: drains never overlap, and the last kick is
// always followed by a drain that sees what it announced (no wake-up is lost).
TEST(StreamDrain, DrainsNeverOverlapAndNoKickIsLost) {
  Detached detached;
  auto server = startStreamServer(detached);
  ASSERT_TRUE(server);
  auto clients = openStreams(*server, detached, 1);
  auto out = detached.at(0);
  constexpr int kKicks = 5000;
  std::atomic<int> produced{0};
  std::atomic<int> drained{0};
  std::atomic<bool> inside{false};
  std::atomic<int> overlaps{0};
  std::atomic<int> drains{0};
  auto drain = StreamDrain::make(out, [&] {
    if (inside.exchange(true)) ++overlaps;
    ++drains;
    drained = produced.load();
    // Long enough that kicks come while it drains.
    std::this_thread::sleep_for(100us);
    inside = false;
    return false;
  });
  std::thread producer([&] {
    for (int i = 1; i <= kKicks; ++i) {
      produced = i;
      drain->kick();
    }
  });
  producer.join();
  EXPECT_TRUE(waitUntil([&] { return drained.load() == kKicks; })) << drained.load();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_GE(drains.load(), 1);
  EXPECT_LE(drains.load(), kKicks);
  out->end();
  std::string got;
  readUntil(clients[0].get(), "0\r\n\r\n", got);
  EXPECT_NE(got.find("0\r\n\r\n"), std::string::npos) << got;
}

}  // namespace
}  // namespace space::http
