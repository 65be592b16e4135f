// Relays (Response::relay): the handler hands its connection and a peer socket to the server's
// event loop and returns, its thread with it; the loop relays until the ends, the idle timeout,
// the peer's owner ending the peer, the client leaving or the server stopping, and then
// releases what the plan keeps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "../support/raw_http.h"
#include "common/unix_socket.h"
#include "http/server.h"

namespace space::http {
namespace {

using namespace std::chrono_literals;
using testsupport::connectRaw;
using testsupport::readUntilClosed;
using testsupport::sendRaw;
using testsupport::waitUntil;

constexpr std::string_view kSwitched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n";
constexpr std::string_view kAnswerHead = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";

// The peers handlers relayed to: the test holds the other end of each socketpair. A peer's own
// end is "kept" by the plan; its release is counted.
struct Peers {
  std::mutex m;
  std::vector<UniqueFd> test_ends;
  std::vector<int> relay_ends;  // owned by the plans
  std::atomic<int> released{0};

  size_t count() {
    std::lock_guard lock(m);
    return test_ends.size();
  }
  int testEnd(size_t i) {
    std::lock_guard lock(m);
    return test_ends.at(i).get();
  }
  int relayEnd(size_t i) {
    std::lock_guard lock(m);
    return relay_ends.at(i);
  }
};

struct Kept {
  Kept(UniqueFd f, std::atomic<int>& r) : fd(std::move(f)), released(r) {}
  ~Kept() { ++released; }
  UniqueFd fd;
  std::atomic<int>& released;
};

// /up relays both ways after a 101, /down one way after a 200 head; anything else is "plain".
std::unique_ptr<Server> startRelayServer(Peers& peers, ServerLimits limits = {}, std::chrono::milliseconds idle = 10s) {
  auto server = Server::start(
      "127.0.0.1:0",
      [&peers, idle](Request& request, Response& response) {
        if (request.path() != "/up" && request.path() != "/down") {
          (void)response.send(200, "text/plain", "plain");
          return;
        }
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair) != 0) {
          (void)response.sendError(500, "internal", "socketpair");
          return;
        }
        timeval limit{5, 0};
        setsockopt(pair[1], SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        int flags = fcntl(pair[1], F_GETFL);
        fcntl(pair[1], F_SETFL, flags & ~O_NONBLOCK);
        auto kept = std::make_shared<Kept>(UniqueFd(pair[0]), peers.released);
        RelayPlan plan;
        plan.peer = pair[0];
        plan.both_ways = request.path() == "/up";
        plan.idle_timeout = idle;
        plan.to_client = std::string(plan.both_ways ? kSwitched : kAnswerHead);
        plan.keep = kept;
        {
          std::lock_guard lock(peers.m);
          peers.test_ends.emplace_back(pair[1]);
          peers.relay_ends.push_back(pair[0]);
        }
        kept.reset();
        if (auto relayed = response.relay(plan.both_ways ? 101 : 200, std::move(plan)); !relayed.ok()) {
          (void)response.sendError(503, errorCodeName(relayed.error().code), relayed.error().message);
        }
      },
      limits);
  if (!server.ok()) {
    ADD_FAILURE() << server.error().message;
    return nullptr;
  }
  return std::move(server.value());
}

std::string readExactly(int fd, size_t n) {
  std::string got;
  char buf[4096];
  while (got.size() < n) {
    ssize_t r = recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  return got;
}

UniqueFd openRelay(uint16_t port, const std::string& path, const std::string& early = "",
                   const std::string& fields = "") {
  UniqueFd client = connectRaw(port);
  sendRaw(client.get(), "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + fields + "\r\n" + early);
  return client;
}

// A both-ways relay whose 101 head the client has read; `peers` then holds `peer_count` peers.
UniqueFd openUpgraded(uint16_t port, Peers& peers, size_t peer_count) {
  UniqueFd client = openRelay(port, "/up");
  EXPECT_EQ(readExactly(client.get(), kSwitched.size()), kSwitched);
  EXPECT_TRUE(waitUntil([&] { return peers.count() == peer_count; })) << peers.count();
  return client;
}

TEST(HttpRelay, RelaysBothWaysPassingHalfClosesAndHoldsNoThread) {
  Peers peers;
  ServerLimits limits;
  limits.max_running_requests = 2;  // four relays at once: none may hold a request's thread
  auto server = startRelayServer(peers, limits);
  ASSERT_TRUE(server);
  constexpr size_t kRelays = 4;
  std::vector<UniqueFd> clients;
  for (size_t i = 0; i < kRelays; ++i) {
    clients.push_back(openRelay(server->port(), "/up", "early" + std::to_string(i)));
    ASSERT_EQ(readExactly(clients.back().get(), kSwitched.size()), kSwitched) << i;
  }
  ASSERT_EQ(peers.count(), kRelays);
  EXPECT_TRUE(waitUntil([&] { return server->runningRequests() == 0; })) << server->runningRequests();
  EXPECT_EQ(server->openRelays(), kRelays);
  EXPECT_EQ(server->openStreams(), 0u) << "relays are not streams";
  {
    // The API still answers meanwhile.
    UniqueFd plain = connectRaw(server->port());
    sendRaw(plain.get(), "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    EXPECT_NE(readUntilClosed(plain.get()).find("plain"), std::string::npos);
  }
  for (size_t i = 0; i < kRelays; ++i) {
    const int peer = peers.testEnd(i);
    const std::string early = "early" + std::to_string(i);
    EXPECT_EQ(readExactly(peer, early.size()), early) << "what followed the request goes first";
    sendRaw(clients[i].get(), "ping");
    EXPECT_EQ(readExactly(peer, 4), "ping");
    sendRaw(peer, "pong");
    EXPECT_EQ(readExactly(clients[i].get(), 4), "pong");
  }
  // The client's half-close reaches the peer, which still answers; then its own end closes all.
  shutdown(clients[0].get(), SHUT_WR);
  char byte;
  EXPECT_EQ(recv(peers.testEnd(0), &byte, 1, 0), 0) << "the client's end passed on";
  sendRaw(peers.testEnd(0), "bye");
  shutdown(peers.testEnd(0), SHUT_WR);
  EXPECT_EQ(readUntilClosed(clients[0].get()), "bye");
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; })) << peers.released;
  EXPECT_TRUE(waitUntil([&] { return server->openRelays() == kRelays - 1; }));
  // The peer's end first, the client's after: the same.
  shutdown(peers.testEnd(1), SHUT_WR);
  EXPECT_EQ(readUntilClosed(clients[1].get()), "") << "the peer's end passed on";
  EXPECT_EQ(peers.released, 1) << "the client can still send";
  sendRaw(clients[1].get(), "last");
  EXPECT_EQ(readExactly(peers.testEnd(1), 4), "last");
  shutdown(clients[1].get(), SHUT_WR);
  EXPECT_TRUE(waitUntil([&] { return peers.released == 2; })) << peers.released;
  server->stop(1s);
  EXPECT_EQ(peers.released, static_cast<int>(kRelays)) << "the stop ends the rest and releases them";
  EXPECT_EQ(readUntilClosed(clients[2].get()), "");
}

TEST(HttpRelay, OneWayEndsWithThePeersEndOrWhenTheClientLeaves) {
  Peers peers;
  auto server = startRelayServer(peers);
  ASSERT_TRUE(server);
  UniqueFd client = openRelay(server->port(), "/down");
  ASSERT_TRUE(waitUntil([&] { return peers.count() == 1; }));
  const std::string body(200 * 1024, 'b');  // more than one buffer's worth
  std::thread writer([&] {
    sendRaw(peers.testEnd(0), body);
    shutdown(peers.testEnd(0), SHUT_WR);
  });
  EXPECT_EQ(readUntilClosed(client.get()), std::string(kAnswerHead) + body);
  writer.join();
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; }));

  // A client that leaves while the peer is silent ends the relay (one way: it is watched; a
  // half-close counts as leaving, as for streams).
  UniqueFd leaving = openRelay(server->port(), "/down");
  EXPECT_EQ(readExactly(leaving.get(), kAnswerHead.size()), kAnswerHead);
  ASSERT_TRUE(waitUntil([&] { return peers.count() == 2; }));
  leaving = UniqueFd();
  EXPECT_TRUE(waitUntil([&] { return peers.released == 2; })) << peers.released;
  char byte;
  EXPECT_EQ(recv(peers.testEnd(1), &byte, 1, 0), 0) << "the peer's socket was released to its owner, who closed it";
  EXPECT_TRUE(waitUntil([&] { return server->openRelays() == 0u; })) << server->openRelays();
}

