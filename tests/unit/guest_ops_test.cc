// GuestOps against the real agent transport: a host AgentClient on one end of a socketpair, the
// guest agent's Channel and HTTP/2 server on the other, with a scripted process and filesystem
// service behind them. The tests check the requests the commands send (paths, envd shapes,
// users, the stdin sequence), how answers become typed values, and that hostile answers
// (malformed events, non-canonical or oversized base64, a consumer that falls behind) end in
// errors or a bounded stream, never in unbounded memory or a crash.
#include "guest/guest_ops.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../support/agent_thread.h"
#include "agentproto/base64.h"

namespace space::guest {
namespace {

using agent::Json;
using agentproto::base64Encode;
using std::chrono::milliseconds;
using std::chrono::seconds;

Json startEvent(int pid) { return Json{{"event", {{"start", {{"pid", pid}}}}}}; }
Json dataEvent(const char* kind, const std::string& bytes) {
  return Json{{"event", {{"data", {{kind, base64Encode(bytes)}}}}}};
}
Json endEvent(int code, const std::string& status) {
  return Json{{"event", {{"end", {{"exitCode", code}, {"exited", true}, {"status", status}}}}}};
}

// One call as the fake agent saw it.
struct Seen {
  std::string method;
  Json request;
  std::string user;
  std::optional<milliseconds> timeout;
};

class GuestOpsTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);

    // Start: the process's argv says what its stream does.
    //   cmd "script": each arg is a message (JSON text) to send, "!<code>" finishes with that error;
    //   cmd "echo": start, then on CloseStdin the stdin received as stdout, and the end;
    //   cmd "flood": start, then 4 KiB stdout events as fast as the host takes them.
    router_.serverStream("/process.Process/Start", [this](const Json& req, const agent::CallContext& ctx,
                                                          std::shared_ptr<agent::ServerStream> s) {
      record("/process.Process/Start", req, ctx);
      const Json& p = req["process"];
      std::string cmd = p.value("cmd", "");
      if (cmd == "script") {
        play(*s, p.value("args", Json::array()));
      } else if (cmd == "echo") {
        s->send(startEvent(7));
        echo_ = s;
      } else if (cmd == "flood") {
        s->setOnClose([this] { flood_closed_ = true; });
        s->send(startEvent(9));
        auto flood = std::make_shared<Flood>();
        flood->s = s;
        flood->sent = &flood_sent_;
        flood->pump();
      } else {
        s->send(startEvent(5));
        s->send(endEvent(0, "exit status 0"));
        s->finish();
      }
    });
    router_.serverStream("/process.Process/Connect", [this](const Json& req, const agent::CallContext& ctx,
                                                            std::shared_ptr<agent::ServerStream> s) {
      record("/process.Process/Connect", req, ctx);
      play(*s, connect_script_);
    });
    router_.unary("/process.Process/SendInput", [this](const Json& req, const agent::CallContext& ctx) {
      record("/process.Process/SendInput", req, ctx);
      if (fail_input_) return agent::UnaryResult(agent::rpcError(agent::RpcCode::kFailedPrecondition, "stdin closed"));
      echoed_ += *agentproto::base64Decode(req["input"]["stdin"].get<std::string>());
      return agent::UnaryResult(Json::object());
    });
    router_.unary("/process.Process/CloseStdin", [this](const Json& req, const agent::CallContext& ctx) {
      record("/process.Process/CloseStdin", req, ctx);
      if (echo_) {
        echo_->send(dataEvent("stdout", echoed_));
        echo_->send(endEvent(0, "exit status 0"));
        echo_->finish();
        echo_.reset();
      }
      return agent::UnaryResult(Json::object());
    });
    router_.unary("/process.Process/SendSignal", [this](const Json& req, const agent::CallContext& ctx) {
      record("/process.Process/SendSignal", req, ctx);
      if (echo_) {  // the echo process dies of it
        echo_->send(Json{{"event", {{"end", {{"exitCode", -1}, {"exited", false}, {"status", "signal: killed"}}}}}});
        echo_->finish();
        echo_.reset();
      }
      return agent::UnaryResult(Json::object());
    });
    for (const char* method :
         {"/process.Process/List", "/filesystem.Filesystem/Remove", "/filesystem.Filesystem/ListDir",
          "/filesystem.Filesystem/MakeDir", "/filesystem.Filesystem/Move"}) {
      std::string m = method;
      router_.unary(m, [this, m](const Json& req, const agent::CallContext& ctx) {
        record(m, req, ctx);
        std::lock_guard lock(m_);
        return agent::UnaryResult(answer_);
      });
    }
    struct Sink : agent::UploadSink {
      GuestOpsTest* t;
      explicit Sink(GuestOpsTest* test) : t(test) {}
      std::optional<agent::RpcError> write(std::string_view chunk) override {
        std::lock_guard lock(t->m_);
        t->uploaded_.append(chunk);
        return std::nullopt;
      }
      agent::UnaryResult finish() override {
        std::lock_guard lock(t->m_);
        return t->answer_;
      }
      void abort() override {}
    };
    router_.upload(
        [this](const std::string& path,
               const agent::CallContext& ctx) -> std::variant<std::unique_ptr<agent::UploadSink>, agent::RpcError> {
          record("upload", Json{{"path", path}}, ctx);
          return std::make_unique<Sink>(this);
        });
    struct Source : agent::DownloadSource {
      std::string data;
      size_t off = 0;
      uint64_t size() const override { return data.size(); }
      std::variant<size_t, agent::RpcError> read(char* out, size_t max) override {
        size_t n = std::min(max, data.size() - off);
        memcpy(out, data.data() + off, n);
        off += n;
        return n;
      }
    };
    router_.download(
        [this](const std::string& path,
               const agent::CallContext& ctx) -> std::variant<std::unique_ptr<agent::DownloadSource>, agent::RpcError> {
          record("download", Json{{"path", path}}, ctx);
          auto source = std::make_unique<Source>();
          source->data = "contents of " + path;
          return source;
        });

