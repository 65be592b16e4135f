#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/event_loop.h"
#include "agent/process_service.h"
#include "agent/rpc.h"
#include "agent/users.h"
#include "agentproto/base64.h"

namespace space::agent {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// A ServerStream that records everything. Its queue drains instantly unless hold() is on, so
// tests can play a slow host.
class CollectingStream : public ServerStream {
 public:
  void send(const Json& message) override {
    if (!open_) return;
    messages.push_back(message);
    if (hold_) queued_ += message.dump().size();
  }
  void finish(std::optional<RpcError> error) override {
    if (finished) return;
    finished = true;
    open_ = false;
    this->error = std::move(error);
  }
  bool open() const override { return open_; }
  void setOnClose(std::function<void()> cb) override { on_close_ = std::move(cb); }
  size_t queuedBytes() const override { return queued_; }
  void setOnDrain(std::function<void()> cb) override { on_drain_ = std::move(cb); }

  // The host cancels the call.
  void cancel() {
    open_ = false;
    if (on_close_) on_close_();
  }
  void hold(bool on) { hold_ = on; }
  void setQueued(size_t bytes) { queued_ = bytes; }
  void drain() {
    queued_ = 0;
    if (on_drain_) on_drain_();
  }

  bool started() const {
    return !messages.empty() && messages[0].contains("event") && messages[0]["event"].contains("start");
  }
  pid_t pid() const { return started() ? messages[0]["event"]["start"]["pid"].get<pid_t>() : -1; }
  // Concatenated, decoded data of one kind ("stdout", "stderr", "pty").
  std::string output(const std::string& kind) const {
    std::string out;
    for (const auto& m : messages) {
      if (!m.contains("event") || !m["event"].contains("data") || !m["event"]["data"].contains(kind)) continue;
      auto bytes = agentproto::base64Decode(m["event"]["data"][kind].get<std::string>());
      EXPECT_TRUE(bytes.has_value());
      if (bytes) out += *bytes;
    }
    return out;
  }
  std::optional<Json> end() const {
    if (messages.empty() || !messages.back().contains("event") || !messages.back()["event"].contains("end")) {
      return std::nullopt;
    }
    return messages.back()["event"]["end"];
  }

  std::vector<Json> messages;
  bool finished = false;
  std::optional<RpcError> error;

 private:
  bool open_ = true;
  bool hold_ = false;
  size_t queued_ = 0;
  std::function<void()> on_close_;
  std::function<void()> on_drain_;
};

Json shell(const std::string& script) { return Json{{"process", {{"cmd", "/bin/sh"}, {"args", {"-c", script}}}}}; }

Json byPid(pid_t pid) { return Json{{"process", {{"pid", pid}}}}; }

RpcCode codeOf(const UnaryResult& r) {
  return std::holds_alternative<RpcError>(r) ? std::get<RpcError>(r).code : RpcCode::kOk;
}

class ProcessServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "agent-process-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    // uid 1000 must be able to reach its home below the 0700 temp dir.
    ASSERT_EQ(chmod(root_.c_str(), 0755), 0);
    root_home_ = root_ + "/root";
    user_home_ = root_ + "/home/user";
    std::filesystem::create_directories(root_ + "/etc");
    std::filesystem::create_directories(root_home_ + "/sub");
    std::filesystem::create_directories(user_home_);
    ASSERT_EQ(chmod((root_ + "/home").c_str(), 0755), 0);
    ASSERT_EQ(chown(user_home_.c_str(), 1000, 1000), 0);
    std::ofstream(root_ + "/etc/passwd") << "root:x:0:0:root:" << root_home_ << ":/bin/sh\n"
                                         << "user:x:1000:1000:user:" << user_home_ << ":/bin/sh\n";
    std::ofstream(root_ + "/etc/group") << "root:x:0:\nuser:x:1000:\nextra:x:2000:user\n";
    users_ = std::make_unique<UserDb>(root_ + "/etc");

