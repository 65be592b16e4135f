// The agent channel end to end inside one process: the host's AgentClient on one end of a
// socketpair, the agent's Channel + HTTP/2 server on the other (its own EventLoop thread), with
// a test router. Then hostile guests in place of the agent: garbage, oversized frames, silence.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <thread>

#include "../support/nested_json.h"
#include "agent/channel.h"
#include "agentproto/agent_client.h"
#include "agentproto/base64.h"

namespace space {
namespace {

using agent::Json;
using agentproto::AgentClient;
using std::chrono::milliseconds;

// Runs an agent Channel with `router` on its own thread over `fd`.
class AgentThread {
 public:
  AgentThread(int fd, agent::Router& router) : stop_fd_(eventfd(0, EFD_CLOEXEC)) {
    thread_ = std::thread([this, fd, &router] {
      agent::EventLoop loop;
      agent::Channel channel(loop, router, [] { return Json{{"version", "test"}, {"kernel", "k"}, {"uptime", 1.5}}; });
      channel.adopt(fd, false);
      loop.addFd(stop_fd_, EPOLLIN, [&](uint32_t) { loop.stop(); });
      loop.run();
      loop.removeFd(stop_fd_);
      sessions = channel.sessions();
    });
  }
  ~AgentThread() {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
    close(stop_fd_);
  }
  std::atomic<uint64_t> sessions{0};

 private:
  int stop_fd_;
  std::thread thread_;
};

// An empty HTTP/2 SETTINGS frame: what a real agent sends once its session took the preface.
const std::string kEmptySettings("\0\0\0\x04\0\0\0\0\0", 9);

// A stand-in for the guest: waits for the host's hello, sends answer(nonce), then reads and
// discards everything until the host goes away.
void fakeGuest(int fd, const std::function<std::string(const std::string& nonce)>& answer) {
  char buf[64 << 10];
  std::string seen;
  size_t at = std::string::npos;
  while (at == std::string::npos || seen.find('\n', at) == std::string::npos) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return;
    seen.append(buf, static_cast<size_t>(n));
    at = seen.find(agentproto::kHelloPrefix);
  }
  size_t start = at + agentproto::kHelloPrefix.size();
  std::string out = answer(seen.substr(start, seen.find('\n', start) - start));
  (void)!send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  while (read(fd, buf, sizeof buf) > 0) {
  }
}

class ChannelTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    router_.unary("/test.Test/Echo", [](const Json& req, const agent::CallContext& ctx) -> agent::UnaryResult {
      return Json{{"echo", req}, {"user", ctx.user}};
    });
    router_.unary("/test.Test/Fail", [](const Json&, const agent::CallContext&) -> agent::UnaryResult {
      return agent::rpcError(agent::RpcCode::kNotFound, "no such thing");
    });
    router_.serverStream("/test.Test/Count",
                         [](const Json& req, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           int n = req.value("n", 0);
                           for (int i = 0; i < n; ++i) s->send(Json{{"i", i}});
                           s->finish();
                         });
    router_.serverStream("/test.Test/BadUtf8",
                         [](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->finish(agent::rpcError(agent::RpcCode::kInvalidArgument, "unknown user \"\xff\xfe\""));
                         });
    router_.unary("/test.Test/Throw", [](const Json& req, const agent::CallContext&) -> agent::UnaryResult {
      return Json{{"n", req.at("missing").get<int>()}};  // throws: a handler bug
    });
    router_.serverStream("/test.Test/Huge",
                         [](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->send(Json{{"blob", std::string(AgentClient::kMaxEnvelope + 10, 'x')}});
                           s->finish();
                         });
    router_.download(
        [](const std::string& path,
           const agent::CallContext&) -> std::variant<std::unique_ptr<agent::DownloadSource>, agent::RpcError> {
          // Announces 100000 bytes, fails after 1000 (a disk error mid-read).
          struct Failing : agent::DownloadSource {
            size_t sent = 0;
            uint64_t size() const override { return 100000; }
            std::variant<size_t, agent::RpcError> read(char* out, size_t max) override {
              if (sent >= 1000) return agent::rpcError(agent::RpcCode::kInternal, "I/O error");
              size_t n = std::min<size_t>(max, 1000 - sent);
              memset(out, 'd', n);
              sent += n;
              return n;
            }
          };
          if (path != "failing") return agent::rpcError(agent::RpcCode::kNotFound, "no " + path);
          return std::make_unique<Failing>();
        });
    // A hostile guest's answers: nested far past the host's bound of 64 levels (deep enough to
    // show the bound, shallow enough that this test's own agent can still build and dump them).
    router_.unary("/test.Test/Deep", [](const Json&, const agent::CallContext&) -> agent::UnaryResult {
      return Json{{"entries", testsupport::nestedArrays(2000)}};
    });
    router_.serverStream("/test.Test/DeepStream",
                         [](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->send(Json{{"ok", 1}});
                           s->send(Json{{"event", testsupport::nestedArrays(2000)}});
                           s->finish();
                         });
    router_.serverStream("/test.Test/Forever",
                         [this](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->send(Json{{"started", true}});
                           s->setOnClose([this] { closed_streams_++; });
                           held_ = s;  // never finishes
                         });
  }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
  }
  std::unique_ptr<AgentClient> connectClient() {
    auto c = AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + milliseconds(5000));
    fds_[1] = -1;
    EXPECT_TRUE(c.ok()) << c.error().message;
    return c.ok() ? std::move(c.value()) : nullptr;
  }
  int fds_[2] = {-1, -1};
  agent::Router router_;
  std::shared_ptr<agent::ServerStream> held_;
  std::atomic<int> closed_streams_{0};
};