    agent_thread_ = std::make_unique<testsupport::AgentThread>(fds_[0], router_);
    auto client = agentproto::AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + seconds(5));
    fds_[1] = -1;
    ASSERT_TRUE(client.ok()) << client.error().message;
    ops_ = std::make_unique<GuestOps>(std::shared_ptr<agentproto::AgentClient>(std::move(client.value())));
  }
  void TearDown() override {
    ops_.reset();
    agent_thread_.reset();
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }

  // Sends each scripted message (JSON text); "!message" ends the stream with a not_found error
  // instead, "@N" sends N bytes of stdout.
  static void play(agent::ServerStream& s, const Json& script) {
    for (const auto& item : script) {
      std::string text = item.is_string() ? item.get<std::string>() : item.dump();
      if (!text.empty() && text[0] == '!') {
        s.finish(agent::rpcError(agent::RpcCode::kNotFound, text.substr(1)));
        return;
      }
      if (!text.empty() && text[0] == '@') {
        s.send(dataEvent("stdout", std::string(std::stoul(text.substr(1)), 'b')));
        continue;
      }
      s.send(Json::parse(text));
    }
    s.finish();
  }
  void record(const std::string& method, const Json& req, const agent::CallContext& ctx) {
    std::lock_guard lock(m_);
    seen_.push_back(Seen{method, req, ctx.user, ctx.timeout});
  }
  std::vector<Seen> seen() {
    std::lock_guard lock(m_);
    return seen_;
  }
  std::vector<std::string> methods() {
    std::vector<std::string> out;
    for (const auto& s : seen()) out.push_back(s.method);
    return out;
  }
  void answer(Json a) {
    std::lock_guard lock(m_);
    answer_ = std::move(a);
  }

  // Reads a stream to its end (bounded); the batches' events in order, and the last batch.
  struct Drained {
    std::vector<ProcessEvent> events;
    ProcessStream::Batch last;
  };
  static Drained drain(ProcessStream& stream) {
    Drained out;
    for (int i = 0; i < 100; ++i) {
      auto batch = stream.next(milliseconds(200));
      for (auto& e : batch.events) out.events.push_back(std::move(e));
      batch.events.clear();
      out.last = std::move(batch);
      if (out.last.state != ProcessStream::State::kOpen) break;
    }
    return out;
  }
  static ProcessSpec script(std::vector<Json> messages) {
    ProcessSpec spec;
    spec.argv = {"script"};
    for (auto& m : messages) spec.argv.push_back(m.is_string() ? m.get<std::string>() : m.dump());
    return spec;
  }

  struct Flood : std::enable_shared_from_this<Flood> {
    std::shared_ptr<agent::ServerStream> s;
    std::atomic<size_t>* sent = nullptr;
    Json event = dataEvent("stdout", std::string(4096, 'o'));
    void pump() {
      while (s->open() && s->queuedBytes() <= agent::ServerStream::kHighWater) {
        s->send(event);
        *sent += 4096;
      }
      if (s->open()) s->setOnDrain([self = shared_from_this()] { self->pump(); });
    }
  };

  int fds_[2] = {-1, -1};
  agent::Router router_;
  std::unique_ptr<testsupport::AgentThread> agent_thread_;
  std::unique_ptr<GuestOps> ops_;

  std::mutex m_;
  std::vector<Seen> seen_;
  Json answer_ = Json::object();
  std::string uploaded_;
  // Touched only on the agent's thread.
  std::shared_ptr<agent::ServerStream> echo_;
  std::string echoed_;
  Json connect_script_ = Json::array();
  std::atomic<bool> fail_input_{false};
  std::atomic<bool> flood_closed_{false};
  std::atomic<size_t> flood_sent_{0};
};

