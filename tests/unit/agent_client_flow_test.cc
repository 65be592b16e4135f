// What a slow API client may do to the other calls on the same agent connection: nothing. The
// host's AgentClient on one end of a socketpair, the real agent Channel + HTTP/2 server on the
// other (its own EventLoop thread), with a test router. An upload's source and a download's
// sink stand in for the HTTP client of the REST API: they block, and the tests check that the
// client's I/O thread goes on serving every other call and keeping every deadline, that a
// blocked download holds back only its own stream, and that runCommand's callbacks never touch
// a frame that returned (run this binary under ASan: build-asan).
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "../support/agent_thread.h"
#include "agent/channel.h"
#include "agentproto/agent_client.h"
#include "agentproto/base64.h"
#include "agentproto/commands.h"

namespace space {
namespace {

using agent::Json;
using agentproto::AgentClient;
using agentproto::CallOptions;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testsupport::AgentThread;

// The host's per-stream receive window (agent_client.cc): what one stalled download may hold.
constexpr size_t kStreamWindow = 8 << 20;

// Where a test's source or sink blocks until the test lets it go. The wait is bounded so that a
// test failing on an implementation that blocks its I/O thread still ends.
class Gate {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Counts the caller as blocked, then waits for open(); false if that never came.
  bool block() {
    std::unique_lock<std::mutex> lock(m_);
    ++blocked_;
    cv_.notify_all();
    return cv_.wait_for(lock, seconds(30), [&] { return open_; });
  }
  bool waitBlocked(int n, milliseconds limit) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, limit, [&] { return blocked_ >= n; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
  int blocked_ = 0;
};

// Declared after the futures whose threads block on `gate`: opens it before they are joined.
struct OpenAtExit {
  Gate& gate;
  ~OpenAtExit() { gate.open(); }
};

bool eventually(const std::function<bool()>& cond, milliseconds limit) {
  auto until = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

char patternByte(size_t i) { return static_cast<char>((i * 131 + i / 7919) & 0xff); }

std::string pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = patternByte(i);
  return out;
}

class FlowTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    router_.unary("/test.Test/Echo", [](const Json& req, const agent::CallContext&) -> agent::UnaryResult {
      return Json{{"echo", req}};
    });

    // Uploads: every byte recorded; closes without finish() (the host reset the stream) counted.
    struct RecordingSink : agent::UploadSink {
      FlowTest* t;
      bool done = false;
      explicit RecordingSink(FlowTest* test) : t(test) {}
      ~RecordingSink() override { abort(); }
      std::optional<agent::RpcError> write(std::string_view chunk) override {
        std::lock_guard<std::mutex> lock(t->uploaded_m_);
        t->uploaded_.append(chunk);
        return std::nullopt;
      }
      agent::UnaryResult finish() override {
        done = true;
        t->upload_finishes_++;
        return Json{{"name", "f"}, {"type", "FILE_TYPE_FILE"}};
      }
      void abort() override {
        if (!done) t->upload_aborts_++;
        done = true;
      }
    };
    router_.upload(
        [this](const std::string&,
               const agent::CallContext&) -> std::variant<std::unique_ptr<agent::UploadSink>, agent::RpcError> {
          upload_opened_++;
          return std::make_unique<RecordingSink>(this);
        });

    // Downloads: "pattern:<n>" is n bytes of pattern(); bytes handed to HTTP/2 and sources
    // dropped (the stream closed) are counted.
    struct PatternSource : agent::DownloadSource {
      FlowTest* t;
      size_t size_;
      size_t off = 0;
      PatternSource(FlowTest* test, size_t n) : t(test), size_(n) {}
      ~PatternSource() override { t->download_closed_++; }
      uint64_t size() const override { return size_; }
      std::variant<size_t, agent::RpcError> read(char* out, size_t max) override {
        size_t n = std::min(max, size_ - off);
        for (size_t i = 0; i < n; ++i) out[i] = patternByte(off + i);
        off += n;
        t->download_read_ += n;
        return n;
      }
    };
    router_.download(
        [this](const std::string& path,
               const agent::CallContext&) -> std::variant<std::unique_ptr<agent::DownloadSource>, agent::RpcError> {
          if (path.rfind("pattern:", 0) != 0) return agent::rpcError(agent::RpcCode::kNotFound, "no " + path);
          return std::make_unique<PatternSource>(this, std::stoul(path.substr(8)));
        });