    // Reap exactly as the agent does: SIGCHLD via signalfd, then waitpid(-1) until nothing is left.
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    ASSERT_EQ(sigprocmask(SIG_BLOCK, &chld, &old_mask_), 0);
    sigfd_ = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    ASSERT_GE(sigfd_, 0);
    loop_.addFd(sigfd_, EPOLLIN, [this](uint32_t) {
      signalfd_siginfo info;
      while (read(sigfd_, &info, sizeof info) == sizeof info) {
      }
      int st = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        if (!service_ || !service_->onChildExit(pid, st)) unclaimed_.push_back(pid);
      }
    });
    service_ = std::make_unique<ProcessService>(loop_, *users_);
    service_->registerWith(router_);
  }

  void TearDown() override {
    EXPECT_TRUE(unclaimed_.empty()) << "a child of the service was not claimed by onChildExit";
    service_.reset();
    loop_.removeFd(sigfd_);
    close(sigfd_);
    while (waitpid(-1, nullptr, 0) > 0) {
    }
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

  std::shared_ptr<CollectingStream> stream(const std::string& method, const Json& req, const std::string& user = "",
                                           std::optional<milliseconds> timeout = std::nullopt) {
    auto s = std::make_shared<CollectingStream>();
    const auto* handler = router_.findStream(method);
    EXPECT_NE(handler, nullptr) << method;
    if (handler) (*handler)(req, CallContext{user, timeout}, s);
    return s;
  }
  std::shared_ptr<CollectingStream> start(const Json& req, const std::string& user = "",
                                          std::optional<milliseconds> timeout = std::nullopt) {
    return stream("/process.Process/Start", req, user, timeout);
  }
  UnaryResult call(const std::string& method, const Json& req) {
    const auto* handler = router_.findUnary(method);
    EXPECT_NE(handler, nullptr) << method;
    if (!handler) return rpcError(RpcCode::kUnimplemented, method);
    return (*handler)(req, CallContext{});
  }

  // Runs the loop until cond() holds or `limit` passes; returns cond().
  bool runUntil(const std::function<bool()>& cond, milliseconds limit = milliseconds(10000)) {
    if (cond()) return true;
    auto deadline = Clock::now() + limit;
    std::function<void()> tick = [&] {
      if (cond() || Clock::now() >= deadline) {
        loop_.stop();
      } else {
        loop_.addTimer(milliseconds(1), tick);
      }
    };
    loop_.addTimer(milliseconds(1), tick);
    loop_.run();
    return cond();
  }
  void runFor(milliseconds d) {
    runUntil([] { return false; }, d);
  }
  bool waitFinished(const std::shared_ptr<CollectingStream>& s) {
    return runUntil([&] { return s->finished; });
  }
  std::optional<Json> listed(pid_t pid) {
    auto r = call("/process.Process/List", Json::object());
    if (!std::holds_alternative<Json>(r)) return std::nullopt;
    for (const auto& p : std::get<Json>(r)["processes"]) {
      if (p["pid"] == pid) return p;
    }
    return std::nullopt;
  }

  std::string root_, root_home_, user_home_;
  EventLoop loop_;
  std::unique_ptr<UserDb> users_;
  Router router_;
  std::unique_ptr<ProcessService> service_;
  int sigfd_ = -1;
  sigset_t old_mask_{};
  std::vector<pid_t> unclaimed_;
};

TEST_F(ProcessServiceTest, EchoStreamsStartDataAndCleanEnd) {
  auto s = start(Json{{"process", {{"cmd", "echo"}, {"args", {"hello", "world"}}}}, {"stdin", false}});
  ASSERT_TRUE(s->started()) << (s->error ? s->error->message : "");
  EXPECT_GT(s->pid(), 0);
  ASSERT_TRUE(waitFinished(s));
  EXPECT_FALSE(s->error.has_value());
  EXPECT_EQ(s->output("stdout"), "hello world\n");
  ASSERT_TRUE(s->end());
  // exitCode 0 is a proto3 default and is omitted; so is "error".
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, NonZeroExitReportsCodeAndStderr) {
  auto s = start(shell("echo oops >&2; exit 3"));
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(waitFinished(s));
  EXPECT_FALSE(s->error.has_value());
  EXPECT_EQ(s->output("stderr"), "oops\n");
  EXPECT_EQ(s->output("stdout"), "");
  EXPECT_EQ(*s->end(),
            (Json{{"exitCode", 3}, {"exited", true}, {"status", "exit status 3"}, {"error", "exit status 3"}}));
}