TEST_F(GuestOpsTest, StartSendsTheEnvdRequestAndPassesOutputThroughAsSent) {
  ProcessSpec spec;
  spec.command = "echo hi";
  spec.env = {{"A", "1"}};
  spec.cwd = "/tmp";
  spec.user = "root";
  spec.timeout = seconds(7);
  auto shell = ops_->start(spec);
  ASSERT_TRUE(shell.ok()) << shell.error().message;
  auto done = drain(*shell.value());
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  auto calls = seen();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].request["process"]["cmd"], "/bin/bash");
  EXPECT_EQ(calls[0].request["process"]["args"], Json::array({"-l", "-c", "echo hi"}));
  EXPECT_EQ(calls[0].request["process"]["envs"], Json({{"A", "1"}}));
  EXPECT_EQ(calls[0].request["process"]["cwd"], "/tmp");
  EXPECT_EQ(calls[0].request["stdin"], false);
  EXPECT_EQ(calls[0].user, "root");
  EXPECT_EQ(calls[0].timeout, milliseconds(7000));

  // Every kind of event, in order; PTY output is stdout; keepalives and unknown kinds vanish.
  auto stream = ops_->start(script({startEvent(11), dataEvent("stdout", "out\n"), Json{{"event", {{"keepalive", {}}}}},
                                    dataEvent("stderr", std::string("\0\xff", 2)), dataEvent("pty", "tty"),
                                    Json{{"event", {{"future", 1}}}}, endEvent(3, "exit status 3")}));
  ASSERT_TRUE(stream.ok());
  done = drain(*stream.value());
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  EXPECT_FALSE(done.last.error);
  ASSERT_EQ(done.events.size(), 5u);
  using Kind = ProcessEvent::Kind;
  EXPECT_EQ(done.events[0].kind, Kind::kStart);
  EXPECT_EQ(done.events[0].pid, 11);
  EXPECT_EQ(done.events[1].kind, Kind::kStdout);
  EXPECT_EQ(done.events[1].data_base64, base64Encode("out\n"));
  EXPECT_EQ(done.events[2].kind, Kind::kStderr);
  EXPECT_EQ(done.events[2].data_base64, base64Encode(std::string("\0\xff", 2)));
  EXPECT_EQ(done.events[3].kind, Kind::kStdout);
  EXPECT_EQ(done.events[3].data_base64, base64Encode("tty"));
  EXPECT_EQ(done.events[4].kind, Kind::kEnd);
  EXPECT_EQ(done.events[4].end.exit_code, 3);
  EXPECT_EQ(done.events[4].end.status, "exit status 3");
  // After the end, the state stays.
  EXPECT_EQ(stream.value()->next(milliseconds(0)).state, ProcessStream::State::kEnded);
}