    // A process that writes stdout as fast as the host takes it, forever, whatever its deadline.
    struct Flood : std::enable_shared_from_this<Flood> {
      std::shared_ptr<agent::ServerStream> s;
      FlowTest* t;
      Json event{{"event", {{"data", {{"stdout", agentproto::base64Encode(std::string(4096, 'o'))}}}}}};
      void pump() {
        while (s->open() && s->queuedBytes() <= agent::ServerStream::kHighWater) {
          s->send(event);
          t->flood_messages_++;
        }
        if (s->open()) s->setOnDrain([self = shared_from_this()] { self->pump(); });
      }
    };
    // Two messages, then an error: what a relaying caller of streamRaw sees.
    router_.serverStream("/test.Test/Two",
                         [](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->send(Json{{"n", 1}, {"text", "caf\u00e9"}});
                           s->send(Json{{"n", 2}});
                           s->finish(agent::rpcError(agent::RpcCode::kNotFound, "gone"));
                         });
    router_.serverStream("/process.Process/Start",
                         [this](const Json&, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           s->setOnClose([this] { flood_closed_++; });
                           s->send(Json{{"event", {{"start", {{"pid", 42}}}}}});
                           auto flood = std::make_shared<Flood>();
                           flood->s = s;
                           flood->t = this;
                           flood->pump();
                         });
  }
  void TearDown() override {
    if (fds_[0] >= 0) close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  std::unique_ptr<AgentClient> connectClient() {
    auto c = AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + milliseconds(5000));
    fds_[1] = -1;
    EXPECT_TRUE(c.ok()) << c.error().message;
    return c.ok() ? std::move(c.value()) : nullptr;
  }
  // A unary call on its own thread, so that a test can say how long it may take even when the
  // client's I/O thread is stuck (then the call's own deadline cannot fire either).
  std::future<Result<Json>> echoAsync(AgentClient& client) {
    return std::async(std::launch::async, [&client] {
      return client.call("/test.Test/Echo", Json{{"x", 1}}, {seconds(5), ""});
    });
  }

  int fds_[2] = {-1, -1};
  agent::Router router_;
  std::mutex uploaded_m_;
  std::string uploaded_;
  std::atomic<int> upload_opened_{0};
  std::atomic<int> upload_finishes_{0};
  std::atomic<int> upload_aborts_{0};
  std::atomic<size_t> download_read_{0};
  std::atomic<int> download_closed_{0};
  std::atomic<uint64_t> flood_messages_{0};
  std::atomic<int> flood_closed_{0};
};

TEST_F(FlowTest, RawStreamsHandOverTheGuestsPayloadsAndParseOnlyTheEnd) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_NE(client, nullptr);
  struct Seen {
    std::mutex m;
    std::vector<std::string> payloads;
    std::optional<Status> end;
  };
  auto seen = std::make_shared<Seen>();
  auto stream = client->streamRaw(
      "/test.Test/Two", Json::object(), CallOptions{seconds(5), ""},
      [seen](std::string_view payload) {
        std::lock_guard lock(seen->m);
        seen->payloads.emplace_back(payload);
      },
      [seen](const Status& end) {
        std::lock_guard lock(seen->m);
        seen->end = end;
      });
  auto end = stream->wait(milliseconds(5000));
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.error().code, ErrorCode::kNotFound);
  std::lock_guard lock(seen->m);
  // Byte for byte as the agent framed them (UTF-8 kept as it was sent).
  EXPECT_EQ(seen->payloads, (std::vector<std::string>{R"({"n":1,"text":"café"})", R"({"n":2})"}));
  ASSERT_TRUE(seen->end.has_value());
  EXPECT_EQ(seen->end->error().message, "gone");
}

