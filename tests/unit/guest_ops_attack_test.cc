// GuestOps under a hostile guest: the real agent transport (AgentThread over a socketpair) with
// a scripted, malicious agent behind it. Each test names the attack and what spaced must keep:
// no exception, bounded memory, canonical pass-through, no hang, no use after free.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/agent_thread.h"
#include "../support/raw_http.h"
#include "agentproto/base64.h"
#include "common/bounded_json.h"
#include "guest/guest_ops.h"

namespace space::guest {
namespace {

using agent::Json;
using agentproto::base64Decode;
using agentproto::base64DecodedSize;
using agentproto::base64Encode;
using std::chrono::milliseconds;
using std::chrono::seconds;

class GuestOpsAttackTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    for (const char* method : {"/process.Process/List", "/filesystem.Filesystem/ListDir",
                               "/filesystem.Filesystem/MakeDir", "/filesystem.Filesystem/Move"}) {
      router_.unary(method, [this](const Json&, const agent::CallContext&) {
        std::lock_guard lock(m_);
        // Moved, not copied: the agent side's DOM stays out of the host's measured peak.
        return agent::UnaryResult(std::move(answer_));
      });
    }
    router_.unary("/process.Process/SendInput",
                  [](const Json&, const agent::CallContext&) { return agent::UnaryResult(Json::object()); });
    router_.unary("/process.Process/CloseStdin",
                  [](const Json&, const agent::CallContext&) { return agent::UnaryResult(Json::object()); });
    // cmd "script": each arg is one message (JSON text); "tiny": start, then empty stdout events
    // as fast as the host takes them; "hang": start, then nothing, never finished.
    router_.serverStream("/process.Process/Start",
                         [this](const Json& req, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           const Json& p = req["process"];
                           std::string cmd = p.value("cmd", "");
                           if (cmd == "script") {
                             for (const auto& a : p.value("args", Json::array()))
                               s->send(Json::parse(a.get<std::string>()));
                             s->finish();
                           } else if (cmd == "tiny") {
                             s->send(Json{{"event", {{"start", {{"pid", 9}}}}}});
                             auto t = std::make_shared<Tiny>();
                             t->s = s;
                             t->sent = &tiny_sent_;
                             t->pump();
                           } else {
                             s->send(Json{{"event", {{"start", {{"pid", 9}}}}}});
                             hung_.push_back(s);  // agent thread only
                           }
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
  void answer(Json a) {
    std::lock_guard lock(m_);
    answer_ = std::move(a);
  }
  static ProcessSpec script(const std::vector<std::string>& messages) {
    ProcessSpec spec;
    spec.argv = {"script"};
    for (const auto& m : messages) spec.argv.push_back(m);
    return spec;
  }
  static ProcessStream::Batch drain(ProcessStream& s, std::vector<ProcessEvent>* events = nullptr) {
    ProcessStream::Batch last;
    for (int i = 0; i < 100; ++i) {
      last = s.next(milliseconds(200));
      if (events)
        for (auto& e : last.events) events->push_back(std::move(e));
      if (last.state != ProcessStream::State::kOpen) break;
    }
    return last;
  }

  struct Tiny : std::enable_shared_from_this<Tiny> {
    std::shared_ptr<agent::ServerStream> s;
    std::atomic<size_t>* sent = nullptr;
    Json event = Json{{"event", {{"data", {{"stdout", ""}}}}}};
    void pump() {
      while (s->open() && s->queuedBytes() <= agent::ServerStream::kHighWater) {
        s->send(event);
        ++*sent;
      }
      if (s->open()) s->setOnDrain([self = shared_from_this()] { self->pump(); });
    }
  };

  int fds_[2] = {-1, -1};
  agent::Router router_;
  std::unique_ptr<testsupport::AgentThread> agent_thread_;
  std::unique_ptr<GuestOps> ops_;
  std::mutex m_;
  Json answer_ = Json::object();
  std::vector<std::shared_ptr<agent::ServerStream>> hung_;
  std::atomic<size_t> tiny_sent_{0};  // events the "tiny" process has sent
};

// The pass-through check must accept exactly what the decoder accepts, with the same size:
// every 4-character string over an alphabet with padding, bad characters and NUL, every
// 8-character one over a smaller set, and random strings of the alphabet.
TEST(GuestOpsAttack, Base64DecodedSizeAgreesWithBase64Decode) {
  auto agree = [](const std::string& s) {
    auto size = base64DecodedSize(s);
    auto decoded = base64Decode(s);
    ASSERT_EQ(size.has_value(), decoded.has_value()) << "'" << s << "'";
    if (size) {
      ASSERT_EQ(*size, decoded->size()) << s;
      ASSERT_EQ(base64Encode(*decoded), s) << s;  // canonical: re-encoding gives it back
    }
  };
  const std::string four = std::string("AQgwBb/+9=$-_ \n") + '\0' + "\x80\xff";
  std::string s(4, 'A');
  for (char a : four)
    for (char b : four)
      for (char c : four)
        for (char d : four) {
          s = {a, b, c, d};
          agree(s);
          agree("AAAA" + s);
          agree(s + "AAAA");
        }
  const std::string eight = "AQ=/";
  for (int n = 0; n < (1 << 16); ++n) {
    std::string t;
    for (int k = 0; k < 8; ++k) t += eight[(n >> (2 * k)) & 3];
    agree(t);
  }
  std::mt19937 rng(7);
  const std::string all = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";
  for (int n = 0; n < 200000; ++n) {
    std::string t(4 * (1 + rng() % 4), 'A');
    for (auto& ch : t) ch = all[rng() % all.size()];
    agree(t);
  }
  agree("");
}

// Every shape a hostile agent could answer with: no exception escapes, each is either a typed
// value or `unavailable`.
TEST_F(GuestOpsAttackTest, HostileAnswerShapesNeverThrow) {
  const char* shapes[] = {
      "null",
      "1",
      "\"x\"",
      "[]",
      "{}",
      "[[]]",
      R"({"entries": null})",
      R"({"entries": {}})",
      R"({"entries": [null]})",
      R"({"entries": [[]]})",
      R"({"entries": [{"name": null, "size": null, "mode": null}]})",
      R"({"entries": [{"size": 18446744073709551615}]})",
      R"({"entries": [{"size": "18446744073709551615"}]})",
      R"({"entries": [{"size": "18446744073709551616"}]})",
      R"({"entries": [{"size": ""}]})",
      R"({"entries": [{"size": "+1"}]})",
      R"({"entries": [{"size": " 1"}]})",
      R"({"entries": [{"size": true}]})",
      R"({"entries": [{"mode": 18446744073709551615}]})",
      R"({"entries": [{"mode": -1}]})",
      R"({"entries": [{"mode": 4095.0}]})",
      R"({"entries": [{"type": 3}]})",
      R"({"entry": null})",
      R"({"entry": []})",
      R"({"entry": "x"})",
      R"({"processes": null})",
      R"({"processes": [{"pid": 18446744073709551615}]})",
      R"({"processes": [{"pid": 9223372036854775808}]})",
      R"({"processes": [{"pid": 2147483648}]})",
      R"({"processes": [{"pid": 1, "config": null}]})",
      R"({"processes": [{"pid": 1, "config": {"args": null}}]})",
      R"({"processes": [{"pid": 1, "config": {"args": [null]}}]})",
      R"({"processes": [{"pid": 1.0}]})",
      R"({"processes": [{"pid": true}]})",
      R"({"processes": [{"pid": 1, "tag": {}}]})",
  };
  for (const char* shape : shapes) {
    SCOPED_TRACE(shape);
    EXPECT_NO_THROW({
      answer(Json::parse(shape));
      auto r = ops_->listDir("/", 1, "");
      if (!r.ok()) {
        EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
      }
      answer(Json::parse(shape));
      auto p = ops_->listProcesses();
      if (!p.ok()) {
        EXPECT_EQ(p.error().code, ErrorCode::kUnavailable);
      }
      answer(Json::parse(shape));
      auto d = ops_->makeDir("/x", "");
      if (!d.ok()) {
        EXPECT_EQ(d.error().code, ErrorCode::kUnavailable);
      }
    });
  }
}

TEST_F(GuestOpsAttackTest, HostileEventShapesNeverThrow) {
  const std::vector<std::string> events = {R"({"event": {"start": {"pid": 18446744073709551615}}})",
                                           R"({"event": {"start": {"pid": 9223372036854775808}}})",
                                           R"({"event": {"start": null}})",
                                           R"({"event": {"start": []}})",
                                           R"({"event": {"data": null}})",
                                           R"({"event": {"data": {"stdout": null}}})",
                                           R"({"event": {"data": {"stderr": []}}})",
                                           R"({"event": {"end": null}})",
                                           R"({"event": {"end": {"exitCode": "1"}}})",
                                           R"({"event": {"end": {"status": 1, "exited": "yes"}}})",
                                           R"({"event": null})",
                                           R"({"event": []})",
                                           R"({"event": {}})",
                                           "null",
                                           "[]",
                                           "\"x\""};
  for (const auto& e : events) {
    SCOPED_TRACE(e);
    EXPECT_NO_THROW({
      auto s = ops_->start(script({R"({"event": {"start": {"pid": 3}}})", e}));
      ASSERT_TRUE(s.ok());
      auto last = drain(*s.value());
      EXPECT_EQ(last.state, ProcessStream::State::kEnded);
    });
  }
}

// An exit code of 2^64-1 is an unsigned JSON number; get<int64_t> would wrap it to -1 and pass
// an INT_MIN..INT_MAX check. It is malformed, as any exit code outside int.
TEST_F(GuestOpsAttackTest, AnUnsignedExitCodeOverIntIsMalformed) {
  auto s = ops_->start(script({R"({"event": {"end": {"exitCode": 18446744073709551615, "exited": true}}})"}));
  ASSERT_TRUE(s.ok());
  std::vector<ProcessEvent> events;
  auto last = drain(*s.value(), &events);
  EXPECT_EQ(last.state, ProcessStream::State::kEnded);
  EXPECT_TRUE(last.error.has_value()) << "exit code 2^64-1 accepted";
  for (const auto& e : events) EXPECT_NE(e.kind, ProcessEvent::Kind::kEnd) << "accepted as " << e.end.exit_code;
}

// What refusing such an answer may cost at its peak: the answer's bytes on both ends of the
// test's socket pair and the bounds scan (unbounded, it was ~1 GB).
#if defined(__SANITIZE_ADDRESS__)
// ASan's quarantine also keeps freed blocks (256 MB by default), so its peak counts memory that
// was already given back: still well under the unbounded cost, which ASan multiplies too.
constexpr size_t kPeakBound = size_t{400} << 20;
#else
constexpr size_t kPeakBound = size_t{64} << 20;
#endif

// A guest answers ListDir with a million empty entries: 3 MB of JSON, within the 16 MiB unary
// limit. Decoded, each entry costs a few hundred bytes (once as a FileEntry, again as the API's
// output): without bounds this cost ~1 GB. Now the value bound (containers count) refuses the
// answer, and spaced's peak grows by no more than a small multiple of what it accepts.
TEST_F(GuestOpsAttackTest, AMillionEmptyDirectoryEntriesAreRefusedCheaply) {
  constexpr size_t kEntries = (size_t{1} << 20) - 16;
  {
    Json entries = Json::array();
    entries.get_ref<Json::array_t&>().resize(kEntries, Json::object());
    answer(Json{{"entries", std::move(entries)}});
  }
  testsupport::resetPeakResident();
  size_t before = testsupport::peakResidentBytes();
  auto listed = ops_->listDir("/", 1, "");
  size_t growth = testsupport::peakGrowth(before);
  std::printf("listDir of %zu empty entries: %s; peak growth %zu MB\n", kEntries,
              listed.ok() ? "accepted" : listed.error().message.c_str(), growth >> 20);
  EXPECT_FALSE(listed.ok());
  EXPECT_LT(growth, kPeakBound) << "a 3 MB ListDir answer grew spaced's peak by " << (growth >> 20) << " MB";
}

// Within the value bound, the entry cap: 50,000 entries are a listing, one more is refused
// with a message that says what to do.
TEST_F(GuestOpsAttackTest, AListingOverTheEntryCapIsRefusedWithAdvice) {
  for (size_t n : {size_t{50000}, size_t{50001}}) {
    Json entries = Json::array();
    entries.get_ref<Json::array_t&>().resize(n, Json{{"name", "f"}});
    answer(Json{{"entries", std::move(entries)}});
    auto listed = ops_->listDir("/", 1, "");
    if (n == 50000) {
      ASSERT_TRUE(listed.ok()) << listed.error().message;
      EXPECT_EQ(listed->size(), n);
    } else {
      ASSERT_FALSE(listed.ok());
      EXPECT_EQ(listed.error().code, ErrorCode::kInvalidArgument);
      EXPECT_EQ(listed.error().reason, "listing_too_large");
      EXPECT_NE(listed.error().message.find("narrower path"), std::string::npos) << listed.error().message;
    }
  }
}

// The same for Process/List: a million {"pid":1}; and over pid_max (32768) processes is malformed.
TEST_F(GuestOpsAttackTest, AMillionProcessesAreRefusedCheaply) {
  for (size_t n : {(size_t{1} << 20) - 16, size_t{32769}}) {
    {
      Json list = Json::array();
      list.get_ref<Json::array_t&>().resize(n, Json{{"pid", 1}});
      answer(Json{{"processes", std::move(list)}});
    }
    testsupport::resetPeakResident();
    size_t before = testsupport::peakResidentBytes();
    auto listed = ops_->listProcesses();
    size_t growth = testsupport::peakGrowth(before);
    EXPECT_FALSE(listed.ok()) << n << " processes accepted";
    EXPECT_LT(growth, kPeakBound) << n << " processes grew spaced's peak by " << (growth >> 20) << " MB";
  }
}

// The value bound once counted only commas, so a member nested 62 levels deep cost 1 of the 2^20
// values while building 62 DOM nodes. Any unary answer or stream envelope from the guest goes
// through it. Containers count now.
TEST(GuestOpsAttack, NestedMembersAreCountedOnceByTheValueBound) {
  std::string member = std::string(62, '[') + std::string(62, ']');
  std::string text = "{\"entries\":[";
  size_t members = (size_t{16} << 20) / (member.size() + 1) - 1;
  for (size_t i = 0; i < members; ++i) {
    if (i) text += ',';
    text += member;
  }
  text += "]}";
  testsupport::resetPeakResident();
  size_t before = testsupport::peakResidentBytes();
  size_t growth = 0;
  {
    auto parsed = parseJsonBounded(text);
    growth = testsupport::peakGrowth(before);
    std::printf("%zu bytes, %zu members x 62 levels = %zu values accepted under a 2^20 bound; peak growth %zu MB\n",
                text.size(), members, members * 62, growth >> 20);
    EXPECT_FALSE(parsed.ok()) << "accepted " << members * 62 << " values, over the bound of " << (1 << 20);
  }
}

// Empty data events cost kEventOverhead (64) in the backlog; each is a ProcessEvent in a vector
// that grows by doubling. How much does a full backlog of them hold?
TEST_F(GuestOpsAttackTest, ABacklogOfEmptyEventsHoldsAboutItsBound) {
  ProcessSpec spec;
  spec.argv = {"tiny"};
  StreamLimits limits;
  limits.max_backlog = 256 << 10;
  auto stream = ops_->start(spec, limits);
  ASSERT_TRUE(stream.ok());
  // A consumer that does not read until the backlog is full: it looks once the guest has sent
  // more than the backlog holds (kEventOverhead each) and the flow-control windows and buffers
  // between them can carry, or has stopped sending because nothing more is taken, however slow
  // the machine (ASan under load sent fewer than 3,000 in 3 s).
  const size_t fills = limits.max_backlog / 64;
  size_t last = 0;
  auto last_change = std::chrono::steady_clock::now();
  for (auto until = last_change + std::chrono::seconds(45); std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(50));
    const size_t now_sent = tiny_sent_;
    if (now_sent != last) {
      last = now_sent;
      last_change = std::chrono::steady_clock::now();
    }
    if (now_sent >= fills + 65536) break;
    if (now_sent > fills && std::chrono::steady_clock::now() - last_change > milliseconds(500)) break;
  }
  // The guest has sent enough, but under load the client's I/O thread may not have taken it all
  // yet: a reader that looks every 3 s reads until the overflow shows, each batch bounded.
  ProcessStream::Batch batch;
  size_t held = 0;
  for (int i = 0; i < 6; ++i) {
    if (i > 0) std::this_thread::sleep_for(milliseconds(3000));  // a reader that looks rarely
    batch = stream.value()->next(milliseconds(2000));
    held = std::max(held, batch.events.capacity() * sizeof(ProcessEvent));
    std::printf("%zu events in one batch, capacity %zu x %zu bytes for a %zu KB backlog\n", batch.events.size(),
                batch.events.capacity(), sizeof(ProcessEvent), limits.max_backlog >> 10);
    if (batch.state != ProcessStream::State::kOpen) break;
  }
  EXPECT_EQ(batch.state, ProcessStream::State::kOverflow);
  EXPECT_LE(held, 2 * limits.max_backlog);
}

// A guest that never ends its stream, and ignores the cancel: destroying the stream returns
// quickly (the cancel is local), and repeated start/destroy under a flood frees everything.
TEST_F(GuestOpsAttackTest, StreamsOfAStalledOrFloodingGuestAreReleasedPromptly) {
  ProcessSpec hang;
  hang.argv = {"hang"};
  hang.timeout = milliseconds(0);
  for (int i = 0; i < 5; ++i) {
    auto s = ops_->start(hang);
    ASSERT_TRUE(s.ok());
    (void)s.value()->next(milliseconds(100));
    auto t0 = std::chrono::steady_clock::now();
    s.value().reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(1));
  }
  ProcessSpec tiny;
  tiny.argv = {"tiny"};
  // 10: each abandoned stream floods until its reset arrives, and under ASan the client's I/O
  // thread needs about a second per stream's worth to drain (more on a loaded machine: 20 ran
  // past the call timeout below with twice as many tests as cores); 50 came within a hair of it
  // on an idle one.
  for (int i = 0; i < 10; ++i) {
    auto s = ops_->start(tiny, StreamLimits{1 << 20});
    ASSERT_TRUE(s.ok());
    (void)s.value()->next(milliseconds(i % 3));
  }
  // The client still works.
  answer(Json{{"entries", Json::array()}});
  EXPECT_TRUE(ops_->listDir("/", 1, "").ok());
}

}  // namespace
}  // namespace space::guest
