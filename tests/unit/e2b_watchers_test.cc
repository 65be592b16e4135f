// The polling watchers of the envd front end over the real agent transport (AgentThread, as in
// the guest command tests), with a scripted WatchDir: what a poll returns, what ends a watcher,
// and the bounds a client that never polls, or a guest that floods events, runs into.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../support/agent_thread.h"
#include "e2b/watchers.h"

namespace space::e2b {
namespace {

using agent::Json;
using std::chrono::milliseconds;
using std::chrono::seconds;

class WatcherTableTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    // The watched path says what the guest does: "two" starts and sends two events, "flood"
    // 50 after the start, "big" one 64 KiB event, "missing" fails, "silent" says nothing.
    router_.serverStream("/filesystem.Filesystem/WatchDir",
                         [](const Json& req, const agent::CallContext&, std::shared_ptr<agent::ServerStream> s) {
                           const std::string path = req.value("path", "");
                           if (path == "missing")
                             return s->finish(agent::rpcError(agent::RpcCode::kNotFound, "no such directory"));
                           if (path == "silent") return;  // the transport keeps the stream open
                           s->send(Json{{"start", Json::object()}});
                           const int n = path == "two" || path == "dies" ? 2 : path == "flood" ? 50 : 1;
                           for (int i = 0; i < n; ++i) {
                             std::string name = path == "big" ? std::string(64 << 10, 'x') : "f" + std::to_string(i);
                             s->send(Json{{"filesystem", {{"name", name}, {"type", "EVENT_TYPE_CREATE"}}}});
                           }
                           if (path == "dies") {
                             s->finish(agent::rpcError(agent::RpcCode::kUnavailable, "the sandbox went away"));
                           }
                         });
    agent_thread_ = std::make_unique<testsupport::AgentThread>(fds_[0], router_);
    auto client = agentproto::AgentClient::connect(UniqueFd(fds_[1]), Clock::now() + seconds(5));
    fds_[1] = -1;
    ASSERT_TRUE(client.ok()) << client.error().message;
    agent_ = std::move(client.value());
  }
  void TearDown() override {
    agent_.reset();
    agent_thread_.reset();
    if (fds_[0] >= 0) close(fds_[0]);
  }
  Result<std::string> create(WatcherTable& table, const std::string& path, const std::string& tenant = "t1",
                             const std::string& sandbox = "sb1") {
    agentproto::CallOptions options;
    options.timeout = milliseconds(0);
    return table.create(tenant, sandbox, *agent_, Json{{"path", path}}, options, milliseconds(2000));
  }
  // Polls until `want` events came or two seconds passed.
  std::vector<std::string> poll(WatcherTable& table, const std::string& id, size_t want) {
    std::vector<std::string> names;
    for (int i = 0; i < 100 && names.size() < want; ++i) {
      auto got = table.events("t1", "sb1", id);
      if (!got.ok()) break;
      for (const auto& e : Json::parse(got.value())) names.push_back(e["name"]);
      if (names.size() < want) std::this_thread::sleep_for(milliseconds(20));
    }
    return names;
  }

  int fds_[2] = {-1, -1};
  agent::Router router_;
  std::unique_ptr<testsupport::AgentThread> agent_thread_;
  std::unique_ptr<agentproto::AgentClient> agent_;
};

TEST_F(WatcherTableTest, EventsArePolledOnceAndAWatcherIsRemoved) {
  WatcherTable table;
  auto id = create(table, "two");
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(id->size(), 32u);
  EXPECT_EQ(poll(table, id.value(), 2), (std::vector<std::string>{"f0", "f1"}));
  EXPECT_EQ(table.events("t1", "sb1", id.value()).value(), "[]");
  // Only its tenant, for its sandbox, reaches it.
  EXPECT_EQ(table.events("t2", "sb1", id.value()).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(table.events("t1", "sb2", id.value()).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(table.remove("t2", "sb1", id.value()).error().code, ErrorCode::kNotFound);
  EXPECT_TRUE(table.remove("t1", "sb1", id.value()).ok());
  EXPECT_EQ(table.events("t1", "sb1", id.value()).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(WatcherTableTest, AWatchTheGuestRefusesOrNeverStartsLeavesNothing) {
  WatcherTable table;
  auto missing = create(table, "missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  agentproto::CallOptions options;
  options.timeout = milliseconds(0);
  auto silent = table.create("t1", "sb1", *agent_, Json{{"path", "silent"}}, options, milliseconds(200));
  ASSERT_FALSE(silent.ok());
  EXPECT_EQ(silent.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(WatcherTableTest, EventsBeyondTheBoundsEndTheWatcherWithAnError) {
  WatcherTable table(WatcherLimits{.per_tenant = 8, .events_per_watcher = 10, .bytes_per_watcher = 32 << 10});
  for (const char* path : {"flood", "big"}) {
    auto id = create(table, path);
    ASSERT_TRUE(id.ok()) << id.error().message;
    Result<std::string> got = std::string("[]");
    for (int i = 0; i < 100 && got.ok(); ++i) {
      got = table.events("t1", "sb1", id.value());
      std::this_thread::sleep_for(milliseconds(20));
    }
    ASSERT_FALSE(got.ok()) << path;
    EXPECT_EQ(got.error().code, ErrorCode::kResourceExhausted) << path;
    EXPECT_EQ(table.events("t1", "sb1", id.value()).error().code, ErrorCode::kNotFound);  // gone
  }
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(WatcherTableTest, AWatcherWhoseStreamFailedHoldsNothingAndLeaves) {
  WatcherTable table(WatcherLimits{.per_tenant = 1});
  auto id = create(table, "dies");
  ASSERT_TRUE(id.ok()) << id.error().message;
  // Never polled (its sandbox is gone, so it cannot be): it does not keep the tenant's share.
  std::this_thread::sleep_for(milliseconds(200));
  auto next = create(table, "one");
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.events("t1", "sb1", id.value()).error().code, ErrorCode::kNotFound);
  // Polled after the failure: the error, not the events it had before.
  auto polled = create(table, "dies", "t2");
  ASSERT_TRUE(polled.ok());
  std::this_thread::sleep_for(milliseconds(200));
  auto got = table.events("t2", "sb1", polled.value());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code, ErrorCode::kUnavailable);
}

TEST_F(WatcherTableTest, ATenantHasItsShareOfWatchers) {
  WatcherTable table(WatcherLimits{.per_tenant = 2});
  ASSERT_TRUE(create(table, "one").ok());
  auto second = create(table, "one");
  ASSERT_TRUE(second.ok());
  auto third = create(table, "one");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(create(table, "one", "t2").ok());  // another tenant is not held back
  ASSERT_TRUE(table.remove("t1", "sb1", second.value()).ok());
  EXPECT_TRUE(create(table, "one").ok());
}

}  // namespace
}  // namespace space::e2b
