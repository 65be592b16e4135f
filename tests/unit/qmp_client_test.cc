// QmpClient against a scripted peer on a real Unix socket: the greeting, interleaved events,
// errors, and a peer that misbehaves (garbage, oversized lines, silence).
#include "vmm/qmp_client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "common/fs.h"

namespace space::vmm {
namespace {

using std::chrono::milliseconds;

// Accepts one connection and hands it to `script`, on its own thread.
class FakeQemu {
 public:
  explicit FakeQemu(std::function<void(int fd, LineReader& in)> script) {
    auto dir = TempDir::create("/tmp", "qmp-");
    dir_.emplace(std::move(dir.value()));
    path_ = dir_->path() + "/qmp.sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(listen_fd_, 1);
    thread_ = std::thread([this, script] {
      int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      LineReader in(fd, 1 << 20);
      script(fd, in);
      close(fd);
    });
  }
  ~FakeQemu() {
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  const std::string& path() const { return path_; }

 private:
  std::optional<TempDir> dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::thread thread_;
};

void say(int fd, const std::string& s) { (void)writeAll(fd, s, Clock::now() + milliseconds(1000)); }
std::string hear(LineReader& in) {
  auto l = in.readLine(Clock::now() + milliseconds(2000));
  return l.ok() ? l.value() : "";
}
nlohmann::json idOf(const std::string& line) { return nlohmann::json::parse(line)["id"]; }

const char* kGreeting = R"({"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": []}})";

TEST(QmpClient, NegotiatesAndRunsCommandsWithInterleavedEvents) {
  FakeQemu fake([](int fd, LineReader& in) {
    say(fd, std::string(kGreeting) + "\n");
    auto caps = hear(in);
    say(fd, R"({"return": {}, "id": )" + idOf(caps).dump() + "}\n");
    auto stop = hear(in);
    say(fd, R"({"timestamp": {"seconds": 1, "microseconds": 2}, "event": "STOP"})"
            "\n");
    say(fd, R"({"return": {}, "id": )" + idOf(stop).dump() + "}\n");
    auto status = hear(in);
    say(fd, R"({"return": {"status": "paused", "running": false}, "id": )" + idOf(status).dump() + "}\n");
  });
  auto qmp = QmpClient::connect(fake.path(), Clock::now() + milliseconds(2000));
  ASSERT_TRUE(qmp.ok()) << qmp.error().message;
  ASSERT_TRUE(qmp->execute("stop").ok());
  auto status = qmp->execute("query-status");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ((*status)["status"], "paused");
  ASSERT_TRUE(qmp->hasEvents());
  EXPECT_EQ(qmp->popEvent().name, "STOP");
}

TEST(QmpClient, CommandErrorIsReported) {
  FakeQemu fake([](int fd, LineReader& in) {
    say(fd, std::string(kGreeting) + "\n");
    auto caps = hear(in);
    say(fd, R"({"return": {}, "id": )" + idOf(caps).dump() + "}\n");
    auto bad = hear(in);
    say(fd, R"({"error": {"class": "CommandNotFound", "desc": "The command nope has not been found"}, "id": )" +
                idOf(bad).dump() + "}\n");
  });
  auto qmp = QmpClient::connect(fake.path(), Clock::now() + milliseconds(2000));
  ASSERT_TRUE(qmp.ok());
  auto r = qmp->execute("nope");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("has not been found"), std::string::npos);
}

TEST(QmpClient, GarbageGreetingIsAnError) {
  FakeQemu fake([](int fd, LineReader&) { say(fd, "\x01\x02 not json at all\n"); });
  auto qmp = QmpClient::connect(fake.path(), Clock::now() + milliseconds(2000));
  ASSERT_FALSE(qmp.ok());
  EXPECT_EQ(qmp.error().code, ErrorCode::kUnavailable);
}

TEST(QmpClient, OversizedMessageIsAnErrorNotAnAllocation) {
  FakeQemu fake([](int fd, LineReader& in) {
    say(fd, std::string(kGreeting) + "\n");
    auto caps = hear(in);
    say(fd, R"({"return": {}, "id": )" + idOf(caps).dump() + "}\n");
    (void)hear(in);
    std::string chunk(64 * 1024, 'x');
    for (int i = 0; i < 40; ++i) say(fd, chunk);  // 2.5 MiB without a newline
  });
  auto qmp = QmpClient::connect(fake.path(), Clock::now() + milliseconds(2000));
  ASSERT_TRUE(qmp.ok());
  auto r = qmp->execute("query-status", nullptr, milliseconds(3000));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("longer than"), std::string::npos);
}

TEST(QmpClient, SilentPeerHitsDeadline) {
  FakeQemu fake([](int fd, LineReader& in) {
    say(fd, std::string(kGreeting) + "\n");
    auto caps = hear(in);
    say(fd, R"({"return": {}, "id": )" + idOf(caps).dump() + "}\n");
    (void)hear(in);
    // Silent until the client hangs up, however long a loaded machine makes the client take:
    // a fixed sleep let the peer close first under ASan on a busy CI host (kUnavailable).
    (void)in.readLine(Clock::now() + milliseconds(30000));
  });
  auto qmp = QmpClient::connect(fake.path(), Clock::now() + milliseconds(2000));
  ASSERT_TRUE(qmp.ok());
  auto r = qmp->execute("query-status", nullptr, milliseconds(100));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded);
}

TEST(QmpParse, ClassifiesMessages) {
  auto ev = QmpClient::parseMessage(R"({"event":"SHUTDOWN","data":{"guest":true,"reason":"guest-reset"}})");
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->kind, QmpClient::Message::Kind::kEvent);
  EXPECT_EQ(ev->body["data"]["reason"], "guest-reset");
  EXPECT_FALSE(QmpClient::parseMessage("[1,2,3]").ok());
  EXPECT_FALSE(QmpClient::parseMessage(R"({"event": 5})").ok());
  EXPECT_FALSE(QmpClient::parseMessage(R"({"id": 1})").ok());
  EXPECT_FALSE(QmpClient::parseMessage("").ok());
}

}  // namespace
}  // namespace space::vmm