TEST_F(GuestOpsTest, StdinIsSentThenClosedOnceTheProcessStarted) {
  ProcessSpec spec;
  spec.argv = {"echo"};
  spec.stdin_data = "some input";
  auto stream = ops_->start(spec);
  ASSERT_TRUE(stream.ok());
  auto done = drain(*stream.value());
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  EXPECT_FALSE(done.last.error);
  ASSERT_EQ(done.events.size(), 3u);
  EXPECT_EQ(done.events[1].data_base64, base64Encode("some input"));
  EXPECT_EQ(methods(), (std::vector<std::string>{"/process.Process/Start", "/process.Process/SendInput",
                                                 "/process.Process/CloseStdin"}));
  auto calls = seen();
  EXPECT_EQ(calls[0].request["stdin"], true);
  EXPECT_EQ(calls[1].request["process"]["pid"], 7);
  EXPECT_EQ(calls[2].request["process"]["pid"], 7);
}

TEST_F(GuestOpsTest, StdinKeptOpenIsNeitherSentNorClosed) {
  ProcessSpec spec;
  spec.argv = {"echo"};
  spec.close_stdin = false;
  auto stream = ops_->start(spec);
  ASSERT_TRUE(stream.ok());
  auto batch = stream.value()->next(milliseconds(2000));
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].pid, 7);
  batch = stream.value()->next(milliseconds(100));
  EXPECT_EQ(batch.state, ProcessStream::State::kOpen);
  EXPECT_EQ(methods(), std::vector<std::string>{"/process.Process/Start"});
  EXPECT_EQ(seen()[0].request["stdin"], true);
  // The front end feeds it later, as a client's stdin calls do.
  ASSERT_TRUE(ops_->sendInput(7, "late").ok());
  ASSERT_TRUE(ops_->sendInput(7, "").ok());  // nothing to send: no call
  ASSERT_TRUE(ops_->closeStdin(7).ok());
  auto done = drain(*stream.value());
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  ASSERT_FALSE(done.events.empty());
  EXPECT_EQ(done.events[0].data_base64, base64Encode("late"));
  EXPECT_EQ(methods().size(), 3u);
}

TEST_F(GuestOpsTest, StdinThatCannotBeDeliveredKillsTheProcessAndEndsInAnError) {
  fail_input_ = true;
  ProcessSpec spec;
  spec.argv = {"echo"};
  spec.stdin_data = "x";
  auto stream = ops_->start(spec);
  ASSERT_TRUE(stream.ok());
  auto done = drain(*stream.value());
  // The start, then the end of a killed process, then why.
  ASSERT_EQ(done.events.size(), 2u);
  EXPECT_EQ(done.events[1].end.status, "signal: killed");
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  ASSERT_TRUE(done.last.error);
  EXPECT_EQ(done.last.error->code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(done.last.error->message.rfind("stdin: ", 0), 0u) << done.last.error->message;
  auto calls = seen();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[1].method, "/process.Process/SendInput");
  EXPECT_EQ(calls[2].method, "/process.Process/SendSignal");
  EXPECT_EQ(calls[2].request["signal"], "SIGNAL_SIGKILL");
  EXPECT_EQ(calls[2].request["process"]["pid"], 7);
}

TEST_F(GuestOpsTest, AnErrorBeforeAnyEventEndsTheStreamWithIt) {
  auto stream = ops_->start(script({"!no such cwd"}));
  ASSERT_TRUE(stream.ok());
  auto done = drain(*stream.value());
  EXPECT_TRUE(done.events.empty());
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  ASSERT_TRUE(done.last.error);
  EXPECT_EQ(done.last.error->code, ErrorCode::kNotFound);
}

