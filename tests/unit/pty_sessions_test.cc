// Terminal sessions (api/pty_session.h) between a scripted guest agent (the real agent transport
// over a socketpair) and a raw WebSocket client on the session's socket, as the HTTP server's
// relay would connect it: keystrokes in order, a guest that sits on them, a client that types
// faster than the guest takes or reads nothing, a refused relay, a revoked key, the end of all
// sessions. The daemon's tests run the same sessions against a real guest.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../support/agent_thread.h"
#include "agentproto/base64.h"
#include "api/pty_session.h"
#include "http/message.h"

namespace space::api {
namespace {

using agent::Json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The client's side of the session socket: reads the 101 and the server's (unmasked) frames,
// writes masked frames.
class WsClient {
 public:
  explicit WsClient(int fd) : fd_(fd) {}

  // The upgrade's answer, up to its blank line; "" when none came within `wait`.
  std::string readHead(milliseconds wait = seconds(10)) {
    while (buffer_.find("\r\n\r\n") == std::string::npos) {
      if (!fill(wait)) return "";
    }
    const size_t end = buffer_.find("\r\n\r\n") + 4;
    std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end);
    return head;
  }

  struct Frame {
    int opcode = -1;  // -1: none (the socket closed, or nothing came in time)
    std::string payload;
  };
  Frame readFrame(milliseconds wait = seconds(10)) {
    while (true) {
      if (buffer_.size() >= 2) {
        const auto* b = reinterpret_cast<const unsigned char*>(buffer_.data());
        size_t length = b[1] & 0x7f;
        size_t at = 2;
        if (length == 126 && buffer_.size() >= 4) {
          length = (size_t{b[2]} << 8) | b[3];
          at = 4;
        } else if (length == 127 && buffer_.size() >= 10) {
          length = 0;
          for (int i = 2; i < 10; ++i) length = (length << 8) | b[i];
          at = 10;
        }
        if ((b[1] & 0x7f) < 126 || at > 2) {
          if (buffer_.size() >= at + length) {
            Frame frame{b[0] & 0x0f, buffer_.substr(at, length)};
            buffer_.erase(0, at + length);
            return frame;
          }
        }
      }
      if (!fill(wait)) return {};
    }
  }
  // The next text frame (skipping output and pings), or an empty frame.
  Frame readText(milliseconds wait = seconds(10)) {
    for (auto until = Clock::now() + wait; Clock::now() < until;) {
      Frame frame = readFrame(wait);
      if (frame.opcode == -1 || frame.opcode == 0x1 || frame.opcode == 0x8) return frame;
    }
    return {};
  }

  static std::string frame(int opcode, const std::string& payload) {
    std::string f;
    f += static_cast<char>(0x80 | opcode);
    if (payload.size() < 126) {
      f += static_cast<char>(0x80 | payload.size());
    } else {
      f += static_cast<char>(0x80 | 126);
      f += static_cast<char>(payload.size() >> 8);
      f += static_cast<char>(payload.size() & 0xff);
    }
    f += std::string(4, '\0');  // a zero mask: the payload goes as it is
    return f + payload;
  }
  bool send(int opcode, const std::string& payload) {
    const std::string f = frame(opcode, payload);
    return ::send(fd_, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size());
  }