TEST_F(ChannelTest, HandshakeUnaryErrorsAndStreams) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  EXPECT_EQ(client->info().version, "test");
  EXPECT_DOUBLE_EQ(client->info().uptime_s, 1.5);

  auto r = client->call("/test.Test/Echo", Json{{"x", 1}}, {milliseconds(5000), "root"});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["echo"]["x"], 1);
  EXPECT_EQ((*r)["user"], "root");

  auto f = client->call("/test.Test/Fail", Json::object());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(f.error().message, "no such thing");

  auto missing = client->call("/test.Test/Nope", Json::object());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kUnimplemented);

  std::vector<int> got;
  auto s = client->stream(
      "/test.Test/Count", Json{{"n", 100}}, {milliseconds(5000), ""},
      [&](const Json& m) { got.push_back(m["i"].get<int>()); }, nullptr);
  ASSERT_TRUE(s->wait(milliseconds(5000)).ok());
  ASSERT_EQ(got.size(), 100u);
  EXPECT_EQ(got[99], 99);
}

TEST_F(ChannelTest, TruncatedDownloadIsAnErrorNotShortData) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto r = client->download("failing", 1 << 20);
  ASSERT_FALSE(r.ok()) << "got " << r.value().size() << " bytes as if complete";
  auto missing = client->download("other", 1 << 20);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST_F(ChannelTest, StreamHandleOutlivesItsClient) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto s = client->stream("/test.Test/Forever", Json::object(), {milliseconds(0), ""}, nullptr, nullptr);
  client.reset();  // fails the stream
  EXPECT_FALSE(s->wait(milliseconds(5000)).ok());
  s->cancel();  // must be harmless now
  held_.reset();
}