TEST_F(ProcessServiceTest, EnvironmentMergeOrderAndCwd) {
  service_->setSandboxEnv({{"A", "sa"}, {"B", "sb"}, {"LOGNAME", "slog"}});
  Json req = shell("echo \"$A $B $C $USER $LOGNAME $HOME $PATH\"; pwd");
  req["process"]["envs"] = {{"B", "rb"}, {"C", "rc"}};
  req["process"]["cwd"] = "sub";  // relative to the home
  auto s = start(req, "root");
  ASSERT_TRUE(s->started()) << (s->error ? s->error->message : "");
  ASSERT_TRUE(waitFinished(s));
  EXPECT_EQ(s->output("stdout"), "sa rb rc root slog " + root_home_ +
                                     " /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n" + root_home_ +
                                     "/sub\n");

  auto home = start(shell("pwd"), "root");
  ASSERT_TRUE(waitFinished(home));
  EXPECT_EQ(home->output("stdout"), root_home_ + "\n");

  Json missing = shell("pwd");
  missing["process"]["cwd"] = "/nonexistent/dir";
  auto bad = start(missing, "root");
  ASSERT_TRUE(bad->finished);
  ASSERT_TRUE(bad->error);
  EXPECT_EQ(bad->error->code, RpcCode::kInvalidArgument);
  EXPECT_TRUE(bad->messages.empty());
}

TEST_F(ProcessServiceTest, RunsAsTheRequestedUser) {
  auto user = start(shell("id -u; id -g; id -G; pwd"));  // "" = the default user
  ASSERT_TRUE(user->started()) << (user->error ? user->error->message : "");
  auto root = start(shell("id -u"), "root");
  ASSERT_TRUE(waitFinished(user));
  ASSERT_TRUE(waitFinished(root));
  EXPECT_EQ(user->output("stdout"), "1000\n1000\n1000 2000\n" + user_home_ + "\n");
  EXPECT_EQ(root->output("stdout"), "0\n");

  auto unknown = start(shell("true"), "nosuchuser");
  ASSERT_TRUE(unknown->error);
  EXPECT_EQ(unknown->error->code, RpcCode::kInvalidArgument);
  EXPECT_TRUE(unknown->messages.empty());
}

TEST_F(ProcessServiceTest, StdinReachesCatAndCloseStdinEndsIt) {
  auto s = start(Json{{"process", {{"cmd", "cat"}}}});  // stdin absent = a pipe
  ASSERT_TRUE(s->started());
  EXPECT_EQ(
      codeOf(call("/process.Process/SendInput",
                  Json{{"process", {{"pid", s->pid()}}}, {"input", {{"stdin", agentproto::base64Encode("hello ")}}}})),
      RpcCode::kOk);
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", Json{{"process", {{"pid", s->pid()}}},
                                                           {"input", {{"stdin", agentproto::base64Encode("world")}}}})),
            RpcCode::kOk);
  ASSERT_TRUE(runUntil([&] { return s->output("stdout") == "hello world"; }));
  EXPECT_FALSE(s->finished);
  EXPECT_EQ(codeOf(call("/process.Process/CloseStdin", byPid(s->pid()))), RpcCode::kOk);
  ASSERT_TRUE(waitFinished(s));
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, LargeInputIsBufferedAndFlushedBeforeClose) {
  auto s = start(Json{{"process", {{"cmd", "wc"}, {"args", {"-c"}}}}});
  ASSERT_TRUE(s->started());
  std::string big(3 << 20, 'x');  // far more than a pipe holds
  Json req{{"process", {{"pid", s->pid()}}}, {"input", {{"stdin", agentproto::base64Encode(big)}}}};
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", req)), RpcCode::kOk);
  EXPECT_EQ(codeOf(call("/process.Process/CloseStdin", byPid(s->pid()))), RpcCode::kOk);
  // Input after CloseStdin is refused even while the buffer is still draining.
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", req)), RpcCode::kFailedPrecondition);
  ASSERT_TRUE(waitFinished(s));
  EXPECT_EQ(s->output("stdout"), std::to_string(big.size()) + "\n");
}