 private:
  bool fill(milliseconds wait) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return false;
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_;
  std::string buffer_;
};

class PtySessionsTest : public testing::Test {
 protected:
  void SetUp() override {
    router_.serverStream("/process.Process/Start",
                         [this](const Json& req, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           const int pid = ++next_pid_;
                           s->send(Json{{"event", {{"start", {{"pid", pid}}}}}});
                           const std::string cmd = req["process"].value("cmd", "");
                           if (cmd == "flood" || cmd == "empty") {
                             auto flood = std::make_shared<Flood>();
                             flood->s = s;
                             if (cmd == "empty") flood->event = Json{{"event", {{"data", {{"pty", ""}}}}}};
                             flood->pump();
                           }
                           std::lock_guard lock(m_);
                           streams_[pid] = s;  // touched on its own guest's agent thread only
                         });
    router_.unary("/process.Process/SendInput", [this](const Json& req, const agent::CallContext&) {
      if (input_delay_.count() > 0) std::this_thread::sleep_for(input_delay_);
      {
        std::unique_lock lock(m_);
        // A guest that takes nothing until the test lets it (bounded, so a failing test ends).
        held_cv_.wait_for(lock, seconds(20), [this] { return !hold_input_; });
        auto data = agentproto::base64Decode(req["input"].value("pty", ""));
        typed_ += data.value_or("");
        ++input_calls_;
        const int pid = req["process"].value("pid", 0);
        if (typed_.find("bye\r") != std::string::npos && streams_.count(pid)) {
          streams_[pid]->send(
              Json{{"event", {{"end", {{"exitCode", 3}, {"exited", true}, {"status", "exit status 3"}}}}}});
          streams_[pid]->finish();
        }
      }
      changed_.notify_all();
      return agent::UnaryResult(Json::object());
    });
    router_.unary("/process.Process/Update", [this](const Json& req, const agent::CallContext&) {
      {
        std::lock_guard lock(m_);
        const Json& size = req["pty"]["size"];
        typed_ += "[" + std::to_string(size.value("cols", 0)) + "x" + std::to_string(size.value("rows", 0)) + "]";
      }
      changed_.notify_all();
      return agent::UnaryResult(Json::object());
    });
    router_.unary("/process.Process/SendSignal", [this](const Json& req, const agent::CallContext&) {
      {
        std::lock_guard lock(m_);
        killed_.push_back(req["process"].value("pid", 0));
      }
      changed_.notify_all();
      return agent::UnaryResult(Json::object());
    });
    agent_ = connectGuest();
    ASSERT_TRUE(agent_);
  }