TEST(HttpRelay, EndsWhenIdle) {
  Peers peers;
  auto server = startRelayServer(peers, {}, 300ms);
  ASSERT_TRUE(server);
  UniqueFd idle = openUpgraded(server->port(), peers, 1);
  auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(readUntilClosed(idle.get()), "");
  EXPECT_GE(std::chrono::steady_clock::now() - started, 250ms);
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; }));

  // Traffic keeps it: three rounds spaced under the timeout outlast it.
  UniqueFd busy = openUpgraded(server->port(), peers, 2);
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(150ms);
    sendRaw(busy.get(), "x");
    EXPECT_EQ(readExactly(peers.testEnd(1), 1), "x") << i;
  }
  EXPECT_EQ(peers.released, 1);
}

// The owner shuts its socket down both ways (the sandbox ended, GuestConnections::endAll): the
// relay ends well before its idle timeout, whether the client is silent or too slow to take
// what the peer sent.
TEST(HttpRelay, EndsWhenThePeersOwnerShutsItDownEvenWhileTheClientIsSlow) {
  Peers peers;
  auto server = startRelayServer(peers, {}, 30s);
  ASSERT_TRUE(server);
  UniqueFd silent = openUpgraded(server->port(), peers, 1);
  auto shut_at = std::chrono::steady_clock::now();
  shutdown(peers.relayEnd(0), SHUT_RDWR);
  EXPECT_EQ(readUntilClosed(silent.get()), "");
  EXPECT_LT(std::chrono::steady_clock::now() - shut_at, 5s);
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; }));

  // This client reads nothing: the relay's write to it stalls with the peer's flood.
  UniqueFd slow = openUpgraded(server->port(), peers, 2);
  const int flood = peers.testEnd(1);
  fcntl(flood, F_SETFL, fcntl(flood, F_GETFL) | O_NONBLOCK);
  const std::string chunk(64 * 1024, 'f');
  auto until = std::chrono::steady_clock::now() + 5s;
  int stalls = 0;
  while (stalls < 20 && std::chrono::steady_clock::now() < until) {  // the pipe is full when sends keep failing
    if (send(flood, chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) {
      ++stalls;
      std::this_thread::sleep_for(10ms);
    } else {
      stalls = 0;
    }
  }
  ASSERT_EQ(stalls, 20) << "the client's side never filled";
  shut_at = std::chrono::steady_clock::now();
  shutdown(peers.relayEnd(1), SHUT_RDWR);
  EXPECT_TRUE(waitUntil([&] { return peers.released == 2; }, 5s)) << "still relaying to a slow client";
  EXPECT_LT(std::chrono::steady_clock::now() - shut_at, 5s);
}