TEST_F(ProcessServiceTest, PendingInputIsBounded) {
  auto s = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}});
  ASSERT_TRUE(s->started());
  std::string chunk(5 << 20, 'x');
  Json req{{"process", {{"pid", s->pid()}}}, {"input", {{"stdin", agentproto::base64Encode(chunk)}}}};
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", req)), RpcCode::kOk);
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", req)), RpcCode::kResourceExhausted);
  EXPECT_EQ(
      codeOf(call("/process.Process/SendSignal", Json{{"process", {{"pid", s->pid()}}}, {"signal", "SIGNAL_SIGKILL"}})),
      RpcCode::kOk);
  ASSERT_TRUE(waitFinished(s));
}

TEST_F(ProcessServiceTest, StdinFalseMeansNoInput) {
  auto s = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}, {"stdin", false}});
  ASSERT_TRUE(s->started());
  EXPECT_EQ(codeOf(call("/process.Process/SendInput",
                        Json{{"process", {{"pid", s->pid()}}}, {"input", {{"stdin", agentproto::base64Encode("x")}}}})),
            RpcCode::kFailedPrecondition);
  EXPECT_EQ(codeOf(call("/process.Process/CloseStdin", byPid(s->pid()))), RpcCode::kOk);
  EXPECT_EQ(codeOf(call("/process.Process/Update",
                        Json{{"process", {{"pid", s->pid()}}}, {"pty", {{"size", {{"cols", 10}, {"rows", 10}}}}}})),
            RpcCode::kFailedPrecondition);
  call("/process.Process/SendSignal", Json{{"process", {{"pid", s->pid()}}}, {"signal", "SIGNAL_SIGKILL"}});
  ASSERT_TRUE(waitFinished(s));

  auto cat = start(Json{{"process", {{"cmd", "cat"}}}, {"stdin", false}});
  ASSERT_TRUE(waitFinished(cat));  // reads /dev/null: immediate EOF
  EXPECT_EQ(cat->output("stdout"), "");
  EXPECT_EQ(*cat->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, PtyResizeAndInput) {
  Json req = shell("sleep 0.2; stty size; read x; echo \"got:$x\"");
  req["process"]["envs"] = {{"TERM", "xterm"}};
  req["pty"] = {{"size", {{"cols", 80}, {"rows", 24}}}};
  auto s = start(req, "root");
  ASSERT_TRUE(s->started()) << (s->error ? s->error->message : "");
  EXPECT_EQ(codeOf(call("/process.Process/Update",
                        Json{{"process", {{"pid", s->pid()}}}, {"pty", {{"size", {{"cols", 100}, {"rows", 30}}}}}})),
            RpcCode::kOk);
  ASSERT_TRUE(runUntil([&] { return s->output("pty").find("30 100") != std::string::npos; })) << s->output("pty");
  EXPECT_EQ(codeOf(call("/process.Process/SendInput",
                        Json{{"process", {{"pid", s->pid()}}}, {"input", {{"stdin", agentproto::base64Encode("x")}}}})),
            RpcCode::kFailedPrecondition);
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", Json{{"process", {{"pid", s->pid()}}},
                                                           {"input", {{"pty", agentproto::base64Encode("hi\n")}}}})),
            RpcCode::kOk);
  ASSERT_TRUE(waitFinished(s));
  EXPECT_NE(s->output("pty").find("got:hi"), std::string::npos) << s->output("pty");
  EXPECT_EQ(s->output("stdout"), "");
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

// Dead or a zombie (its reaper is the host's init, not this test).
bool processGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST_F(ProcessServiceTest, SendSignalKillsTheProcessGroup) {
  auto s = start(shell("sleep 30 & echo $!; wait"));
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(runUntil([&] { return s->output("stdout").find('\n') != std::string::npos; }));
  pid_t grandchild = std::stoi(s->output("stdout"));
  EXPECT_FALSE(processGone(grandchild));
  EXPECT_EQ(
      codeOf(call("/process.Process/SendSignal", Json{{"process", {{"pid", s->pid()}}}, {"signal", "SIGNAL_SIGKILL"}})),
      RpcCode::kOk);
  ASSERT_TRUE(waitFinished(s));
  EXPECT_FALSE(s->error.has_value());
  EXPECT_TRUE(runUntil([&] { return processGone(grandchild); }, milliseconds(2000)));
  EXPECT_EQ(*s->end(),
            (Json{{"exitCode", -1}, {"exited", false}, {"status", "signal: killed"}, {"error", "signal: killed"}}));

  auto t = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}});
  EXPECT_EQ(codeOf(call("/process.Process/SendSignal", Json{{"process", {{"pid", t->pid()}}}, {"signal", 15}})),
            RpcCode::kOk);
  ASSERT_TRUE(waitFinished(t));
  EXPECT_EQ((*t->end())["status"], "signal: terminated");
}