  // One more scripted guest (another sandbox's agent) on its own channel, with the same router.
  std::shared_ptr<agentproto::AgentClient> connectGuest() {
    int fds[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
    guests_.push_back(std::make_unique<Guest>());
    guests_.back()->fd = fds[0];
    guests_.back()->thread = std::make_unique<testsupport::AgentThread>(fds[0], router_);
    auto client = agentproto::AgentClient::connect(UniqueFd(fds[1]), Clock::now() + seconds(5));
    EXPECT_TRUE(client.ok()) << client.error().message;
    if (!client.ok()) return nullptr;
    return std::shared_ptr<agentproto::AgentClient>(std::move(client.value()));
  }

  void TearDown() override {
    {
      std::lock_guard lock(m_);
      hold_input_ = false;
    }
    held_cv_.notify_all();
    sessions_.reset();
    agent_.reset();
    other_agent_.reset();
    for (auto& guest : guests_) {
      guest->thread.reset();
      close(guest->fd);
    }
  }

  void startSessions(PtySessionLimits limits) { sessions_ = std::make_unique<PtySessions>(limits); }

  // What a handler does: starts the process, waits for its start, opens the session.
  http::RelayPlan open(const std::string& cmd = "shell", std::function<bool()> authorized = {},
                       milliseconds control_timeout = seconds(5), std::shared_ptr<agentproto::AgentClient> agent = {}) {
    guest::GuestOps ops(agent ? agent : agent_);
    ops.setControlTimeout(control_timeout);
    guest::ProcessSpec spec;
    spec.argv = {cmd};
    spec.pty = guest::PtySize{80, 24};
    auto process = ops.start(spec, guest::StreamLimits{1 << 20});
    EXPECT_TRUE(process.ok());
    if (!process.ok()) return {};
    int pid = 0;
    for (auto until = Clock::now() + seconds(5); pid == 0 && Clock::now() < until;) {
      for (auto& event : process.value()->next(milliseconds(200)).events) {
        if (event.kind == guest::ProcessEvent::Kind::kStart) pid = event.pid;
      }
    }
    EXPECT_GT(pid, 0);
    PtyProcess session{ops, std::move(process).value(), pid, {}, std::make_shared<int>(0), std::move(authorized), {}};
    session.ended = [this](const PtySessionEnd& end) {
      {
        std::lock_guard lock(m_);
        ended_.push_back(end.outcome);
      }
      changed_.notify_all();
    };
    auto plan = sessions_->open("/v1/sandboxes/sb_x/pty",
                                {{"Host", "localhost"},
                                 {"Upgrade", "websocket"},
                                 {"Connection", "Upgrade"},
                                 {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="},
                                 {"Sec-WebSocket-Version", "13"}},
                                std::move(session));
    EXPECT_TRUE(plan.ok());
    return plan.ok() ? std::move(plan).value() : http::RelayPlan{};
  }

  template <class Pred>
  bool waitFor(Pred pred, milliseconds wait = seconds(10)) {
    std::unique_lock lock(m_);
    return changed_.wait_for(lock, wait, pred);
  }

  struct Flood : std::enable_shared_from_this<Flood> {
    std::shared_ptr<agent::ServerStream> s;
    Json event = Json{{"event", {{"data", {{"pty", agentproto::base64Encode(std::string(16384, 'y'))}}}}}};
    void pump() {
      while (s->open() && s->queuedBytes() <= agent::ServerStream::kHighWater) s->send(event);
      if (s->open()) s->setOnDrain([self = shared_from_this()] { self->pump(); });
    }
  };

  struct Guest {
    int fd = -1;  // the agent's end, closed after its thread
    std::unique_ptr<testsupport::AgentThread> thread;
  };
  agent::Router router_;  // shared by the guests: its handlers lock m_
  std::vector<std::unique_ptr<Guest>> guests_;
  std::shared_ptr<agentproto::AgentClient> agent_;
  std::shared_ptr<agentproto::AgentClient> other_agent_;
  std::unique_ptr<PtySessions> sessions_;

  std::mutex m_;
  std::condition_variable changed_;
  std::condition_variable held_cv_;
  std::map<int, std::shared_ptr<agent::ServerStream>> streams_;
  std::atomic<int> next_pid_{100};
  milliseconds input_delay_{0};
  bool hold_input_ = false;
  std::string typed_;
  int input_calls_ = 0;
  std::vector<int> killed_;
  std::vector<std::string> ended_;
};

TEST_F(PtySessionsTest, KeystrokesAndResizesReachTheGuestInOrderAndTheProcessesEndEndsTheSession) {
  input_delay_ = milliseconds(20);  // the guest takes each call a little late: the next ones wait
  startSessions({});
  http::RelayPlan plan = open();
  WsClient client(plan.peer);
  ASSERT_NE(client.readHead().find("HTTP/1.1 101"), std::string::npos);
  auto started = client.readText();
  EXPECT_NE(started.payload.find("\"started\""), std::string::npos) << started.payload;
  std::string expected;
  for (int i = 0; i < 60; ++i) {
    const std::string keys = "k" + std::to_string(i) + ";";
    ASSERT_TRUE(client.send(0x2, keys));
    expected += keys;
    if (i % 20 == 19) {
      ASSERT_TRUE(client.send(0x1, R"({"type":"resize","cols":)" + std::to_string(100 + i) + R"(,"rows":30})"));
      expected += "[" + std::to_string(100 + i) + "x30]";
    }
  }
  EXPECT_TRUE(waitFor([&] { return typed_ == expected; })) << typed_;
  {
    std::lock_guard lock(m_);
    EXPECT_LT(input_calls_, 60) << "keystrokes typed while a call was out did not go together";
  }
  ASSERT_TRUE(client.send(0x2, "bye\r"));
  auto exit = client.readText();
  EXPECT_NE(exit.payload.find("\"exit_code\":3"), std::string::npos) << exit.payload;
  EXPECT_EQ(client.readText().opcode, 0x8) << "a close frame after the exit message";
  // The client's answer, and its end of the connection, complete the close at once.
  ASSERT_TRUE(client.send(0x8, ""));
  ::shutdown(plan.peer, SHUT_WR);
  EXPECT_TRUE(waitFor([&] { return ended_ == std::vector<std::string>{"exited"}; }));
  EXPECT_TRUE(killed_.empty()) << "a process that ended was killed";
  EXPECT_EQ(sessions_->openSessions(), 0u);
}

TEST_F(PtySessionsTest, AGuestThatSitsOnAKeystrokeEndsTheSessionAndItsProcess) {
  input_delay_ = milliseconds(1500);
  startSessions({});
  http::RelayPlan plan = open("shell", {}, milliseconds(300));
  WsClient client(plan.peer);
  ASSERT_NE(client.readHead().find("HTTP/1.1 101"), std::string::npos);
  ASSERT_NE(client.readText().payload.find("\"started\""), std::string::npos);
  ASSERT_TRUE(client.send(0x2, "x"));
  auto error = client.readText();
  EXPECT_NE(error.payload.find("deadline_exceeded"), std::string::npos) << error.payload;
  EXPECT_EQ(client.readText().opcode, 0x8);
  ASSERT_TRUE(client.send(0x8, ""));
  ::shutdown(plan.peer, SHUT_WR);
  EXPECT_TRUE(waitFor([&] { return ended_ == std::vector<std::string>{"error"}; }));
  EXPECT_TRUE(waitFor([&] { return killed_.size() == 1; }, seconds(10))) << "the process was not killed";
}

TEST_F(PtySessionsTest, AClientTypingFasterThanTheGuestTakesIsReadNoFurtherThanTheBound) {
  {
    std::lock_guard lock(m_);
    hold_input_ = true;
  }
  PtySessionLimits limits;
  limits.max_queued_input = 128 * 1024;
  startSessions(limits);
  http::RelayPlan plan = open();
  WsClient client(plan.peer);
  ASSERT_NE(client.readHead().find("HTTP/1.1 101"), std::string::npos);
  // 4 MiB of keystrokes in 32 KiB frames, written while the socket takes them.
  std::string all;
  for (int i = 0; i < 128; ++i) all += WsClient::frame(0x2, std::string(32 * 1024, static_cast<char>('a' + i % 26)));
  size_t written = 0;
  for (auto quiet_since = Clock::now(); Clock::now() - quiet_since < milliseconds(1000) && written < all.size();) {
    ssize_t n = ::send(plan.peer, all.data() + written, all.size() - written, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      written += static_cast<size_t>(n);
      quiet_since = Clock::now();
    } else {
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  EXPECT_LT(written, all.size() / 2) << "the session read on while the guest took nothing";
  {
    std::lock_guard lock(m_);
    hold_input_ = false;
  }
  held_cv_.notify_all();
  // Once the guest takes them, the rest goes in, in order.
  const int flags = ::fcntl(plan.peer, F_GETFL);
  ASSERT_EQ(::fcntl(plan.peer, F_SETFL, flags & ~O_NONBLOCK), 0);
  ASSERT_EQ(::send(plan.peer, all.data() + written, all.size() - written, MSG_NOSIGNAL),
            static_cast<ssize_t>(all.size() - written))
      << std::strerror(errno) << "; ended: " << (waitFor([&] { return !ended_.empty(); }) ? ended_[0] : "");
  EXPECT_TRUE(waitFor([&] { return typed_.size() == 128u * 32 * 1024; }, seconds(30))) << typed_.size();
  std::lock_guard lock(m_);
  for (size_t i = 0; i < 128 && i * 32 * 1024 < typed_.size(); ++i) {
    ASSERT_EQ(typed_[i * 32 * 1024], static_cast<char>('a' + i % 26)) << "frame " << i << " out of order";
  }
}

TEST_F(PtySessionsTest, AClientThatReadsNothingIsTooSlowAndItsProcessIsKilled) {
  PtySessionLimits limits;
  limits.max_queued_output = 256 * 1024;
  limits.stalled_client_timeout = milliseconds(800);
  startSessions(limits);
  http::RelayPlan plan = open("flood");
  int small = 4096;
  ::setsockopt(plan.peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  EXPECT_TRUE(waitFor([&] { return ended_ == std::vector<std::string>{"client_too_slow"}; }, seconds(20)));
  EXPECT_TRUE(waitFor([&] { return killed_.size() == 1; }));
}

// A guest that floods its terminal with empty pieces of output: they cost the client nothing
// (no frames), and the loop serves another sandbox's session meanwhile. The other session is on
// a guest of its own: a second process of the flooding guest would wait behind the flood on their
// shared channel, which measures that channel's throughput and not the loop. (The loop's cap on
// batches per turn is not what this proves: here the loop empties the stream faster than the
// agent client decodes the flood, so a drain ends for want of events before the cap.)
TEST_F(PtySessionsTest, AGuestFloodingEmptyOutputSendsNoFramesWhileAnotherSandboxsSessionIsServed) {
  startSessions({});
  other_agent_ = connectGuest();
  ASSERT_TRUE(other_agent_);
  http::RelayPlan flooded = open("empty");
  WsClient flooded_client(flooded.peer);
  ASSERT_NE(flooded_client.readHead().find("HTTP/1.1 101"), std::string::npos);
  ASSERT_NE(flooded_client.readText().payload.find("\"started\""), std::string::npos);
  http::RelayPlan other = open("shell", {}, seconds(5), other_agent_);
  WsClient client(other.peer);
  const auto opened = Clock::now();
  ASSERT_NE(client.readHead().find("HTTP/1.1 101"), std::string::npos);
  ASSERT_NE(client.readText().payload.find("\"started\""), std::string::npos);
  ASSERT_TRUE(client.send(0x2, "bye\r"));
  auto exit = client.readText();
  EXPECT_NE(exit.payload.find("\"exit_code\":3"), std::string::npos) << exit.payload;
  EXPECT_LT(Clock::now() - opened, seconds(3)) << "the other sandbox's session waited on the flood";
  EXPECT_EQ(client.readText().opcode, 0x8);
  ASSERT_TRUE(client.send(0x8, ""));
  ::shutdown(other.peer, SHUT_WR);
  size_t frames = 0;
  for (auto until = Clock::now() + seconds(2); Clock::now() < until;) {
    if (flooded_client.readFrame(milliseconds(200)).opcode == 0x2) ++frames;
  }
  EXPECT_EQ(frames, 0u) << "empty output became frames";
  EXPECT_EQ(sessions_->openSessions(), 1u) << "the flooded session ended";
}

TEST_F(PtySessionsTest, ADroppedPlanARevokedKeyAndTheEndOfAllSessionsEachEndTheirs) {
  PtySessionLimits limits;
  limits.reauthorize_every = milliseconds(200);
  startSessions(limits);
  // The relay was refused: its socket closed before the handshake went out.
  { http::RelayPlan dropped = open(); }
  EXPECT_TRUE(waitFor([&] { return ended_.size() == 1 && killed_.size() == 1; })) << ended_.size();
  EXPECT_EQ(ended_.at(0), "client_closed");
  // A key that stops being valid ends its session with a reason.
  std::atomic<bool> valid{true};
  http::RelayPlan revoked = open("shell", [&valid] { return valid.load(); });
  WsClient client(revoked.peer);
  ASSERT_NE(client.readHead().find("HTTP/1.1 101"), std::string::npos);
  ASSERT_NE(client.readText().payload.find("\"started\""), std::string::npos);
  http::RelayPlan others[3] = {open(), open(), open()};
  EXPECT_EQ(sessions_->openSessions(), 4u);
  valid = false;
  auto error = client.readText();
  EXPECT_NE(error.payload.find("unauthenticated"), std::string::npos) << error.payload;
  EXPECT_EQ(client.readText().opcode, 0x8);
  ASSERT_TRUE(client.send(0x8, ""));
  ::shutdown(revoked.peer, SHUT_WR);
  EXPECT_TRUE(waitFor([&] { return ended_.size() == 2 && killed_.size() == 2; }));
  EXPECT_EQ(ended_.at(1), "unauthenticated");
  // The sessions object goes: every session ends, and every process is killed.
  sessions_.reset();
  EXPECT_TRUE(waitFor([&] { return ended_.size() == 5 && killed_.size() == 5; })) << ended_.size();
  for (size_t i = 2; i < ended_.size(); ++i) EXPECT_EQ(ended_[i], "aborted");
  for (auto& other : others) {
    bool closed = false;
    char buf[4096];
    for (auto until = Clock::now() + seconds(5); !closed && Clock::now() < until;) {
      pollfd p{other.peer, POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) closed = ::recv(other.peer, buf, sizeof buf, MSG_DONTWAIT) == 0;
    }
    EXPECT_TRUE(closed) << "an aborted session's socket is still open";
  }
}

}  // namespace
}  // namespace space::api