// The client's end passed on (our shutdown of the peer's sending side) and then the peer's own
// end make a hang-up on the peer's socket that the owner did not cause: a slow client still gets
// everything the peer sent.
TEST(HttpRelay, AfterBothEndsASlowClientStillGetsTheWholeAnswer) {
  Peers peers;
  auto server = startRelayServer(peers, {}, 30s);
  ASSERT_TRUE(server);
  UniqueFd client = openUpgraded(server->port(), peers, 1);
  shutdown(client.get(), SHUT_WR);
  char byte;
  ASSERT_EQ(recv(peers.testEnd(0), &byte, 1, 0), 0) << "the client's end passed on";
  // The whole answer and the peer's end wait in the peer's socket (a send buffer that holds it
  // all) while the relay's write to the client stalls (more than loopback TCP holds).
  const std::string answer(24 << 20, 'a');
  const int forced = 64 << 20;
  ASSERT_EQ(setsockopt(peers.testEnd(0), SOL_SOCKET, SO_SNDBUFFORCE, &forced, sizeof forced), 0) << strerror(errno);
  std::thread writer([&] {
    sendRaw(peers.testEnd(0), answer);
    shutdown(peers.testEnd(0), SHUT_WR);
  });
  std::this_thread::sleep_for(2500ms);  // the client reads nothing for a few of the peer watch's looks
  EXPECT_EQ(readUntilClosed(client.get()).size(), answer.size());
  writer.join();
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; }));
}