TEST_F(ChannelTest, DisconnectedClientFailsCallsAtOnce) {
  auto client = AgentClient::disconnected("test");
  auto r = client->call("/test.Test/Echo", Json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  auto s = client->stream("/test.Test/Count", Json::object(), {milliseconds(1000), ""}, nullptr, nullptr);
  EXPECT_FALSE(s->wait(milliseconds(1000)).ok());
}

TEST_F(ChannelTest, MalformedHandshakeInfoIsTolerated) {
  std::thread guest(fakeGuest, fds_[0], [](const std::string& nonce) {
    return agentproto::makeOlleh(nonce, R"({"version":1,"kernel":[],"uptime":"x"})") + kEmptySettings;
  });
  auto client = connectClient();
  ASSERT_TRUE(client);
  EXPECT_EQ(client->info().version, "");
  client.reset();
  shutdown(fds_[0], SHUT_RDWR);
  guest.join();
}

TEST_F(ChannelTest, HandlerBugsAndHostileRequestsFailOnlyTheirCall) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto s = client->stream("/test.Test/BadUtf8", Json::object(), {milliseconds(5000), ""}, nullptr, nullptr);
  auto end = s->wait(milliseconds(5000));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ErrorCode::kInvalidArgument);
  auto thrown = client->call("/test.Test/Throw", Json::object());
  ASSERT_FALSE(thrown.ok());
  EXPECT_EQ(thrown.error().code, ErrorCode::kInternal);
  Json deep = Json::array();
  for (int i = 0; i < 200; ++i) {  // well past the agent's nesting limit of 64
    Json outer = Json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  auto nested = client->call("/test.Test/Echo", Json{{"x", deep}});
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(client->call("/test.Test/Echo", Json{{"still", "alive"}}).ok());
}

// The guest answers with JSON nested past the bound: the call fails as the guest's fault
// (kUnavailable, which the API maps to 502) and nothing deep reaches the host's code.
TEST_F(ChannelTest, DeeplyNestedAnswersFailOnlyTheirCall) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto unary = client->call("/test.Test/Deep", Json::object());
  ASSERT_FALSE(unary.ok());
  EXPECT_EQ(unary.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(unary.error().message.find("deeper than 64 levels"), std::string::npos) << unary.error().message;
  std::vector<Json> got;
  auto s = client->stream(
      "/test.Test/DeepStream", Json::object(), {milliseconds(5000), ""}, [&got](const Json& m) { got.push_back(m); },
      nullptr);
  auto end = s->wait(milliseconds(5000));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(end.error().message.find("deeper than 64 levels"), std::string::npos) << end.error().message;
  ASSERT_EQ(got.size(), 1u);  // the message before the deep one arrived; the deep one did not
  EXPECT_EQ(got[0]["ok"], 1);
  EXPECT_TRUE(client->call("/test.Test/Echo", Json{{"still", "alive"}}).ok());
}

TEST_F(ChannelTest, ManyConcurrentCallsShareTheConnection) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 50; ++t) {
    threads.emplace_back([&, t] {
      auto r = client->call("/test.Test/Echo", Json{{"t", t}});
      if (r.ok() && (*r)["echo"]["t"] == t) ok++;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 50);
}

TEST_F(ChannelTest, OversizedMessageFailsOnlyItsCall) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto s = client->stream("/test.Test/Huge", Json::object(), {milliseconds(10000), ""}, nullptr, nullptr);
  auto end = s->wait(milliseconds(10000));
  ASSERT_FALSE(end.ok());
  EXPECT_NE(end.error().message.find("exceeds"), std::string::npos) << end.error().message;
  EXPECT_TRUE(client->call("/test.Test/Echo", Json::object()).ok());  // the connection lives on
}