TEST_F(ProcessServiceTest, CallTimeoutKillsTheProcess) {
  auto began = Clock::now();
  auto s = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}}, "", milliseconds(200));
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(waitFinished(s));
  EXPECT_LT(Clock::now() - began, milliseconds(5000));
  EXPECT_EQ(*s->end(),
            (Json{{"exitCode", -1}, {"exited", false}, {"status", "signal: killed"}, {"error", "signal: killed"}}));
}

TEST_F(ProcessServiceTest, ConnectReattachesAndUnattachedOutputIsDropped) {
  Json req = shell("echo one; read x; echo \"two:$x\"");
  req["tag"] = "job";
  auto a = start(req);
  ASSERT_TRUE(a->started());
  ASSERT_TRUE(runUntil([&] { return a->output("stdout") == "one\n"; }));
  size_t seen = a->messages.size();
  a->cancel();  // the host went away; the process keeps running

  auto b = stream("/process.Process/Connect", byPid(a->pid()));
  auto c = stream("/process.Process/Connect", Json{{"process", {{"tag", "job"}}}});
  ASSERT_TRUE(b->started());
  ASSERT_TRUE(c->started());
  EXPECT_EQ(b->pid(), a->pid());
  EXPECT_EQ(c->pid(), a->pid());
  EXPECT_EQ(codeOf(call("/process.Process/SendInput",
                        Json{{"process", {{"tag", "job"}}}, {"input", {{"stdin", agentproto::base64Encode("x\n")}}}})),
            RpcCode::kOk);
  ASSERT_TRUE(waitFinished(b));
  ASSERT_TRUE(waitFinished(c));
  EXPECT_EQ(b->output("stdout"), "two:x\n");
  EXPECT_EQ(c->output("stdout"), "two:x\n");
  EXPECT_EQ(*b->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
  EXPECT_EQ(a->messages.size(), seen);
  EXPECT_FALSE(a->finished);

  // Finished processes cannot be connected to.
  auto late = stream("/process.Process/Connect", byPid(a->pid()));
  ASSERT_TRUE(late->error);
  EXPECT_EQ(late->error->code, RpcCode::kNotFound);
  EXPECT_TRUE(late->messages.empty());
}

TEST_F(ProcessServiceTest, OutputWithNoStreamAttachedIsDiscarded) {
  auto a = start(shell("read x; head -c 300000 /dev/zero; read y; echo done"));
  ASSERT_TRUE(a->started());
  pid_t pid = a->pid();
  a->cancel();
  Json line{{"process", {{"pid", pid}}}, {"input", {{"stdin", agentproto::base64Encode("\n")}}}};
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", line)), RpcCode::kOk);
  runFor(milliseconds(200));  // more than a pipe holds: it would block forever if nobody read it
  auto b = stream("/process.Process/Connect", byPid(pid));
  ASSERT_TRUE(b->started());
  EXPECT_EQ(codeOf(call("/process.Process/SendInput", line)), RpcCode::kOk);
  ASSERT_TRUE(waitFinished(b));
  EXPECT_EQ(b->output("stdout"), "done\n");
}

TEST_F(ProcessServiceTest, ListShowsRunningProcessesWithConfig) {
  Json req{{"process", {{"cmd", "sleep"}, {"args", {"30"}}, {"envs", {{"K", "V"}}}, {"cwd", "/"}}}, {"tag", "t1"}};
  auto s = start(req);
  auto plain = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}});
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(plain->started());
  auto entry = listed(s->pid());
  ASSERT_TRUE(entry);
  EXPECT_EQ(*entry, (Json{{"config", {{"cmd", "sleep"}, {"args", {"30"}}, {"envs", {{"K", "V"}}}, {"cwd", "/"}}},
                          {"pid", s->pid()},
                          {"tag", "t1"}}));
  auto other = listed(plain->pid());
  ASSERT_TRUE(other);
  EXPECT_FALSE(other->contains("tag"));
  EXPECT_EQ((*other)["config"]["cwd"], user_home_);
  EXPECT_EQ((*other)["config"]["envs"], Json::object());

  for (auto& p : {s, plain}) {
    call("/process.Process/SendSignal", Json{{"process", {{"pid", p->pid()}}}, {"signal", "SIGNAL_SIGKILL"}});
    ASSERT_TRUE(waitFinished(p));
  }
  EXPECT_FALSE(listed(s->pid()));
  EXPECT_FALSE(listed(plain->pid()));
}

