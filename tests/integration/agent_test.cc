// The guest agent in a real microVM: processes and files through the host's AgentClient, over
// the virtio-serial channel. One VM serves the whole suite (booting costs seconds under TCG);
// tests that change the VM's state (reconnect, disk full) clean up after themselves.
#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>

#include "agentproto/base64.h"
#include "common/fs.h"
#include "vmm/vm.h"

namespace space::vmm {
namespace {

using agentproto::CallOptions;
using agentproto::CommandSpec;
using agentproto::Json;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string imagePath(const char* env, const char* name) {
  if (const char* v = getenv(env); v != nullptr && *v != '\0') return v;
  return std::string(SPACE_IMAGES_DIR) + "/" + name;
}

std::string sha256Hex(const std::string& data) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  std::string hex;
  char b[3];
  for (unsigned char c : md) {
    snprintf(b, sizeof b, "%02x", c);
    hex += b;
  }
  return hex;
}

// Collects a process stream's events (thread-safe) and lets a test wait for conditions.
struct EventLog {
  std::mutex m;
  std::condition_variable cv;
  int pid = 0;
  std::string out, err, pty;
  bool ended = false;
  agentproto::ProcessEnd end;

  void on(const Json& msg) {
    auto ev = agentproto::decodeProcessEvent(msg);
    std::lock_guard<std::mutex> lock(m);
    if (!ev.ok()) return;
    switch (ev->kind) {
      case agentproto::ProcessEvent::Kind::kStart: pid = ev->pid; break;
      case agentproto::ProcessEvent::Kind::kStdout: out += ev->data; break;
      case agentproto::ProcessEvent::Kind::kStderr: err += ev->data; break;
      case agentproto::ProcessEvent::Kind::kPty: pty += ev->data; break;
      case agentproto::ProcessEvent::Kind::kEnd:
        ended = true;
        end = ev->end;
        break;
      default: break;
    }
    cv.notify_all();
  }
  template <class Pred>
  bool waitFor(Pred pred, milliseconds timeout = milliseconds(30000)) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, timeout, [&] { return pred(*this); });
  }
};

class AgentTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = TempDir::create("/tmp", "space-agenttest-");
    ASSERT_TRUE(dir.ok());
    run_root_ = new TempDir(std::move(dir.value()));
    VmSpec spec;
    spec.kernel_path = imagePath("SPACE_KERNEL", "vmlinux");
    spec.rootfs_path = imagePath("SPACE_ROOTFS", "rootfs.ext4");
    spec.qemu_binary = imagePath("SPACE_QEMU", "qemu-system-x86_64");
    spec.vcpus = 2;
    spec.memory_mib = 1024;
    spec.boot_timeout = seconds(120);
    VmStartOptions options;
    options.run_root = run_root_->path();
    auto vm = Vm::start(spec, options);
    ASSERT_TRUE(vm.ok()) << vm.error().message;
    vm_ = vm.value().release();
  }
  static void TearDownTestSuite() {
    // A failure inside the guest (the agent's own messages) is only visible on its console.
    if (vm_ != nullptr && testing::UnitTest::GetInstance()->current_test_suite()->failed_test_count() > 0) {
      // Whether the agent still answers, and what it runs: a lost call or a stuck process.
      auto list = vm_->agent().call("/process.Process/List", Json::object());
      fprintf(stderr, "--- process list: %s\n", list.ok() ? list->dump().c_str() : list.error().message.c_str());
      fprintf(stderr, "--- guest console (tail) ---\n%s\n", vm_->consoleTail(16384).c_str());
    }
    delete vm_;
    vm_ = nullptr;
    EXPECT_TRUE(std::filesystem::is_empty(run_root_->path()));
    delete run_root_;
  }
  void SetUp() override { ASSERT_NE(vm_, nullptr) << "the suite's VM did not boot"; }

  agentproto::AgentClient& agent() { return vm_->agent(); }
  agentproto::CommandResult run(const CommandSpec& spec) {
    auto r = vm_->exec(spec);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r.value() : agentproto::CommandResult{};
  }
  agentproto::CommandResult run(const std::string& cmd, const std::string& user = "") {
    CommandSpec spec;
    spec.command = cmd;
    spec.user = user;
    return run(spec);
  }

  static Vm* vm_;
  static TempDir* run_root_;
};
Vm* AgentTest::vm_ = nullptr;
TempDir* AgentTest::run_root_ = nullptr;