TEST_F(GuestOpsTest, HostileEventsEndTheStreamAsUnavailable) {
  const std::vector<Json> hostile = {
      Json{{"event", {{"data", {{"stdout", "aGk"}}}}}},   // not a multiple of 4
      Json{{"event", {{"data", {{"stdout", "aGl="}}}}}},  // non-canonical padding bits
      Json{{"event", {{"data", {{"stdout", "a$c!"}}}}}},  // not the alphabet
      Json{{"event", {{"data", {{"stdout", 5}}}}}},       // not a string
      Json("@" + std::to_string(kMaxEventData + 1)),      // over kMaxEventData
      Json{{"event", {{"start", {{"pid", "7"}}}}}},       // pid as a string
      Json{{"event", {{"start", {{"pid", -1}}}}}},        // no such pid
      Json{{"event", {{"end", {{"exitCode", 1e300}}}}}},  // not an integer
      Json{{"event", {{"data", {{"other", "aGk="}}}}}},   // no output kind
      Json{{"event", 3}},
      Json::array(),
  };
  for (const auto& bad : hostile) {
    SCOPED_TRACE(bad.dump().substr(0, 100));
    auto stream = ops_->start(script({startEvent(3), bad, dataEvent("stdout", "after")}));
    ASSERT_TRUE(stream.ok());
    auto done = drain(*stream.value());
    EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
    ASSERT_TRUE(done.last.error);
    EXPECT_EQ(done.last.error->code, ErrorCode::kUnavailable);
    // What came before is delivered; nothing after the malformed event is.
    ASSERT_EQ(done.events.size(), 1u);
    EXPECT_EQ(done.events[0].kind, ProcessEvent::Kind::kStart);
  }
  // Exactly kMaxEventData is fine.
  auto stream = ops_->start(script({Json("@" + std::to_string(kMaxEventData))}));
  ASSERT_TRUE(stream.ok());
  auto done = drain(*stream.value());
  EXPECT_FALSE(done.last.error);
  ASSERT_EQ(done.events.size(), 1u);
}

TEST_F(GuestOpsTest, AConsumerThatFallsBehindGetsOverflowWithinTheBacklog) {
  ProcessSpec spec;
  spec.argv = {"flood"};
  StreamLimits limits;
  limits.max_backlog = 256 << 10;
  auto stream = ops_->start(spec, limits);
  ASSERT_TRUE(stream.ok());
  // The consumer is slow: it looks only once the guest has sent 16 times the backlog (more than
  // the flow-control windows and socket buffers can hold in between), however slow the machine.
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       flood_sent_ < 16 * limits.max_backlog && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  auto batch = stream.value()->next(milliseconds(2000));
  size_t bytes = 0;
  for (const auto& e : batch.events) bytes += e.data_base64.size();
  EXPECT_EQ(batch.state, ProcessStream::State::kOverflow);
  EXPECT_LE(bytes, limits.max_backlog);
  EXPECT_GT(bytes, limits.max_backlog / 2);
  // next() stopped the stream; the agent saw the cancel.
  for (int i = 0; i < 100 && !flood_closed_; ++i) std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(flood_closed_);
  EXPECT_EQ(stream.value()->next(milliseconds(0)).state, ProcessStream::State::kOverflow);
}

TEST_F(GuestOpsTest, ConnectStreamsARunningProcessWithoutDeadline) {
  connect_script_ = Json::array({startEvent(21).dump(), dataEvent("stdout", "again").dump(), endEvent(0, "ok").dump()});
  auto stream = ops_->connect(21);
  auto done = drain(*stream);
  EXPECT_EQ(done.last.state, ProcessStream::State::kEnded);
  ASSERT_EQ(done.events.size(), 3u);
  EXPECT_EQ(done.events[1].data_base64, base64Encode("again"));
  auto calls = seen();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].method, "/process.Process/Connect");
  EXPECT_EQ(calls[0].request, Json({{"process", {{"pid", 21}}}}));
  EXPECT_FALSE(calls[0].timeout);
}

TEST_F(GuestOpsTest, RunCollectsOutputAndSendsStdin) {
  ProcessSpec spec;
  spec.argv = {"echo"};
  spec.stdin_data = "round trip";
  auto out = ops_->run(spec, 1 << 20);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out->pid, 7);
  EXPECT_EQ(out->stdout_data, "round trip");
  spec.close_stdin = false;
  EXPECT_EQ(ops_->run(spec, 1 << 20).error().code, ErrorCode::kInvalidArgument);
}