// A unary call nobody waits for: its answer, or its error, reaches the callback exactly once,
// and the caller's thread never waits (housekeeping asks guests for their figures so).
TEST_F(FlowTest, AnAsyncCallAnswersItsCallbackOnceWithoutTheCallerWaiting) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_NE(client, nullptr);
  struct Answers {
    std::mutex m;
    std::vector<Result<Json>> got;
  };
  auto answers = std::make_shared<Answers>();
  auto record = [answers](Result<Json> answer) {
    std::lock_guard lock(answers->m);
    answers->got.push_back(std::move(answer));
  };
  client->callAsync("/test.Test/Echo", Json{{"n", 7}}, CallOptions{seconds(5), ""}, record);
  client->callAsync("/test.Test/Missing", Json::object(), CallOptions{seconds(5), ""}, record);
  ASSERT_TRUE(eventually(
      [&] {
        std::lock_guard lock(answers->m);
        return answers->got.size() == 2;
      },
      milliseconds(5000)));
  std::this_thread::sleep_for(milliseconds(50));  // nothing more comes
  std::lock_guard lock(answers->m);
  ASSERT_EQ(answers->got.size(), 2u);
  int echoed = 0, failed = 0;
  for (const auto& answer : answers->got) {
    if (answer.ok()) {
      EXPECT_EQ(answer.value(), (Json{{"echo", {{"n", 7}}}}));
      ++echoed;
    } else {
      EXPECT_NE(answer.error().message.find("no method"), std::string::npos) << answer.error().message;
      ++failed;
    }
  }
  EXPECT_EQ(echoed, 1);
  EXPECT_EQ(failed, 1);
  // An answer over the caller's bound fails that call alone; the next one works.
  CallOptions small{seconds(5), ""};
  small.max_response_bytes = 4096;
  std::promise<Result<Json>> big_answer;
  client->callAsync("/test.Test/Echo", Json{{"pad", std::string(8192, 'x')}}, small,
                    [&big_answer](Result<Json> answer) { big_answer.set_value(std::move(answer)); });
  auto big_future = big_answer.get_future();
  ASSERT_EQ(big_future.wait_for(seconds(5)), std::future_status::ready);
  auto big = big_future.get();
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("exceeds 4096 bytes"), std::string::npos) << big.error().message;
  auto fits = client->call("/test.Test/Echo", Json{{"pad", "y"}}, small);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  // A client without a connection answers at once, on the caller's thread.
  auto none = agentproto::AgentClient::disconnected("no guest");
  std::optional<Result<Json>> at_once;
  none->callAsync("/test.Test/Echo", Json::object(), CallOptions{seconds(5), ""},
                  [&](Result<Json> answer) { at_once = std::move(answer); });
  ASSERT_TRUE(at_once.has_value());
  ASSERT_FALSE(at_once->ok());
  EXPECT_EQ(at_once->error().code, ErrorCode::kUnavailable);
}

TEST_F(FlowTest, UploadSourceThatBlocksStallsNeitherOtherCallsNorItsDeadline) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  Gate gate;
  std::future<Result<Json>> upload, echo;
  OpenAtExit opener{gate};
  std::atomic<int> source_calls{0};
  const auto started = Clock::now();
  upload = std::async(std::launch::async, [&] {
    return client->upload(
        "held",
        [&](char* out, size_t max) -> Result<size_t> {
          if (source_calls++ == 0) {
            size_t n = std::min<size_t>(max, 1000);
            memset(out, 'u', n);
            return n;
          }
          // An API client that sent 1000 bytes and then nothing.
          if (!gate.block()) return makeError(ErrorCode::kInternal, "the test never opened the gate");
          return makeError(ErrorCode::kInvalidArgument, "the client went away");
        },
        CallOptions{milliseconds(500), ""});
  });
  ASSERT_TRUE(gate.waitBlocked(1, seconds(5)));

  echo = echoAsync(*client);
  ASSERT_EQ(echo.wait_for(seconds(2)), std::future_status::ready) << "a blocked upload source stalled another call";
  auto answer = echo.get();
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  EXPECT_EQ((*answer)["echo"]["x"], 1);

  // The upload's deadline resets its stream while the source is still blocked: the guest
  // drops the partial file then, not whenever the API client gets round to it.
  ASSERT_TRUE(eventually([&] { return upload_aborts_ > 0; }, seconds(3))) << "the upload's deadline did not fire";
  EXPECT_LT(Clock::now() - started, milliseconds(2500));
  EXPECT_EQ(upload.wait_for(milliseconds(0)), std::future_status::timeout) << "upload() returned while its source ran";
  gate.open();
  ASSERT_EQ(upload.wait_for(seconds(3)), std::future_status::ready);
  auto r = upload.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded) << r.error().message;
  EXPECT_EQ(source_calls.load(), 2) << "the source was called again after the call ended";
  EXPECT_EQ(upload_finishes_.load(), 0);
  EXPECT_TRUE(client->call("/test.Test/Echo", Json::object()).ok());
}

// The source's bytes arrive whole and in order, whether it trickles (the I/O thread finds the
// buffer empty and parks the stream, the producer resumes it) or floods (the producer waits for
// room in the bounded buffer).
TEST_F(FlowTest, PipedUploadDeliversEveryByteInOrder) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  const std::string expected = pattern(3 << 20);
  size_t off = 0;
  int calls = 0;
  auto r = client->upload(
      "whole",
      [&](char* out, size_t max) -> Result<size_t> {
        EXPECT_LE(max, AgentClient::kUploadChunk);
        ++calls;
        size_t want = calls <= 40 ? 100 + static_cast<size_t>(calls) : max - static_cast<size_t>(calls % 7);
        if (calls <= 40) std::this_thread::sleep_for(milliseconds(2));
        size_t n = std::min(want, expected.size() - off);
        memcpy(out, expected.data() + off, n);
        off += n;
        return n;
      },
      CallOptions{seconds(30), ""});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(upload_finishes_.load(), 1);
  std::lock_guard<std::mutex> lock(uploaded_m_);
  ASSERT_EQ(uploaded_.size(), expected.size());
  EXPECT_TRUE(uploaded_ == expected) << "upload bytes arrived altered or out of order";
}