TEST_F(ProcessServiceTest, UnknownProcessIsNotFound) {
  const pid_t pid = 999999999;
  auto c = stream("/process.Process/Connect", byPid(pid));
  ASSERT_TRUE(c->error);
  EXPECT_EQ(c->error->code, RpcCode::kNotFound);
  EXPECT_TRUE(c->messages.empty());
  auto t = stream("/process.Process/Connect", Json{{"process", {{"tag", "nope"}}}});
  ASSERT_TRUE(t->error);
  EXPECT_EQ(t->error->code, RpcCode::kNotFound);
  EXPECT_EQ(codeOf(call("/process.Process/SendInput",
                        Json{{"process", {{"pid", pid}}}, {"input", {{"stdin", agentproto::base64Encode("x")}}}})),
            RpcCode::kNotFound);
  EXPECT_EQ(
      codeOf(call("/process.Process/SendSignal", Json{{"process", {{"pid", pid}}}, {"signal", "SIGNAL_SIGKILL"}})),
      RpcCode::kNotFound);
  EXPECT_EQ(codeOf(call("/process.Process/CloseStdin", byPid(pid))), RpcCode::kNotFound);
  EXPECT_EQ(codeOf(call("/process.Process/Update",
                        Json{{"process", {{"pid", pid}}}, {"pty", {{"size", {{"cols", 10}, {"rows", 10}}}}}})),
            RpcCode::kNotFound);
  // Our own pid is no child of the service: never signalled.
  EXPECT_EQ(
      codeOf(call("/process.Process/SendSignal", Json{{"process", {{"pid", getpid()}}}, {"signal", "SIGNAL_SIGKILL"}})),
      RpcCode::kNotFound);
}

TEST_F(ProcessServiceTest, ExecFailureIsAnErrorWithoutStart) {
  struct Case {
    const char* cmd;
    RpcCode code;
  };
  std::string not_executable = root_ + "/etc/passwd";
  for (const auto& c : {Case{"/nonexistent/prog", RpcCode::kNotFound}, Case{"no-such-command-xyz", RpcCode::kNotFound},
                        Case{not_executable.c_str(), RpcCode::kPermissionDenied}}) {
    auto s = start(Json{{"process", {{"cmd", c.cmd}}}});
    EXPECT_TRUE(s->finished) << c.cmd;
    ASSERT_TRUE(s->error) << c.cmd;
    EXPECT_EQ(s->error->code, c.code) << c.cmd << ": " << s->error->message;
    EXPECT_TRUE(s->messages.empty()) << c.cmd;
  }
  // The failed children are reaped through onChildExit and claimed (TearDown checks).
  runFor(milliseconds(100));
}