TEST_F(GuestOpsTest, SpecsAreCheckedBeforeAnythingIsSent) {
  ProcessSpec none;
  ProcessSpec both;
  both.command = "x";
  both.argv = {"x"};
  ProcessSpec nul;
  nul.command = std::string("a\0b", 3);
  ProcessSpec empty_program;
  empty_program.argv = {""};
  for (const auto* spec : {&none, &both, &nul, &empty_program}) {
    EXPECT_EQ(checkProcessSpec(*spec).error().code, ErrorCode::kInvalidArgument);
    EXPECT_FALSE(ops_->start(*spec).ok());
  }
  EXPECT_EQ(checkProcessSpec(nul).error().message, "command: contains a NUL byte");
  EXPECT_EQ(checkProcessSpec(empty_program).error().message, "argv: must name a program");
  EXPECT_TRUE(seen().empty());
}

TEST_F(GuestOpsTest, SignalsByNameOnlyFromTheAllowedSet) {
  EXPECT_EQ(parseSignal("SIGTERM"), Signal::kTerm);
  EXPECT_EQ(parseSignal("KILL"), Signal::kKill);
  EXPECT_EQ(parseSignal("SIGUSR2"), Signal::kUsr2);
  for (const char* bad : {"", "SIG", "SIGSEGV", "sigterm", "SIGTERM ", "9"}) EXPECT_FALSE(parseSignal(bad)) << bad;
  ASSERT_TRUE(ops_->sendSignal(12, Signal::kInt).ok());
  auto calls = seen();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].method, "/process.Process/SendSignal");
  EXPECT_EQ(calls[0].request, Json({{"process", {{"pid", 12}}}, {"signal", "SIGNAL_SIGINT"}}));
}

TEST_F(GuestOpsTest, ProcessListIsTypedAndAMalformedOneRefused) {
  answer(Json::parse(R"({"processes": [{"pid": 4, "tag": "t", "config": {"cmd": "/bin/sh", "args": ["-c", "x"],
                                                                        "cwd": "/", "envs": {"A": "1"}}},
                                         {"pid": 5}]})"));
  auto list = ops_->listProcesses();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].pid, 4);
  EXPECT_EQ((*list)[0].cmd, "/bin/sh");
  EXPECT_EQ((*list)[0].args, (std::vector<std::string>{"-c", "x"}));
  EXPECT_EQ((*list)[0].cwd, "/");
  EXPECT_EQ((*list)[0].tag, "t");
  EXPECT_FALSE((*list)[1].tag);
  answer(Json::object());
  EXPECT_TRUE(ops_->listProcesses()->empty());
  for (const char* bad :
       {R"({"processes": 1})", R"({"processes": [1]})", R"({"processes": [{"pid": "4"}]})", R"({"processes": [{}]})",
        R"({"processes": [{"pid": 4, "config": {"args": [1]}}]})",
        R"({"processes": [{"pid": 4, "config": {"cmd": 1}}]})", R"({"processes": [{"pid": 4, "tag": 3}]})", R"([])"}) {
    answer(Json::parse(bad));
    auto refused = ops_->listProcesses();
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.error().code, ErrorCode::kUnavailable);
  }
}