TEST_F(FlowTest, UploadSourceErrorFailsTheUploadWithIt) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  int calls = 0;
  auto r = client->upload(
      "broken",
      [&](char* out, size_t max) -> Result<size_t> {
        if (++calls > 3) return makeError(ErrorCode::kInvalidArgument, "body cut short");
        memset(out, 'b', max);
        return max;
      },
      CallOptions{seconds(10), ""});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.error().message, "body cut short");
  // The reset may even overtake the request's headers: then the guest never opened a file.
  EXPECT_TRUE(eventually([&] { return upload_aborts_ == upload_opened_; }, seconds(3)));
  EXPECT_EQ(upload_finishes_.load(), 0);
  EXPECT_TRUE(client->call("/test.Test/Echo", Json::object()).ok());
}

// Five downloads whose readers stall: each holds one stream window (8 MiB) and no more, the
// guest stops sending on those streams only, and a call on the same connection still goes
// through. Together they hold more (40 MiB) than the connection's window (32 MiB): had the
// connection-level window waited for the readers too, nothing at all could arrive now.
TEST_F(FlowTest, DownloadSinksThatBlockHoldBackOnlyTheirOwnStreams) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  constexpr int kDownloads = 5;
  constexpr size_t kSize = 12 << 20;
  Gate gate;
  std::vector<std::future<std::pair<Status, std::string>>> downloads;
  std::future<Result<Json>> echo;
  OpenAtExit opener{gate};
  for (int i = 0; i < kDownloads; ++i) {
    downloads.push_back(std::async(std::launch::async, [&] {
      std::string got;
      bool first = true;
      auto st = client->download(
          "pattern:" + std::to_string(kSize),
          [&](std::string_view chunk) -> Status {
            if (first) {
              first = false;
              // An API client that stopped reading.
              if (!gate.block()) return makeError(ErrorCode::kInternal, "the test never opened the gate");
            }
            got.append(chunk);
            return okStatus();
          },
          CallOptions{seconds(60), ""});
      return std::make_pair(st, std::move(got));
    }));
  }
  ASSERT_TRUE(gate.waitBlocked(kDownloads, seconds(5))) << "a blocked sink kept the other downloads from starting";
  const size_t filled = kDownloads * (kStreamWindow - (64 << 10));
  ASSERT_TRUE(eventually([&] { return download_read_ >= filled; }, seconds(10)))
      << "the guest sent " << download_read_ << " bytes, want " << filled;

  echo = echoAsync(*client);
  ASSERT_EQ(echo.wait_for(seconds(2)), std::future_status::ready) << "blocked download sinks stalled another call";
  EXPECT_TRUE(echo.get().ok());
  // Flow control holds the guest at one window per stream while nobody reads.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_LE(download_read_.load(), kDownloads * kStreamWindow);

  gate.open();
  const std::string expected = pattern(kSize);
  for (auto& d : downloads) {
    ASSERT_EQ(d.wait_for(seconds(30)), std::future_status::ready);
    auto [st, got] = d.get();
    ASSERT_TRUE(st.ok()) << st.error().message;
    ASSERT_EQ(got.size(), kSize);
    EXPECT_TRUE(got == expected) << "download bytes arrived altered or out of order";
  }
}

TEST_F(FlowTest, DownloadDeadlineFiresWhileItsSinkBlocks) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  Gate gate;
  std::future<Status> download;
  OpenAtExit opener{gate};
  std::atomic<int> sink_calls{0};
  const auto started = Clock::now();
  download = std::async(std::launch::async, [&] {
    return client->download(
        "pattern:" + std::to_string(32 << 20),
        [&](std::string_view) -> Status {
          if (sink_calls++ == 0 && !gate.block()) {
            return makeError(ErrorCode::kInternal, "the test never opened the gate");
          }
          return okStatus();
        },
        CallOptions{milliseconds(500), ""});
  });
  ASSERT_TRUE(gate.waitBlocked(1, seconds(5)));
  ASSERT_TRUE(eventually([&] { return download_closed_ > 0; }, seconds(3))) << "the download's deadline did not fire";
  EXPECT_LT(Clock::now() - started, milliseconds(2500));
  gate.open();
  ASSERT_EQ(download.wait_for(seconds(3)), std::future_status::ready);
  auto st = download.get();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kDeadlineExceeded) << st.error().message;
  EXPECT_EQ(sink_calls.load(), 1) << "the sink was called again after the call ended";
  EXPECT_TRUE(client->call("/test.Test/Echo", Json::object()).ok());
}