TEST_F(ProcessServiceTest, MalformedRequestsAreInvalidArgument) {
  const std::vector<Json> bad_starts = {
      Json::array(),
      Json::object(),
      Json{{"process", "sh"}},
      Json{{"process", {{"cmd", 5}}}},
      Json{{"process", {{"cmd", ""}}}},
      Json{{"process", {{"cmd", std::string("s\0h", 3)}}}},
      Json{{"process", {{"cmd", "sh"}, {"args", "-c"}}}},
      Json{{"process", {{"cmd", "sh"}, {"args", {1, 2}}}}},
      Json{{"process", {{"cmd", "sh"}, {"envs", Json::array()}}}},
      Json{{"process", {{"cmd", "sh"}, {"envs", {{"A", 1}}}}}},
      Json{{"process", {{"cmd", "sh"}, {"envs", {{"A=B", "c"}}}}}},
      Json{{"process", {{"cmd", "sh"}, {"cwd", 7}}}},
      Json{{"process", {{"cmd", "sh"}}}, {"stdin", "yes"}},
      Json{{"process", {{"cmd", "sh"}}}, {"tag", 5}},
      Json{{"process", {{"cmd", "sh"}}}, {"pty", {{"size", {{"cols", "abc"}, {"rows", 24}}}}}},
      Json{{"process", {{"cmd", "sh"}}}, {"pty", {{"size", {{"cols", 0}, {"rows", 24}}}}}},
      Json{{"process", {{"cmd", "sh"}}}, {"pty", 1}},
  };
  for (const auto& req : bad_starts) {
    auto s = start(req);
    ASSERT_TRUE(s->error) << req.dump();
    EXPECT_EQ(s->error->code, RpcCode::kInvalidArgument) << req.dump() << ": " << s->error->message;
    EXPECT_TRUE(s->messages.empty());
  }
  auto huge = start(Json{{"process", {{"cmd", "sh"}, {"args", {std::string(2 << 20, 'a')}}}}});
  ASSERT_TRUE(huge->error);
  EXPECT_EQ(huge->error->code, RpcCode::kResourceExhausted);

  const std::vector<std::pair<std::string, Json>> bad_calls = {
      {"/process.Process/Connect", Json{{"process", {{"pid", -1}}}}},
      {"/process.Process/Connect", Json{{"process", {{"pid", 1}, {"tag", "x"}}}}},
      {"/process.Process/Connect", Json{{"process", Json::array()}}},
      {"/process.Process/SendInput", Json{{"process", {{"pid", "abc"}}}, {"input", {{"stdin", "aGk="}}}}},
      {"/process.Process/SendInput", Json{{"process", {{"pid", 1}}}, {"input", {{"stdin", 5}}}}},
      {"/process.Process/SendInput", Json{{"process", {{"pid", 1}}}, {"input", {{"stdin", "***"}}}}},
      {"/process.Process/SendInput", Json{{"process", {{"pid", 1}}}}},
      {"/process.Process/SendInput", Json{{"process", {{"pid", 1}}}, {"input", {{"stdin", "aGk="}, {"pty", "aGk="}}}}},
      {"/process.Process/SendSignal", Json{{"process", {{"pid", 1}}}, {"signal", "SIGNAL_BOGUS"}}},
      {"/process.Process/SendSignal", Json{{"process", {{"pid", 1}}}, {"signal", true}}},
      {"/process.Process/SendSignal", Json{{"process", {{"pid", 1}}}, {"signal", 4}}},
      {"/process.Process/SendSignal", Json{{"process", {{"pid", 1}}}}},
      {"/process.Process/Update", Json{{"process", {{"pid", 1}}}, {"pty", {{"size", {{"cols", 0}, {"rows", 5}}}}}}},
      {"/process.Process/Update", Json{{"process", {{"pid", 1}}}, {"pty", {{"size", "big"}}}}},
      {"/process.Process/CloseStdin", Json{{"process", {{"pid", 1.5}}}}},
      {"/process.Process/CloseStdin", Json::array()},
  };
  for (const auto& [method, req] : bad_calls) {
    RpcCode code;
    std::string message;
    if (method == "/process.Process/Connect") {
      auto s = stream(method, req);
      ASSERT_TRUE(s->error) << req.dump();
      code = s->error->code;
      message = s->error->message;
    } else {
      auto r = call(method, req);
      code = codeOf(r);
      if (auto* e = std::get_if<RpcError>(&r)) message = e->message;
    }
    EXPECT_EQ(code, RpcCode::kInvalidArgument) << method << " " << req.dump() << ": " << message;
  }
}

TEST_F(ProcessServiceTest, FiftyConcurrentProcesses) {
  std::vector<std::shared_ptr<CollectingStream>> streams;
  for (int i = 0; i < 50; ++i) {
    streams.push_back(start(shell("echo out-" + std::to_string(i) + "; exit " + std::to_string(i % 7))));
    ASSERT_TRUE(streams.back()->started()) << i;
  }
  ASSERT_TRUE(
      runUntil([&] { return std::all_of(streams.begin(), streams.end(), [](const auto& s) { return s->finished; }); }));
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(streams[i]->output("stdout"), "out-" + std::to_string(i) + "\n");
    ASSERT_TRUE(streams[i]->end()) << i;
    EXPECT_EQ((*streams[i]->end())["status"], "exit status " + std::to_string(i % 7));
    EXPECT_EQ((*streams[i]->end()).value("exitCode", 0), i % 7);
  }
}