TEST_F(GuestOpsTest, FileCommandsSendTheirPathsAndUser) {
  Json entry{{"name", "d"},     {"path", "/home/user/d"}, {"type", "FILE_TYPE_DIRECTORY"},
             {"size", "4096"},  {"mode", 0755},           {"permissions", "drwxr-xr-x"},
             {"owner", "user"}, {"group", "user"},        {"modifiedTime", "2024-01-01T00:00:00Z"}};
  answer(Json{{"entry", entry}});
  auto made = ops_->makeDir("/home/user/d", "root");
  ASSERT_TRUE(made.ok()) << made.error().message;
  EXPECT_EQ(made->type, FileType::kDirectory);
  EXPECT_EQ(made->size, 4096u);
  EXPECT_EQ(made->mode, 0755u);
  EXPECT_EQ(made->name, "d");
  EXPECT_EQ(made->modified_at, "2024-01-01T00:00:00Z");
  EXPECT_FALSE(made->symlink_target);
  auto moved = ops_->move("/a", "/b", "");
  ASSERT_TRUE(moved.ok());
  ASSERT_TRUE(ops_->remove("/c", "user").ok());
  Json link{{"name", "l"}, {"symlinkTarget", "/x"}, {"type", "FILE_TYPE_FILE"}, {"size", 3}};
  answer(Json{{"entries", {entry, link}}});
  auto listed = ops_->listDir("/home", 2, "");
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[1].type, FileType::kSymlink);
  EXPECT_EQ((*listed)[1].size, 3u);
  EXPECT_FALSE((*listed)[1].mode);

  auto calls = seen();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[0].method, "/filesystem.Filesystem/MakeDir");
  EXPECT_EQ(calls[0].request, Json({{"path", "/home/user/d"}}));
  EXPECT_EQ(calls[0].user, "root");
  EXPECT_EQ(calls[1].method, "/filesystem.Filesystem/Move");
  EXPECT_EQ(calls[1].request, Json({{"source", "/a"}, {"destination", "/b"}}));
  EXPECT_EQ(calls[1].user, "");
  EXPECT_EQ(calls[2].method, "/filesystem.Filesystem/Remove");
  EXPECT_EQ(calls[2].request, Json({{"path", "/c"}}));
  EXPECT_EQ(calls[2].user, "user");
  EXPECT_EQ(calls[3].method, "/filesystem.Filesystem/ListDir");
  EXPECT_EQ(calls[3].request, Json({{"path", "/home"}, {"depth", 2}}));

  // An answer without an entry is an entry with nothing known.
  answer(Json::object());
  auto bare = ops_->makeDir("/e", "");
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE(bare->name);
  EXPECT_EQ(bare->type, FileType::kOther);
}

TEST_F(GuestOpsTest, MalformedFileAnswersAreRefused) {
  for (const char* bad : {R"([])", R"({"entry": 1})", R"({"entry": {"name": 1}})", R"({"entry": {"size": "-1"}})",
                          R"({"entry": {"size": "99999999999999999999999"}})", R"({"entry": {"size": -4}})",
                          R"({"entry": {"size": 1.5}})", R"({"entry": {"mode": 28672}})",
                          R"({"entry": {"mode": "0755"}})", R"({"entry": {"symlinkTarget": []}})"}) {
    answer(Json::parse(bad));
    auto made = ops_->makeDir("/x", "");
    ASSERT_FALSE(made.ok()) << bad;
    EXPECT_EQ(made.error().code, ErrorCode::kUnavailable);
  }
  for (const char* bad : {R"({"entries": 1})", R"({"entries": [1]})", R"([])"}) {
    answer(Json::parse(bad));
    EXPECT_FALSE(ops_->listDir("/", 1, "").ok()) << bad;
  }
}

TEST_F(GuestOpsTest, UploadAndDownloadGoThroughWithTheirUser) {
  answer(Json::array({Json{{"name", "f"}, {"type", "FILE_TYPE_FILE"}, {"size", "5"}}}));
  bool given = false;
  auto up = ops_->upload(
      "/f",
      [&](char* out, size_t max) -> Result<size_t> {
        if (given) return size_t{0};
        given = true;
        EXPECT_GE(max, 5u);
        memcpy(out, "hello", 5);
        return size_t{5};
      },
      "root");
  ASSERT_TRUE(up.ok()) << up.error().message;
  EXPECT_EQ(up->type, FileType::kFile);
  EXPECT_EQ(up->size, 5u);
  {
    std::lock_guard lock(m_);
    EXPECT_EQ(uploaded_, "hello");
  }
  std::string got;
  auto down = ops_->download(
      "/g",
      [&](std::string_view chunk) -> Status {
        got.append(chunk);
        return okStatus();
      },
      "user");
  ASSERT_TRUE(down.ok()) << down.error().message;
  EXPECT_EQ(got, "contents of /g");
  auto calls = seen();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].user, "root");
  EXPECT_EQ(calls[1].user, "user");
  EXPECT_EQ(calls[1].request["path"], "/g");
  // An upload answered with no entry at all is malformed.
  answer(Json::array());
  given = false;
  auto none = ops_->upload(
      "/f", [&](char*, size_t) -> Result<size_t> { return size_t{0}; }, "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace space::guest