TEST_F(AgentTest, EchoExitCodesAndStderr) {
  auto r = run("echo hello");
  EXPECT_EQ(r.stdout_data, "hello\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_GT(r.pid, 1);
  auto f = run("echo oops >&2; exit 7");
  EXPECT_EQ(f.exit_code, 7);
  EXPECT_TRUE(f.exited);
  EXPECT_EQ(f.status, "exit status 7");
  EXPECT_EQ(f.stderr_data, "oops\n");
  CommandSpec argv;
  argv.argv = {"/bin/echo", "a b", "c"};
  EXPECT_EQ(run(argv).stdout_data, "a b c\n");
}

TEST_F(AgentTest, EnvCwdAndUser) {
  ASSERT_TRUE(
      agent().call("/agent.Agent/Configure", Json{{"envVars", {{"SANDBOX_VAR", "s"}, {"BOTH", "sandbox"}}}}).ok());
  CommandSpec spec;
  spec.command = "echo $SANDBOX_VAR $BOTH $HOME $USER; pwd; id -un";
  spec.env = {{"BOTH", "call"}};
  auto r = run(spec);
  EXPECT_EQ(r.stdout_data, "s call /home/user user\n/home/user\nuser\n");
  spec.user = "root";
  spec.cwd = "/tmp";
  spec.command = "pwd; id -u; echo $HOME";
  EXPECT_EQ(run(spec).stdout_data, "/tmp\n0\n/root\n");
  spec.cwd = "/no/such/dir";
  auto bad = vm_->exec(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  spec.cwd = "";
  spec.user = "nobody-here";
  auto nouser = vm_->exec(spec);
  ASSERT_FALSE(nouser.ok());
  EXPECT_EQ(nouser.error().code, ErrorCode::kInvalidArgument);
}

TEST_F(AgentTest, StdinToCat) {
  CommandSpec spec;
  spec.command = "cat; echo done";
  spec.stdin_data = std::string("line one\nline two\n");
  auto r = run(spec);
  EXPECT_EQ(r.stdout_data, "line one\nline two\ndone\n");
}

TEST_F(AgentTest, TenMebibyteFileRoundTripWithChecksum) {
  std::string data(10 << 20, '\0');
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    uint64_t v = rng();
    memcpy(&data[i], &v, 8);
  }
  auto up = agent().upload("blobs/ten.bin", data, CallOptions{seconds(120), ""});
  ASSERT_TRUE(up.ok()) << up.error().message;
  EXPECT_EQ((*up)["path"], "/home/user/blobs/ten.bin");
  EXPECT_EQ((*up)["owner"], "user");
  auto sum = run("sha256sum blobs/ten.bin | cut -d' ' -f1; stat -c %U:%s blobs/ten.bin");
  EXPECT_EQ(sum.stdout_data, sha256Hex(data) + "\nuser:" + std::to_string(data.size()) + "\n");
  auto down = agent().download("/home/user/blobs/ten.bin", 64 << 20, CallOptions{seconds(120), ""});
  ASSERT_TRUE(down.ok()) << down.error().message;
  EXPECT_EQ(sha256Hex(down.value()), sha256Hex(data));
  auto missing = agent().download("nope.bin", 1024);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
}

TEST_F(AgentTest, FiftyConcurrentCommands) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 50; ++i) {
    threads.emplace_back([&, i] {
      CommandSpec spec;
      spec.argv = {"/bin/sh", "-c", "echo $0", std::to_string(i)};
      spec.timeout = seconds(120);
      auto r = vm_->exec(spec);
      if (r.ok() && r->stdout_data == std::to_string(i) + "\n" && r->exit_code == 0) ok++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 50);
}

// Small calls one at a time, so that nothing else from the host follows a request, while a
// command prints (the agent's loop has other work when requests land), at
// uneven intervals (they land at every point of its cycle). A request whose notification the
// guest missed waited until the host wrote again, which a lone call never does: it timed out
// (docs/agent.md, "The channel: a look at the port is a read"). Each call takes milliseconds;
// 5 s each is far above that, and far below the 30 s a lost call took.
TEST_F(AgentTest, CallsOneAtATimeAreNeverLost) {
  CommandSpec chatter;
  chatter.command = "for i in $(seq 1 3000); do echo chatter $i; sleep 0.005; done";
  EventLog log;
  auto stream = agent().stream(
      "/process.Process/Start", agentproto::startRequest(chatter), CallOptions{seconds(120), ""},
      [&](const Json& m) { log.on(m); }, nullptr);
  ASSERT_TRUE(log.waitFor([](EventLog& l) { return l.pid > 0; }));
  constexpr int kCalls = 1000;
  const uint64_t nudges_before = agent().nudges();
  std::mt19937 rng(11);
  int64_t slowest_ms = 0;
  for (int i = 0; i < kCalls; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    const auto start = Clock::now();
    auto r = i % 2 == 0 ? agent().call("/process.Process/List", Json::object(), CallOptions{seconds(5), ""})
                        : agent().call("/filesystem.Filesystem/Stat", Json{{"path", "/"}}, CallOptions{seconds(5), ""});
    ASSERT_TRUE(r.ok()) << "call " << i << ": " << r.error().message;
    slowest_ms = std::max<int64_t>(slowest_ms, std::chrono::duration_cast<milliseconds>(Clock::now() - start).count());
  }
  size_t chatter_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(log.m);
    chatter_bytes = log.out.size();
  }
  std::cout << "[ info     ] " << kCalls << " calls, slowest " << slowest_ms << " ms; " << chatter_bytes
            << " bytes of output meanwhile; " << agent().nudges() - nudges_before << " nudges\n";
  EXPECT_GT(chatter_bytes, 0u);
  // The host's nudge would hide a guest that misses requests (each lost one costing a second),
  // so the guest's own handling is checked too: a call nudged means it went a second
  // unanswered. A loaded machine may make that happen once or twice; lost requests make more.
  EXPECT_LE(agent().nudges() - nudges_before, 2u);
  (void)agent().call("/process.Process/SendSignal",
                     Json{{"process", {{"pid", log.pid}}}, {"signal", "SIGNAL_SIGKILL"}});
  EXPECT_TRUE(stream->wait(seconds(30)).ok());
}