// A peer that sends its end first and closes altogether later (a WebSocket server after its
// close handshake) ends the relay then, though the client, which may still send, keeps its
// connection open.
TEST(HttpRelay, APeerThatSentItsEndAndThenClosedEndsTheRelayThoughTheClientStays) {
  Peers peers;
  auto server = startRelayServer(peers, {}, 30s);
  ASSERT_TRUE(server);
  UniqueFd client = openUpgraded(server->port(), peers, 1);
  std::this_thread::sleep_for(1500ms);  // no write to the client is under way: no watch is armed
  shutdown(peers.testEnd(0), SHUT_WR);
  char byte;
  ASSERT_EQ(recv(client.get(), &byte, 1, 0), 0) << "the peer's end passed on";
  std::this_thread::sleep_for(1500ms);  // the relay goes on: the client may still send
  EXPECT_EQ(peers.released, 0);
  sendRaw(client.get(), "late");
  EXPECT_EQ(readExactly(peers.testEnd(0), 4), "late");
  const auto closed_at = std::chrono::steady_clock::now();
  shutdown(peers.testEnd(0), SHUT_RDWR);
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; }, 5s)) << "the relay outlived its closed peer";
  EXPECT_LT(std::chrono::steady_clock::now() - closed_at, 5s);
  // The peer is released when the relay's last owner lets go, which may come before or after
  // the server uncounts the relay: each is waited for, not one read right after the other.
  EXPECT_TRUE(waitUntil([&] { return server->openRelays() == 0u; })) << server->openRelays();
}

TEST(HttpRelay, RelaysHaveALimitOfTheirOwnAndOneOverItIsRefusedWithNothingSent) {
  Peers peers;
  ServerLimits limits;
  limits.max_streams = 1;  // relays are not streams
  limits.max_relays = 2;
  auto server = startRelayServer(peers, limits);
  ASSERT_TRUE(server);
  UniqueFd first = openUpgraded(server->port(), peers, 1);
  UniqueFd second = openUpgraded(server->port(), peers, 2);
  UniqueFd third = openRelay(server->port(), "/up", "", "Connection: close\r\n");
  std::string refused = readUntilClosed(third.get());
  EXPECT_EQ(refused.rfind("HTTP/1.1 503", 0), 0u) << refused;
  EXPECT_NE(refused.find("connections relayed (the limit is 2)"), std::string::npos) << refused;
  EXPECT_TRUE(waitUntil([&] { return peers.released == 1; })) << "the refused plan's peer is released";
  sendRaw(first.get(), "still");
  EXPECT_EQ(readExactly(peers.testEnd(0), 5), "still");
}

}  // namespace
}  // namespace space::http