TEST_F(ChannelTest, CancelAndClientDropCloseAgentStreams) {
  auto* agent = new AgentThread(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  std::atomic<bool> started{false};
  auto s = client->stream(
      "/test.Test/Forever", Json::object(), {milliseconds(0), ""}, [&](const Json&) { started = true; }, nullptr);
  for (int i = 0; i < 200 && !started; ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(started);
  s->cancel();
  auto end = s->wait(milliseconds(5000));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ErrorCode::kCanceled);
  for (int i = 0; i < 200 && closed_streams_ == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(closed_streams_.load(), 1);
  delete agent;
  held_.reset();
}

TEST_F(ChannelTest, CallDeadlineWhenTheAgentNeverAnswers) {
  // A "guest" that completes the handshake, then reads and never writes again.
  std::thread guest(fakeGuest, fds_[0],
                    [](const std::string& nonce) { return agentproto::makeOlleh(nonce, "{}") + kEmptySettings; });
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto start = Clock::now();
  auto r = client->call("/test.Test/Echo", Json::object(), {milliseconds(300), ""});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  client.reset();
  shutdown(fds_[0], SHUT_RDWR);
  guest.join();
}

// A hostile guest: handshake, then the given bytes.
void hostileGuest(int fd, std::string payload) {
  fakeGuest(fd, [&payload](const std::string& nonce) { return agentproto::makeOlleh(nonce, "{}") + payload; });
}

// A hostile guest's bytes fail the client cleanly and fast: either the handshake (its HTTP/2
// is checked there) or the first call, with kUnavailable, never a hang to the deadline.
void expectCleanFailure(int fd) {
  auto start = Clock::now();
  auto c = AgentClient::connect(UniqueFd(fd), Clock::now() + milliseconds(5000));
  if (!c.ok()) {
    EXPECT_EQ(c.error().code, ErrorCode::kUnavailable) << c.error().message;
  } else {
    auto r = c.value()->call("/test.Test/Echo", Json::object(), {milliseconds(5000), ""});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
    for (int i = 0; i < 100 && c.value()->alive(); ++i) std::this_thread::sleep_for(milliseconds(10));
    EXPECT_FALSE(c.value()->alive());
  }
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

TEST_F(ChannelTest, GarbageFromTheGuestFailsTheClientCleanly) {
  std::string garbage(100000, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>((i * 7919) & 0xff);
  std::thread guest(hostileGuest, fds_[0], kEmptySettings + garbage);
  expectCleanFailure(fds_[1]);
  fds_[1] = -1;
  shutdown(fds_[0], SHUT_RDWR);
  guest.join();
}

TEST_F(ChannelTest, OversizedFrameFromTheGuestFailsTheClientCleanly) {
  // A SETTINGS frame header announcing 16 MiB of payload, far above the 16 KiB frame limit.
  std::string frame = {'\xff', '\xff', '\xff', '\x04', '\x00', '\x00', '\x00', '\x00', '\x00'};
  std::thread guest(hostileGuest, fds_[0], frame + std::string(1000, 'A'));
  expectCleanFailure(fds_[1]);
  fds_[1] = -1;
  shutdown(fds_[0], SHUT_RDWR);
  guest.join();
}

TEST_F(ChannelTest, HandshakeFailsWhenTheGuestOnlySendsJunk) {
  std::thread guest([fd = fds_[0]] {
    std::string junk(8 << 20, 'z');
    size_t off = 0;
    while (off < junk.size()) {
      ssize_t n = send(fd, junk.data() + off, junk.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  });
  auto start = Clock::now();
  auto c = AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + milliseconds(10000));
  fds_[1] = -1;
  ASSERT_FALSE(c.ok());
  // Refused for the junk bound (4 MiB), as soon as it is crossed: not for the deadline.
  EXPECT_EQ(c.error().code, ErrorCode::kUnavailable) << c.error().message;
  EXPECT_NE(c.error().message.find("no handshake within " + std::to_string(agentproto::kMaxHandshakeJunk) + " bytes"),
            std::string::npos)
      << c.error().message;
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  shutdown(fds_[0], SHUT_RDWR);
  guest.join();
}

// The create hang: a restored guest is told its host detached and came back, and its agent
// dropped the channel state that had just answered our hello. It then scans for a new hello
// and takes our HTTP/2 preface for junk. Here a stand-in answers the first hello and hands the
// socket to a real agent Channel, which is then in exactly that state. The client must notice
// that no session followed and make the handshake again, not leave every call to time out.
TEST_F(ChannelTest, HandshakeLostAfterTheAnswerIsMadeAgain) {
  std::unique_ptr<AgentThread> agent;
  std::thread guest([&] {
    char buf[64 << 10];
    std::string seen;
    size_t at = std::string::npos;
    while (at == std::string::npos || seen.find('\n', at) == std::string::npos) {
      ssize_t n = read(fds_[0], buf, sizeof buf);
      if (n <= 0) return;
      seen.append(buf, static_cast<size_t>(n));
      at = seen.find(agentproto::kHelloPrefix);
    }
    size_t start = at + agentproto::kHelloPrefix.size();
    std::string answer = agentproto::makeOlleh(seen.substr(start, seen.find('\n', start) - start), "{}");
    (void)!send(fds_[0], answer.data(), answer.size(), MSG_NOSIGNAL);
    agent = std::make_unique<AgentThread>(fds_[0], router_);
  });
  auto start = Clock::now();
  auto client = connectClient();
  guest.join();
  ASSERT_TRUE(client);
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  auto r = client->call("/test.Test/Echo", Json{{"after", "rehandshake"}}, {milliseconds(3000), ""});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)["echo"]["after"], "rehandshake");
  client.reset();
  agent.reset();
}

// Between the client and the agent, a guest that misses a notification: once armed, the
// host's bytes are held back until the host writes again after 100 ms of quiet, as a virtio
// port's request waits for the next interrupt when the one for it was lost (docs/agent.md).
class ForgetfulRelay {
 public:
  ForgetfulRelay(int host_fd, int agent_fd) : host_fd_(host_fd), agent_fd_(agent_fd) {
    thread_ = std::thread([this] { run(); });
  }
  ~ForgetfulRelay() {
    stop_ = true;
    thread_.join();
  }
  void arm() { armed_ = true; }
  int released() const { return released_; }

 private:
  void run() {
    char buf[64 << 10];
    std::string held;
    Clock::time_point last_held{};
    while (!stop_) {
      pollfd fds[2] = {{host_fd_, POLLIN, 0}, {agent_fd_, POLLIN, 0}};
      if (poll(fds, 2, 20) <= 0) continue;
      if (fds[1].revents & (POLLIN | POLLHUP)) {
        ssize_t n = read(agent_fd_, buf, sizeof buf);
        if (n <= 0) return;
        if (!sendAll(host_fd_, std::string_view(buf, static_cast<size_t>(n)))) return;
      }
      if (fds[0].revents & (POLLIN | POLLHUP)) {
        ssize_t n = read(host_fd_, buf, sizeof buf);
        if (n <= 0) return;
        std::string_view bytes(buf, static_cast<size_t>(n));
        if (!armed_) {
          if (!sendAll(agent_fd_, bytes)) return;
          continue;
        }
        const auto now = Clock::now();
        if (!held.empty() && now - last_held > milliseconds(100)) {
          armed_ = false;
          released_++;
          held.append(bytes);
          if (!sendAll(agent_fd_, held)) return;
          held.clear();
          continue;
        }
        held.append(bytes);
        last_held = now;
      }
    }
  }
  static bool sendAll(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  int host_fd_, agent_fd_;
  std::atomic<bool> stop_{false}, armed_{false};
  std::atomic<int> released_{0};
  std::thread thread_;
};

// A request whose notification the guest missed is answered after the client's next write,
// which the client makes itself (a PING after a second without an answer), not at the call's
// deadline. Before that, such a call timed out: 30 s in spaced, for every kind of call.
TEST_F(ChannelTest, ARequestTheGuestMissedIsAnsweredAfterTheClientsNudge) {
  int agent_side[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, agent_side), 0);
  struct Closer {
    int* fds;
    ~Closer() {
      close(fds[0]);
      close(fds[1]);
    }
  } closer{agent_side};  // after the threads below are gone
  AgentThread agent(agent_side[0], router_);
  ForgetfulRelay relay(fds_[0], agent_side[1]);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto first = client->call("/test.Test/Echo", Json{{"n", 1}}, {milliseconds(5000), ""});
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(client->nudges(), 0u) << "a prompt answer needs no nudge";

  relay.arm();
  const auto start = Clock::now();
  auto missed = client->call("/test.Test/Echo", Json{{"n", 2}}, {milliseconds(10000), ""});
  const auto took = Clock::now() - start;
  ASSERT_TRUE(missed.ok()) << missed.error().message;
  EXPECT_EQ((*missed)["echo"]["n"], 2);
  EXPECT_EQ(relay.released(), 1);
  EXPECT_GE(client->nudges(), 1u);
  EXPECT_GE(took, milliseconds(900));
  EXPECT_LT(took, milliseconds(4000));

  client.reset();
  shutdown(fds_[0], SHUT_RDWR);
  shutdown(agent_side[1], SHUT_RDWR);
}

}  // namespace
}  // namespace space