// A 24 MiB upload and a command's output share the channel: ticks printed every 50 ms must
// keep arriving on the host while the upload is in flight, not queue behind it. Each tick is
// timestamped on the host as it arrives; several must land strictly between the upload's start
// and its end.
TEST_F(AgentTest, OutputFlowsWhileALargeUploadRuns) {
  EventLog log;
  std::mutex times_mu;
  std::vector<Clock::time_point> tick_times;
  CommandSpec spec;
  spec.command = "for i in $(seq 1 100); do echo tick $i; sleep 0.05; done";
  auto stream = agent().stream(
      "/process.Process/Start", agentproto::startRequest(spec), CallOptions{seconds(120), ""},
      [&](const Json& m) {
        auto ev = agentproto::decodeProcessEvent(m);
        if (ev.ok() && ev->kind == agentproto::ProcessEvent::Kind::kStdout) {
          const auto now = Clock::now();
          std::lock_guard<std::mutex> lock(times_mu);
          for (size_t at = ev->data.find("tick"); at != std::string::npos; at = ev->data.find("tick", at + 1)) {
            tick_times.push_back(now);
          }
        }
        log.on(m);
      },
      nullptr);
  ASSERT_TRUE(log.waitFor([](EventLog& l) { return l.out.find("tick 1\n") != std::string::npos; }));
  const auto upload_start = Clock::now();
  auto r = agent().upload("/tmp/big.bin", std::string(24 << 20, 'u'), CallOptions{seconds(120), ""});
  const auto upload_end = Clock::now();
  EXPECT_TRUE(r.ok()) << r.error().message;
  size_t during = 0;
  {
    std::lock_guard<std::mutex> lock(times_mu);
    for (auto t : tick_times) during += t > upload_start && t < upload_end;
  }
  const auto upload_ms = std::chrono::duration_cast<milliseconds>(upload_end - upload_start).count();
  std::cout << "[ info     ] upload took " << upload_ms << " ms; " << during << " ticks arrived meanwhile\n";
  // One tick per 50 ms when nothing stalls; the guest is slow under TCG and busier during the
  // upload (measured: 7 ticks in 1.3 s), so ask for one per 300 ms, and at least 2. Output
  // queued behind the upload would all arrive after it: none inside.
  EXPECT_GE(during, std::max<size_t>(2, static_cast<size_t>(upload_ms / 300)))
      << "command output stalled behind the upload (" << upload_ms << " ms)";
  ASSERT_TRUE(stream->wait(seconds(60)).ok());
  EXPECT_NE(log.out.find("tick 100\n"), std::string::npos);
  run("rm -f /tmp/big.bin");
}