TEST_F(ProcessServiceTest, BackgroundGrandchildDoesNotDelayEnd) {
  auto began = Clock::now();
  auto s = start(shell("sleep 2 & echo hi"));
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(waitFinished(s));
  EXPECT_LT(Clock::now() - began, milliseconds(1500));
  EXPECT_EQ(s->output("stdout"), "hi\n");
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, SlowStreamPausesReadingUntilDrained) {
  constexpr size_t kTotal = 4 << 20;
  auto s = std::make_shared<CollectingStream>();
  s->hold(true);
  (*router_.findStream("/process.Process/Start"))(
      Json{{"process", {{"cmd", "head"}, {"args", {"-c", std::to_string(kTotal), "/dev/zero"}}}}}, CallContext{}, s);
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(runUntil([&] { return s->queuedBytes() > ServerStream::kHighWater; }));
  runFor(milliseconds(300));
  // Paused: at most one read past the mark, and the writer is stuck on a full pipe.
  EXPECT_LT(s->queuedBytes(), ServerStream::kHighWater + (200 << 10));
  EXPECT_LT(s->output("stdout").size(), kTotal);
  EXPECT_FALSE(s->finished);
  s->hold(false);
  s->drain();
  ASSERT_TRUE(waitFinished(s));
  EXPECT_EQ(s->output("stdout"), std::string(kTotal, '\0'));
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, SlowStreamThatLeavesReleasesTheProcess) {
  auto s = std::make_shared<CollectingStream>();
  s->hold(true);
  (*router_.findStream("/process.Process/Start"))(
      Json{{"process", {{"cmd", "head"}, {"args", {"-c", "4000000", "/dev/zero"}}}}}, CallContext{}, s);
  ASSERT_TRUE(s->started());
  ASSERT_TRUE(runUntil([&] { return s->queuedBytes() > ServerStream::kHighWater; }));
  pid_t pid = s->pid();
  s->cancel();  // the blocking stream detaches: reading resumes and the output is dropped
  auto late = stream("/process.Process/Connect", byPid(pid));
  ASSERT_TRUE(late->started());
  ASSERT_TRUE(waitFinished(late));
  EXPECT_EQ(*late->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, ExitWhilePausedDeliversTheRestWithoutSpinning) {
  auto s = std::make_shared<CollectingStream>();
  s->hold(true);
  s->setQueued(ServerStream::kHighWater + 1);  // the host is already behind
  (*router_.findStream("/process.Process/Start"))(
      Json{{"process", {{"cmd", "head"}, {"args", {"-c", "30000", "/dev/zero"}}}}}, CallContext{}, s);
  ASSERT_TRUE(s->started());
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  // The process exits with output still unread (reading is paused): the end comes after the
  // exit linger, with every byte, and the hung-up pipe must not spin the loop meanwhile.
  ASSERT_TRUE(waitFinished(s));
  getrusage(RUSAGE_SELF, &after);
  auto cpu_us = [](const rusage& r) {
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
  };
  EXPECT_LT(cpu_us(after) - cpu_us(before), 100000L);
  EXPECT_EQ(s->output("stdout"), std::string(30000, '\0'));
  EXPECT_EQ(*s->end(), (Json{{"exited", true}, {"status", "exit status 0"}}));
}

TEST_F(ProcessServiceTest, DestructionKillsProcessesAndFinishesStreams) {
  auto s = start(Json{{"process", {{"cmd", "sleep"}, {"args", {"30"}}}}});
  ASSERT_TRUE(s->started());
  pid_t pid = s->pid();
  service_.reset();
  ASSERT_TRUE(s->finished);
  ASSERT_TRUE(s->error);
  EXPECT_EQ(s->error->code, RpcCode::kUnavailable);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(st));
  EXPECT_EQ(WTERMSIG(st), SIGKILL);
}

}  // namespace
}  // namespace space::agent