TEST_F(FlowTest, DownloadSinkErrorCancelsOnlyThatDownload) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  auto st = client->download(
      "pattern:" + std::to_string(16 << 20),
      [](std::string_view) -> Status { return makeError(ErrorCode::kCanceled, "the client went away"); },
      CallOptions{seconds(10), ""});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kCanceled);
  EXPECT_TRUE(eventually([&] { return download_closed_ > 0; }, seconds(3)));
  auto small = client->download("pattern:100000", 1 << 20, CallOptions{seconds(10), ""});
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ(small.value(), pattern(100000));
}

// runCommand gives up (abandoned by its caller, or at its deadline) while the process's output
// still streams in. Its stream's callbacks may go on running on the I/O thread for a while
// after it returned; under ASan a callback that touched runCommand's dead frame fails here.
TEST_F(FlowTest, RunCommandLeavingEarlyLeavesNoCallbackADeadFrame) {
  AgentThread agent(fds_[0], router_);
  auto client = connectClient();
  ASSERT_TRUE(client);
  agentproto::CommandSpec spec;
  spec.command = "flood";
  spec.timeout = seconds(60);
  std::atomic<int> asked{0};
  auto started = Clock::now();
  // Output beyond 1 MiB is dropped (and fails the command), so the flood costs no memory.
  auto abandoned = agentproto::runCommand(*client, spec, 1 << 20, [&] { return ++asked >= 1; });
  ASSERT_FALSE(abandoned.ok());
  EXPECT_EQ(abandoned.error().code, ErrorCode::kCanceled) << abandoned.error().message;
  EXPECT_LT(Clock::now() - started, seconds(5));
  // Output keeps arriving until the cancel is carried out; then the guest sees the stream close.
  ASSERT_TRUE(eventually([&] { return flood_closed_ == 1; }, seconds(5)));
  EXPECT_GT(flood_messages_.load(), 0u);

  // The same at runCommand's own deadline (the process's 100 ms plus the 5 s grace).
  spec.timeout = milliseconds(100);
  started = Clock::now();
  auto expired = agentproto::runCommand(*client, spec, 1 << 20);
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.error().code, ErrorCode::kDeadlineExceeded) << expired.error().message;
  EXPECT_LT(Clock::now() - started, seconds(8));
  ASSERT_TRUE(eventually([&] { return flood_closed_ == 2; }, seconds(5)));
  EXPECT_TRUE(client->call("/test.Test/Echo", Json::object()).ok());
}

#if defined(__x86_64__)
// In the calling process from now on, creating a thread fails with EAGAIN, as when the host is
// out of threads (pids.max, threads-max). Other clones (fork) still work.
bool denyNewThreads() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      // clone3's flags sit behind a pointer BPF cannot follow: refuse it as an old kernel
      // would, so that glibc falls back to clone, whose flags it can see.
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone3, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAGAIN),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

// A host out of threads gets an error it can answer 503 with, not a terminated daemon. The
// client connects in a child process whose thread creation is made to fail.
TEST_F(FlowTest, IoThreadThatCannotStartIsAnErrorNotATermination) {
  // Forked before the agent's thread starts: a child forked while another thread holds an
  // allocator lock (ASan's, malloc's) can hang in its first allocation (it did once, in CI). The
  // child only needs the socket; the parent's agent answers it from here on.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child never returns into the test runner, and ends with _exit(): no atexit work
    // (LeakSanitizer's needs a thread).
    if (!denyNewThreads()) _exit(10);
    try {
      auto c = AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + milliseconds(5000));
      if (c.ok()) _exit(11);
      if (c.error().code != ErrorCode::kResourceExhausted || c.error().reason != "insufficient_capacity") _exit(12);
    } catch (...) {
      _exit(13);
    }
    _exit(0);
  }
  AgentThread agent(fds_[0], router_);
  close(fds_[1]);
  fds_[1] = -1;
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == 10) GTEST_SKIP() << "seccomp filters are not available here";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "11: connected anyway; 12: another error; 13: it threw (spaced would "
                                       "terminate)";
}
#endif

}  // namespace
}  // namespace space