TEST_F(AgentTest, PtyReportsColumnsAfterResize) {
  EventLog log;
  Json req{{"process",
            {{"cmd", "/bin/bash"},
             {"args", {"-c", "sleep 1; tput cols; stty size"}},
             {"envs", {{"TERM", "xterm-256color"}}}}},
           {"pty", {{"size", {{"cols", 80}, {"rows", 24}}}}}};
  auto stream = agent().stream(
      "/process.Process/Start", req, CallOptions{seconds(60), ""}, [&](const Json& m) { log.on(m); }, nullptr);
  ASSERT_TRUE(log.waitFor([](EventLog& l) { return l.pid > 0; }));
  auto resized = agent().call("/process.Process/Update", Json{{"process", {{"pid", log.pid}}},
                                                              {"pty", {{"size", {{"cols", 123}, {"rows", 45}}}}}});
  ASSERT_TRUE(resized.ok()) << resized.error().message;
  ASSERT_TRUE(stream->wait(seconds(60)).ok());
  EXPECT_NE(log.pty.find("123\r\n45 123"), std::string::npos) << log.pty;
}

TEST_F(AgentTest, SigkillAndTimeout) {
  EventLog log;
  CommandSpec spec;
  spec.command = "sleep 300";
  auto stream = agent().stream(
      "/process.Process/Start", agentproto::startRequest(spec), CallOptions{seconds(60), ""},
      [&](const Json& m) { log.on(m); }, nullptr);
  ASSERT_TRUE(log.waitFor([](EventLog& l) { return l.pid > 0; }));
  auto killed =
      agent().call("/process.Process/SendSignal", Json{{"process", {{"pid", log.pid}}}, {"signal", "SIGNAL_SIGKILL"}});
  ASSERT_TRUE(killed.ok()) << killed.error().message;
  ASSERT_TRUE(stream->wait(seconds(30)).ok());
  EXPECT_FALSE(log.end.exited);
  EXPECT_EQ(log.end.exit_code, -1);
  EXPECT_EQ(log.end.status, "signal: killed");
  auto unknown =
      agent().call("/process.Process/SendSignal", Json{{"process", {{"pid", 999999}}}, {"signal", "SIGNAL_SIGKILL"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, ErrorCode::kNotFound);

  CommandSpec slow;
  slow.command = "sleep 300";
  slow.timeout = seconds(2);
  auto start = Clock::now();
  auto r = vm_->exec(slow);
  EXPECT_LT(Clock::now() - start, seconds(20));
  if (r.ok()) {
    EXPECT_FALSE(r->exited);  // killed by the agent at the deadline
  } else {
    EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded);
  }
  EXPECT_EQ(run("pgrep -x sleep | wc -l").stdout_data, "0\n") << "the timed-out process survived";
}

TEST_F(AgentTest, ReattachAfterTheHostReconnects) {
  CommandSpec spec;
  spec.command = "for i in $(seq 1 60); do echo n$i; sleep 0.1; done";
  spec.tag = "counter";
  EventLog first;
  auto stream = agent().stream(
      "/process.Process/Start", agentproto::startRequest(spec), CallOptions{seconds(60), ""},
      [&](const Json& m) { first.on(m); }, nullptr);
  ASSERT_TRUE(first.waitFor([](EventLog& l) { return l.out.find("n2\n") != std::string::npos; }));
  int pid = first.pid;
  auto reconnected = vm_->reconnectAgent(seconds(30));  // drops the old connection and its streams
  ASSERT_TRUE(reconnected.ok()) << reconnected.error().message << "\n" << vm_->consoleTail(2000);
  auto listed = agent().call("/process.Process/List", Json::object());
  ASSERT_TRUE(listed.ok());
  bool found = false;
  for (const auto& p : (*listed)["processes"]) found = found || (p["pid"] == pid && p.value("tag", "") == "counter");
  EXPECT_TRUE(found) << listed->dump();
  EventLog second;
  auto again = agent().stream(
      "/process.Process/Connect", Json{{"process", {{"pid", pid}}}}, CallOptions{seconds(60), ""},
      [&](const Json& m) { second.on(m); }, nullptr);
  ASSERT_TRUE(again->wait(seconds(60)).ok());
  EXPECT_EQ(second.pid, pid);
  EXPECT_NE(second.out.find("n60\n"), std::string::npos) << second.out;
  EXPECT_TRUE(second.ended);
  auto gone = agent().stream("/process.Process/Connect", Json{{"process", {{"pid", 999999}}}},
                             CallOptions{seconds(10), ""}, nullptr, nullptr);
  auto end = gone->wait(seconds(10));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ErrorCode::kNotFound);
}

TEST_F(AgentTest, FilesystemCallsAndWatch) {
  auto mk = agent().call("/filesystem.Filesystem/MakeDir", Json{{"path", "watched"}});
  ASSERT_TRUE(mk.ok()) << mk.error().message;
  auto again = agent().call("/filesystem.Filesystem/MakeDir", Json{{"path", "watched"}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::kAlreadyExists);

  std::mutex m;
  std::condition_variable cv;
  std::vector<Json> events;
  Json req{{"path", "watched"}, {"recursive", true}};
  auto watch = agent().stream(
      "/filesystem.Filesystem/WatchDir", req, CallOptions{milliseconds(0), ""},
      [&](const Json& msg) {
        std::lock_guard<std::mutex> lock(m);
        events.push_back(msg);
        cv.notify_all();
      },
      nullptr);
  {
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, seconds(20), [&] { return !events.empty(); }));
    EXPECT_TRUE(events[0].contains("start"));
  }
  ASSERT_TRUE(agent().upload("watched/a.txt", std::string("hello")).ok());
  {
    std::unique_lock<std::mutex> lock(m);
    EXPECT_TRUE(cv.wait_for(lock, seconds(20), [&] {
      for (const auto& e : events) {
        if (e.contains("filesystem") && e["filesystem"].value("name", "") == "a.txt") return true;
      }
      return false;
    })) << Json(events).dump();
  }
  watch->cancel();
  (void)watch->wait(seconds(10));

  auto st = agent().call("/filesystem.Filesystem/Stat", Json{{"path", "watched/a.txt"}});
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)["entry"]["size"], "5");
  EXPECT_EQ((*st)["entry"]["permissions"], "-rw-r--r--");
  EXPECT_EQ((*st)["entry"]["owner"], "user");
  auto mv =
      agent().call("/filesystem.Filesystem/Move", Json{{"source", "watched/a.txt"}, {"destination", "watched/b.txt"}});
  ASSERT_TRUE(mv.ok());
  auto ls = agent().call("/filesystem.Filesystem/ListDir", Json{{"path", "watched"}, {"depth", 1}});
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ((*ls)["entries"].size(), 1u);
  EXPECT_EQ((*ls)["entries"][0]["name"], "b.txt");
  ASSERT_TRUE(agent().call("/filesystem.Filesystem/Remove", Json{{"path", "watched"}}).ok());
  auto gone = agent().call("/filesystem.Filesystem/Stat", Json{{"path", "watched"}});
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, ErrorCode::kNotFound);
}

TEST_F(AgentTest, DiskFullWriteFailsAndKeepsTheOldFile) {
  ASSERT_EQ(run("mkdir -p /mnt/small && mount -t tmpfs -o size=1m tmpfs /mnt/small && chmod 1777 /mnt/small", "root")
                .exit_code,
            0);
  ASSERT_TRUE(agent().upload("/mnt/small/keep.txt", std::string("original")).ok());
  auto full = agent().upload("/mnt/small/keep.txt", std::string(4 << 20, 'x'), CallOptions{seconds(60), ""});
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, ErrorCode::kResourceExhausted) << full.error().message;
  auto kept = agent().download("/mnt/small/keep.txt", 1024);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept.value(), "original");
  EXPECT_EQ(run("ls -A /mnt/small").stdout_data, "keep.txt\n") << "a temp file was left behind";
  run("umount /mnt/small", "root");
}

}  // namespace
}  // namespace space::vmm
