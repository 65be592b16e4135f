// End-to-end tests of the daemon: a real `spaced` process, real microVMs (TCG here), driven
// over HTTP like any client. Each test starts its own daemon on a fresh data directory.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../support/fake_internet.h"
#include "../support/raw_http.h"
#include "agentproto/base64.h"
#include "apiclient/api_client.h"
#include "apiclient/terminal.h"
#include "common/digest.h"
#include "common/fs.h"
#include "common/process.h"
#include "common/unix_socket.h"
#include "http/client.h"
#include "http/url.h"
#include "jail/cgroup.h"
#include "net/policy.h"
#include "vmm/accelerator.h"
#include "vmm/image_bases.h"
#include "vmm/node_facts.h"
#include "vmm/qmp_client.h"

namespace space {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

const std::string kImages = SPACE_IMAGES_DIR;

// QEMU processes whose command line names `dir` (live ones: zombies are not running VMs).
std::vector<pid_t> processesUnder(const std::string& dir, const std::string& program) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    auto cmdline = processCmdline(static_cast<pid_t>(pid));
    if (!cmdline.ok() || cmdline->find(program) == std::string::npos) continue;
    if (cmdline->find(dir) == std::string::npos) continue;
    auto stat = readSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
    if (stat.ok()) {
      auto close = stat->rfind(')');
      if (close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 2] == 'Z') continue;
    }
    out.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return out;
}

std::vector<pid_t> qemuProcessesUnder(const std::string& dir) { return processesUnder(dir, "qemu-system"); }

// The directory of the memory cgroup (v1; v2: its group) of the one QEMU under `dir`, "" if none.
std::string qemuMemoryGroup(const std::string& dir) {
  auto pids = qemuProcessesUnder(dir);
  if (pids.size() != 1) return "";
  auto text = readSmallFile("/proc/" + std::to_string(pids[0]) + "/cgroup", 1 << 16);
  if (!text.ok()) return "";
  std::istringstream lines(text.value());
  for (std::string line; std::getline(lines, line);) {
    if (line.find(":memory:") != std::string::npos) {
      const std::string path = line.substr(line.find(":memory:") + 8);
      // Its hierarchy is mounted at /sys/fs/cgroup/memory (this project's hosts).
      return "/sys/fs/cgroup/memory" + path;
    }
    if (line.rfind("0::", 0) == 0 && text->find(":memory:") == std::string::npos) {
      return "/sys/fs/cgroup" + line.substr(3);
    }
  }
  return "";
}

// Runs a command to its end; its exit code (-1 if it could not run or was killed).
int runCommand(const std::vector<std::string>& argv, const std::string& log) {
  auto p = ChildProcess::spawn(argv, SpawnOptions{log, "", true});
  if (!p.ok()) return -1;
  auto status = p->waitFor(seconds(120));
  if (!status) {
    p->kill();
    return -1;
  }
  return status->signaled ? -1 : status->exit_code;
}

// Where the daemons' gateways reach "the outside" from: a namespace of this test process with
// nothing but a loopback, so no test's sandbox can send a packet off this machine whatever a
// bug does. Network tests that need servers build a fake internet instead.
class IsolatedUpstream {
 public:
  static const IsolatedUpstream& get() {
    static IsolatedUpstream instance;
    return instance;
  }
  const std::string& path() const { return path_; }
  ~IsolatedUpstream() { (void)runCommand({"ip", "netns", "del", name_}, "/dev/null"); }

 private:
  IsolatedUpstream() : name_("spacetest-void-" + std::to_string(::getpid())), path_("/run/netns/" + name_) {
    (void)runCommand({"ip", "netns", "del", name_}, "/dev/null");
    EXPECT_EQ(runCommand({"ip", "netns", "add", name_}, "/dev/null"), 0);
    EXPECT_EQ(runCommand({"ip", "-n", name_, "link", "set", "lo", "up"}, "/dev/null"), 0);
  }
  std::string name_;
  std::string path_;
};

// What every daemon of these tests is started with unless a test gives its own.
std::vector<std::string> isolatedNetworkArgs() {
  return {"--gateway-upstream-netns", IsolatedUpstream::get().path(), "--gateway-upstream-dns", "192.0.2.53"};
}

// A filesystem mounted for one test: a small ext4 (to fill it) or a btrfs, loop-mounted. The
// tests run as root (CI does); a mount that fails fails the test, never skips it.
class Mount {
 public:
  // `type`: "ext4" or "btrfs", made in a sparse image file of `bytes`. (Not tmpfs: reading a
  // hole of a tmpfs file allocates a page, so a full tmpfs kills a QEMU reading its memory file,
  // which no disk filesystem does.)
  static std::unique_ptr<Mount> loop(const std::string& type, const std::string& image, const std::string& at,
                                     uint64_t bytes) {
    std::filesystem::create_directories(at);
    { std::ofstream(image).flush(); }
    std::filesystem::resize_file(image, bytes);
    // ext4 -m 0: no blocks reserved for root (the daemon runs as root and would write into them).
    std::vector<std::string> mkfs = type == "btrfs"
                                        ? std::vector<std::string>{"mkfs.btrfs", "-q", "-f", image}
                                        : std::vector<std::string>{"mkfs.ext4", "-q", "-F", "-m", "0", image};
    if (runCommand(mkfs, at + ".log") != 0 || runCommand({"mount", "-o", "loop", image, at}, at + ".log") != 0) {
      return nullptr;
    }
    return std::unique_ptr<Mount>(new Mount(at));
  }
  ~Mount() {
    // Detached: whatever still holds files there, the mount leaves the namespace (and the loop
    // device is released once they let go).
    ::umount2(at_.c_str(), MNT_DETACH);
  }
  uint64_t freeBytes() const {
    struct statvfs fs {};
    ::statvfs(at_.c_str(), &fs);
    return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  }

 private:
  explicit Mount(std::string at) : at_(std::move(at)) {}
  std::string at_;
};

class Daemon {
 public:
  // Starts spaced on `data_dir` and waits until it serves. Unless told otherwise, it powers its
  // sandboxes off when stopped, so a test leaves no VM behind.
  static std::unique_ptr<Daemon> start(const std::string& data_dir, std::vector<std::string> extra = {}) {
    if (std::find(extra.begin(), extra.end(), "--on-shutdown") == extra.end()) {
      extra.insert(extra.end(), {"--on-shutdown", "stop"});
    }
    // No VMs waiting in a warm pool unless a test asks: the others count QEMU processes.
    if (std::find(extra.begin(), extra.end(), "--warm-pool") == extra.end()) {
      extra.insert(extra.end(), {"--warm-pool", "0"});
    }
    // Nor guests of other kinds the pool would add as creates ask for them (PoolSizer).
    if (std::find(extra.begin(), extra.end(), "--warm-pool-budget-mb") == extra.end()) {
      extra.insert(extra.end(), {"--warm-pool-budget-mb", "0"});
    }
    // The E2B front ends on ports of their own, never the fixed defaults another run may hold.
    if (std::find(extra.begin(), extra.end(), "--e2b-api-listen") == extra.end()) {
      extra.insert(extra.end(), {"--e2b-api-listen", "127.0.0.1:0", "--e2b-envd-listen", "127.0.0.1:0"});
    }
    if (std::find(extra.begin(), extra.end(), "--gateway-upstream-netns") == extra.end()) {
      auto isolated = isolatedNetworkArgs();
      extra.insert(extra.end(), isolated.begin(), isolated.end());
    }
    std::unique_ptr<Daemon> d(new Daemon());
    d->data_dir_ = data_dir;
    std::vector<std::string> argv = {SPACED_BIN, "--listen",           "127.0.0.1:0", "--data-dir", data_dir,
                                     "--kernel", kImages + "/vmlinux", "--log-level", "debug"};
    if (std::find(extra.begin(), extra.end(), "--rootfs") == extra.end()) {
      argv.insert(argv.end(), {"--rootfs", kImages + "/rootfs.ext4"});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::filesystem::remove(data_dir + "/spaced.json");
    auto p = ChildProcess::spawn(argv, SpawnOptions{data_dir + ".log", "", true});
    EXPECT_TRUE(p.ok());
    if (!p.ok()) return nullptr;
    d->process_.emplace(std::move(p.value()));
    auto deadline = Clock::now() + seconds(60);
    while (Clock::now() < deadline) {
      auto endpoint = readSmallFile(data_dir + "/spaced.json", 4096);
      if (endpoint.ok()) {
        json written = json::parse(endpoint.value());
        d->url_ = written["url"].get<std::string>();
        d->ca_file_ = written.value("tls_cert", "");  // with --tls-cert: trusted as the CA
        break;
      }
      if (d->process_->tryWait()) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    EXPECT_FALSE(d->url_.empty()) << "spaced did not come up:\n" << d->log();
    if (d->url_.empty()) return nullptr;
    auto key = readSmallFile(data_dir + "/api-key", 4096);
    EXPECT_TRUE(key.ok());
    d->key_ = key.ok() ? key.value().substr(0, key.value().find('\n')) : "";
    return d;
  }

  ~Daemon() {
    if (process_ && !process_->reaped()) stop(SIGTERM);
  }

  ExitStatus stop(int sig) {
    ::kill(process_->pid(), sig);
    auto status = process_->waitFor(seconds(60));
    if (!status) return process_->kill();
    return *status;
  }

  std::string log() const {
    auto tail = readFileTail(data_dir_ + ".log", 8192);
    return tail.ok() ? tail.value() : "";
  }

  http::ClientResponse call(const std::string& method, const std::string& target, const std::string& body = "",
                            const std::string& key = "\x01") const {
    auto client = http::Client::create(url_, ca_file_);
    EXPECT_TRUE(client.ok());
    std::map<std::string, std::string> headers;
    const std::string& k = key == "\x01" ? key_ : key;
    if (!k.empty()) headers["Authorization"] = "Bearer " + k;
    if (!body.empty()) headers["Content-Type"] = "application/json";
    auto r = client->request(method, target, headers, body, seconds(60));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? r.value() : http::ClientResponse{};
  }
  json callJson(const std::string& method, const std::string& target, const json& body, int want_status,
                const std::string& key = "\x01") const {
    auto r = call(method, target, body.is_null() ? "" : body.dump(), key);
    EXPECT_EQ(r.status, want_status) << method << " " << target << ": " << r.body;
    if (r.body.empty()) return json();
    return json::parse(r.body, nullptr, false);
  }
  std::string create(const json& body = json{{"cpus", 1}, {"memory_mb", 256}}) const {
    json sb = callJson("POST", "/v1/sandboxes", body, 201);
    return sb.value("id", "");
  }

  const std::string& url() const { return url_; }
  const std::string& key() const { return key_; }
  pid_t pid() const { return process_->pid(); }
  // Reaps it if it has exited (killed by a fault point, say): then stop() must not be called.
  bool alive() { return !process_->reaped() && !process_->tryWait().has_value(); }

 private:
  Daemon() = default;
  std::string data_dir_, url_, key_, ca_file_;
  std::optional<ChildProcess> process_;
};

class SpacedTest : public testing::Test {
 protected:
  void SetUp() override {
    // Short: VM sockets live under it and Unix socket paths are limited to 107 bytes.
    auto dir = TempDir::create("/tmp", "spaced-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    data_dir_ = dir_->path() + "/data";
  }
  void TearDown() override {
    daemon_.reset();
    // Whatever happened, no VM of this test may outlive it.
    for (pid_t pid : qemuProcessesUnder(dir_->path())) {
      ADD_FAILURE() << "leftover QEMU " << pid;
      ::kill(pid, SIGKILL);
    }
    // Tests that kill spaced on purpose leave its sandboxes' gateways and slots for a next
    // start that never comes: removed here, as that start would.
    for (pid_t pid : processesUnder(dir_->path(), "space-gateway")) ::kill(pid, SIGKILL);
    const std::string slot_prefix = "space-" + sha256Hex(data_dir_).substr(0, 8) + "-";
    std::error_code ec;
    for (const auto& slot : std::filesystem::directory_iterator("/run/space/netns", ec)) {
      if (slot.path().filename().string().rfind(slot_prefix, 0) != 0) continue;
      ::umount2(slot.path().c_str(), MNT_DETACH);
      ::unlink(slot.path().c_str());
    }
    for (const auto& file : std::filesystem::directory_iterator("/run/space/credentials", ec)) {
      if (file.path().filename().string().rfind(slot_prefix, 0) == 0) ::unlink(file.path().c_str());
    }
  }
  std::string sandboxDir(const std::string& id) const { return data_dir_ + "/sandboxes/" + id; }

  // Starts spaced armed to kill itself at `fault` (common/fault.h); it keeps its VMs.
  void startWithFault(const std::string& fault) {
    ::setenv("SPACE_FAULT", fault.c_str(), 1);
    daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
    ::unsetenv("SPACE_FAULT");
  }
  // Sends the request that reaches `fault`: spaced must die there (SIGKILL), not answer.
  void expectDeathAt(const std::string& fault, const std::string& method, const std::string& target,
                     const std::string& body = "") {
    auto client = http::Client::create(daemon_->url());
    ASSERT_TRUE(client.ok());
    std::map<std::string, std::string> headers{{"Authorization", "Bearer " + daemon_->key()}};
    if (!body.empty()) headers["Content-Type"] = "application/json";
    auto r = client->request(method, target, headers, body, seconds(60));
    EXPECT_FALSE(r.ok()) << "spaced answered instead of dying at " << fault << ": " << r.value().body;
    EXPECT_TRUE(daemon_->stop(SIGKILL).signaled) << "spaced was not killed by its fault point";
    EXPECT_NE(daemon_->log().find("fault point reached, killing myself: " + fault), std::string::npos)
        << daemon_->log();
  }

  // A new tenant's API key (`spaced tenant add`), once the running daemon accepts it.
  std::string addTenant(const std::string& name) {
    const std::string out = dir_->path() + "/tenant-" + name + ".json";
    std::filesystem::remove(out);  // the output of an earlier add of the same name
    auto add = ChildProcess::spawn({SPACED_BIN, "tenant", "add", name, "--json", "--data-dir", data_dir_},
                                   SpawnOptions{out, dir_->path() + "/tenant.err", true});
    if (!add.ok()) return "";
    auto added = add->waitFor(seconds(30));
    auto text = readSmallFile(out, 4096);
    if (!added || added->exit_code != 0 || !text.ok()) return "";
    const std::string key = json::parse(text.value())["api_key"].get<std::string>();
    // The key ring reloads at most once a second.
    for (auto until = Clock::now() + seconds(10);
         Clock::now() < until && daemon_->call("GET", "/v1/sandboxes", "", key).status != 200;) {
      std::this_thread::sleep_for(milliseconds(100));
    }
    return key;
  }
  // The daemon's log since `from` (a size it had) contains `text`, within `timeout`.
  bool waitForLog(const std::string& text, size_t from, std::chrono::milliseconds timeout) {
    for (auto until = Clock::now() + timeout; Clock::now() < until; std::this_thread::sleep_for(milliseconds(100))) {
      auto log = readSmallFile(logPath(), 64 << 20);
      if (log.ok() && log->size() > from && log->find(text, from) != std::string::npos) return true;
    }
    return false;
  }
  // A gauge without labels from the daemon's /metrics, or -1 when it is missing.
  int metric(const std::string& name) const {
    auto body = daemon_->call("GET", "/metrics").body;
    auto at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1 : std::stoi(body.substr(at + name.size() + 2));
  }
  size_t logSize() const {
    std::error_code ec;
    auto size = std::filesystem::file_size(logPath(), ec);
    return ec ? 0 : size;
  }
  std::string logPath() const { return data_dir_ + ".log"; }
  // GET until the sandbox is in `want` (or `timeout` passed); the last answer.
  json waitState(const std::string& id, const std::string& want, std::chrono::milliseconds timeout,
                 const std::string& key = "\x01") {
    json sb;
    for (auto until = Clock::now() + timeout; Clock::now() < until; std::this_thread::sleep_for(milliseconds(100))) {
      sb = daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200, key);
      if (sb.value("state", "") == want) break;
    }
    return sb;
  }

  std::optional<TempDir> dir_;
  std::string data_dir_;
  std::unique_ptr<Daemon> daemon_;
};

json execJson(const Daemon& d, const std::string& id, const json& body, int want = 200) {
  return d.callJson("POST", "/v1/sandboxes/" + id + "/exec", body, want);
}

// Prints the ticker's pid once it has written it: waits for the condition in the guest (up to
// 10 s) instead of sleeping on the host and hoping.
const char* const kCatTickerPid =
    "for i in $(seq 200); do [ -s /tmp/ticker.pid ] && break; sleep 0.05; done; cat /tmp/ticker.pid";

TEST_F(SpacedTest, SandboxLifecycleExecAndFiles) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  EXPECT_EQ(d.call("GET", "/healthz", "", "").status, 200);

  json sb = d.callJson("POST", "/v1/sandboxes",
                       json{{"template", "base"},
                            {"cpus", 1},
                            {"memory_mb", 256},
                            {"timeout_s", 600},
                            {"env", {{"GREETING", "hello"}}},
                            {"metadata", {{"task", "t1"}}}},
                       201);
  const std::string id = sb.value("id", "");
  ASSERT_EQ(id.substr(0, 3), "sb_");
  EXPECT_EQ(sb["state"], "running");
  EXPECT_EQ(sb["cpus"], 1);
  EXPECT_EQ(sb["memory_mb"], 256);
  EXPECT_EQ(sb["metadata"]["task"], "t1");
  EXPECT_FALSE(sb.value("created_at", "").empty());
  EXPECT_FALSE(sb.value("expires_at", "").empty());
  EXPECT_TRUE(std::filesystem::exists(sandboxDir(id) + "/qmp.sock"));

  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 200)["state"], "running");
  json listed = d.callJson("GET", "/v1/sandboxes?metadata=task%3Dt1&state=running", nullptr, 200);
  ASSERT_EQ(listed["sandboxes"].size(), 1u);
  EXPECT_EQ(listed["sandboxes"][0]["id"], id);
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes?metadata=task%3Dother", nullptr, 200)["sandboxes"].size(), 0u);

  // exec: shell command, sandbox env, exit code, stderr, stdin, argv, cwd.
  json out = execJson(d, id, json{{"command", "uname -r; echo $GREETING; echo oops >&2; exit 3"}});
  EXPECT_EQ(out["exit_code"], 3);
  EXPECT_NE(out["stdout"].get<std::string>().find("-space\nhello\n"), std::string::npos) << out;
  EXPECT_EQ(out["stderr"], "oops\n");
  EXPECT_GE(out["duration_ms"].get<int>(), 0);
  out = execJson(d, id, json{{"argv", {"cat"}}, {"stdin", agentproto::base64Encode("piped")}});
  EXPECT_EQ(out["stdout"], "piped");
  out = execJson(d, id, json{{"command", "pwd; id -un"}, {"cwd", "/tmp"}, {"user", "root"}});
  EXPECT_EQ(out["stdout"], "/tmp\nroot\n");

  // Streamed exec: NDJSON start, output, exit.
  {
    auto client = http::Client::create(d.url());
    ASSERT_TRUE(client.ok());
    std::string stream;
    auto r = client->requestStreaming(
        "POST", "/v1/sandboxes/" + id + "/exec", {{"Authorization", "Bearer " + d.key()}},
        json{{"command", "echo one; sleep 0.2; echo two >&2"}, {"stream", true}}.dump(),
        [](const http::ClientResponse& head) {
          EXPECT_EQ(head.status, 200);
          EXPECT_EQ(head.headers.at("content-type"), "application/x-ndjson");
          return okStatus();
        },
        [&](std::string_view chunk) {
          stream += chunk;
          return okStatus();
        });
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::vector<json> lines;
    size_t start = 0;
    for (size_t nl; (nl = stream.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(json::parse(stream.substr(start, nl - start)));
    }
    ASSERT_GE(lines.size(), 4u) << stream;
    EXPECT_EQ(lines.front()["type"], "start");
    EXPECT_GT(lines.front()["pid"].get<int>(), 1);
    EXPECT_EQ(lines.back()["type"], "exit");
    EXPECT_EQ(lines.back()["exit_code"], 0);
    std::string out_bytes, err_bytes;
    for (const auto& l : lines) {
      if (l["type"] == "stdout") out_bytes += agentproto::base64Decode(l["data"].get<std::string>()).value();
      if (l["type"] == "stderr") err_bytes += agentproto::base64Decode(l["data"].get<std::string>()).value();
    }
    EXPECT_EQ(out_bytes, "one\n");
    EXPECT_EQ(err_bytes, "two\n");

    // Output in many small writes (an event each, mostly): every byte arrives once and in order
    // (a drain that output keeps waking goes back in line after a few batches).
    stream.clear();
    r = client->requestStreaming(
        "POST", "/v1/sandboxes/" + id + "/exec", {{"Authorization", "Bearer " + d.key()}},
        json{{"argv", {"sh", "-c", "i=1; while [ $i -le 10000 ]; do echo $i; i=$((i+1)); done"}}, {"stream", true}}
            .dump(),
        [](const http::ClientResponse& head) {
          EXPECT_EQ(head.status, 200);
          return okStatus();
        },
        [&](std::string_view chunk) {
          stream += chunk;
          return okStatus();
        });
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::string expected;
    for (int i = 1; i <= 10000; ++i) expected += std::to_string(i) + "\n";
    out_bytes.clear();
    std::string last;
    start = 0;
    for (size_t nl; (nl = stream.find('\n', start)) != std::string::npos; start = nl + 1) {
      json l = json::parse(stream.substr(start, nl - start));
      if (l["type"] == "stdout") out_bytes += agentproto::base64Decode(l["data"].get<std::string>()).value();
      last = l["type"];
    }
    EXPECT_EQ(last, "exit");
    EXPECT_TRUE(out_bytes == expected) << out_bytes.size() << " bytes of " << expected.size();
  }

  // Processes: background processes show in the list and can be signalled, through the API
  // and through `spacectl kill`; a signalled one leaves the list, the other stays.
  {
    auto client = http::Client::create(d.url());
    ASSERT_TRUE(client.ok());
    auto startDetached = [&](const std::string& tag) {
      int pid = 0;
      (void)client->requestStreaming(
          "POST", "/v1/sandboxes/" + id + "/exec", {{"Authorization", "Bearer " + d.key()}},
          json{{"argv", {"sleep", "300." + tag}}, {"stream", true}}.dump(),
          [](const http::ClientResponse&) { return okStatus(); },
          [&](std::string_view chunk) -> Status {
            auto line = json::parse(chunk.substr(0, chunk.find('\n')), nullptr, false);
            if (line.is_object() && line["type"] == "start") pid = line["pid"].get<int>();
            return makeError(ErrorCode::kCanceled, "detach");
          });
      return pid;
    };
    auto listedPids = [&] {
      std::set<int> pids;
      const json listed = d.callJson("GET", "/v1/sandboxes/" + id + "/processes", nullptr, 200);
      for (const auto& p : listed["processes"]) pids.insert(p["pid"].get<int>());
      return pids;
    };
    auto waitGone = [&](int pid) {
      for (auto until = Clock::now() + seconds(10); Clock::now() < until && listedPids().count(pid);) {
        std::this_thread::sleep_for(milliseconds(100));
      }
      return listedPids().count(pid) == 0;
    };
    const int by_api = startDetached("1"), by_cli = startDetached("2");
    ASSERT_GT(by_api, 1);
    ASSERT_GT(by_cli, 1);
    EXPECT_EQ(listedPids(), (std::set<int>{by_api, by_cli}));
    d.callJson("POST", "/v1/sandboxes/" + id + "/processes/" + std::to_string(by_api) + "/signal",
               json{{"signal", "SIGTERM"}}, 204);
    EXPECT_TRUE(waitGone(by_api)) << "SIGTERM did not end the process";
    EXPECT_EQ(listedPids(), std::set<int>{by_cli});
    setenv("SPACE_API", d.url().c_str(), 1);
    setenv("SPACE_API_KEY", d.key().c_str(), 1);
    const std::string kill_out = dir_->path() + "/kill.out";
    EXPECT_EQ(runCommand({SPACECTL_BIN, "kill", id, std::to_string(by_cli), "--signal", "SIGKILL"}, kill_out), 0)
        << readSmallFile(kill_out, 1 << 16).value();
    EXPECT_TRUE(waitGone(by_cli)) << "spacectl kill did not end the process";
    EXPECT_EQ(runCommand({SPACECTL_BIN, "kill", id, std::to_string(by_cli)}, kill_out), 1)
        << "a process that is gone: " << readSmallFile(kill_out, 1 << 16).value();
  }
  d.callJson("POST", "/v1/sandboxes/" + id + "/processes/999999/signal", json{{"signal", "SIGTERM"}}, 404);
  d.callJson("POST", "/v1/sandboxes/" + id + "/processes/12/signal", json{{"signal", "SIGBOGUS"}}, 400);

  // Files: upload, download, list, mkdir, move, remove.
  const std::string files = "/v1/sandboxes/" + id + "/files";
  std::string blob;
  for (int i = 0; i < 300000; ++i) blob += static_cast<char>(i * 7 % 251);
  {
    auto client = http::Client::create(d.url());
    auto put = client->request("PUT", files + "?path=" + http::urlEncode("/home/user/data/blob.bin"),
                               {{"Authorization", "Bearer " + d.key()}}, blob, seconds(60));
    ASSERT_TRUE(put.ok());
    EXPECT_EQ(put->status, 200) << put->body;
    json entry = json::parse(put->body);
    EXPECT_EQ(entry["size"], blob.size());
    EXPECT_EQ(entry["type"], "file");
  }
  auto got = d.call("GET", files + "?path=/home/user/data/blob.bin");
  EXPECT_EQ(got.status, 200);
  EXPECT_TRUE(got.body == blob) << "downloaded " << got.body.size() << " bytes";
  EXPECT_EQ(d.callJson("POST", files + "/mkdir", json{{"path", "/home/user/data/sub"}}, 201)["type"], "dir");
  d.callJson("POST", files + "/mkdir", json{{"path", "/home/user/data/sub"}}, 409);
  d.callJson("POST", files + "/move",
             json{{"source", "/home/user/data/blob.bin"}, {"destination", "/home/user/data/sub/moved.bin"}}, 200);
  json entries = d.callJson("GET", files + "/list?path=/home/user/data&depth=2", nullptr, 200)["entries"];
  std::set<std::string> paths;
  for (const auto& e : entries) paths.insert(e["path"].get<std::string>());
  EXPECT_TRUE(paths.count("/home/user/data/sub/moved.bin")) << entries;
  EXPECT_FALSE(paths.count("/home/user/data/blob.bin"));
  EXPECT_EQ(d.call("DELETE", files + "?path=/home/user/data/sub/moved.bin").status, 204);
  EXPECT_EQ(d.call("GET", files + "?path=/home/user/data/sub/moved.bin").status, 404);
  EXPECT_EQ(d.call("GET", files + "?path=/home/user/data").status, 400);  // a directory

  // Console log and metrics.
  // (A restored sandbox's console starts empty: the boot happened in its template.)
  execJson(d, id, json{{"command", "echo console-marker-42 > /dev/console"}, {"user", "root"}});
  auto logs = d.call("GET", "/v1/sandboxes/" + id + "/logs?tail_bytes=100000");
  EXPECT_EQ(logs.status, 200);
  EXPECT_NE(logs.body.find("console-marker-42"), std::string::npos) << logs.body;
  auto metrics = d.call("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("space_sandboxes{state=\"running\"} 1"), std::string::npos) << metrics.body;
  EXPECT_NE(metrics.body.find("space_sandbox_create_seconds_count 1"), std::string::npos);
  EXPECT_NE(metrics.body.find("space_exec_seconds_count"), std::string::npos);
  auto openapi = d.call("GET", "/v1/openapi.json");
  EXPECT_EQ(openapi.status, 200);
  EXPECT_FALSE(json::parse(openapi.body, nullptr, false).is_discarded());

  // Delete: 204, then the record says deleted, the VM and its files are gone, and further
  // requests are refused with the state.
  EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
  json gone = d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 200);
  EXPECT_EQ(gone["state"], "deleted");
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(id)));
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  json refused = d.callJson("DELETE", "/v1/sandboxes/" + id, nullptr, 409);
  EXPECT_EQ(refused["error"]["state"], "deleted");
  refused = execJson(d, id, json{{"command", "true"}}, 409);
  EXPECT_EQ(refused["error"]["code"], "invalid_state");
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes", nullptr, 200)["sandboxes"].size(), 0u);
}

TEST_F(SpacedTest, ProcessesOutliveTheirStreamAndCanBeReattached) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  auto client = http::Client::create(d.url());
  ASSERT_TRUE(client.ok());
  const std::map<std::string, std::string> auth{{"Authorization", "Bearer " + d.key()}};

  // Start `cat` with stdin kept open, read the start event, then drop the connection.
  int pid = 0;
  auto first = client->requestStreaming(
      "POST", "/v1/sandboxes/" + id + "/exec", auth,
      json{{"argv", {"cat"}}, {"stream", true}, {"stdin_open", true}}.dump(),
      [](const http::ClientResponse&) { return okStatus(); },
      [&](std::string_view chunk) -> Status {
        auto line = json::parse(chunk.substr(0, chunk.find('\n')), nullptr, false);
        if (line.is_object() && line["type"] == "start") pid = line["pid"].get<int>();
        return makeError(ErrorCode::kCanceled, "detach");
      });
  EXPECT_FALSE(first.ok());  // we aborted it
  ASSERT_GT(pid, 1);

  // Still running, listed, and re-attachable: input sent now comes out of the new stream.
  json procs = d.callJson("GET", "/v1/sandboxes/" + id + "/processes", nullptr, 200)["processes"];
  bool listed = false;
  for (const auto& p : procs) listed = listed || (p["pid"] == pid && p["cmd"] == "cat");
  EXPECT_TRUE(listed) << procs;
  std::string stream;
  std::promise<void> attached;
  bool attached_set = false;
  std::thread attach([&] {
    auto r = client->requestStreaming(
        "GET", "/v1/sandboxes/" + id + "/processes/" + std::to_string(pid) + "/stream", auth, "",
        [](const http::ClientResponse& head) {
          EXPECT_EQ(head.status, 200);
          return okStatus();
        },
        [&](std::string_view chunk) {
          stream += chunk;
          if (!attached_set && stream.find("\"type\":\"start\"") != std::string::npos) {
            attached_set = true;
            attached.set_value();
          }
          return okStatus();
        },
        seconds(60));
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!attached_set) attached.set_value();
  });
  // The input goes once the new stream is attached (its start event arrived), not after a guess.
  ASSERT_EQ(attached.get_future().wait_for(seconds(30)), std::future_status::ready);
  d.callJson("POST", "/v1/sandboxes/" + id + "/processes/" + std::to_string(pid) + "/stdin",
             json{{"data", agentproto::base64Encode("hello again\n")}, {"eof", true}}, 204);
  attach.join();
  EXPECT_NE(stream.find(json{{"type", "stdout"}, {"data", agentproto::base64Encode("hello again\n")}}.dump()),
            std::string::npos)
      << stream;
  EXPECT_NE(stream.find("\"type\":\"exit\""), std::string::npos) << stream;
  d.callJson("GET", "/v1/sandboxes/" + id + "/processes/" + std::to_string(pid) + "/stream", nullptr, 404);
}

// Issue 11: a streamed exec holds its connection and its tenant's place, but no server thread:
// the handler returns once the first event went out and the event loop writes the rest.
TEST_F(SpacedTest, StreamedExecsHoldNoServerThreadButKeepTheirTenantsPlace) {
  constexpr int kStreams = 24;
  daemon_ = Daemon::start(data_dir_, {"--max-requests-per-tenant", std::to_string(kStreams)});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  const uint16_t port = static_cast<uint16_t>(std::stoi(d.url().substr(d.url().rfind(':') + 1)));
  auto threads = [&] {
    auto status = readSmallFile("/proc/" + std::to_string(d.pid()) + "/status", 1 << 16);
    size_t at = status.ok() ? status->find("Threads:") : std::string::npos;
    return at == std::string::npos ? -1 : std::stoi(status->substr(at + 8));
  };
  d.callJson("POST", "/v1/sandboxes/" + id + "/exec", json{{"argv", {"true"}}}, 200);
  const int before = threads();
  ASSERT_GT(before, 0);

  const std::string body = json{{"argv", {"sh", "-c", "echo up; exec sleep 300"}}, {"stream", true}}.dump();
  const std::string up = json{{"type", "stdout"}, {"data", agentproto::base64Encode("up\n")}}.dump();
  // One after another: each handler returns once its first event went out, so the next one
  // finds its thread idle. Were a stream to hold its thread, each would need a new one.
  std::vector<UniqueFd> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(testsupport::connectRaw(port, seconds(30)));
    auto& fd = streams.back();
    testsupport::sendRaw(fd.get(), "POST /v1/sandboxes/" + id + "/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                       d.key() + "\r\nContent-Type: application/json\r\nContent-Length: " +
                                       std::to_string(body.size()) + "\r\n\r\n" + body);
    std::string got;
    char buf[4096];
    while (got.find(up) == std::string::npos) {
      ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    ASSERT_NE(got.find(up), std::string::npos) << got;
  }
  // Every stream is open and its process runs: with a thread each there would be 24 more.
  const int during = threads();
  EXPECT_LT(during, before + kStreams / 3)
      << "threads before " << before << ", with " << kStreams << " streams " << during;
  // Each stream still counts against its tenant's requests: the next request is refused...
  auto refused = d.call("GET", "/v1/sandboxes/" + id);
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_NE(refused.body.find("already has " + std::to_string(kStreams) + " requests running"), std::string::npos)
      << refused.body;
  // ...until one of them ends: a client that hangs up gives its place back.
  streams.pop_back();
  bool admitted = false;
  for (auto until = Clock::now() + seconds(10); !admitted && Clock::now() < until;
       std::this_thread::sleep_for(milliseconds(100))) {
    admitted = d.call("GET", "/v1/sandboxes/" + id).status == 200;
  }
  EXPECT_TRUE(admitted);
  streams.clear();
  d.callJson("DELETE", "/v1/sandboxes/" + id, nullptr, 204);
}

TEST_F(SpacedTest, BadInputIsRefusedAndChangesNothing) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  // Authentication first.
  EXPECT_EQ(d.call("GET", "/v1/sandboxes", "", "").status, 401);
  EXPECT_EQ(d.call("GET", "/v1/sandboxes", "", "sk_wrong_key_wrong_key_wrong").status, 401);
  EXPECT_EQ(d.call("GET", "/v1/nothing-here", "", "").status, 401);
  EXPECT_EQ(d.call("GET", "/v1/nothing-here").status, 404);
  EXPECT_EQ(d.call("PATCH", "/v1/sandboxes").status, 405);

  // Create requests that must not create anything.
  auto code_of = [](const json& j) { return j.is_object() ? j["error"].value("code", "") : ""; };
  EXPECT_EQ(code_of(json::parse(d.call("POST", "/v1/sandboxes", "{\"cpus\":").body)), "invalid_argument");
  json e = d.callJson("POST", "/v1/sandboxes", json{{"cpus", "two"}}, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("cpus"), std::string::npos);
  e = d.callJson("POST", "/v1/sandboxes", json{{"cpu", 2}}, 400);
  EXPECT_EQ(e["error"]["message"], "unknown field \"cpu\"");
  d.callJson("POST", "/v1/sandboxes", json{{"memory_mb", 1 << 30}}, 400);
  d.callJson("POST", "/v1/sandboxes", json{{"memory_mb", 64}}, 400);
  d.callJson("POST", "/v1/sandboxes", json{{"timeout_s", 0}}, 400);
  d.callJson("POST", "/v1/sandboxes", json{{"timeout_s", 10 * 24 * 3600}}, 400);
  d.callJson("POST", "/v1/sandboxes", json{{"cpus", 4096}}, 400);
  // A name the guest cannot set: refused before any VM (a pooled guest) is spent on it.
  EXPECT_NE(d.callJson("POST", "/v1/sandboxes", json{{"env", {{"A=B", "x"}}}}, 400)["error"]["message"].dump().find(
                "cannot contain '='"),
            std::string::npos);
  e = d.callJson("POST", "/v1/sandboxes", json{{"template", "nope"}}, 404);
  EXPECT_EQ(e["error"]["code"], "template_not_found");
  std::string huge = "{\"metadata\":{\"k\":\"" + std::string(2 << 20, 'x') + "\"}}";
  EXPECT_EQ(d.call("POST", "/v1/sandboxes", huge).status, 413);
  // An exec's body (it carries stdin) is held to 4 MiB, before its sandbox is even looked up.
  const auto execBody = [](size_t stdin_bytes) {
    return "{\"command\":\"true\",\"stdin\":\"" + std::string(stdin_bytes, 'A') + "\"}";
  };
  EXPECT_EQ(d.call("POST", "/v1/sandboxes/sb_doesnotexist/exec", execBody(4 << 20)).status, 413);
  EXPECT_EQ(d.call("POST", "/v1/sandboxes/sb_doesnotexist/exec", execBody(3 << 20)).status, 404);
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes", nullptr, 200)["sandboxes"].size(), 0u);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());

  // Unknown ids.
  e = d.callJson("GET", "/v1/sandboxes/sb_doesnotexist", nullptr, 404);
  EXPECT_EQ(e["error"]["code"], "sandbox_not_found");
  d.callJson("DELETE", "/v1/sandboxes/sb_doesnotexist", nullptr, 404);
  d.callJson("POST", "/v1/sandboxes/sb_doesnotexist/exec", json{{"command", "true"}}, 404);
  d.callJson("GET", "/v1/sandboxes?state=bogus", nullptr, 400);
  d.callJson("GET", "/v1/sandboxes?limit=0", nullptr, 400);

  // Requests on a running sandbox.
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  const std::string files = "/v1/sandboxes/" + id + "/files";
  EXPECT_EQ(d.call("GET", files + "?path=%2Ftmp%2Fa%00b").status, 400);             // NUL byte
  EXPECT_EQ(d.call("GET", files + "?path=" + std::string(5000, 'a')).status, 400);  // over-long
  EXPECT_EQ(d.call("GET", files).status, 400);                                      // no path
  execJson(d, id, json{{"command", "true"}, {"argv", {"true"}}}, 400);
  execJson(d, id, json{{"stdin", "***"}, {"command", "cat"}}, 400);
  execJson(d, id, json{{"command", "true"}, {"timeout", 5}}, 400);
  d.callJson("POST", "/v1/sandboxes/" + id + "/timeout", json{{"timeout_s", -1}}, 400);
  // None of it harmed the sandbox.
  EXPECT_EQ(execJson(d, id, json{{"command", "echo ok"}})["stdout"], "ok\n");
}

// Quotas: a tenant at its quota of sandboxes, vCPUs, snapshots or request rate gets 429
// tenant_quota (or too_many_requests with Retry-After), and another tenant still creates,
// snapshots and calls as if the first were not there.
#ifdef SPACE_HOSTILE_AGENT_BIN
// Puts space-hostile-agent (tests/support/hostile_agent.cc) in the place of sandbox `id`'s agent,
// started with `args`, and makes spaced meet it: the takeover ends spaced's session (calls fail
// until it connects again), and a pause and resume connects again.
void takeOverAgent(const Daemon& d, const std::string& id, const std::string& args) {
  const std::string sb = "/v1/sandboxes/" + id;
  auto binary = readSmallFile(SPACE_HOSTILE_AGENT_BIN, 64 << 20);
  ASSERT_TRUE(binary.ok());
  ASSERT_EQ(d.call("PUT", sb + "/files?path=/root/hostile&user=root", binary.value()).status, 200);
  execJson(d, id,
           json{{"command",
                 "chmod 700 /root/hostile && (setsid /root/hostile " + args + " </dev/null >/dev/console 2>&1 &)"},
                {"user", "root"}});
  // The real agent answers until the takeover ends its session.
  http::ClientResponse answer;
  for (auto until = Clock::now() + seconds(30); Clock::now() < until; std::this_thread::sleep_for(milliseconds(200))) {
    answer = d.call("GET", sb + "/files/list?path=/");
    if (answer.status != 200) break;
  }
  ASSERT_EQ(answer.status, 502) << answer.body;
  auto logs = d.call("GET", sb + "/logs?tail_bytes=100000");
  ASSERT_NE(logs.body.find("PID 1 stopped; serving its port"), std::string::npos) << logs.body;
  // A resume connects again, and meets the hostile guest: its handshake is well formed.
  ASSERT_EQ(d.callJson("POST", sb + "/pause", nullptr, 200)["state"], "paused");
  ASSERT_EQ(d.callJson("POST", sb + "/resume", nullptr, 200)["state"], "running");
}

// A sandbox made on the E2B front (for its envd token), and envd calls to it.
struct E2bSandbox {
  std::string id, token;
};
E2bSandbox e2bCreate(const Daemon& d, const std::string& data_dir) {
  const json endpoint = json::parse(readSmallFile(data_dir + "/spaced.json", 4096).value());
  auto e2b = http::Client::create(endpoint["e2b_api_url"].get<std::string>());
  EXPECT_TRUE(e2b.ok());
  if (!e2b.ok()) return {};
  auto created = e2b->request("POST", "/v2/sandboxes", {{"X-API-KEY", d.key()}, {"Content-Type", "application/json"}},
                              R"({"templateID":"base","timeout":300})");
  EXPECT_TRUE(created.ok() && created->status == 201) << (created.ok() ? created->body : created.error().message);
  if (!created.ok() || created->status != 201) return {};
  const json made = json::parse(created->body);
  return {made["sandboxID"], made["envdAccessToken"]};
}
http::ClientResponse envdCall(const std::string& data_dir, const E2bSandbox& sandbox, const std::string& target,
                              const std::string& content_type, const std::string& body) {
  const json endpoint = json::parse(readSmallFile(data_dir + "/spaced.json", 4096).value());
  auto envd = http::Client::create(endpoint["e2b_sandbox_url"].get<std::string>());
  EXPECT_TRUE(envd.ok());
  if (!envd.ok()) return {};
  auto r = envd->request("POST", target,
                         {{"E2b-Sandbox-Id", sandbox.id},
                          {"E2b-Sandbox-Port", "49983"},
                          {"X-Access-Token", sandbox.token},
                          {"Content-Type", content_type}},
                         body, seconds(60));
  // No answer at all: status 0, and why in the body (a stream cut when its sandbox is deleted).
  return r.ok() ? r.value() : http::ClientResponse{0, {}, r.error().message};
}
// envd's Process/Start of `true`, as a Connect stream (one request envelope).
http::ClientResponse envdStartTrue(const std::string& data_dir, const E2bSandbox& sandbox) {
  const std::string payload = R"({"process":{"cmd":"/bin/true","args":[]}})";
  std::string envelope(5, '\0');
  for (int i = 0; i < 4; ++i) envelope[1 + i] = static_cast<char>((payload.size() >> (24 - 8 * i)) & 0xff);
  return envdCall(data_dir, sandbox, "/process.Process/Start", "application/connect+json", envelope + payload);
}

// Guest root takes its agent's place on the port (tests/support/hostile_agent.cc: it stops the
// real agent, breaks the host's session and serves the next one) and answers every call with
// JSON nested 200,000 levels deep, the depth that overflowed spaced's stack when it copied or
// dumped such an answer (the envd front end passes answers through: without the depth bound,
// its ListDir below kills spaced). Every call fails as the guest's fault, another sandbox runs
// on, and so it stays after a restart, when spaced adopts the VM and meets the same guest
// again (issue 15, item 1).
TEST_F(SpacedTest, AGuestAnsweringWithDeepNestingGets502AndSpacedRunsOn) {
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  const pid_t spaced_pid = daemon_->pid();
  const std::string bystander = daemon_->create();
  ASSERT_FALSE(bystander.empty());
  const E2bSandbox hostile = e2bCreate(*daemon_, data_dir_);
  ASSERT_FALSE(hostile.id.empty());
  const std::string id = hostile.id;
  const std::string sb = "/v1/sandboxes/" + id;
  const std::string list = sb + "/files/list?path=/";
  auto envdListDir = [&] {
    return envdCall(data_dir_, hostile, "/filesystem.Filesystem/ListDir", "application/json", R"({"path":"/"})");
  };
  const std::string kTooDeep = "JSON nests deeper than 64 levels";

  takeOverAgent(*daemon_, id, "");
  json refused = daemon_->callJson("GET", list, nullptr, 502);
  EXPECT_EQ(refused["error"]["code"], "unavailable");
  EXPECT_NE(refused["error"]["message"].get<std::string>().find(kTooDeep), std::string::npos) << refused;
  refused = execJson(*daemon_, id, json{{"command", "true"}}, 502);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find(kTooDeep), std::string::npos) << refused;
  auto answer = envdListDir();
  EXPECT_EQ(answer.status, 503) << answer.body;  // Connect's code for unavailable
  EXPECT_NE(answer.body.find(kTooDeep), std::string::npos) << answer.body;
  ASSERT_TRUE(daemon_->alive()) << daemon_->log();
  EXPECT_EQ(daemon_->pid(), spaced_pid);
  EXPECT_EQ(execJson(*daemon_, bystander, json{{"command", "echo fine"}})["stdout"], "fine\n");

  // A restart adopts the VM and meets the same guest: still only its calls fail.
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "running");
  refused = daemon_->callJson("GET", list, nullptr, 502);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find(kTooDeep), std::string::npos) << refused;
  EXPECT_EQ(envdListDir().status, 503);
  EXPECT_TRUE(daemon_->alive()) << daemon_->log();
  EXPECT_EQ(execJson(*daemon_, bystander, json{{"command", "echo fine"}})["stdout"], "fine\n");
  EXPECT_EQ(daemon_->call("DELETE", sb).status, 204);
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + bystander).status, 204);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
}

// A guest that leaves its answers unfinished holds little of spaced's memory (review helper-90).
// Streams it keeps open after their EndStream envelope, each then given most of an 8 MiB
// message, are reset at their first byte past the end: each held its 8 MiB for as long as the
// sandbox lived (120 calls took spaced to 960 MB). Streams still running, each holding most of
// an 8 MiB message, hold 32 MiB of a sandbox's client at most: the call that would go past it
// fails (AgentClient::kMaxBufferedAnswers).
TEST_F(SpacedTest, AGuestLeavingItsAnswersUnfinishedHoldsLittleOfSpacedsMemory) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  const E2bSandbox ended = e2bCreate(*daemon_, data_dir_);
  const E2bSandbox running = e2bCreate(*daemon_, data_dir_);
  ASSERT_FALSE(ended.id.empty() || running.id.empty());
  takeOverAgent(*daemon_, ended.id, "--mode hold-open");
  takeOverAgent(*daemon_, running.id, "--mode hold-running");
  const pid_t pid = daemon_->pid();

  testsupport::resetPeakResident(pid);
  size_t before = testsupport::peakResidentBytes(pid);
  for (int i = 0; i < 24; ++i) {
    auto r = envdStartTrue(data_dir_, ended);
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_NE(r.body.find("\"exitCode\""), std::string::npos) << r.body;  // the whole answer came
  }
  std::this_thread::sleep_for(seconds(1));  // the last one's unfinished message on its way
  // Nothing is held: 1 MiB here (39 MiB with the client's bound alone, which four streams reach).
  EXPECT_LT(testsupport::peakGrowth(before, pid), size_t{16} << 20) << "24 streams of 8 MiB unfinished each";

  constexpr int kStreams = 12;
  testsupport::resetPeakResident(pid);
  before = testsupport::peakResidentBytes(pid);
  std::vector<std::future<http::ClientResponse>> held;
  for (int i = 0; i < kStreams; ++i) {
    held.push_back(std::async(std::launch::async, [&] { return envdStartTrue(data_dir_, running); }));
  }
  // Those past the bound end (with the error); the first few stay open, each holding its message.
  int over = 0;
  for (auto until = Clock::now() + seconds(40); Clock::now() < until && over < kStreams - 4;) {
    over = 0;
    for (auto& f : held) over += f.wait_for(milliseconds(0)) == std::future_status::ready ? 1 : 0;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_GE(over, kStreams - 4);
  // The bound and what the streams cost besides: 38 MiB here (96 MiB would be unbounded).
  EXPECT_LT(testsupport::peakGrowth(before, pid), size_t{64} << 20) << kStreams << " streams of 8 MiB unfinished each";
  // Deleting the sandbox ends the rest.
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + running.id).status, 204);
  int refused = 0;
  for (auto& f : held) {
    ASSERT_EQ(f.wait_for(seconds(30)), std::future_status::ready);
    refused += f.get().body.find("unfinished answers") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(refused, kStreams - 4);
  EXPECT_TRUE(daemon_->alive()) << daemon_->log();
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + ended.id).status, 204);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
}
#endif

TEST_F(SpacedTest, ATenantAtItsQuotaCannotStopAnotherFromCreating) {
  daemon_ = Daemon::start(
      data_dir_, {"--tenant-max-sandboxes", "2", "--tenant-max-vcpus", "3", "--tenant-max-snapshots", "1",
                  "--tenant-max-memory-mb", "768", "--tenant-requests-per-s", "2", "--tenant-request-burst", "40"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());

  // The operator's tenant: two sandboxes (512 and 256 MB: its whole memory quota), then its quota.
  const std::string mine = d.create();
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(d.create(json{{"cpus", 2}, {"memory_mb", 256}}).empty());
  json refused = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}}, 429);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota");
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("quota of 2 running or paused sandboxes"),
            std::string::npos)
      << refused;
  // Bob is not held back by the operator's full quota; his own vCPU quota (3) holds him.
  json bobs = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 2}, {"memory_mb", 256}}, 201, bob);
  const std::string theirs = bobs.value("id", "");
  ASSERT_FALSE(theirs.empty());
  json over_vcpus = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 2}, {"memory_mb", 256}}, 429, bob);
  EXPECT_EQ(over_vcpus["error"]["code"], "tenant_quota");
  EXPECT_NE(over_vcpus["error"]["message"].get<std::string>().find("quota of 3 vCPUs"), std::string::npos)
      << over_vcpus;
  // And his memory quota: guest memory, as he asked for it (the node adds its QEMU's, not he).
  json over_memory = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 768}}, 429, bob);
  EXPECT_EQ(over_memory["error"]["code"], "tenant_quota");
  EXPECT_NE(over_memory["error"]["message"].get<std::string>().find("quota of 768 MB of memory (256 in use, 768"),
            std::string::npos)
      << over_memory;

  // Snapshots: one each.
  d.callJson("POST", "/v1/sandboxes/" + mine + "/snapshots", json::object(), 201);
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + mine + "/snapshots", json::object(), 429)["error"]["code"],
            "tenant_quota");
  d.callJson("POST", "/v1/sandboxes/" + theirs + "/snapshots", json::object(), 201, bob);

  // Deleting frees the place.
  ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + mine).status, 204);
  const std::string again = d.create();
  EXPECT_FALSE(again.empty());

  // Request rate: the operator spends its burst (40) at 2/s; bob's calls still pass.
  int limited = 0;
  std::string retry_after;
  for (int i = 0; i < 60 && limited == 0; ++i) {
    auto r = d.call("GET", "/v1/sandboxes");
    if (r.status == 429) {
      ++limited;
      retry_after = r.headers["retry-after"];
      EXPECT_NE(r.body.find("rate of 2 requests per second"), std::string::npos) << r.body;
    }
  }
  EXPECT_EQ(limited, 1) << "60 calls in a row never hit a burst of 40";
  EXPECT_FALSE(retry_after.empty());
  EXPECT_GE(std::stoi(retry_after.empty() ? "0" : retry_after), 1);
  EXPECT_EQ(d.call("GET", "/v1/sandboxes", "", bob).status, 200);
  std::this_thread::sleep_for(seconds(2));  // refilled: the operator may call again
  EXPECT_EQ(d.call("GET", "/v1/sandboxes").status, 200);
}

// An operator gives one tenant a quota of its own (`spaced tenant quota`) while spaced runs: it
// applies at the tenant's next create, to that tenant only, and GET /v1/quota shows each tenant
// its own limits and usage. --reset gives the tenant the node's defaults back.
TEST_F(SpacedTest, ATenantsOwnQuotaAppliesAtOnceAndOnlyToIt) {
  daemon_ = Daemon::start(data_dir_, {"--tenant-max-sandboxes", "1", "--tenant-max-suspended", "5"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  const json small{{"cpus", 1}, {"memory_mb", 256}};
  auto setQuota = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {SPACED_BIN, "tenant", "quota"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--json", "--data-dir", data_dir_});
    const std::string out = dir_->path() + "/quota.json";
    std::filesystem::remove(out);
    auto p = ChildProcess::spawn(argv, SpawnOptions{out, dir_->path() + "/quota.err", true});
    if (!p.ok()) return json();
    auto done = p->waitFor(seconds(30));
    auto text = readSmallFile(out, 4096);
    if (!done || done->exit_code != 0 || !text.ok()) return json();
    return json::parse(text.value(), nullptr, false);
  };
  json set = setQuota({"bob", "--sandboxes", "2", "--suspended-mb", "4096"});
  EXPECT_EQ(set["max_sandboxes"], 2) << set;
  EXPECT_EQ(set["max_suspended_mb"], 4096) << set;
  EXPECT_EQ(set["max_vcpus"], "default") << set;

  json bobs = d.callJson("GET", "/v1/quota", json(), 200, bob);
  EXPECT_EQ(bobs["tenant"], "bob");
  EXPECT_EQ(bobs["own"], true);
  EXPECT_EQ(bobs["limits"]["max_sandboxes"], 2);
  EXPECT_EQ(bobs["limits"]["max_suspended"], 5);  // the node's default where bob has no value
  EXPECT_EQ(bobs["limits"]["max_suspended_mb"], 4096);
  EXPECT_EQ(bobs["usage"]["sandboxes"], 0);
  json mine = d.callJson("GET", "/v1/quota", json(), 200);
  EXPECT_EQ(mine["own"], false);
  EXPECT_EQ(mine["limits"]["max_sandboxes"], 1);

  // Bob gets his two; the operator's tenant keeps the node's one.
  const std::string bobs_first = d.callJson("POST", "/v1/sandboxes", small, 201, bob).value("id", "");
  ASSERT_FALSE(bobs_first.empty());
  ASSERT_EQ(d.callJson("POST", "/v1/sandboxes", small, 201, bob)["state"], "running");
  json refused = d.callJson("POST", "/v1/sandboxes", small, 429, bob);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota");
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("quota of 2 running or paused"), std::string::npos)
      << refused;
  ASSERT_FALSE(d.create().empty());
  EXPECT_NE(d.callJson("POST", "/v1/sandboxes", small, 429)["error"]["message"].get<std::string>().find(
                "quota of 1 running or paused"),
            std::string::npos);
  bobs = d.callJson("GET", "/v1/quota", json(), 200, bob);
  EXPECT_EQ(bobs["usage"]["sandboxes"], 2) << bobs;
  EXPECT_EQ(bobs["usage"]["vcpus"], 2) << bobs;
  EXPECT_EQ(bobs["usage"]["memory_mb"], 512) << bobs;
  EXPECT_EQ(d.callJson("GET", "/v1/quota", json(), 200)["usage"]["sandboxes"], 1);  // never bob's figures
  // spacectl shows the same to a person.
  setenv("SPACE_API", d.url().c_str(), 1);
  setenv("SPACE_API_KEY", bob.c_str(), 1);
  const std::string shown = dir_->path() + "/spacectl-quota.out";
  EXPECT_EQ(runCommand({SPACECTL_BIN, "quota"}, shown), 0);
  unsetenv("SPACE_API");
  unsetenv("SPACE_API_KEY");
  auto read_back = readSmallFile(shown, 1 << 16);
  const std::string table = read_back.ok() ? read_back.value() : "";
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(sandboxes \(running or paused\) +2 +2\n)"))) << table;
  EXPECT_NE(table.find("tenant bob: limits set for this tenant by the operator"), std::string::npos) << table;

  // Snapshots and branches go by his own values too: one snapshot; a branch of two would make
  // four sandboxes where he may hold three.
  EXPECT_EQ(setQuota({"bob", "--sandboxes", "3", "--snapshots", "1"})["max_snapshots"], 1);
  const std::string snap =
      d.callJson("POST", "/v1/sandboxes/" + bobs_first + "/snapshots", json::object(), 201, bob).value("id", "");
  ASSERT_FALSE(snap.empty());
  json second_snap = d.callJson("POST", "/v1/sandboxes/" + bobs_first + "/snapshots", json::object(), 429, bob);
  EXPECT_NE(second_snap["error"]["message"].get<std::string>().find("quota of 1 snapshots"), std::string::npos)
      << second_snap;
  json branch = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 429, bob);
  EXPECT_NE(branch["error"]["message"].get<std::string>().find("would exceed its quota"), std::string::npos) << branch;
  EXPECT_EQ(d.callJson("GET", "/v1/quota", json(), 200, bob)["usage"]["snapshots"], 1);

  // His own request rate (read within a second): a burst of 3, then 429 with Retry-After; the
  // operator's tenant keeps the node's rate.
  json rated = setQuota({"bob", "--requests-per-s", "1", "--request-burst", "3"});
  EXPECT_EQ(rated["requests_per_s"], 1) << rated;
  std::this_thread::sleep_for(milliseconds(1100));
  int answered = 0;
  http::ClientResponse limited;
  for (int i = 0; i < 10; ++i) {
    limited = d.call("GET", "/v1/quota", "", bob);
    if (limited.status != 200) break;
    ++answered;
  }
  EXPECT_EQ(limited.status, 429) << limited.body;
  EXPECT_LE(answered, 4) << "a burst of 3 at 1/s let " << answered << " through";
  EXPECT_NE(limited.body.find("rate of 1 requests per second"), std::string::npos) << limited.body;
  // One bucket for every front end: E2B's API, with the same key, has nothing left to spend.
  {
    auto endpoint = readSmallFile(data_dir_ + "/spaced.json", 4096);
    ASSERT_TRUE(endpoint.ok());
    auto e2b = http::Client::create(json::parse(endpoint.value()).value("e2b_api_url", ""));
    ASSERT_TRUE(e2b.ok()) << e2b.error().message;
    auto via_e2b = e2b->request("GET", "/sandboxes", {{"X-API-Key", bob}});
    ASSERT_TRUE(via_e2b.ok()) << via_e2b.error().message;
    EXPECT_EQ(via_e2b->status, 429) << "E2B's API had a rate of its own: " << via_e2b->body;
  }
  for (int i = 0; i < 10; ++i) ASSERT_EQ(d.call("GET", "/v1/quota").status, 200) << i;
  std::this_thread::sleep_for(milliseconds(1100));
  json bobs_rate = d.callJson("GET", "/v1/quota", json(), 200, bob);
  EXPECT_EQ(bobs_rate["limits"]["requests_per_s"], 1) << bobs_rate;
  EXPECT_EQ(bobs_rate["limits"]["request_burst"], 3) << bobs_rate;
  EXPECT_EQ(setQuota({"bob", "--requests-per-s", "0"})["requests_per_s"], 0);  // 0: no rate limit
  std::this_thread::sleep_for(milliseconds(1100));
  for (int i = 0; i < 10; ++i) ASSERT_EQ(d.call("GET", "/v1/quota", "", bob).status, 200) << i;

  // Back to the node's default: bob holds two, so a third is refused at the node's 1.
  json reset = setQuota({"bob", "--reset"});
  EXPECT_EQ(reset["max_sandboxes"], "default") << reset;
  EXPECT_EQ(d.callJson("GET", "/v1/quota", json(), 200, bob)["own"], false);
  EXPECT_NE(d.callJson("POST", "/v1/sandboxes", small, 429, bob)["error"]["message"].get<std::string>().find(
                "quota of 1 running or paused"),
            std::string::npos);
  // 0 is no limit at all: the operator's tenant creates a second.
  EXPECT_EQ(setQuota({"default", "--sandboxes", "0"})["max_sandboxes"], 0);
  EXPECT_FALSE(d.create().empty());
  EXPECT_EQ(d.callJson("GET", "/v1/quota", json(), 200)["limits"]["max_sandboxes"], 0);
  // A tenant removed and added again does not inherit the old quota.
  EXPECT_EQ(setQuota({"bob", "--sandboxes", "9"})["max_sandboxes"], 9);
  ASSERT_EQ(runCommand({SPACED_BIN, "tenant", "rm", "bob", "--data-dir", data_dir_}, dir_->path() + "/rm.log"), 0);
  EXPECT_EQ(setQuota({"bob"})["max_sandboxes"], "default");
  // A name with a quota and no key is removed all the same.
  EXPECT_EQ(setQuota({"ghost", "--sandboxes", "0"})["max_sandboxes"], 0);
  ASSERT_EQ(runCommand({SPACED_BIN, "tenant", "rm", "ghost", "--data-dir", data_dir_}, dir_->path() + "/rm.log"), 0);
  EXPECT_EQ(setQuota({"ghost"})["max_sandboxes"], "default");
  // Names with control characters are refused; a data dir without a database is named.
  EXPECT_EQ(runCommand({SPACED_BIN, "tenant", "quota", "x\rEVIL", "--data-dir", data_dir_}, dir_->path() + "/bad.log"),
            1);
  EXPECT_EQ(runCommand({SPACED_BIN, "tenant", "quota", "bob", "--data-dir", dir_->path() + "/nowhere"},
                       dir_->path() + "/nowhere.log"),
            1);
  EXPECT_NE(readSmallFile(dir_->path() + "/nowhere.log", 4096).value().find("no state database"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_->path() + "/nowhere/state.db"));
}

// A suspended sandbox has no QEMU, and so no cgroup: its group goes at the suspend, a resume
// makes a new one, and a delete removes that.
// Also its disk I/O limit, which QEMU holds (not saved state): set again at every start. The
// sandbox (1 vCPU) may write 1 MiB/s; 4 MiB then take at least 3 s (the first request of up to
// 1 MiB goes at once), against under half a second unthrottled (VmTest.AGuestsDiskIoIsHeldToItsRate).
TEST_F(SpacedTest, ASuspendedSandboxHoldsNoCgroupAndGetsItsLimitsBackAtResume) {
  daemon_ = Daemon::start(data_dir_, {"--disk-mib-per-vcpu", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  auto writeTakesMs = [&] {
    const auto start = std::chrono::steady_clock::now();
    auto r =
        execJson(d, id, json{{"command", "dd if=/dev/zero of=/home/user/f bs=1M count=4 oflag=direct status=none"}});
    EXPECT_EQ(r.value("exit_code", -1), 0) << r.dump();
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  };
  EXPECT_GE(writeTakesMs(), 2500);
  const std::string first = qemuMemoryGroup(sandboxDir(id));
  ASSERT_NE(first.find("/space/spaced-"), std::string::npos) << first;
  d.callJson("POST", "/v1/sandboxes/" + id + "/suspend", json::object(), 200);
  EXPECT_FALSE(std::filesystem::exists(first)) << "a suspended sandbox kept its QEMU's group";
  d.callJson("POST", "/v1/sandboxes/" + id + "/resume", json::object(), 200);
  const std::string second = qemuMemoryGroup(sandboxDir(id));
  EXPECT_TRUE(!second.empty() && std::filesystem::exists(second)) << second;
  EXPECT_GE(writeTakesMs(), 2500);
  ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
  EXPECT_FALSE(std::filesystem::exists(second)) << "a deleted sandbox's group outlived it";
}

// Every size of a template is a permanent snapshot of the guest's memory: a loop of creates over
// sizes must not fill the disk. Beyond --max-template-sizes a new size boots and keeps nothing
// (slower, never refused: no tenant can lock others out of sizes); the default size is always
// kept.
TEST_F(SpacedTest, TemplatesAreKeptForAtMostTheAllowedNumberOfSizes) {
  daemon_ = Daemon::start(data_dir_, {"--max-template-sizes", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  auto templateDirs = [&] {
    std::set<std::string> dirs;
    for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/templates")) {
      if (e.path().filename().string().rfind("base-", 0) == 0) dirs.insert(e.path().filename().string());
    }
    return dirs;
  };
  auto templates = [&] { return static_cast<int>(templateDirs().size()); };
  ASSERT_FALSE(d.create(json{{"cpus", 1}, {"memory_mb", 256}}).empty());
  ASSERT_EQ(templates(), 1);
  const std::string small = *templateDirs().begin();
  const std::string odd = d.create(json{{"cpus", 1}, {"memory_mb", 384}});
  ASSERT_FALSE(odd.empty());
  EXPECT_EQ(templates(), 1) << "a size beyond the bound kept a template";
  EXPECT_EQ(execJson(d, odd, json{{"command", "echo booted"}})["stdout"], "booted\n");
  EXPECT_TRUE(waitForLog("sandbox " + odd + ": running (tenant default, 1 vCPU, 384 MB, booted (no template kept", 0,
                         seconds(1)));
  // The default size (2 vCPUs, 512 MB) is always kept: the pool and every plain create need it.
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes", json::object(), 201)["memory_mb"], 512);
  ASSERT_EQ(templates(), 2);
  std::string default_size;
  for (const auto& dir : templateDirs()) {
    if (dir != small) default_size = dir;
  }

  // The operator's list instead of first come: only a listed size gets a template. A size no
  // longer kept goes once no disk stands on it: here at the restart (--on-shutdown stop powered
  // its sandbox off). The default size stays without any disk on it.
  daemon_->stop(SIGTERM);
  size_t from = logSize();
  daemon_ = Daemon::start(data_dir_, {"--max-template-sizes", "0", "--template-sizes", "1x320"});
  ASSERT_TRUE(daemon_);
  EXPECT_TRUE(
      waitForLog("templates: evicting " + small + " (size 1x256 is not among --template-sizes", from, seconds(1)));
  EXPECT_EQ(templateDirs(), std::set<std::string>{default_size});
  const std::string unlisted = daemon_->create(json{{"cpus", 1}, {"memory_mb", 352}});
  ASSERT_FALSE(unlisted.empty());
  EXPECT_EQ(templates(), 1) << "a size not listed kept a template";
  ASSERT_FALSE(daemon_->create(json{{"cpus", 1}, {"memory_mb", 320}}).empty());
  ASSERT_EQ(templates(), 2) << "the listed size kept none";
  std::string listed;
  for (const auto& dir : templateDirs()) {
    if (dir != default_size) listed = dir;
  }

  // First come again, with an idle time of 1 s: a template a disk stands on stays however long
  // unused; once its last sandbox goes it is evicted. Again the default size stays.
  daemon_->stop(SIGTERM);
  daemon_ = Daemon::start(data_dir_, {"--template-idle", "1"});
  ASSERT_TRUE(daemon_);
  const std::string user = daemon_->create(json{{"cpus", 1}, {"memory_mb", 320}});
  ASSERT_FALSE(user.empty());
  std::this_thread::sleep_for(milliseconds(1500));
  // Any delete makes housekeeping collect; its debug line says the round ran.
  const std::string passer = daemon_->callJson("POST", "/v1/sandboxes", json::object(), 201).value("id", "");
  ASSERT_FALSE(passer.empty());  // of the default size: no new template
  from = logSize();
  ASSERT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + passer).status, 204);
  ASSERT_TRUE(waitForLog("layers: collected (", from, seconds(5)));
  EXPECT_EQ(templates(), 2) << "an idle template a running sandbox stands on was evicted";
  from = logSize();
  ASSERT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + user).status, 204);
  EXPECT_TRUE(waitForLog("templates: evicting " + listed + " (size 1x320 not used for", from, seconds(5)));
  EXPECT_EQ(templateDirs(), std::set<std::string>{default_size});
}

TEST_F(SpacedTest, TenantsSeeOnlyTheirOwnSandboxes) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  // A second tenant, added while the daemon runs.
  auto out_file = dir_->path() + "/tenant.json";
  auto add = ChildProcess::spawn({SPACED_BIN, "tenant", "add", "bob", "--json", "--data-dir", data_dir_},
                                 SpawnOptions{out_file, dir_->path() + "/tenant.err", true});
  ASSERT_TRUE(add.ok());
  auto added = add->waitFor(seconds(30));
  ASSERT_TRUE(added && added->exit_code == 0);
  auto text = readSmallFile(out_file, 4096);
  ASSERT_TRUE(text.ok());
  const std::string bob = json::parse(text.value())["api_key"].get<std::string>();

  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  // The key ring reloads at most once a second: wait until bob's key is known.
  for (auto until = Clock::now() + seconds(10);
       Clock::now() < until && d.call("GET", "/v1/sandboxes", "", bob).status != 200;) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 404, bob)["error"]["code"], "sandbox_not_found");
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes", nullptr, 200, bob)["sandboxes"].size(), 0u);
  d.callJson("DELETE", "/v1/sandboxes/" + id, nullptr, 404, bob);
  d.callJson("POST", "/v1/sandboxes/" + id + "/exec", json{{"command", "true"}}, 404, bob);
  EXPECT_EQ(d.call("GET", "/v1/sandboxes/" + id + "/files?path=/etc/hostname", "", bob).status, 404);
  // Still there for its owner.
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 200)["state"], "running");
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes", nullptr, 200)["sandboxes"].size(), 1u);

  // Snapshots are the owner's too: for bob they do not exist.
  const std::string snap =
      d.callJson("POST", "/v1/sandboxes/" + id + "/snapshots", json::object(), 201).value("id", "");
  ASSERT_FALSE(snap.empty());
  EXPECT_EQ(d.call("GET", "/v1/snapshots/" + snap, "", bob).status, 404);
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots", nullptr, 200, bob)["snapshots"].size(), 0u);
  EXPECT_EQ(d.call("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 1}}.dump(), bob).status, 404);
  EXPECT_EQ(d.call("POST", "/v1/sandboxes", json{{"snapshot", snap}}.dump(), bob).status, 404);
  EXPECT_EQ(d.call("DELETE", "/v1/snapshots/" + snap, "", bob).status, 404);
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots/" + snap, nullptr, 200)["id"], snap);

  // tenant ls names both; tenant rm revokes bob's key, which then stops working.
  auto spacedTenant = [&](std::vector<std::string> args) {
    const std::string out = dir_->path() + "/tenant-cmd.out";
    args.insert(args.begin(), {SPACED_BIN, "tenant"});
    args.insert(args.end(), {"--data-dir", data_dir_});
    EXPECT_EQ(runCommand(args, out), 0) << readSmallFile(out, 1 << 16).value();
    auto text = readSmallFile(out, 1 << 16);
    return text.ok() ? text.value() : std::string();
  };
  json tenants = json::parse(spacedTenant({"ls", "--json"}), nullptr, false);
  ASSERT_TRUE(tenants.is_array()) << tenants;
  std::set<std::string> names;
  for (const auto& t : tenants) names.insert(t.value("tenant", ""));
  EXPECT_TRUE(names.count("bob")) << tenants;
  EXPECT_EQ(names.size(), 2u) << tenants;
  spacedTenant({"rm", "bob"});
  int status = 0;
  for (auto until = Clock::now() + seconds(10); Clock::now() < until;) {
    status = d.call("GET", "/v1/sandboxes", "", bob).status;
    if (status == 401) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(status, 401) << "a revoked key still works";
  EXPECT_EQ(d.call("GET", "/v1/sandboxes", "").status, 200);  // the other tenant is unaffected
}

// Exec's limits through the API: a timeout kills the command, output over 4 MiB (as JSON) is refused,
// a client that goes away leaves the command running; list paging; the running QEMU's seccomp.
TEST_F(SpacedTest, ExecLimitsListPagingAndSeccompThroughTheApi) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());

  auto start = Clock::now();
  auto timed = d.call("POST", "/v1/sandboxes/" + id + "/exec", json{{"command", "sleep 30"}, {"timeout_s", 1}}.dump());
  EXPECT_LT(Clock::now() - start, seconds(15));
  if (timed.status == 200) {
    json r = json::parse(timed.body);
    EXPECT_EQ(r["exit_code"], -1) << r;
    EXPECT_EQ(r["status"], "signal: killed") << r;
  } else {
    EXPECT_EQ(timed.status, 504) << timed.body;
  }

  json big = execJson(d, id, json{{"command", "head -c 20000000 /dev/zero"}}, 422);
  EXPECT_EQ(big["error"]["code"], "output_too_large") << big;
  // The limit counts the answer as JSON: 1 MB of NUL bytes is 6 MB of "\u0000".
  json escaped = execJson(d, id, json{{"command", "head -c 1000000 /dev/zero"}}, 422);
  EXPECT_NE(escaped["error"]["message"].get<std::string>().find("as JSON"), std::string::npos) << escaped;
  EXPECT_EQ(execJson(d, id, json{{"command", "head -c 1000000 /dev/zero | tr '\\0' a | wc -c"}})["stdout"],
            "1000000\n");

  // A client that disconnects from a non-streamed exec: the command still runs to its end.
  {
    auto client = http::Client::create(d.url());
    ASSERT_TRUE(client.ok());
    auto r = client->request("POST", "/v1/sandboxes/" + id + "/exec",
                             {{"Authorization", "Bearer " + d.key()}, {"Content-Type", "application/json"}},
                             json{{"command", "sleep 2; echo done > /tmp/after-disconnect"}}.dump(), milliseconds(300));
    EXPECT_FALSE(r.ok()) << "the client gave up after 300 ms";
  }
  json waited = execJson(d, id,
                         json{{"command",
                               "for i in $(seq 100); do [ -s /tmp/after-disconnect ] && break; sleep 0.1; "
                               "done; cat /tmp/after-disconnect"}});
  EXPECT_EQ(waited["stdout"], "done\n");

  // Paging: three sandboxes, one per page, each once.
  const std::string b = d.create(), c = d.create();
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(c.empty());
  std::set<std::string> seen;
  std::string cursor;
  int pages = 0;
  do {
    json page = d.callJson("GET", "/v1/sandboxes?limit=1" + (cursor.empty() ? "" : "&cursor=" + cursor), nullptr, 200);
    ASSERT_LE(page["sandboxes"].size(), 1u);
    for (const auto& s : page["sandboxes"]) EXPECT_TRUE(seen.insert(s["id"].get<std::string>()).second) << "twice";
    cursor = page["next_cursor"].is_string() ? page["next_cursor"].get<std::string>() : "";
    ASSERT_LT(++pages, 10);
  } while (!cursor.empty());
  EXPECT_EQ(seen, (std::set<std::string>{id, b, c}));
  d.callJson("GET", "/v1/sandboxes?limit=0", nullptr, 400);

  // QEMU runs under its own seccomp filter (mode 2).
  auto pids = qemuProcessesUnder(sandboxDir(id));
  ASSERT_EQ(pids.size(), 1u);
  auto status = readSmallFile("/proc/" + std::to_string(pids[0]) + "/status", 1 << 16);
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("\nSeccomp:\t2\n"), std::string::npos) << *status;
  // It is SPACE's own QEMU (make images builds it, spaced's default --qemu), not Debian's in PATH.
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(pids[0]) + "/exe", ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(exe, std::filesystem::canonical(kImages + "/qemu-system-x86_64"));
}

TEST_F(SpacedTest, PauseAndResumeKeepProcessesAcrossADaemonRestart) {
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  const std::string sb = "/v1/sandboxes/" + id;
  // The ticker records its own pid: the same process must be there after pause, restart, resume.
  execJson(*daemon_, id,
           json{{"command",
                 "setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do echo t >> /tmp/ticks; sleep 0.05; done' "
                 ">/dev/null 2>&1 &"}});
  const std::string ticker = execJson(*daemon_, id, json{{"command", kCatTickerPid}})["stdout"];

  EXPECT_EQ(daemon_->callJson("POST", sb + "/pause", nullptr, 200)["state"], "paused");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/pause", nullptr, 200)["state"], "paused");  // idempotent
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "paused");
  json refused = execJson(*daemon_, id, json{{"command", "true"}}, 409);
  EXPECT_EQ(refused["error"]["code"], "invalid_state");
  EXPECT_EQ(refused["error"]["state"], "paused");
  daemon_->callJson("POST", sb + "/pause", json{{"force", true}}, 400);  // no such field

  // A restart finds it paused; resume re-attaches the agent; the process lived through it all.
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "paused");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/resume", nullptr, 200)["state"], "running");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/resume", nullptr, 200)["state"], "running");
  int before = std::stoi(execJson(*daemon_, id, json{{"command", "wc -l < /tmp/ticks"}})["stdout"].get<std::string>());
  // Waits in the guest (up to 10 s) for the ticker to tick again, rather than sleeping here.
  json after =
      execJson(*daemon_, id,
               json{{"command", "for i in $(seq 200); do [ $(wc -l < /tmp/ticks) -gt " + std::to_string(before) +
                                    " ] && break; sleep 0.05; done; wc -l < /tmp/ticks; kill -0 $(cat "
                                    "/tmp/ticker.pid) && cat /tmp/ticker.pid"}});
  EXPECT_GT(std::stoi(after["stdout"].get<std::string>()), before);
  EXPECT_FALSE(ticker.empty());
  EXPECT_NE(after["stdout"].get<std::string>().find(ticker), std::string::npos) << after << " ticker " << ticker;

  // A paused sandbox can be deleted; a deleted one cannot be paused.
  EXPECT_EQ(daemon_->callJson("POST", sb + "/pause", nullptr, 200)["state"], "paused");
  EXPECT_EQ(daemon_->call("DELETE", sb).status, 204);
  EXPECT_EQ(daemon_->callJson("POST", sb + "/resume", nullptr, 409)["error"]["state"], "deleted");
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
}

TEST_F(SpacedTest, SandboxesAreRestoredFromATemplateWithTheirOwnIdentity) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  std::vector<std::string> ids;
  // The first create builds the template snapshot; the clones come 5 s later, so a clock left
  // at the snapshot's time would be at least 5 s behind.
  ids.push_back(d.create());
  ASSERT_FALSE(ids[0].empty());
  std::this_thread::sleep_for(seconds(5));
  for (int i = 0; i < 2; ++i) ids.push_back(d.create());
  ASSERT_FALSE(ids[1].empty());
  ASSERT_FALSE(ids[2].empty());
  ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + ids[0]).status, 204);
  ids.erase(ids.begin());
  // One template snapshot for the size, made on first use.
  int templates = 0;
  for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/templates")) {
    if (e.path().filename().string().rfind("base-", 0) == 0) {
      ++templates;
      EXPECT_TRUE(std::filesystem::exists(e.path() / "meta.json"));
      EXPECT_TRUE(std::filesystem::exists(e.path() / "state"));
    }
  }
  EXPECT_EQ(templates, 1);
  const std::string probe =
      "hostname; cat /proc/sys/kernel/random/uuid; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
      "date +%s.%N";
  std::vector<std::vector<std::string>> seen;
  auto wallNow = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  for (const auto& id : ids) {
    const double before = wallNow();
    std::string out = execJson(d, id, json{{"command", probe}})["stdout"];
    const double after = wallNow();
    std::vector<std::string> lines;
    for (size_t start = 0, nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(out.substr(start, nl - start));
    }
    ASSERT_EQ(lines.size(), 4u) << out;
    std::string host = id;
    std::replace(host.begin(), host.end(), '_', '-');
    EXPECT_EQ(lines[0], host);
    // The clock was set at restore, not left at the template's snapshot time: within 1 s of the
    // host's clock over the exec that read it.
    const double guest = std::stod(lines[3]);
    EXPECT_GE(guest, before - 1.0) << "guest clock behind the host's by " << before - guest << " s";
    EXPECT_LE(guest, after + 1.0) << "guest clock ahead of the host's by " << guest - after << " s";
    seen.push_back(lines);
  }
  EXPECT_NE(seen[0][1], seen[1][1]) << "clones share their random state";
  EXPECT_NE(seen[0][2], seen[1][2]) << "clones share their random state";
  // The clock source the template's kernel chose, which every clone inherits. Under TCG the
  // guest's own TSC calibration fails on a busy host and leaves it on jiffies, whose periodic
  // tick keeps an idle guest at ~5% of a core; spaced gives it the host's TSC frequency
  // (tsc_early_khz) so it runs on the TSC, tickless when idle.
  std::string clock = execJson(
      d, ids[0], json{{"command", "cat /sys/devices/system/clocksource/clocksource0/current_clocksource"}})["stdout"];
  const bool kvm =
      vmm::chooseAccelerator(vmm::Accelerator::kAuto, vmm::probeKvm())->accelerator == vmm::Accelerator::kKvm;
  EXPECT_EQ(clock, kvm ? "kvm-clock\n" : "tsc\n");
}

// Branched children must not share their random state. A guest kernel reseeds its CRNG by
// itself, at intervals of half its uptime early on, from interrupt timings that differ between
// clones; that alone would make clones diverge within a second or two and hide a missing host
// reseed. So the parent forces a kernel reseed right before its snapshot (its uptime is 20 s
// then, so the kernel's own next reseed is 10 s away): children that differ in their first
// reads can only owe it to the entropy the host gives each of them at start.
TEST_F(SpacedTest, BranchedChildrenDoNotShareTheirRandomState) {
  // One child after another (the serial path; ABranchStartsItsChildrenTogether has the parallel one).
  daemon_ = Daemon::start(data_dir_, {"--branch-workers", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  execJson(d, parent,
           json{{"command",
                 "while [ $(cut -d. -f1 /proc/uptime) -lt 20 ]; do sleep 0.2; done; "
                 "python3 -c 'import fcntl; fcntl.ioctl(open(\"/dev/urandom\", \"rb\"), 0x5207)'"},
                {"user", "root"},
                {"timeout_s", 60}});  // 0x5207: RNDRESEEDCRNG
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  json children = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 201);
  ASSERT_EQ(children["sandboxes"].size(), 2u) << children;
  std::vector<std::string> reads;
  for (const auto& child : children["sandboxes"]) {
    reads.push_back(execJson(d, child["id"],
                             json{{"command",
                                   "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; cat "
                                   "/proc/sys/kernel/random/uuid"}})["stdout"]);
  }
  ASSERT_EQ(reads[0].size(), 65u + 37u) << reads[0];
  EXPECT_NE(reads[0].substr(0, 64), reads[1].substr(0, 64)) << "two children read the same bytes from /dev/urandom";
  EXPECT_NE(reads[0].substr(65), reads[1].substr(65)) << "two children made the same UUID";
}

// `make images` rebuilt the root filesystem, and spaced restarted on the new one: a sandbox
// suspended before still stands (through its template's disk) on the old image. That entry is
// pinned for its data dir (the cache's prune keeps it while spaced is stopped), and a jailed VM
// may open it: the sandbox resumes with its files.
TEST_F(SpacedTest, ASandboxSavedBeforeAnImageRebuildResumesOnTheImageItStandsOn) {
  const std::string old_image = std::filesystem::canonical(kImages + "/rootfs.ext4").string();
  const std::filesystem::path old_entry = std::filesystem::path(old_image).parent_path();
  const std::string pin =
      (old_entry / "pins" / vmm::imagePinName(std::filesystem::weakly_canonical(data_dir_))).string();
  // The "rebuilt" image: a new entry of the same cache (a link to the same bytes is enough: the
  // path is what a disk names).
  const std::filesystem::path new_entry = old_entry.parent_path() / ("rootfs-spacedtest" + std::to_string(getpid()));
  struct Cleanup {
    std::filesystem::path entry;
    std::string pin;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(entry, ec);
      std::filesystem::remove(pin, ec);
    }
  } cleanup{new_entry, pin};
  std::filesystem::create_directory(new_entry);
  ASSERT_EQ(::link(old_image.c_str(), (new_entry / "rootfs.ext4").c_str()), 0) << strerror(errno);
  ASSERT_TRUE(writeFileAtomic((new_entry / "manifest.json").string(), "{}\n", 0644).ok());

  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep", "--warm-pool", "0"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create(json{{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(id.empty());
  execJson(*daemon_, id, json{{"command", "echo saved > /home/user/file.txt"}});
  EXPECT_EQ(daemon_->callJson("POST", "/v1/sandboxes/" + id + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  auto pinned = readSmallFile(pin, 4096);
  ASSERT_TRUE(pinned.ok()) << "no pin at " << pin;
  EXPECT_EQ(pinned.value(), std::filesystem::weakly_canonical(data_dir_).string() + "\n");

  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "0", "--rootfs", (new_entry / "rootfs.ext4").string()});
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(execJson(*daemon_, id, json{{"command", "cat /home/user/file.txt"}})["stdout"], "saved\n");
  // Still pinned: the old template stands on it.
  EXPECT_TRUE(std::filesystem::exists(pin));
  daemon_->callJson("DELETE", "/v1/sandboxes/" + id, nullptr, 204);
}

TEST_F(SpacedTest, SuspendReleasesTheVmAndExecResumesItOnDemand) {
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create(json{{"cpus", 1}, {"memory_mb", 256}, {"env", {{"KEPT", "yes"}}}});
  ASSERT_FALSE(id.empty());
  const std::string sb = "/v1/sandboxes/" + id;
  execJson(*daemon_, id,
           json{{"command",
                 "echo on-disk > /home/user/file.txt; setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do "
                 "sleep 0.05; done' >/dev/null 2>&1 &"}});
  const std::string ticker = execJson(*daemon_, id, json{{"command", kCatTickerPid}})["stdout"];
  ASSERT_FALSE(ticker.empty());

  EXPECT_EQ(daemon_->callJson("POST", sb + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/suspend", nullptr, 200)["state"], "suspended");  // idempotent
  EXPECT_TRUE(qemuProcessesUnder(sandboxDir(id)).empty()) << "a suspended sandbox holds no QEMU";
  EXPECT_TRUE(std::filesystem::exists(sandboxDir(id) + "/suspended.state"));
  auto metrics = daemon_->call("GET", "/metrics");
  EXPECT_NE(metrics.body.find("space_node_memory_reserved_mb 0"), std::string::npos) << metrics.body;
  // Its value depends on this host's packages (NodeFacts.AQemuBuildWatch... covers it).
  EXPECT_NE(metrics.body.find("\nspace_qemu_build_stale "), std::string::npos) << metrics.body;
  EXPECT_EQ(daemon_->callJson("POST", sb + "/pause", nullptr, 409)["error"]["state"], "suspended");

  // A restart keeps it suspended (nothing to adopt, nothing removed).
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "suspended");

  // A call that only looks (X-Space-No-Resume, the console's polls) leaves it suspended.
  auto client = http::Client::create(daemon_->url());
  auto looked =
      client->request("GET", sb + "/processes",
                      {{"Authorization", "Bearer " + daemon_->key()}, {"X-Space-No-Resume", "1"}}, "", seconds(30));
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(looked->status, 409) << looked->body;
  EXPECT_EQ(looked->headers.count("x-space-resumed"), 0u);
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "suspended");

  // An exec resumes it on demand and says so; processes, files and env survived, and the clock,
  // which stood still while suspended (at least 4 s here), is the host's again.
  std::this_thread::sleep_for(seconds(4));
  const double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto r = client->request("POST", sb + "/exec", {{"Authorization", "Bearer " + daemon_->key()}},
                           json{{"command",
                                 "cat /home/user/file.txt; kill -0 $(cat /tmp/ticker.pid) && "
                                 "cat /tmp/ticker.pid; echo $KEPT; date +%s.%N"}}
                               .dump(),
                           seconds(60));
  const double after = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->headers["x-space-resumed"], "true");
  std::string out = json::parse(r->body)["stdout"];
  const size_t last = out.rfind('\n', out.size() - 2);
  ASSERT_NE(last, std::string::npos) << out;
  const double guest = std::stod(out.substr(last + 1));
  EXPECT_GE(guest, before - 1.0) << "guest clock behind the host's by " << before - guest << " s after resume";
  EXPECT_LE(guest, after + 1.0) << "guest clock ahead of the host's by " << guest - after << " s after resume";
  EXPECT_EQ(out.substr(0, last + 1), "on-disk\n" + ticker + "yes\n");
  EXPECT_EQ(daemon_->callJson("GET", sb, nullptr, 200)["state"], "running");
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(id) + "/suspended.state"));
  auto again = client->request("POST", sb + "/exec", {{"Authorization", "Bearer " + daemon_->key()}},
                               json{{"command", "true"}}.dump());
  EXPECT_EQ(again->headers.count("x-space-resumed"), 0u);

  // Suspend, resume explicitly, then suspend and delete: the files go with it.
  EXPECT_EQ(daemon_->callJson("POST", sb + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/resume", nullptr, 200)["state"], "running");
  EXPECT_EQ(daemon_->callJson("POST", sb + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->call("DELETE", sb).status, 204);
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(id)));
}

// What QEMU in `run_dir` says its guest is doing ("running", "paused", "postmigrate", ...).
std::string qemuStatus(const std::string& run_dir) {
  auto qmp = vmm::QmpClient::connect(run_dir + "/qmp.sock", Clock::now() + seconds(10));
  if (!qmp.ok()) return "unreachable: " + qmp.error().message;
  auto status = qmp->execute("query-status");
  return status.ok() ? status->value("status", "?") : "error: " + status.error().message;
}

// spaced killed (SIGKILL, by its fault points) right after each step of a suspend and a resume.
// After a restart the sandbox is in the state that step implies, its files are intact, and the
// guest never ran from a saved state that could still be loaded again: a resume continues the
// guest only once the saved state is gone, so a crash can never restore stale RAM over a disk
// the guest has written since.
TEST_F(SpacedTest, CrashAtEachStepOfSuspendAndResume) {
  struct Step {
    const char* fault;
    const char* after_restart;  // the state recovery must find
  };
  for (const Step& step :
       {Step{"suspend.saved", "suspended"}, Step{"suspend.recorded", "suspended"}, Step{"resume.restored", "suspended"},
        Step{"resume.recorded", "suspended"}, Step{"resume.state_removed", "running"}}) {
    SCOPED_TRACE(step.fault);
    const bool in_resume = std::string(step.fault).rfind("resume.", 0) == 0;
    startWithFault(step.fault);
    ASSERT_TRUE(daemon_);
    const std::string id = daemon_->create();
    ASSERT_FALSE(id.empty());
    execJson(*daemon_, id, json{{"command", "echo kept > /home/user/kept.txt; sync"}});
    if (in_resume) {
      ASSERT_EQ(daemon_->callJson("POST", "/v1/sandboxes/" + id + "/suspend", nullptr, 200)["state"], "suspended");
    }
    expectDeathAt(step.fault, "POST", "/v1/sandboxes/" + id + (in_resume ? "/resume" : "/suspend"));
    if (in_resume) {
      // The restored QEMU outlives spaced; its guest must still be stopped at every resume step.
      auto left = qemuProcessesUnder(data_dir_);
      ASSERT_EQ(left.size(), 1u);
      EXPECT_NE(qemuStatus(sandboxDir(id)), "running") << "the guest ran before its resume was complete";
    }
    daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
    ASSERT_TRUE(daemon_);
    json got = daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200);
    EXPECT_EQ(got["state"], step.after_restart) << got;
    EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), std::string(step.after_restart) == "running" ? 1u : 0u);
    EXPECT_EQ(std::filesystem::exists(sandboxDir(id) + "/suspended.state"),
              std::string(step.after_restart) == "suspended");
    // Usable either way (an exec resumes a suspended sandbox), with its files.
    EXPECT_EQ(execJson(*daemon_, id, json{{"command", "cat /home/user/kept.txt"}})["stdout"], "kept\n");
    EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200)["state"], "running");
    EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
    EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
    daemon_->stop(SIGTERM);
  }
}

// spaced killed right after each step of a create and a delete: the sandbox is failed (its
// create never completed) or running (recorded), or deleted; no QEMU or run directory is left
// that no sandbox owns.
TEST_F(SpacedTest, CrashAtEachStepOfCreateAndDelete) {
  struct Step {
    const char* fault;
    const char* after_restart;
  };
  for (const Step& step : {Step{"create.inserted", "failed"}, Step{"create.configured", "failed"},
                           Step{"create.recorded", "running"}, Step{"delete.vm_removed", "failed"}}) {
    SCOPED_TRACE(step.fault);
    const bool in_delete = std::string(step.fault).rfind("delete.", 0) == 0;
    startWithFault(step.fault);
    ASSERT_TRUE(daemon_);
    std::string id;
    if (in_delete) {
      id = daemon_->create();
      ASSERT_FALSE(id.empty());
      expectDeathAt(step.fault, "DELETE", "/v1/sandboxes/" + id);
    } else {
      expectDeathAt(step.fault, "POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}}.dump());
    }
    daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
    ASSERT_TRUE(daemon_);
    json all = daemon_->callJson("GET", "/v1/sandboxes?state=running,failed,deleted,creating", nullptr, 200);
    if (id.empty() && all["sandboxes"].size() == 1) id = all["sandboxes"][0]["id"];
    ASSERT_FALSE(id.empty()) << all;
    json got = daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200);
    EXPECT_EQ(got["state"], step.after_restart) << got;
    const bool running = std::string(step.after_restart) == "running";
    EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), running ? 1u : 0u);
    EXPECT_EQ(std::filesystem::exists(sandboxDir(id)), running);
    if (running) {
      EXPECT_EQ(execJson(*daemon_, id, json{{"command", "echo up"}})["stdout"], "up\n");
    }
    daemon_->stop(SIGTERM);
    std::filesystem::remove_all(data_dir_);
  }
}

// spaced killed right after each step of a snapshot: the sandbox runs on with its files, the
// snapshot exists only if it was recorded (and then branches), and no build directory,
// unrecorded snapshot or unreferenced layer is left.
TEST_F(SpacedTest, CrashAtEachStepOfASnapshot) {
  for (const char* fault : {"snapshot.disk_frozen", "snapshot.captured", "snapshot.sandbox_released",
                            "snapshot.published", "snapshot.recorded"}) {
    SCOPED_TRACE(fault);
    const bool kept = std::string(fault) == "snapshot.recorded";
    startWithFault(fault);
    ASSERT_TRUE(daemon_);
    const std::string id = daemon_->create();
    ASSERT_FALSE(id.empty());
    execJson(*daemon_, id, json{{"command", "echo kept > /home/user/kept.txt; sync"}});
    expectDeathAt(fault, "POST", "/v1/sandboxes/" + id + "/snapshots");
    daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
    ASSERT_TRUE(daemon_);
    EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200)["state"], "running");
    EXPECT_EQ(execJson(*daemon_, id,
                       json{{"command", "echo after >> /home/user/kept.txt; cat /home/user/kept.txt"}})["stdout"],
              "kept\nafter\n");
    json snaps = daemon_->callJson("GET", "/v1/snapshots?sandbox_id=" + id, nullptr, 200);
    ASSERT_EQ(snaps["snapshots"].size(), kept ? 1u : 0u) << snaps;
    size_t dirs = 0;
    for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/snapshots")) {
      EXPECT_NE(e.path().filename().string().rfind(".build-", 0), 0u) << "left: " << e.path();
      ++dirs;
    }
    EXPECT_EQ(dirs, snaps["snapshots"].size());
    if (kept) {
      const std::string snap = snaps["snapshots"][0]["id"];
      const std::string child = daemon_->create(json{{"snapshot", snap}});
      ASSERT_FALSE(child.empty());
      EXPECT_EQ(execJson(*daemon_, child, json{{"command", "cat /home/user/kept.txt"}})["stdout"], "kept\n");
      EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + child).status, 204);
      EXPECT_EQ(daemon_->call("DELETE", "/v1/snapshots/" + snap).status, 204);
    }
    EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
    EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
    daemon_->stop(SIGTERM);
    daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});  // its recovery collects the layers
    ASSERT_TRUE(daemon_);
    EXPECT_TRUE(std::filesystem::is_empty(data_dir_ + "/layers"));
    daemon_->stop(SIGTERM);
  }
}

// A branch is all or nothing: when one child fails to start (here the 3rd create fails on
// purpose, SPACE_FAULT_FAIL), the children already started are deleted, the error says so,
// and only the parent runs on.
TEST_F(SpacedTest, AFailedChildRollsTheWholeBranchBack) {
  ::setenv("SPACE_FAULT_FAIL", "create.configured@3", 1);  // the parent is the 1st create
  daemon_ = Daemon::start(data_dir_);
  ::unsetenv("SPACE_FAULT_FAIL");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  auto r = d.call("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 4}}.dump());
  EXPECT_GE(r.status, 500) << r.body;
  json error = json::parse(r.body, nullptr, false);
  EXPECT_NE(error["error"].value("message", "").find("now deleted"), std::string::npos) << r.body;
  json running = d.callJson("GET", "/v1/sandboxes?state=running,creating,paused", nullptr, 200);
  ASSERT_EQ(running["sandboxes"].size(), 1u) << running;
  EXPECT_EQ(running["sandboxes"][0]["id"], parent);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u) << "a child outlived the rollback";
  // The next branch (no failure armed any more) works.
  json children = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 201);
  EXPECT_EQ(children["sandboxes"].size(), 2u) << children;
}

// A child whose create throws (SPACE_FAULT_THROW: std::bad_alloc on a branch worker's thread,
// where nothing above would catch it) fails the branch like a child that failed: spaced runs on,
// the others are deleted, and the next branch works.
TEST_F(SpacedTest, AChildThatThrowsFailsTheBranchAndSpacedRunsOn) {
  ::setenv("SPACE_FAULT_THROW", "create.configured@3", 1);  // the parent passes it 1st
  daemon_ = Daemon::start(data_dir_);
  ::unsetenv("SPACE_FAULT_THROW");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  auto r = d.call("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 3}}.dump());
  EXPECT_GE(r.status, 500) << r.body;
  EXPECT_NE(r.body.find("now deleted"), std::string::npos) << r.body;
  json running = d.callJson("GET", "/v1/sandboxes?state=running,creating,paused", nullptr, 200);
  ASSERT_EQ(running["sandboxes"].size(), 1u) << running;
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u) << "a child outlived the rollback";
  json children = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 201);
  EXPECT_EQ(children["sandboxes"].size(), 2u) << children;
}

// A snapshot taken under one accelerator is never restored under another: 409
// snapshot_incompatible, nothing started. (This machine has only TCG; the record is edited to
// say the snapshot came from a KVM node.)
TEST_F(SpacedTest, ASnapshotFromAnotherAcceleratorIsRefused) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  const std::string snap = daemon_->callJson("POST", "/v1/sandboxes/" + id + "/snapshots", json::object(), 201)["id"];
  ASSERT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
  daemon_->stop(SIGTERM);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((data_dir_ + "/state.db").c_str(), &db), SQLITE_OK);
    const std::string sql = "UPDATE snapshots SET accelerator = 'kvm' WHERE id = '" + snap + "'";
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    EXPECT_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
  }
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  json refused = daemon_->callJson("POST", "/v1/sandboxes", json{{"snapshot", snap}}, 409);
  EXPECT_EQ(refused["error"]["code"], "snapshot_incompatible") << refused;
  EXPECT_NE(refused["error"].value("message", "").find("kvm"), std::string::npos) << refused;
  EXPECT_EQ(daemon_->callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 409)["error"]["code"],
            "snapshot_incompatible");
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes?state=running,creating,failed", nullptr, 200)["sandboxes"].size(),
            0u);
}

// A snapshot of a running sandbox: the sandbox runs on unchanged; five children branched from
// it each start with its processes, files and env, diverge copy-on-write, and have their own
// identity. Deleting the snapshot does not break its children; its disk layer goes when the
// last disk standing on it does.
TEST_F(SpacedTest, SnapshotsBranchIntoIndependentChildren) {
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep", "--warm-pool", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"env", {{"KEPT", "yes"}}}});
  ASSERT_FALSE(parent.empty());
  execJson(d, parent,
           json{{"command",
                 "echo before > /home/user/shared.txt; setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do "
                 "sleep 1; done' >/dev/null 2>&1 &"}});
  const std::string ticker = execJson(d, parent, json{{"command", kCatTickerPid}})["stdout"];
  ASSERT_FALSE(ticker.empty());

  json snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json{{"name", "after setup"}}, 201);
  const std::string snap_id = snap.value("id", "");
  ASSERT_EQ(snap_id.substr(0, 5), "snap_") << snap;
  EXPECT_EQ(snap["name"], "after setup");
  EXPECT_EQ(snap["sandbox_id"], parent);
  EXPECT_EQ(snap["memory_mb"], 256);
  EXPECT_GT(snap["size_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots/" + snap_id, nullptr, 200)["id"], snap_id);
  json listed = d.callJson("GET", "/v1/snapshots?sandbox_id=" + parent, nullptr, 200);
  ASSERT_EQ(listed["snapshots"].size(), 1u);
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots?sandbox_id=sb_other", nullptr, 200)["snapshots"].size(), 0u);

  // The parent runs on: same process, and its later writes are its own.
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + parent, nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(d, parent,
                     json{{"command",
                           "kill -0 $(cat /tmp/ticker.pid) && cat /tmp/ticker.pid && echo parent > "
                           "/home/user/shared.txt"}})["stdout"],
            ticker);

  // Bad requests change nothing.
  EXPECT_EQ(d.callJson("POST", "/v1/snapshots/" + snap_id + "/branch", json{{"count", 0}}, 400)["error"]["code"],
            "invalid_argument");
  EXPECT_EQ(d.callJson("POST", "/v1/snapshots/snap_nope/branch", json{{"count", 1}}, 404)["error"]["code"],
            "snapshot_not_found");
  d.callJson("POST", "/v1/sandboxes", json{{"snapshot", snap_id}, {"template", "base"}}, 400);
  d.callJson("POST", "/v1/sandboxes", json{{"snapshot", snap_id}, {"memory_mb", 512}}, 400);
  d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json{{"name", std::string("a\nb")}}, 400);
  d.callJson("POST", "/v1/sandboxes/sb_nope/snapshots", json::object(), 404);

  json branched = d.callJson("POST", "/v1/snapshots/" + snap_id + "/branch",
                             json{{"count", 5}, {"metadata", {{"batch", "b1"}}}}, 201);
  ASSERT_EQ(branched["sandboxes"].size(), 5u) << branched;
  std::vector<std::string> children;
  for (const auto& child : branched["sandboxes"]) {
    EXPECT_EQ(child["state"], "running");
    EXPECT_EQ(child["snapshot"], snap_id);
    EXPECT_EQ(child["metadata"]["batch"], "b1");
    children.push_back(child["id"]);
  }
  std::set<std::string> hostnames, uuids;
  for (size_t i = 0; i < children.size(); ++i) {
    json r = execJson(d, children[i],
                      json{{"command",
                            "kill -0 $(cat /tmp/ticker.pid) && cat /tmp/ticker.pid /home/user/shared.txt "
                            "&& echo $KEPT && echo child" +
                                std::to_string(i) + " > /home/user/shared.txt"}});
    EXPECT_EQ(r["exit_code"], 0) << r;
    EXPECT_EQ(r["stdout"], ticker + "before\nyes\n");
    hostnames.insert(execJson(d, children[i], json{{"command", "hostname"}})["stdout"].get<std::string>());
    uuids.insert(
        execJson(d, children[i], json{{"command", "cat /proc/sys/kernel/random/uuid"}})["stdout"].get<std::string>());
  }
  EXPECT_EQ(hostnames.size(), children.size()) << "every child has its own hostname";
  EXPECT_EQ(uuids.size(), children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    EXPECT_EQ(execJson(d, children[i], json{{"command", "cat /home/user/shared.txt"}})["stdout"],
              "child" + std::to_string(i) + "\n");
  }
  EXPECT_EQ(execJson(d, parent, json{{"command", "cat /home/user/shared.txt"}})["stdout"], "parent\n");

  // Snapshots of snapshots: the parent again (its disk frozen a second time) and a child; a
  // grandchild sees the child's write; the parent survives a suspend over its two frozen layers.
  d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201);
  // A paused sandbox is snapshotted twice and stays paused; it resumes intact.
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + parent + "/pause", nullptr, 200)["state"], "paused");
  d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201);
  d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201);
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + parent, nullptr, 200)["state"], "paused");
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + parent + "/resume", nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(d, parent, json{{"command", "cat /home/user/shared.txt"}})["stdout"], "parent\n");
  json child_snap = d.callJson("POST", "/v1/sandboxes/" + children[0] + "/snapshots", json::object(), 201);
  const std::string grandchild = d.create(json{{"snapshot", child_snap["id"]}});
  ASSERT_FALSE(grandchild.empty());
  EXPECT_EQ(execJson(d, grandchild, json{{"command", "cat /home/user/shared.txt"}})["stdout"], "child0\n");
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + parent + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(execJson(d, parent, json{{"command", "cat /home/user/shared.txt; cat /tmp/ticker.pid"}})["stdout"],
            "parent\n" + ticker);
  EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + grandchild).status, 204);

  // One more from the snapshot through create, after a daemon restart.
  EXPECT_EQ(d.stop(SIGTERM).exit_code, 0);
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  const std::string single = daemon_->create(json{{"snapshot", snap_id}});
  ASSERT_FALSE(single.empty());
  EXPECT_EQ(execJson(*daemon_, single, json{{"command", "cat /home/user/shared.txt"}})["stdout"], "before\n");

  // Deleting the snapshot leaves the children working; the layer stays while they stand on it.
  EXPECT_EQ(daemon_->call("DELETE", "/v1/snapshots/" + snap_id).status, 204);
  daemon_->callJson("GET", "/v1/snapshots/" + snap_id, nullptr, 404);
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/snapshots/" + snap_id));
  EXPECT_TRUE(std::filesystem::exists(data_dir_ + "/layers/" + snap_id + ".qcow2"));
  EXPECT_EQ(execJson(*daemon_, children[0],
                     json{{"command",
                           "cat /home/user/shared.txt; echo more >> "
                           "/home/user/shared.txt; sync; cat /home/user/shared.txt"}})["stdout"],
            "child0\nchild0\nmore\n");
  // A suspended child still resumes from its disk over the deleted snapshot's layer.
  EXPECT_EQ(daemon_->callJson("POST", "/v1/sandboxes/" + children[1] + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(execJson(*daemon_, children[1], json{{"command", "cat /home/user/shared.txt"}})["stdout"], "child1\n");
  const json left = daemon_->callJson("GET", "/v1/snapshots", nullptr, 200);
  EXPECT_EQ(left["snapshots"].size(), 4u);
  for (const auto& snap_left : left["snapshots"]) {
    EXPECT_EQ(daemon_->call("DELETE", "/v1/snapshots/" + snap_left["id"].get<std::string>()).status, 204);
  }
  // A snapshot published but not yet recorded (between its directory's rename and its row) keeps
  // its layer, though nothing else names it yet.
  const std::string publishing = "snap-published-not-recorded";
  std::filesystem::create_directory(data_dir_ + "/snapshots/" + publishing);
  std::ofstream(data_dir_ + "/layers/" + publishing + ".qcow2") << "a layer";
  // A sandbox directory that cannot be listed (ELOOP here; EMFILE or EIO in production) could
  // hold disks: nothing is collected while it cannot be.
  const std::string unlistable = data_dir_ + "/sandboxes/sb_unlistable";
  std::filesystem::create_directory_symlink(unlistable, unlistable);
  const size_t before_deletes = logSize();
  for (const auto& id : children) EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + single).status, 204);
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + parent).status, 204);
  EXPECT_TRUE(waitForLog("layers: not collected: cannot list " + unlistable, before_deletes, seconds(5)));
  EXPECT_GT(std::distance(std::filesystem::directory_iterator(data_dir_ + "/layers"), {}), 1)
      << "layers were removed after an incomplete listing";
  std::filesystem::remove(unlistable);
  const std::string trigger = daemon_->create();  // its delete collects again
  ASSERT_FALSE(trigger.empty());
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + trigger).status, 204);
  auto layerFiles = [&] {
    std::set<std::string> names;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(data_dir_ + "/layers", ec))
      names.insert(f.path().filename().string());
    return names;
  };
  const std::set<std::string> only_publishing{publishing + ".qcow2"};
  auto deadline = Clock::now() + seconds(10);
  while (Clock::now() < deadline && layerFiles() != only_publishing) std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(layerFiles(), only_publishing) << "layers nothing stands on are removed, a publishing snapshot's stays\n"
                                           << daemon_->log();
  std::filesystem::remove_all(data_dir_ + "/snapshots/" + publishing);
  std::filesystem::remove(data_dir_ + "/layers/" + publishing + ".qcow2");
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
}

// Idle sandboxes suspend by themselves and resume on demand; on_timeout=suspend keeps a
// sandbox (suspended) past its timeout and re-arms the timeout when it resumes.
// Suspended sandboxes keep their disk and memory on the node's disk: a tenant keeps at most its
// quota of them. Beyond it a suspend is refused (the sandbox runs on), and a timeout that would
// suspend deletes instead, with the reason said; another tenant is not affected.
TEST_F(SpacedTest, ATenantKeepsAtMostItsQuotaOfSuspendedSandboxes) {
  daemon_ = Daemon::start(data_dir_, {"--tenant-max-suspended", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string a = d.create();
  const std::string b = d.create();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  d.callJson("POST", "/v1/sandboxes/" + a + "/suspend", json::object(), 200);
  json refused = d.callJson("POST", "/v1/sandboxes/" + b + "/suspend", json::object(), 429);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota") << refused;
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("1 suspended sandboxes"), std::string::npos) << refused;
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + b, nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(d, b, json{{"command", "echo still here"}})["stdout"], "still here\n");
  // Another tenant has its own quota.
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  const std::string bobs =
      d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}}, 201, bob).value("id", "");
  d.callJson("POST", "/v1/sandboxes/" + bobs + "/suspend", json::object(), 200, bob);
  // A resume frees the place.
  d.callJson("POST", "/v1/sandboxes/" + a + "/resume", json::object(), 200);
  d.callJson("POST", "/v1/sandboxes/" + b + "/suspend", json::object(), 200);
  // At the quota, a timeout that would suspend deletes, and says why.
  const std::string timed = d.create(
      json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 2}, {"on_timeout", "suspend"}, {"idle_suspend_s", 0}});
  ASSERT_FALSE(timed.empty());
  json ended = waitState(timed, "deleted", seconds(30));
  EXPECT_EQ(ended["state"], "deleted") << ended;
  EXPECT_NE(ended.value("state_reason", "").find("suspended quota"), std::string::npos) << ended;
  d.callJson("DELETE", "/v1/sandboxes/" + b, json(), 204);
  d.callJson("DELETE", "/v1/sandboxes/" + bobs, json(), 204, bob);
}

// The disk a tenant's suspended sandboxes take (their disks and saved memory) has a quota too:
// once reached, a suspend is refused and the sandbox runs on; GET /v1/quota shows the bytes.
TEST_F(SpacedTest, ATenantsSuspendedSandboxesTakeAtMostItsQuotaOfDisk) {
  daemon_ = Daemon::start(data_dir_, {"--tenant-max-suspended-mb", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string a = d.create();
  const std::string b = d.create();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  json quota = d.callJson("GET", "/v1/quota", json(), 200);
  EXPECT_EQ(quota["limits"]["max_suspended_mb"], 1) << quota;
  EXPECT_EQ(quota["usage"]["suspended_bytes"], 0) << quota;
  // Under the quota (nothing suspended): a suspend goes, and its saved memory and disk count.
  d.callJson("POST", "/v1/sandboxes/" + a + "/suspend", json::object(), 200);
  quota = d.callJson("GET", "/v1/quota", json(), 200);
  EXPECT_GT(quota["usage"]["suspended_bytes"].get<uint64_t>(), 1u << 20) << quota;
  json refused = d.callJson("POST", "/v1/sandboxes/" + b + "/suspend", json::object(), 429);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota") << refused;
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("MiB of suspended sandboxes"), std::string::npos)
      << refused;
  EXPECT_EQ(execJson(d, b, json{{"command", "echo still here"}})["stdout"], "still here\n");
  // A resume gives the disk back.
  d.callJson("POST", "/v1/sandboxes/" + a + "/resume", json::object(), 200);
  EXPECT_EQ(d.callJson("GET", "/v1/quota", json(), 200)["usage"]["suspended_bytes"], 0);
  d.callJson("POST", "/v1/sandboxes/" + b + "/suspend", json::object(), 200);
  d.callJson("DELETE", "/v1/sandboxes/" + a, json(), 204);
  d.callJson("DELETE", "/v1/sandboxes/" + b, json(), 204);
}

// A snapshot's disk layer outlives it while a sandbox branched from it stands on it. Such layers
// count against the tenant's snapshot bytes, or a loop of write, snapshot, branch, delete would
// pile up layers (each up to a disk of writes) that no quota sees.
TEST_F(SpacedTest, LayersOfDeletedSnapshotsCountAgainstTheSnapshotQuota) {
  daemon_ = Daemon::start(data_dir_, {"--tenant-max-snapshot-mb", "64"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  // 96 MiB written after the template: they land in the layer of the snapshot taken next.
  auto write96MiB = [](Daemon& daemon, const std::string& id) {
    EXPECT_EQ(execJson(daemon, id,
                       json{{"command", "head -c 96M /dev/zero | tr '\\0' x > /home/user/big && sync && echo written"},
                            {"timeout_s", 120}})["stdout"],
              "written\n");
  };
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  write96MiB(d, parent);
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  json children = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 1}}, 201);
  ASSERT_EQ(children["sandboxes"].size(), 1u) << children;
  const std::string child = children["sandboxes"][0]["id"];
  ASSERT_EQ(d.call("DELETE", "/v1/snapshots/" + snap).status, 204);
  ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + parent).status, 204);
  // No snapshot is recorded any more, but the child stands on the layer: 96 of the 64 MiB.
  json refused = d.callJson("POST", "/v1/sandboxes/" + child + "/snapshots", json::object(), 429);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota") << refused;
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("disk layers of deleted snapshots"), std::string::npos)
      << refused;
  EXPECT_GE(d.callJson("GET", "/v1/quota", json(), 200)["usage"]["snapshot_bytes"].get<uint64_t>(), 96u << 20);
  EXPECT_EQ(execJson(d, child, json{{"command", "wc -c < /home/user/big"}})["stdout"], "100663296\n");
  // Once the child goes, nothing stands on the layer: the quota is free again.
  ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + child).status, 204);
  const std::string fresh = d.create();
  ASSERT_FALSE(fresh.empty());
  d.callJson("POST", "/v1/sandboxes/" + fresh + "/snapshots", json::object(), 201);

  // The same through a later snapshot: snapshot, snapshot again, delete the first and the
  // sandbox. The second's disk names the first's layer, which holds the 96 MiB; only the
  // second's record is left, and it holds none of them.
  ASSERT_EQ(d.stop(SIGTERM).exit_code, 0);
  daemon_ = Daemon::start(data_dir_, {"--tenant-max-snapshot-mb", "4096"});
  ASSERT_TRUE(daemon_);
  auto& again = *daemon_;
  const std::string writer = again.create();
  ASSERT_FALSE(writer.empty());
  write96MiB(again, writer);
  const std::string first = again.callJson("POST", "/v1/sandboxes/" + writer + "/snapshots", json::object(), 201)["id"];
  again.callJson("POST", "/v1/sandboxes/" + writer + "/snapshots", json::object(), 201);
  // Suspended, its run dir keeps its earlier overlays: hard links of the snapshots' layers, whose
  // bytes count as snapshot bytes, not a second time as suspended bytes.
  again.callJson("POST", "/v1/sandboxes/" + writer + "/suspend", json::object(), 200);
  const uint64_t run_dir_bytes = allocatedBytesUnder(data_dir_ + "/sandboxes/" + writer);
  const uint64_t suspended_bytes =
      again.callJson("GET", "/v1/quota", json(), 200)["usage"]["suspended_bytes"].get<uint64_t>();
  EXPECT_GT(suspended_bytes, 0u);
  EXPECT_LE(suspended_bytes + (90u << 20), run_dir_bytes) << "the 96 MiB layer counted as suspended bytes too";
  ASSERT_EQ(again.call("DELETE", "/v1/snapshots/" + first).status, 204);
  ASSERT_EQ(again.call("DELETE", "/v1/sandboxes/" + writer).status, 204);
  uint64_t recorded = 0;
  const json kept = again.callJson("GET", "/v1/snapshots", json(), 200);
  ASSERT_EQ(kept["snapshots"].size(), 2u) << kept;  // the first part's and the second here
  for (const auto& one : kept["snapshots"]) recorded += one["size_bytes"].get<uint64_t>();
  EXPECT_GE(again.callJson("GET", "/v1/quota", json(), 200)["usage"]["snapshot_bytes"].get<uint64_t>(),
            recorded + (96u << 20))
      << "a deleted snapshot's layer under a later snapshot counts against no quota";
}

TEST_F(SpacedTest, IdleAndTimedOutSandboxesSuspendAndResumeOnDemand) {
  daemon_ = Daemon::start(data_dir_, {"--idle-suspend", "2"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string idle = d.create();
  const std::string busy = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"idle_suspend_s", 0}});
  const std::string timed = d.create(
      json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 3}, {"on_timeout", "suspend"}, {"idle_suspend_s", 0}});
  ASSERT_FALSE(idle.empty());
  ASSERT_FALSE(busy.empty());
  ASSERT_FALSE(timed.empty());
  json created = d.callJson("GET", "/v1/sandboxes/" + timed, nullptr, 200);
  EXPECT_EQ(created["on_timeout"], "suspend");
  EXPECT_EQ(created["timeout_s"], 3);
  execJson(d, idle, json{{"command", "echo idle-file > /home/user/f.txt"}});
  execJson(d, timed, json{{"command", "echo timed-file > /home/user/f.txt"}});

  auto waitState = [&](const std::string& id, const std::string& want) {
    auto deadline = Clock::now() + seconds(30);
    json sb;
    while (Clock::now() < deadline) {
      sb = d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 200);
      if (sb["state"] == want) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return sb;
  };
  json idled = waitState(idle, "suspended");
  EXPECT_EQ(idled["state"], "suspended");
  EXPECT_NE(idled.value("state_reason", "").find("idle"), std::string::npos) << idled;
  json timed_out = waitState(timed, "suspended");
  EXPECT_EQ(timed_out["state"], "suspended");
  EXPECT_NE(timed_out.value("state_reason", "").find("timeout"), std::string::npos) << timed_out;
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + busy, nullptr, 200)["state"], "running");
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u) << "suspended sandboxes hold no QEMU";

  // A file call resumes the idle one and says so.
  auto client = http::Client::create(d.url());
  auto r = client->request("GET", "/v1/sandboxes/" + idle + "/files?path=/home/user/f.txt",
                           {{"Authorization", "Bearer " + d.key()}}, "", seconds(120));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, "idle-file\n");
  EXPECT_EQ(r->headers["x-space-resumed"], "true");
  // The timed-out one resumes with its timeout re-armed (3 s from now, not from creation).
  auto before = Clock::now();
  EXPECT_EQ(execJson(d, timed, json{{"command", "cat /home/user/f.txt"}})["stdout"], "timed-file\n");
  json rearmed = waitState(timed, "suspended");
  EXPECT_EQ(rearmed["state"], "suspended");
  EXPECT_GE(Clock::now() - before, seconds(2)) << "its timeout started again at the resume";
  EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + timed).status, 204);
}

// The create hang (about one create in sixty waited 30 s for Configure and failed): a restored
// guest is told its host detached and came back, and its agent could drop the channel state
// that had just answered the handshake. Creates from the warm pool, back to back, each followed
// by a shell exec and a delete, as in the report: every one must work, and none may take long.
TEST_F(SpacedTest, CreateExecDeleteLoopNeverHangs) {
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "2", "--default-memory-mb", "256", "--default-cpus", "1"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  double worst_ms = 0;
  for (int i = 0; i < 60; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i));
    auto start = Clock::now();
    json sb = d.callJson("POST", "/v1/sandboxes", json{{"template", "base"}}, 201);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    worst_ms = std::max(worst_ms, ms);
    if (ms > 500) std::cout << "[ info     ] create " << i << " took " << ms << " ms\n";
    const std::string id = sb.value("id", "");
    ASSERT_FALSE(id.empty()) << sb;
    EXPECT_LT(ms, 10000) << "create took " << ms << " ms";
    EXPECT_EQ(execJson(d, id, json{{"command", "true"}})["exit_code"], 0);
    ASSERT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
  }
  std::cout << "[ info     ] 60 creates, slowest " << worst_ms << " ms\n";
  const std::string log = d.log();
  size_t redone = 0;
  for (size_t at = log.find("making it again"); at != std::string::npos; at = log.find("making it again", at + 1)) {
    ++redone;
  }
  std::cout << "[ info     ] handshakes made again (lost after the answer): " << redone << " in the log's tail\n";
}

// What one VM holds of the node's memory beyond its guest's: its QEMU's own memory and, under
// TCG, its translation buffer (spaced's --tcg-tb-mib, 128 by default).
int vmQemuMb() {
  const bool kvm =
      vmm::chooseAccelerator(vmm::Accelerator::kAuto, vmm::probeKvm())->accelerator == vmm::Accelerator::kKvm;
  return static_cast<int>(vmm::kQemuOwnMemoryMib) + (kvm ? 0 : 128);
}

// Room for three sandboxes of 256 MB and their QEMUs, and no more.
std::string threeSmallSandboxes() { return std::to_string(3 * (256 + vmQemuMb())); }

// The warm pool: QEMU processes wait (named by the sandbox id they will have) for a create of
// the default size, which then only loads the guest; the pool refills; waiting VMs never outlive
// the daemon, whatever its shutdown mode.
// The pool learns the kinds creates ask for: after two creates of another size, the third
// finds a guest of that size waiting, within the budget (a kind that does not fit gets none).
TEST_F(SpacedTest, ThePoolKeepsGuestsOfTheKindsCreatesAskFor) {
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "1", "--warm-pool-budget-mb", std::to_string(640 + 2 * vmQemuMb()),
                                      "--default-memory-mb", "256", "--default-cpus", "1"});
  ASSERT_TRUE(daemon_);
  auto waitForPool = [&](int target) {
    auto deadline = Clock::now() + seconds(120);
    while (Clock::now() < deadline &&
           !(metric("space_warm_pool_target") == target && metric("space_warm_pool_ready") == target)) {
      std::this_thread::sleep_for(milliseconds(100));
    }
    return metric("space_warm_pool_target") == target && metric("space_warm_pool_ready") == target;
  };
  ASSERT_TRUE(waitForPool(1));
  const json odd_size{{"cpus", 1}, {"memory_mb", 384}};
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    ids.push_back(daemon_->create(odd_size));
    ASSERT_FALSE(ids.back().empty());
    EXPECT_FALSE(waitForLog("sandbox " + ids.back() + ": running (tenant default, 1 vCPU, 384 MB, taken from the pool",
                            0, milliseconds(1)));
  }
  // The budget (the default kind's 256 and one 384, with their QEMUs) leaves no room for a second
  // guest of that kind, nor for a kind of 512 MB.
  const json too_big{{"cpus", 1}, {"memory_mb", 512}};
  for (int i = 0; i < 2; ++i) {
    ids.push_back(daemon_->create(too_big));
    ASSERT_FALSE(ids.back().empty());
  }
  ASSERT_TRUE(waitForPool(2)) << "target " << metric("space_warm_pool_target") << ", ready "
                              << metric("space_warm_pool_ready");
  EXPECT_TRUE(waitForLog("warm pool: 1 guest(s) of base 1 vCPU 384 MB (was 0)", 0, seconds(1)));
  ids.push_back(daemon_->create(odd_size));
  ASSERT_FALSE(ids.back().empty());
  EXPECT_TRUE(waitForLog("sandbox " + ids.back() + ": running (tenant default, 1 vCPU, 384 MB, taken from the pool in",
                         0, seconds(1)));
  EXPECT_FALSE(waitForLog("guest(s) of base 1 vCPU 512 MB", 0, milliseconds(1)));
  for (const auto& id : ids) EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
}

// The pool's guests count against the node's capacity, and give it to sandboxes that need it.
// With room for three guests of 256 MB: two waiting guests leave room for a sandbox of 512 MB
// only once one of them gives way; a create then takes the other, and the node is full (no
// refill, no third QEMU, a further create refused); the pool refills once a sandbox goes, and
// gives a snapshot's helper VM room too, and starts no guest in the room the helper holds.
TEST_F(SpacedTest, PooledGuestsHoldNodeCapacityAndGiveItToSandboxes) {
  // The snapshot at the end holds its helper's memory 5 s once its sandbox is released.
  ::setenv("SPACE_FAULT_DELAY", "snapshot.sandbox_released@5000", 1);
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "2", "--default-memory-mb", "256", "--default-cpus", "1",
                                      "--max-memory-mb", threeSmallSandboxes()});
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  const int small_vm = 256 + vmQemuMb();  // a 256 MB sandbox's share of the node
  auto poolReady = [&] {
    return metric("space_warm_pool_target") == 2 && metric("space_warm_pool_ready") == 2 &&
           metric("space_warm_pool_memory_mb") == 2 * small_vm;
  };
  auto deadline = Clock::now() + seconds(90);
  while (Clock::now() < deadline && !poolReady()) std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(poolReady()) << metric("space_warm_pool_ready") << " ready, " << metric("space_warm_pool_memory_mb")
                           << " MB";
  const std::string big = daemon_->create(json{{"cpus", 1}, {"memory_mb", 512}});
  ASSERT_FALSE(big.empty());
  EXPECT_TRUE(waitForLog("sandbox " + big + ": 1 guest(s) of the pool give their capacity to it", 0, seconds(1)));
  EXPECT_EQ(metric("space_warm_pool_memory_mb"), small_vm);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u) << "the guest that gave way was killed before the sandbox ran";
  const std::string small = daemon_->create(json::object());
  ASSERT_FALSE(small.empty());
  EXPECT_TRUE(waitForLog("sandbox " + small + ": running (tenant default, 1 vCPU, 256 MB, taken from the pool in", 0,
                         seconds(1)));
  // Full: 768 MB of guests and their buffers reserved by sandboxes, so the pool starts nothing.
  EXPECT_TRUE(waitForLog("warm pool: no room for a waiting VM of base 1 vCPU 256 MB", 0, seconds(10)));
  std::this_thread::sleep_for(seconds(2));
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
  EXPECT_EQ(metric("space_warm_pool_memory_mb"), 0);
  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 768 + 2 * vmQemuMb());
  auto refused = daemon_->call("POST", "/v1/sandboxes", json::object().dump());
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("insufficient_capacity"), std::string::npos) << refused.body;
  // A sandbox goes: the pool takes the room again, within about a second of retries.
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + big).status, 204);
  deadline = Clock::now() + seconds(60);
  while (Clock::now() < deadline && !poolReady()) std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(poolReady()) << metric("space_warm_pool_ready") << " ready";
  // The node is full again (a sandbox, two guests): a snapshot's helper VM takes a guest's room.
  const size_t log_from = logSize();
  auto snapshot = std::async(std::launch::async, [&] {
    return daemon_->callJson("POST", "/v1/sandboxes/" + small + "/snapshots", json::object(), 201);
  });
  ASSERT_TRUE(waitForLog("fault point reached, delaying: snapshot.sandbox_released", log_from, seconds(60)));
  EXPECT_TRUE(waitForLog("sandbox " + small + ": 1 guest(s) of the pool give their capacity to its snapshot's helper",
                         log_from, seconds(1)));
  // While the helper holds that room, the pool (one guest short) makes no guest in it.
  EXPECT_TRUE(
      waitForLog("warm pool: no room for a waiting VM of base 1 vCPU 256 MB until capacity frees: sandboxes "
                 "hold 1 vCPUs and " +
                     std::to_string(small_vm) + " MB, snapshots' helpers " + std::to_string(small_vm) + " MB",
                 log_from, seconds(3)));
  std::this_thread::sleep_for(seconds(1));
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u) << "the sandbox and one waiting guest (the helper starts later)";
  EXPECT_EQ(metric("space_warm_pool_memory_mb"), small_vm);
  EXPECT_FALSE(snapshot.get().value("id", "").empty());
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + small).status, 204);
}

// The helper VM that makes a snapshot's memory file holds its sandbox's memory of the node's
// limit while it works (held here 6 s once the sandbox is released, so that the same sandbox can
// be snapshotted again meanwhile), and a tenant's helpers hold at most what its sandboxes hold:
// creates, branches and snapshots that do not fit beside them are refused before anything is
// touched, and all is given back when the snapshot is made.
TEST_F(SpacedTest, SnapshotHelpersHoldTheirMemoryOfTheNodeAndOfTheirTenant) {
  ::setenv("SPACE_FAULT_DELAY", "snapshot.sandbox_released@6000", 1);
  daemon_ = Daemon::start(data_dir_, {"--max-memory-mb", threeSmallSandboxes()});
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  const json small{{"cpus", 1}, {"memory_mb", 256}};
  const std::string mine = d.create(small);
  ASSERT_FALSE(mine.empty());
  const std::string bobs = d.callJson("POST", "/v1/sandboxes", small, 201, bob).value("id", "");
  ASSERT_FALSE(bobs.empty());
  const std::string my_snaps = "/v1/sandboxes/" + mine + "/snapshots";
  const std::string bobs_snaps = "/v1/sandboxes/" + bobs + "/snapshots";
  // One to branch from later (its helper comes and goes first).
  const std::string earlier = d.callJson("POST", my_snaps, json::object(), 201).value("id", "");
  ASSERT_FALSE(earlier.empty());
  ASSERT_EQ(metric("space_snapshot_helpers_memory_mb"), 0);
  // One of mine: a 256 MB helper, what my one sandbox holds; the node holds all it may.
  size_t log_from = logSize();
  auto first = std::async(std::launch::async, [&] { return d.callJson("POST", my_snaps, json::object(), 201); });
  ASSERT_TRUE(waitForLog("fault point reached, delaying: snapshot.sandbox_released", log_from, seconds(60)));
  EXPECT_EQ(metric("space_snapshot_helpers_memory_mb"), 256 + vmQemuMb());
  auto frozenLayers = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(data_dir_ + "/layers")) ++n;
    return n;
  };
  const size_t layers_before = frozenLayers();
  json refused = d.callJson("POST", my_snaps, json::object(), 429);
  EXPECT_EQ(refused["error"]["code"], "tenant_quota") << refused;
  EXPECT_NE(refused.dump().find("helper VMs"), std::string::npos) << refused;
  // Bob has no helper yet, but the node has no room beside mine: neither for a sandbox nor for
  // a snapshot's helper (a tenant is not told what others hold).
  refused = d.callJson("POST", "/v1/sandboxes", small, 503, bob);
  EXPECT_EQ(refused["error"]["code"], "insufficient_capacity") << refused;
  refused = d.callJson("POST", bobs_snaps, json::object(), 503, bob);
  EXPECT_EQ(refused["error"]["code"], "insufficient_capacity") << refused;
  // Nor for a branch child: refused as a whole before any child starts (without the helper
  // counted there, the child would start and fail its own reservation).
  refused = d.callJson("POST", "/v1/snapshots/" + earlier + "/branch", json{{"count", 1}}, 503);
  EXPECT_EQ(refused["error"]["code"], "insufficient_capacity") << refused;
  EXPECT_NE(refused.dump().find("none started"), std::string::npos) << refused;
  // Refused before the sandboxes were touched: no disk was frozen, and bob's runs on without a
  // snapshot.
  EXPECT_EQ(frozenLayers(), layers_before);
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + bobs + "/exec", json{{"command", "echo still"}}, 200, bob)["stdout"],
            "still\n");
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots", json(), 200, bob)["snapshots"].size(), 0u);
  EXPECT_FALSE(first.get().value("id", "").empty());
  EXPECT_EQ(metric("space_snapshot_helpers_memory_mb"), 0);
  // Given back: bob's snapshot fits now.
  EXPECT_FALSE(d.callJson("POST", bobs_snaps, json::object(), 201, bob).value("id", "").empty());
}

TEST_F(SpacedTest, WarmPoolVmsBecomeSandboxesAndNeverOutliveTheDaemon) {
  daemon_ = Daemon::start(
      data_dir_, {"--on-shutdown", "keep", "--warm-pool", "2", "--default-memory-mb", "256", "--default-cpus", "1"});
  ASSERT_TRUE(daemon_);
  auto waiting = [&] {
    std::set<std::string> ids;
    for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/sandboxes")) {
      ids.insert(e.path().filename().string());
    }
    return ids;
  };
  // Ready: restored, agent connected, warmed up (the metric counts only those).
  auto poolReady = [&] {
    auto metrics = daemon_->call("GET", "/metrics");
    return metrics.body.find("\nspace_warm_pool_ready 2\n") != std::string::npos;
  };
  auto deadline = Clock::now() + seconds(90);
  while (Clock::now() < deadline && !poolReady()) std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(poolReady());
  auto before = waiting();
  ASSERT_EQ(before.size(), 2u);
  // Refilled below the sandboxes in use: the pool's QEMUs run at nice 10 until taken.
  auto niceOf = [](pid_t pid) {
    auto stat = readSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
    if (!stat.ok()) return -100;
    std::istringstream fields(stat->substr(stat->rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19 && fields >> field; ++i) {
    }
    return std::stoi(field);  // field 19: nice
  };
  for (pid_t pid : qemuProcessesUnder(data_dir_)) EXPECT_EQ(niceOf(pid), 10) << pid;
  // Two creates back to back take both: each its own hostname, random state and clock.
  const std::string id = daemon_->create(json::object());
  ASSERT_FALSE(id.empty());
  const std::string second = daemon_->create(json::object());
  ASSERT_FALSE(second.empty());
  EXPECT_TRUE(before.count(id)) << "the sandbox is a VM that was waiting in the pool";
  EXPECT_TRUE(before.count(second)) << "the sandbox is a VM that was waiting in the pool";
  // Running guests that only took their identity, not QEMUs that had to load one.
  for (const auto& sandbox : {id, second}) {
    EXPECT_TRUE(waitForLog("sandbox " + sandbox + ": running (tenant default, 1 vCPU, 256 MB, taken from the pool in",
                           0, seconds(1)))
        << sandbox;
  }
  const std::string probe =
      "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
      "python3 -c 'import uuid; print(uuid.uuid4())'; date +%s.%N";
  std::vector<std::vector<std::string>> seen;
  for (const auto& sandbox : {id, second}) {
    const double host_before =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string out = execJson(*daemon_, sandbox, json{{"command", probe}})["stdout"];
    const double host_after =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::vector<std::string> lines;
    for (size_t start = 0, nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(out.substr(start, nl - start));
    }
    ASSERT_EQ(lines.size(), 4u) << out;
    EXPECT_EQ(lines[0], "sb-" + sandbox.substr(3));
    const double guest = std::stod(lines[3]);
    EXPECT_GE(guest, host_before - 1.0) << "guest clock behind the host's";
    EXPECT_LE(guest, host_after + 1.0) << "guest clock ahead of the host's";
    seen.push_back(lines);
  }
  EXPECT_NE(seen[0][1], seen[1][1]) << "pool guests share their random state";
  EXPECT_NE(seen[0][2], seen[1][2]) << "pool guests share their random state";
  for (pid_t pid : qemuProcessesUnder(data_dir_ + "/sandboxes/" + id)) {
    EXPECT_EQ(niceOf(pid), 0) << "a sandbox taken from the pool keeps its low priority";
  }
  ASSERT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + second).status, 204);
  // Another size does not fit the pool: restored the usual way.
  const std::string other = daemon_->create(json{{"cpus", 1}, {"memory_mb", 384}});
  ASSERT_FALSE(other.empty());
  EXPECT_FALSE(before.count(other));
  deadline = Clock::now() + seconds(60);
  while (Clock::now() < deadline && qemuProcessesUnder(data_dir_).size() < 4) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 4u) << "two sandboxes and a refilled pool of two";

  // SIGTERM keeping sandboxes: the pool's VMs go, the sandboxes stay and are re-adopted.
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
  EXPECT_EQ(waiting(), (std::set<std::string>{id, other}));
  // kill -9 leaves a full pool behind: the next start sweeps it.
  daemon_ = Daemon::start(
      data_dir_, {"--on-shutdown", "keep", "--warm-pool", "2", "--default-memory-mb", "256", "--default-cpus", "1"});
  ASSERT_TRUE(daemon_);
  deadline = Clock::now() + seconds(60);
  while (Clock::now() < deadline && qemuProcessesUnder(data_dir_).size() < 4) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  daemon_->stop(SIGKILL);
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "0"});
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
  EXPECT_EQ(waiting(), (std::set<std::string>{id, other}));
  EXPECT_EQ(execJson(*daemon_, id, json{{"command", "echo still"}})["stdout"], "still\n");
}

// A full disk: a snapshot or suspend fails with 507 and a clear message, the sandbox runs on
// unchanged, nothing partial is left; once there is room again both work.
TEST_F(SpacedTest, AFullDiskFailsSnapshotAndSuspendAndTheSandboxRunsOn) {
  auto fs = Mount::loop("ext4", dir_->path() + "/ext4.img", dir_->path() + "/fs", uint64_t{1200} << 20);
  ASSERT_TRUE(fs) << "mkfs.ext4 + loop mount (the tests run as root)";
  const std::string data = dir_->path() + "/fs/data";
  daemon_ = Daemon::start(data);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  execJson(d, id, json{{"command", "echo kept > /home/user/kept.txt; head -c 30000000 /dev/urandom > /tmp/noise"}});
  const std::string sb = "/v1/sandboxes/" + id;
  auto fill = [&](uint64_t leave) {
    std::filesystem::remove(dir_->path() + "/fs/filler");
    uint64_t free_bytes = fs->freeBytes();
    ASSERT_GT(free_bytes, leave);
    int fd = ::open((dir_->path() + "/fs/filler").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(free_bytes - leave)), 0);
    ::close(fd);
  };
  auto unchanged = [&] {
    EXPECT_EQ(d.callJson("GET", sb, nullptr, 200)["state"], "running");
    EXPECT_EQ(execJson(d, id, json{{"command", "cat /home/user/kept.txt"}})["stdout"], "kept\n");
    EXPECT_EQ(d.callJson("GET", "/v1/snapshots", nullptr, 200)["snapshots"].size(), 0u);
    EXPECT_TRUE(std::filesystem::is_empty(data + "/snapshots")) << "no partial snapshot";
    EXPECT_FALSE(std::filesystem::exists(sandboxDir(id) + "/suspended.state"));
    EXPECT_FALSE(std::filesystem::exists(sandboxDir(id) + "/suspended.state.tmp"));
  };
  for (uint64_t leave : {uint64_t{8} << 20, uint64_t{70} << 20}) {
    SCOPED_TRACE("free space left: " + std::to_string(leave >> 20) + " MiB");
    fill(leave);
    json refused = d.callJson("POST", sb + "/snapshots", json::object(), 507);
    EXPECT_NE(refused["error"]["message"].get<std::string>().find("sandbox is unchanged"), std::string::npos)
        << refused;
    unchanged();
    // With 70 MiB left the suspend fits (its stream is the guest's used memory); the snapshot
    // did not, as it needs room for its memory file too.
    if (leave < (uint64_t{32} << 20)) {
      d.callJson("POST", sb + "/suspend", nullptr, 507);
      unchanged();
    }
  }
  std::filesystem::remove(dir_->path() + "/fs/filler");
  json snap = d.callJson("POST", sb + "/snapshots", json::object(), 201);
  EXPECT_EQ(d.callJson("POST", sb + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(execJson(d, id, json{{"command", "cat /home/user/kept.txt"}})["stdout"], "kept\n");
  const std::string child = d.create(json{{"snapshot", snap["id"]}});
  EXPECT_EQ(execJson(d, child, json{{"command", "cat /home/user/kept.txt"}})["stdout"], "kept\n");
  daemon_.reset();  // before the mount goes
}

// Housekeeping only decides; suspends and kills run on a few workers. One tenant's suspend that
// takes 15 s (SPACE_FAULT_DELAY at suspend.saved) delays neither another tenant's timeout nor
// the health check that notices another VM died.
TEST_F(SpacedTest, OneTenantsSlowSuspendDelaysNoOneElsesTimeoutOrHealthCheck) {
  ::setenv("SPACE_FAULT_DELAY", "suspend.saved@15000", 1);
  daemon_ = Daemon::start(data_dir_);
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  const size_t log_from = logSize();
  // Bob's sandbox is idle after 1 s; its suspend then takes 15 s.
  const std::string slow =
      d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}, {"idle_suspend_s", 1}}, 201, bob)
          .value("id", "");
  ASSERT_FALSE(slow.empty());
  ASSERT_TRUE(waitForLog("fault point reached, delaying: suspend.saved", log_from, seconds(30)));
  // Meanwhile the default tenant's sandboxes: one with a 2 s timeout, one whose QEMU dies.
  const auto created = Clock::now();
  const std::string timed = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 2}});
  const std::string dying = d.create();
  ASSERT_FALSE(timed.empty());
  ASSERT_FALSE(dying.empty());
  auto qemu = qemuProcessesUnder(sandboxDir(dying));
  ASSERT_EQ(qemu.size(), 1u);
  ::kill(qemu[0], SIGKILL);
  json t = waitState(timed, "deleted", seconds(10));
  EXPECT_EQ(t["state"], "deleted") << t;
  EXPECT_NE(t.value("state_reason", "").find("timeout"), std::string::npos) << t;
  json f = waitState(dying, "failed", seconds(5));
  EXPECT_EQ(f["state"], "failed") << f;
  // Its timeout was 2 s after its create; the other suspend has 10 s or more to go.
  EXPECT_LT(Clock::now() - created, seconds(8)) << "waited for the other tenant's suspend";
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + slow, nullptr, 200, bob)["state"], "running")
      << "the slow suspend is still under way";
  json s = waitState(slow, "suspended", seconds(30), bob);
  EXPECT_EQ(s["state"], "suspended") << s;
  EXPECT_NE(s.value("state_reason", "").find("idle"), std::string::npos) << s;
}

// Deleting a snapshot waits neither for a child of it whose guest is slow to answer (the delay
// at create.state_loaded: QEMU has opened the files, the agent has not answered) nor for
// another snapshot being taken (the delay at snapshot.disk_frozen, inside its capture).
TEST_F(SpacedTest, SnapshotDeletionWaitsForNoGuestAndNoOtherSnapshot) {
  ::setenv("SPACE_FAULT_DELAY", "create.state_loaded@10000", 1);
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  const std::string parent = daemon_->create();
  ASSERT_FALSE(parent.empty());
  execJson(*daemon_, parent, json{{"command", "echo from-parent > /home/user/f.txt; sync"}});
  const std::string snaps = "/v1/sandboxes/" + parent + "/snapshots";
  const std::string first = daemon_->callJson("POST", snaps, json::object(), 201).value("id", "");
  const std::string second = daemon_->callJson("POST", snaps, json::object(), 201).value("id", "");
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  {
    SCOPED_TRACE("a child whose guest is slow to answer");
    size_t log_from = logSize();
    auto child = std::async(std::launch::async, [&] {
      return daemon_->callJson("POST", "/v1/sandboxes", json{{"snapshot", first}}, 201).value("id", "");
    });
    ASSERT_TRUE(waitForLog("fault point reached, delaying: create.state_loaded", log_from, seconds(30)));
    auto asked = Clock::now();
    EXPECT_EQ(daemon_->call("DELETE", "/v1/snapshots/" + first).status, 204);
    EXPECT_LT(Clock::now() - asked, seconds(4)) << "the deletion waited for the child's guest";
    const std::string id = child.get();  // its QEMU had the files: it comes up all the same
    ASSERT_FALSE(id.empty());
    EXPECT_EQ(execJson(*daemon_, id, json{{"command", "cat /home/user/f.txt"}})["stdout"], "from-parent\n");
  }
  daemon_->stop(SIGTERM);  // kept running
  ::setenv("SPACE_FAULT_DELAY", "snapshot.disk_frozen@10000", 1);
  daemon_ = Daemon::start(data_dir_);
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  {
    SCOPED_TRACE("another snapshot being taken");
    size_t log_from = logSize();
    auto third = std::async(std::launch::async,
                            [&] { return daemon_->callJson("POST", snaps, json::object(), 201).value("id", ""); });
    ASSERT_TRUE(waitForLog("fault point reached, delaying: snapshot.disk_frozen", log_from, seconds(30)));
    auto asked = Clock::now();
    EXPECT_EQ(daemon_->call("DELETE", "/v1/snapshots/" + second).status, 204);
    EXPECT_LT(Clock::now() - asked, seconds(4)) << "the deletion waited for the other snapshot";
    const std::string taken = third.get();
    ASSERT_FALSE(taken.empty());
    const std::string child = daemon_->create(json{{"snapshot", taken}});
    EXPECT_EQ(execJson(*daemon_, child, json{{"command", "cat /home/user/f.txt"}})["stdout"], "from-parent\n");
  }
  EXPECT_EQ(daemon_->callJson("GET", "/v1/snapshots", nullptr, 200)["snapshots"].size(), 1u);
}

// A node disk that fills while a guest writes: QEMU stops that guest (werror=enospc) rather than
// fail its write. The sandbox must not look healthy: it is paused and says why, the exec that
// was writing ends at once with 507 (not at its timeout), so do later calls and a resume while
// the disk is still full; once there is room, resume continues the guest where it stopped.
TEST_F(SpacedTest, AVmStoppedByAFullDiskIsPausedAndSaysWhy) {
  auto fs = Mount::loop("ext4", dir_->path() + "/ext4.img", dir_->path() + "/fs", uint64_t{1200} << 20);
  ASSERT_TRUE(fs) << "mkfs.ext4 + loop mount (the tests run as root)";
  data_dir_ = dir_->path() + "/fs/data";
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  const std::string sb = "/v1/sandboxes/" + id;
  const std::string filler = dir_->path() + "/fs/filler";
  {
    uint64_t free_bytes = fs->freeBytes();
    ASSERT_GT(free_bytes, uint64_t{4} << 20);
    int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(free_bytes - (uint64_t{4} << 20))), 0);
    ::close(fd);
  }
  auto asked = Clock::now();
  json cut = execJson(
      d, id, json{{"command", "head -c 64000000 /dev/urandom > /home/user/big; sync; echo written"}, {"timeout_s", 40}},
      507);
  EXPECT_LT(Clock::now() - asked, seconds(25)) << "the exec waited for its timeout";
  EXPECT_EQ(cut["error"].value("code", ""), "resource_exhausted") << cut;
  EXPECT_NE(cut["error"].value("message", "").find("No space left on device"), std::string::npos) << cut;
  json paused = d.callJson("GET", sb, nullptr, 200);
  EXPECT_EQ(paused["state"], "paused") << paused;
  EXPECT_NE(paused.value("state_reason", "").find("disk error"), std::string::npos) << paused;
  EXPECT_NE(paused.value("state_reason", "").find("No space left on device"), std::string::npos) << paused;
  // Calls answer at once.
  asked = Clock::now();
  execJson(d, id, json{{"command", "true"}}, 507);
  EXPECT_LT(Clock::now() - asked, seconds(2));
  // A resume while the disk is still full: QEMU retries the write and stops the guest again,
  // before the agent answers (507) or after (200, and the next health check pauses it again).
  auto again = d.call("POST", sb + "/resume");
  EXPECT_TRUE(again.status == 507 || again.status == 200) << again.status << " " << again.body;
  paused = waitState(id, "paused", seconds(10));
  EXPECT_EQ(paused["state"], "paused") << paused;
  EXPECT_NE(paused.value("state_reason", "").find("disk error"), std::string::npos) << paused;
  execJson(d, id, json{{"command", "true"}}, 507);
  // Room again: the guest continues where QEMU stopped it; its write completes.
  std::filesystem::remove(filler);
  json resumed = d.callJson("POST", sb + "/resume", nullptr, 200);
  EXPECT_EQ(resumed["state"], "running") << resumed;
  EXPECT_FALSE(resumed.contains("state_reason")) << resumed;
  json out =
      execJson(d, id,
               json{{"command", "while pgrep -x head >/dev/null; do sleep 0.2; done; sync; stat -c %s /home/user/big"},
                    {"timeout_s", 50}});
  EXPECT_EQ(out["stdout"], "64000000\n") << out;
  EXPECT_EQ(d.callJson("GET", sb, nullptr, 200)["state"], "running");
  daemon_.reset();  // before the mount goes
}

// A branch starts its children together, as many at once as --branch-workers (0: one per host
// CPU), each running with the parent's processes. The parent, snapshotted while a process in it
// writes, is stopped only at the end of its live save (logged "stopped for"). A branch that
// cannot fit the node is refused before any child starts.
TEST_F(SpacedTest, ABranchStartsItsChildrenTogetherAndOneThatCannotFitStartsNone) {
  daemon_ = Daemon::start(data_dir_, {"--branch-workers", "2", "--warm-pool", "0", "--max-sandboxes", "4"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create(json{{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(parent.empty());
  execJson(d, parent,
           json{{"command",
                 "setsid sh -c 'echo $$ > /tmp/ticker.pid; while :; do date > /tmp/now; sleep 0.01; done' "
                 ">/dev/null 2>&1 &"}});
  const std::string ticker = execJson(d, parent, json{{"command", kCatTickerPid}})["stdout"];
  ASSERT_FALSE(ticker.empty());
  const size_t log_from = logSize();
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  EXPECT_TRUE(waitForLog("(sandbox stopped for ", log_from, seconds(10)));

  json branched = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 3}}, 201);
  ASSERT_EQ(branched["sandboxes"].size(), 3u) << branched;
  EXPECT_TRUE(waitForLog("branched into 3 sandboxes in", log_from, seconds(10)));
  EXPECT_TRUE(waitForLog(" ms (2 at a time)", log_from, seconds(10)));
  std::set<std::string> ids;
  for (const auto& child : branched["sandboxes"]) {
    EXPECT_EQ(child["state"], "running");
    ids.insert(child["id"].get<std::string>());
    EXPECT_EQ(
        execJson(d, child["id"], json{{"command", "kill -0 $(cat /tmp/ticker.pid) && cat /tmp/ticker.pid"}})["stdout"],
        ticker);
  }
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 4u);
  // The parent ran on through its snapshot.
  EXPECT_EQ(execJson(d, parent, json{{"command", "kill -0 $(cat /tmp/ticker.pid) && echo alive"}})["stdout"],
            "alive\n");
  for (const auto& id : ids) EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);

  // The parent and 4 children would be 5 of at most 4: refused at once, nothing started.
  const size_t before_refusal = logSize();
  json refused = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 4}}, 429);
  EXPECT_EQ(refused["error"].value("code", ""), "too_many_sandboxes") << refused;
  EXPECT_NE(refused["error"].value("message", "").find("none started"), std::string::npos) << refused;
  // How many sandboxes the node runs (other tenants' too) is not told.
  EXPECT_EQ(refused["error"].value("message", "").find(" now"), std::string::npos) << refused;
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u);
  auto log = readSmallFile(logPath(), 64 << 20);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->find(": running (", before_refusal), std::string::npos) << "a child started before the refusal";
  json running = d.callJson("GET", "/v1/sandboxes?state=running,creating,failed", nullptr, 200);
  ASSERT_EQ(running["sandboxes"].size(), 1u) << running;
  EXPECT_EQ(running["sandboxes"][0]["id"], parent);
}

// A thread that cannot be started (SPACE_FAULT_FAIL at branch.worker makes the second one fail as
// EAGAIN would) fails the branch with 503 and leaves nothing: what the first worker started is
// deleted again. The daemon goes on serving.
TEST_F(SpacedTest, ABranchThatCannotStartItsThreadsFailsWith503AndLeavesNothing) {
  ::setenv("SPACE_FAULT_FAIL", "branch.worker@2", 1);
  daemon_ = Daemon::start(data_dir_, {"--branch-workers", "3"});  // whatever the host's cores
  ::unsetenv("SPACE_FAULT_FAIL");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  const std::string snap =
      d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201).value("id", "");
  ASSERT_FALSE(snap.empty());
  json e = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 3}}, 503);
  EXPECT_EQ(e["error"].value("code", ""), "insufficient_capacity") << e;
  EXPECT_NE(e["error"].value("message", "").find("cannot start a thread"), std::string::npos) << e;
  json running = d.callJson("GET", "/v1/sandboxes?state=running", nullptr, 200);
  ASSERT_EQ(running["sandboxes"].size(), 1u) << running;
  EXPECT_EQ(running["sandboxes"][0]["id"], parent);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u);
  // The failure point is spent: the next branch works.
  json branched = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 201);
  EXPECT_EQ(branched["sandboxes"].size(), 2u);
}

// An exception mid-create or mid-resume (SPACE_FAULT_THROW: std::bad_alloc at a fault point, as
// a failed allocation would throw) leaves by no error return. The request fails with 500, its
// QEMU goes, its reservation comes back (the node's only sandbox place is free again), and
// the sandbox is recorded failed (create) or stays suspended and resumes on the next call.
TEST_F(SpacedTest, AnExceptionMidCreateOrResumeGivesItsReservationBack) {
  ::setenv("SPACE_FAULT_THROW", "create.configured", 1);
  daemon_ = Daemon::start(data_dir_, {"--max-sandboxes", "1", "--warm-pool", "0", "--on-shutdown", "keep"});
  ::unsetenv("SPACE_FAULT_THROW");
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  d.callJson("POST", "/v1/sandboxes", json{{"template", "base"}}, 500);
  json failed = d.callJson("GET", "/v1/sandboxes?state=failed", nullptr, 200);
  ASSERT_EQ(failed["sandboxes"].size(), 1u) << failed;
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 0u);
  EXPECT_NE(d.call("GET", "/metrics").body.find("space_node_memory_reserved_mb 0"), std::string::npos);
  const std::string id = d.create();  // the node's one place is free again
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + id + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(d.stop(SIGTERM).exit_code, 0);
  ::setenv("SPACE_FAULT_THROW", "resume.restored", 1);
  daemon_ = Daemon::start(data_dir_, {"--max-sandboxes", "1", "--warm-pool", "0"});
  ::unsetenv("SPACE_FAULT_THROW");
  ASSERT_TRUE(daemon_);
  auto& again = *daemon_;
  const std::string sb = "/v1/sandboxes/" + id;
  again.callJson("POST", sb + "/resume", nullptr, 500);
  EXPECT_EQ(again.callJson("GET", sb, nullptr, 200)["state"], "suspended");
  EXPECT_TRUE(std::filesystem::exists(sandboxDir(id) + "/suspended.state"));
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 0u);
  EXPECT_NE(again.call("GET", "/metrics").body.find("space_node_memory_reserved_mb 0"), std::string::npos);
  EXPECT_EQ(again.callJson("POST", sb + "/resume", nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(again, id, json{{"command", "echo back"}})["stdout"], "back\n");
  EXPECT_EQ(again.call("DELETE", sb).status, 204);
  EXPECT_EQ(again.stop(SIGTERM).exit_code, 0);

  // A create that throws after taking the pool's guest: the guest goes, and its place is
  // refilled (not counted as taken for good), so the next create finds a guest waiting again.
  ::setenv("SPACE_FAULT_THROW", "create.pool_taken", 1);
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "1"});
  ::unsetenv("SPACE_FAULT_THROW");
  ASSERT_TRUE(daemon_);
  auto poolReady = [&] {
    return daemon_->call("GET", "/metrics").body.find("\nspace_warm_pool_ready 1\n") != std::string::npos;
  };
  auto waitForPool = [&] {
    auto deadline = Clock::now() + seconds(90);
    while (Clock::now() < deadline && !poolReady()) std::this_thread::sleep_for(milliseconds(100));
    return poolReady();
  };
  ASSERT_TRUE(waitForPool());
  daemon_->callJson("POST", "/v1/sandboxes", json{{"template", "base"}}, 500);
  EXPECT_TRUE(waitForPool()) << "the pool never refilled the guest's place";
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u) << "the pool's guest, and no other";
  const std::string last = daemon_->create();
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(daemon_->callJson("POST", "/v1/sandboxes/" + last + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);

  // An exception once the saved state is gone: the guest, restored stopped, is continued
  // anyway (it is recorded running and nothing else holds it now).
  ::setenv("SPACE_FAULT_THROW", "resume.state_removed", 1);
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "0"});
  ::unsetenv("SPACE_FAULT_THROW");
  ASSERT_TRUE(daemon_);
  daemon_->callJson("POST", "/v1/sandboxes/" + last + "/resume", nullptr, 500);
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + last, nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(*daemon_, last, json{{"command", "echo continued"}})["stdout"], "continued\n");
  EXPECT_EQ(daemon_->callJson("POST", "/v1/sandboxes/" + last + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);

  // The same exception, but the restored guest's QEMU died meanwhile (killed while the resume
  // was recorded): it cannot be continued, so the sandbox is failed, with its reservation given
  // back and nothing left running, rather than recorded running with no guest.
  const size_t log_from = logSize();
  ::setenv("SPACE_FAULT_THROW", "resume.state_removed", 1);
  ::setenv("SPACE_FAULT_DELAY", "resume.recorded@3000", 1);
  daemon_ = Daemon::start(data_dir_, {"--warm-pool", "0"});
  ::unsetenv("SPACE_FAULT_THROW");
  ::unsetenv("SPACE_FAULT_DELAY");
  ASSERT_TRUE(daemon_);
  std::atomic<int> killed{0};
  std::thread killer([&] {
    // The resume's QEMU is restored (and the resume recorded) well within the delay.
    if (!waitForLog("fault point reached, delaying: resume.recorded", log_from, seconds(60))) return;
    for (pid_t pid : qemuProcessesUnder(sandboxDir(last))) {
      if (::kill(pid, SIGKILL) == 0) ++killed;
    }
  });
  auto failed_resume = daemon_->call("POST", "/v1/sandboxes/" + last + "/resume", "");
  killer.join();
  EXPECT_EQ(killed.load(), 1);
  EXPECT_EQ(failed_resume.status, 500) << failed_resume.body;
  auto after = daemon_->callJson("GET", "/v1/sandboxes/" + last, nullptr, 200);
  EXPECT_EQ(after["state"], "failed") << after;
  EXPECT_EQ(after.value("state_reason", ""), "spaced failed while resuming it") << after;
  EXPECT_FALSE(waitForLog("its guest was continued", log_from, milliseconds(1)));
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  EXPECT_NE(daemon_->call("GET", "/metrics").body.find("space_node_memory_reserved_mb 0"), std::string::npos);
  EXPECT_EQ(daemon_->call("GET", "/healthz").status, 200) << "spaced runs on";
}

// Threads spaced needs from the start (housekeeping, its workers, the warm pool's refill): one
// that cannot be started is an error spaced exits with, not an abort, and it leaves no VM.
TEST_F(SpacedTest, AThreadThatCannotStartAtStartupIsAnErrorNotACrash) {
  for (const char* point : {"housekeeping.worker@3", "housekeeping.thread", "warm_pool.refill"}) {
    SCOPED_TRACE(point);
    ::setenv("SPACE_FAULT_FAIL", point, 1);
    const std::string log = dir_->path() + "/start.log";
    std::filesystem::remove(log);
    std::vector<std::string> argv = {SPACED_BIN,           "--listen", "127.0.0.1:0",
                                     "--data-dir",         data_dir_,  "--kernel",
                                     kImages + "/vmlinux", "--rootfs", kImages + "/rootfs.ext4",
                                     "--warm-pool",        "1"};
    for (const std::string& arg : isolatedNetworkArgs()) argv.push_back(arg);
    auto p = ChildProcess::spawn(argv, SpawnOptions{log, "", true});
    ::unsetenv("SPACE_FAULT_FAIL");
    ASSERT_TRUE(p.ok());
    auto status = p->waitFor(seconds(60));
    ASSERT_TRUE(status.has_value()) << "spaced kept running";
    EXPECT_FALSE(status->signaled) << status->describe();
    EXPECT_EQ(status->exit_code, 1);
    auto text = readSmallFile(log, 1 << 20);
    const std::string said = text.ok() ? text.value() : "";
    EXPECT_NE(said.find("cannot start a thread"), std::string::npos) << said;
    EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  }
}

// Each snapshot makes its sandbox's disk chain one file deeper, and a child starts one deeper
// than its snapshot. A snapshot that would pass --max-disk-layers is refused (409 disk_layers,
// nothing changes), so that every snapshot taken still restores, the deepest one included.
TEST_F(SpacedTest, ASnapshotThatWouldMakeTheDiskTooDeepIsRefused) {
  daemon_ = Daemon::start(data_dir_, {"--max-disk-layers", "5"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  const std::string snapshots = "/v1/sandboxes/" + id + "/snapshots";
  std::vector<std::string> taken;
  json refused;
  for (int i = 0; i < 6 && refused.is_null(); ++i) {
    execJson(d, id, json{{"command", "echo " + std::to_string(i) + " > /home/user/n; sync"}});
    auto answer = d.call("POST", snapshots, json::object().dump());
    if (answer.status == 201) {
      taken.push_back(json::parse(answer.body).value("id", ""));
    } else {
      EXPECT_EQ(answer.status, 409) << answer.body;
      refused = json::parse(answer.body);
    }
  }
  ASSERT_FALSE(refused.is_null()) << "6 snapshots in a row were all taken";
  ASSERT_FALSE(taken.empty()) << refused;
  EXPECT_EQ(refused["error"].value("code", ""), "disk_layers") << refused;
  EXPECT_NE(refused["error"].value("message", "").find("--max-disk-layers (5)"), std::string::npos) << refused;
  EXPECT_EQ(d.callJson("GET", "/v1/snapshots", nullptr, 200)["snapshots"].size(), taken.size());
  // The sandbox runs on, and the deepest snapshot restores with what it held.
  EXPECT_EQ(execJson(d, id, json{{"command", "echo still"}})["stdout"], "still\n");
  const std::string child = d.create(json{{"snapshot", taken.back()}});
  ASSERT_FALSE(child.empty());
  EXPECT_EQ(execJson(d, child, json{{"command", "cat /home/user/n"}})["stdout"],
            std::to_string(taken.size() - 1) + "\n");
  // Its child stands as deep as the sandbox would have: it cannot be snapshotted either.
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + child + "/snapshots", json::object(), 409)["error"]["code"],
            "disk_layers");
}

// The same storage design on btrfs as on the ext4 work disk: hard-linked layers, overlays and
// private memory mappings; branch, suspend/resume and snapshot deletion all work there.
TEST_F(SpacedTest, SnapshotsAndBranchesWorkOnABtrfsDataDir) {
  auto fs = Mount::loop("btrfs", dir_->path() + "/btrfs.img", dir_->path() + "/fs", uint64_t{3} << 30);
  ASSERT_TRUE(fs) << "mkfs.btrfs + loop mount (the tests run as root)";
  const std::string data = dir_->path() + "/fs/data";
  daemon_ = Daemon::start(data);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent = d.create();
  ASSERT_FALSE(parent.empty());
  execJson(d, parent, json{{"command", "echo before > /home/user/f.txt"}});
  json snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201);
  json branched =
      d.callJson("POST", "/v1/snapshots/" + snap["id"].get<std::string>() + "/branch", json{{"count", 2}}, 201);
  ASSERT_EQ(branched["sandboxes"].size(), 2u);
  std::vector<std::string> ids{parent, branched["sandboxes"][0]["id"], branched["sandboxes"][1]["id"]};
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(execJson(d, ids[i],
                       json{{"command", "cat /home/user/f.txt; echo " + std::to_string(i) +
                                            " > /home/user/f.txt; sync"}})["stdout"],
              "before\n");
  }
  EXPECT_EQ(d.callJson("POST", "/v1/sandboxes/" + ids[1] + "/suspend", nullptr, 200)["state"], "suspended");
  EXPECT_EQ(d.call("DELETE", "/v1/snapshots/" + snap["id"].get<std::string>()).status, 204);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(execJson(d, ids[i], json{{"command", "cat /home/user/f.txt"}})["stdout"], std::to_string(i) + "\n");
  }
  for (const auto& id : ids) EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
  auto deadline = Clock::now() + seconds(10);
  while (Clock::now() < deadline && !std::filesystem::is_empty(data + "/layers")) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_TRUE(std::filesystem::is_empty(data + "/layers"));
  daemon_.reset();  // before the mount goes
}

// spaced runs a confined gateway at start that tries what a compromised one would
// (GatewayTest.ItsProbeFindsEveryPartOfItsConfinementInPlace), and says what it found; a
// gateway that is not confined, or cannot say, stops it unless --allow-unconfined-gateways.
TEST_F(SpacedTest, ItSaysAtStartWhetherGatewaysAreConfinedAndRequiresIt) {
  const std::string log = dir_->path() + "/required.log";
  auto refused = ChildProcess::spawn(
      {SPACED_BIN, "--listen", "127.0.0.1:0", "--data-dir", data_dir_, "--kernel", kImages + "/vmlinux", "--rootfs",
       kImages + "/rootfs.ext4", "--gateway-binary", "/bin/false"},
      SpawnOptions{log, "", true});
  ASSERT_TRUE(refused.ok());
  auto status = refused->waitFor(seconds(30));
  ASSERT_TRUE(status.has_value()) << "spaced started with a gateway that cannot say it is confined";
  EXPECT_EQ(status->exit_code, 1);
  auto text = readSmallFile(log, 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("network: a gateway is not confined: /bin/false --probe-confinement"), std::string::npos)
      << *text;
  EXPECT_NE(text->find("(--allow-unconfined-gateways starts anyway"), std::string::npos) << *text;
  EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/network/.gateway-probe"));

  // The operator's choice: it starts, and says what is missing.
  daemon_ = Daemon::start(data_dir_, {"--allow-unconfined-gateways", "--gateway-binary", "/bin/false"});
  ASSERT_TRUE(daemon_);
  EXPECT_TRUE(waitForLog("network: gateways are not fully confined: /bin/false --probe-confinement", 0, seconds(1)));
  daemon_.reset();

  // Scripts that name the earlier flag still start.
  daemon_ = Daemon::start(data_dir_, {"--require-gateway-confinement"});
  ASSERT_TRUE(daemon_);
  EXPECT_TRUE(waitForLog("network: gateways are confined (Landlock ABI ", 0, seconds(1)));
  EXPECT_TRUE(waitForLog(": 24 checks of what a compromised one would try, all refused", 0, seconds(1)));
  for (const char* left : {"", ".json", ".log"}) {
    EXPECT_FALSE(std::filesystem::exists(data_dir_ + "/network/.gateway-probe" + left)) << "the probe leaves nothing";
  }
}

// Network options the gateways cannot work with (their one resolver, the ranges their egress
// table opens) stop spaced at start, with the flag named.
TEST_F(SpacedTest, NetworkOptionsTheGatewaysCannotUseAreRefusedAtStart) {
  for (auto [flag, value] :
       {std::pair{"--gateway-upstream-dns", "resolver.example"}, std::pair{"--gateway-upstream-dns", "192.0.2.53:0"},
        std::pair{"--tenant-openable-cidrs", "10.0.0.0/8:22"}, std::pair{"--tenant-openable-cidrs", "*.example"}}) {
    SCOPED_TRACE(std::string(flag) + " " + value);
    const std::string log = dir_->path() + "/refused.log";
    std::vector<std::string> argv = {SPACED_BIN,           "--listen", "127.0.0.1:0",
                                     "--data-dir",         data_dir_,  "--kernel",
                                     kImages + "/vmlinux", "--rootfs", kImages + "/rootfs.ext4"};
    const bool dns = std::string(flag) == "--gateway-upstream-dns";
    argv.insert(argv.end(), {"--gateway-upstream-netns", IsolatedUpstream::get().path(), "--gateway-upstream-dns",
                             dns ? value : "192.0.2.53"});
    if (!dns) argv.insert(argv.end(), {flag, value});
    auto p = ChildProcess::spawn(argv, SpawnOptions{log, "", true});
    ASSERT_TRUE(p.ok());
    auto status = p->waitFor(seconds(30));
    ASSERT_TRUE(status.has_value()) << "spaced started";
    EXPECT_EQ(status->exit_code, 1);
    auto text = readSmallFile(log, 1 << 20);
    const std::string said = text.ok() ? text.value() : "";
    EXPECT_NE(said.find(std::string("spaced: ") + flag + ": "), std::string::npos) << said;
  }
}

TEST_F(SpacedTest, OneDaemonPerDataDir) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  const std::string log = dir_->path() + "/second.log";
  auto second = ChildProcess::spawn({SPACED_BIN, "--listen", "127.0.0.1:0", "--data-dir", data_dir_, "--kernel",
                                     kImages + "/vmlinux", "--rootfs", kImages + "/rootfs.ext4"},
                                    SpawnOptions{log, "", true});
  ASSERT_TRUE(second.ok());
  auto status = second->waitFor(seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->exit_code, 1);
  auto text = readSmallFile(log, 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("another spaced is using"), std::string::npos) << *text;
  EXPECT_EQ(daemon_->call("GET", "/healthz", "", "").status, 200);  // the first one is unharmed
}

// Seconds from now to an RFC 3339 time as the API writes it ("2026-12-01T06:30:00.123Z").
double secondsUntil(const std::string& rfc3339) {
  struct tm utc {};
  const char* rest = strptime(rfc3339.c_str(), "%Y-%m-%dT%H:%M:%S", &utc);
  if (rest == nullptr) return -1e9;
  double at = static_cast<double>(timegm(&utc)) + (*rest == '.' ? atof(rest) : 0.0);
  auto now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return at - now;
}

// POST /timeout sets a new expiry counted from now: one sandbox's is extended past its original
// timeout (it must outlive it), another's shortened (it must end early, for the reason timeout).
TEST_F(SpacedTest, TimeoutKillsTheSandbox) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  // The one with 3 s is made last and extended at once: its 3 s count from the start of its
  // create, and another create in between can take them all on a loaded machine.
  const std::string shortened = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 600}});
  const std::string extended = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 3}});
  ASSERT_FALSE(extended.empty());
  ASSERT_FALSE(shortened.empty());
  json e = d.callJson("POST", "/v1/sandboxes/" + extended + "/timeout", json{{"timeout_s", 600}}, 200);
  EXPECT_EQ(e["state"], "running");
  EXPECT_NEAR(secondsUntil(e.value("expires_at", "")), 600, 5) << e;
  json s = d.callJson("POST", "/v1/sandboxes/" + shortened + "/timeout", json{{"timeout_s", 2}}, 200);
  EXPECT_NEAR(secondsUntil(s.value("expires_at", "")), 2, 1.5) << s;
  EXPECT_NEAR(secondsUntil(d.callJson("GET", "/v1/sandboxes/" + shortened, nullptr, 200).value("expires_at", "")), 2,
              1.5);
  const auto original_expiry = Clock::now() + seconds(3);
  auto deadline = Clock::now() + seconds(20);
  json sb;
  while (Clock::now() < deadline) {
    sb = d.callJson("GET", "/v1/sandboxes/" + shortened, nullptr, 200);
    if (sb["state"] != "running") break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_EQ(sb["state"], "deleted");
  EXPECT_NE(sb.value("state_reason", "").find("timeout"), std::string::npos) << sb;
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(shortened)));
  // The extended one outlives the 3 s it was created with (and the housekeeping that follows).
  std::this_thread::sleep_until(std::max(Clock::now(), original_expiry) + seconds(2));
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + extended, nullptr, 200)["state"], "running");
  EXPECT_EQ(execJson(d, extended, json{{"command", "echo alive"}})["stdout"], "alive\n");
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 1u);
}

// Deleted and failed sandboxes' records go once --deleted-retention has passed: housekeeping
// purges them at spaced's start and every 5 minutes, so they do not pile up in the database.
TEST_F(SpacedTest, OldDeletedRecordsArePurgedOnSchedule) {
  daemon_ = Daemon::start(data_dir_, {"--deleted-retention", "1"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + id).status, 204);
  // The start's pass came before it: still there until the next.
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200)["state"], "deleted");
  std::this_thread::sleep_for(seconds(2));
  daemon_.reset();
  daemon_ = Daemon::start(data_dir_, {"--deleted-retention", "1"});
  ASSERT_TRUE(daemon_);
  int status = 200;
  for (int i = 0; i < 100 && status != 404; ++i, std::this_thread::sleep_for(milliseconds(100))) {
    status = daemon_->call("GET", "/v1/sandboxes/" + id).status;
  }
  EXPECT_EQ(status, 404) << "a record deleted 2 s ago outlived a retention of 1 s";
  // A refused retention says so.
  const std::string out = dir_->path() + "/retention.log";
  auto p = ChildProcess::spawn({SPACED_BIN, "--data-dir", data_dir_ + "-other", "--deleted-retention", "0"},
                               SpawnOptions{out, "", true});
  ASSERT_TRUE(p.ok());
  auto exit = p->waitFor(seconds(30));
  ASSERT_TRUE(exit);
  EXPECT_NE(exit->exit_code, 0);
}

TEST_F(SpacedTest, RestartReadoptsRunningSandboxes) {
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  const std::string kept = daemon_->create(json{{"cpus", 1}, {"memory_mb", 256}, {"timeout_s", 900}});
  const std::string lost = daemon_->create(json{{"cpus", 1}, {"memory_mb", 256}});
  ASSERT_FALSE(kept.empty());
  ASSERT_FALSE(lost.empty());
  json before = daemon_->callJson("GET", "/v1/sandboxes/" + kept, nullptr, 200);
  execJson(*daemon_, kept, json{{"command", "echo state > /tmp/mark; setsid sleep 600 >/dev/null 2>&1 &"}});

  // Each QEMU is jailed in a group of its own (space-jail; cgroups on this host).
  const std::string kept_group = qemuMemoryGroup(sandboxDir(kept));
  const std::string lost_group = qemuMemoryGroup(sandboxDir(lost));
  ASSERT_NE(kept_group.find("/space/spaced-"), std::string::npos) << kept_group;
  ASSERT_NE(lost_group, kept_group);
  EXPECT_TRUE(std::filesystem::exists(kept_group) && std::filesystem::exists(lost_group));
  // ... and sees only its own files (space-jail --view): seen through its root, the state
  // database and the other sandbox's directory do not exist.
  auto viewOf = [](const std::vector<pid_t>& pids) {
    return pids.size() == 1 ? "/proc/" + std::to_string(pids[0]) + "/root" : std::string("/nonexistent");
  };
  const std::string kept_view = viewOf(qemuProcessesUnder(sandboxDir(kept)));
  EXPECT_TRUE(std::filesystem::exists(kept_view + sandboxDir(kept)));
  EXPECT_FALSE(std::filesystem::exists(kept_view + sandboxDir(lost)));
  EXPECT_FALSE(std::filesystem::exists(kept_view + data_dir_ + "/state.db"));
  std::vector<std::string> processes;  // its /proc lists the processes of its PID namespace
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kept_view + "/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") == std::string::npos) processes.push_back(name);
  }
  EXPECT_EQ(processes, std::vector<std::string>{"1"});
  // The template's memory, shared by every tenant's clones, is not in its view: QEMU maps a
  // sealed copy (descriptor 3), which nothing can write.
  for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/templates", ec)) {
    if (std::filesystem::exists(e.path() / "memory")) {
      EXPECT_FALSE(std::filesystem::exists(kept_view + (e.path() / "memory").string())) << e.path();
    }
  }
  std::error_code link_ec;
  const auto pids = qemuProcessesUnder(sandboxDir(kept));
  const std::string mapped =
      pids.empty() ? "" : std::filesystem::read_symlink("/proc/" + std::to_string(pids[0]) + "/fd/3", link_ec).string();
  EXPECT_EQ(mapped.rfind("/memfd:space-template-memory", 0), 0u) << mapped;

  // Graceful stop: VMs keep running.
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
  // A process in a VM group that holds no sandbox's VM (what a QEMU that rewrote its command
  // line looks like) is stopped at the next start, whatever its command line says.
  const std::string stray_group = (std::filesystem::path(kept_group).parent_path() / "vm-stray").string();
  ASSERT_TRUE(std::filesystem::create_directory(stray_group));
  auto stray = ChildProcess::spawn({"/bin/sleep", "600"}, SpawnOptions{});
  ASSERT_TRUE(stray.ok());
  { std::ofstream(stray_group + "/cgroup.procs") << stray->pid() << "\n"; }
  auto members = readSmallFile(stray_group + "/cgroup.procs", 4096);
  ASSERT_TRUE(members.ok() && members->find(std::to_string(stray->pid())) != std::string::npos);
  // One VM dies while no daemon watches.
  for (pid_t pid : qemuProcessesUnder(sandboxDir(lost))) ::kill(pid, SIGKILL);

  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep"});
  ASSERT_TRUE(daemon_);
  json after = daemon_->callJson("GET", "/v1/sandboxes/" + kept, nullptr, 200);
  EXPECT_EQ(after["state"], "running");
  EXPECT_EQ(after["expires_at"], before["expires_at"]);  // the timeout survived
  EXPECT_EQ(execJson(*daemon_, kept, json{{"command", "cat /tmp/mark"}})["stdout"], "state\n");
  EXPECT_TRUE(std::filesystem::exists(kept_view + sandboxDir(kept)));  // the same jailed QEMU
  EXPECT_TRUE(stray->waitFor(std::chrono::seconds(5)).has_value()) << "the stray process in a VM group survived";
  ::rmdir(stray_group.c_str());
  json failed = daemon_->callJson("GET", "/v1/sandboxes/" + lost, nullptr, 200);
  EXPECT_EQ(failed["state"], "failed");
  EXPECT_NE(failed.value("state_reason", "").find("lost"), std::string::npos) << failed;
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(lost)));
  // The dead VM's group went; the adopted one's stays with it.
  EXPECT_FALSE(std::filesystem::exists(lost_group)) << lost_group;
  EXPECT_EQ(qemuMemoryGroup(sandboxDir(kept)), kept_group);

  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 256 + vmQemuMb());

  // A crash (kill -9) of the daemon: the same again. Started now with a smaller translation
  // buffer for new VMs, it counts the adopted QEMU's own (128 MiB, from its command line).
  daemon_->stop(SIGKILL);
  daemon_ = Daemon::start(data_dir_, {"--on-shutdown", "keep", "--tcg-tb-mib", "64"});
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(execJson(*daemon_, kept, json{{"command", "cat /tmp/mark"}})["stdout"], "state\n");
  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 256 + vmQemuMb());
  EXPECT_EQ(daemon_->call("DELETE", "/v1/sandboxes/" + kept).status, 204);
  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 0);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  EXPECT_FALSE(std::filesystem::exists(kept_group)) << "a deleted sandbox's group outlived it";

  // --on-shutdown stop powers sandboxes off and records them deleted.
  daemon_->stop(SIGTERM);
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  const std::string stopped = daemon_->create();
  ASSERT_FALSE(stopped.empty());
  EXPECT_EQ(daemon_->stop(SIGTERM).exit_code, 0);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + stopped, nullptr, 200)["state"], "deleted");
}

TEST_F(SpacedTest, NodeLimitsRefuseInsteadOfOvercommitting) {
  daemon_ = Daemon::start(
      data_dir_, {"--max-sandboxes", "2", "--max-vcpus", "2", "--max-memory-mb", std::to_string(768 + 2 * vmQemuMb())});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  ASSERT_FALSE(d.create(json{{"cpus", 1}, {"memory_mb", 256}}).empty());
  json e = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 2}, {"memory_mb", 256}}, 503);
  EXPECT_EQ(e["error"]["code"], "insufficient_capacity");
  e = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 600}}, 503);
  EXPECT_EQ(e["error"]["code"], "insufficient_capacity");
  // The operator hears what the node counts.
  EXPECT_NE(
      e["error"].value("message", "").find("600 MB requested and " + std::to_string(vmQemuMb()) + " MB for its QEMU"),
      std::string::npos)
      << e;
  ASSERT_FALSE(d.create(json{{"cpus", 1}, {"memory_mb", 256}}).empty());
  e = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 128}}, 429);
  EXPECT_EQ(e["error"]["code"], "too_many_sandboxes");
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
}

// A branch is refused as a whole, before any child starts, when its children's shares of the
// node's memory do not fit: each child's guest memory and its QEMU's (its own and, under TCG,
// its translation buffer). Counted by guest memory alone, this one (room for 256 MB more) would
// fit, start its child and undo it.
TEST_F(SpacedTest, ABranchThatDoesNotFitTheNodesMemoryStartsNoChild) {
  const int share = 256 + vmQemuMb();
  daemon_ = Daemon::start(data_dir_, {"--max-memory-mb", std::to_string(2 * share + 256)});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const json small{{"cpus", 1}, {"memory_mb", 256}};
  const std::string a = d.create(small);
  ASSERT_FALSE(a.empty());
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + a + "/snapshots", json::object(), 201).value("id", "");
  ASSERT_FALSE(snap.empty());
  ASSERT_FALSE(d.create(small).empty());
  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 2 * share);
  json refused = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 1}}, 503);
  EXPECT_EQ(refused["error"]["code"], "insufficient_capacity") << refused;
  EXPECT_NE(refused.dump().find("none started"), std::string::npos) << refused;
  EXPECT_EQ(qemuProcessesUnder(data_dir_).size(), 2u);
  EXPECT_EQ(metric("space_node_memory_reserved_mb"), 2 * share);
}

TEST_F(SpacedTest, ExecOnADeadVmFailsClearlyAndMarksTheSandboxFailed) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id = d.create();
  ASSERT_FALSE(id.empty());
  auto qemu = qemuProcessesUnder(sandboxDir(id));
  ASSERT_EQ(qemu.size(), 1u);
  ::kill(qemu[0], SIGKILL);
  json e = execJson(d, id, json{{"command", "true"}}, 502);
  // Either this exec noticed the death, or the health check did first: both end in `failed`.
  std::string code = e["error"].value("code", "");
  EXPECT_TRUE(code == "sandbox_failed" || code == "unavailable") << e;
  json sb;
  auto deadline = Clock::now() + seconds(10);
  while (Clock::now() < deadline) {
    sb = d.callJson("GET", "/v1/sandboxes/" + id, nullptr, 200);
    if (sb["state"] == "failed") break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(sb["state"], "failed");
  EXPECT_NE(sb.value("state_reason", "").find("VM stopped"), std::string::npos) << sb;
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(id)));
  EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
}

TEST_F(SpacedTest, SpacectlRunRemovesItsSandbox) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  const std::string out = dir_->path() + "/spacectl.out";
  const std::string err = dir_->path() + "/spacectl.err";
  setenv("SPACE_API", daemon_->url().c_str(), 1);
  setenv("SPACE_API_KEY", daemon_->key().c_str(), 1);
  auto run =
      ChildProcess::spawn({SPACECTL_BIN, "run", "--rm", "--cpus", "1", "--memory", "256", "--", "uname -a; exit 7"},
                          SpawnOptions{out, err, true});
  ASSERT_TRUE(run.ok());
  auto status = run->waitFor(seconds(120));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->exit_code, 7);  // the remote command's exit code
  auto text = readSmallFile(out, 1 << 20);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("Linux"), std::string::npos);
  EXPECT_NE(text->find("-space"), std::string::npos) << *text << readSmallFile(err, 1 << 20).value();
  json all = daemon_->callJson("GET", "/v1/sandboxes?state=deleted", nullptr, 200);
  ASSERT_EQ(all["sandboxes"].size(), 1u);
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  unsetenv("SPACE_API");
  unsetenv("SPACE_API_KEY");
}

// A WebSocket upgrade to GET .../pty by hand; what the daemon sent back within `wait` (the 101,
// then its frames: ours are unmasked, so their text is readable as it is).
// `small_window`: a 4 KiB receive buffer, so a client that stops reading backs up at once.
// `auth`: the fields that authenticate it (default: the daemon's key).
std::string rawTerminal(const Daemon& d, const std::string& id, const std::string& query, int& fd_out,
                        bool small_window = false, std::string auth = "") {
  if (auth.empty()) auth = "Authorization: Bearer " + d.key() + "\r\n";
  const uint16_t port = static_cast<uint16_t>(std::stoi(d.url().substr(d.url().rfind(':') + 1)));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (small_window) {
    int size = 4096;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  }
  timeval limit{20, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  testsupport::sendRaw(fd.get(),
                       "GET /v1/sandboxes/" + id + "/pty?" + query +
                           " HTTP/1.1\r\nHost: " + d.url().substr(d.url().find("://") + 3) + "\r\n" + auth +
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
  std::string got;
  char buf[4096];
  for (auto until = Clock::now() + seconds(20); Clock::now() < until && got.find("\"started\"") == std::string::npos;) {
    ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  fd_out = fd.release();
  return got;
}

// A client frame: FIN, the opcode, masked with a zero key (so the payload goes as it is).
std::string clientFrame(uint8_t opcode, const std::string& payload) {
  std::string f;
  f += static_cast<char>(0x80 | opcode);
  f += static_cast<char>(0x80 | payload.size());  // < 126 bytes here
  f += std::string(4, '\0');
  return f + payload;
}

bool processRuns(const Daemon& d, const std::string& id, const std::string& arg) {
  json listed = d.callJson("GET", "/v1/sandboxes/" + id + "/processes", json(), 200);
  for (const auto& p : listed["processes"]) {
    for (const auto& a : p["args"]) {
      if (a == arg) return true;
    }
  }
  return false;
}

TEST_F(SpacedTest, ATerminalFollowsItsWindowRunsFullScreenProgramsAndEndsWithTheShellsStatus) {
  // A console build of one page: enough for a browser's session (its terminal ends with it).
  std::filesystem::create_directories(dir_->path() + "/ui");
  { std::ofstream(dir_->path() + "/ui/index.html") << "<!doctype html>"; }
  daemon_ = Daemon::start(data_dir_, {"--ui-dir", dir_->path() + "/ui"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  auto api = apiclient::Client::create(apiclient::Endpoint{daemon_->url(), "", daemon_->key(), "test"});
  ASSERT_TRUE(api.ok());

  // Through the client library, on pipes: the size asked for, TERM, output, the exit status.
  {
    apiclient::TerminalOptions options;
    options.cols = 91;
    options.rows = 17;
    options.term = "vt100";
    options.argv = {"/bin/sh", "-c", "stty size; echo term=$TERM out-$((2+3)); exit 5"};
    std::string output;
    apiclient::TerminalIo io;
    io.on_output = [&output](std::string_view data) { output += data; };
    auto end = apiclient::runTerminal(api.value(), id, options, io);
    ASSERT_TRUE(end.ok()) << end.error().message;
    EXPECT_EQ(end->exit_code, 5) << end->status;
    EXPECT_NE(output.find("17 91"), std::string::npos) << output;
    EXPECT_NE(output.find("term=vt100 out-5"), std::string::npos) << output;
  }
  // Keystrokes and a resize while it runs, into an interactive login shell.
  {
    int keys[2], winch[2];
    ASSERT_EQ(::pipe2(keys, O_CLOEXEC), 0);
    ASSERT_EQ(::pipe2(winch, O_CLOEXEC | O_NONBLOCK), 0);
    const std::string typed = "echo typed-$((1+1)); sleep 1; stty size; exit 4\r";
    ASSERT_EQ(::write(keys[1], typed.data(), typed.size()), static_cast<ssize_t>(typed.size()));
    std::string output;
    int pid = 0;
    apiclient::TerminalIo io;
    io.input_fd = keys[0];
    io.on_output = [&output](std::string_view data) { output += data; };
    io.resize_fd = winch[0];
    io.window_size = [] { return std::optional<std::pair<int, int>>(std::pair{123, 33}); };
    io.on_started = [&](int started) {
      pid = started;
      (void)!::write(winch[1], "w", 1);
    };
    auto end = apiclient::runTerminal(api.value(), id, apiclient::TerminalOptions{}, io);
    for (int fd : {keys[0], keys[1], winch[0], winch[1]}) ::close(fd);
    ASSERT_TRUE(end.ok()) << end.error().message;
    EXPECT_GT(pid, 0);
    EXPECT_EQ(end->exit_code, 4) << output;
    EXPECT_NE(output.find("typed-2"), std::string::npos) << output;
    EXPECT_NE(output.find("33 123"), std::string::npos) << output;
  }
  // Refusals: before the upgrade as the API's errors, after it as the session's.
  {
    auto unknown = apiclient::runTerminal(api.value(), "sb_00000000000000000000000000", {}, {});
    ASSERT_FALSE(unknown.ok());
    EXPECT_EQ(unknown.error().reason, "sandbox_not_found") << unknown.error().message;
    auto wrong_key =
        apiclient::Client::create(apiclient::Endpoint{daemon_->url(), "", "e2b_" + std::string(40, '0'), "test"});
    auto refused = apiclient::runTerminal(wrong_key.value(), id, {}, {});
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().reason, "unauthenticated") << refused.error().message;
    apiclient::TerminalOptions too_wide;
    too_wide.cols = 70000;
    auto wide = apiclient::runTerminal(api.value(), id, too_wide, {});
    ASSERT_FALSE(wide.ok());
    EXPECT_EQ(wide.error().reason, "invalid_argument") << wide.error().message;
    apiclient::TerminalOptions nobody;
    nobody.user = "nobody-here";
    EXPECT_FALSE(apiclient::runTerminal(api.value(), id, nobody, {}).ok());
    // Another tenant's key finds no such sandbox, and starts nothing in it.
    const std::string other = addTenant("neighbour");
    ASSERT_FALSE(other.empty());
    auto neighbour = apiclient::Client::create(apiclient::Endpoint{daemon_->url(), "", other, "test"});
    apiclient::TerminalOptions intruder;
    intruder.argv = {"sleep", "604"};
    auto crossed = apiclient::runTerminal(neighbour.value(), id, intruder, {});
    ASSERT_FALSE(crossed.ok());
    EXPECT_EQ(crossed.error().reason, "sandbox_not_found") << crossed.error().message;
    EXPECT_FALSE(processRuns(*daemon_, id, "604"));
    auto plain = daemon_->call("GET", "/v1/sandboxes/" + id + "/pty");
    EXPECT_EQ(plain.status, 400) << plain.body;
    EXPECT_NE(plain.body.find("WebSocket"), std::string::npos) << plain.body;
  }
  // A control message that is not one ends the session with a reason, and its process with it.
  {
    int fd = -1;
    std::string got = rawTerminal(*daemon_, id, "arg=sleep&arg=601", fd);
    UniqueFd owned(fd);
    ASSERT_NE(got.find("HTTP/1.1 101"), std::string::npos) << got;
    ASSERT_TRUE(processRuns(*daemon_, id, "601"));
    testsupport::sendRaw(fd, clientFrame(0x1, "{\"type\":\"paste\"}"));
    std::string rest = testsupport::readUntilClosed(fd);
    EXPECT_NE(rest.find("invalid_argument"), std::string::npos) << rest;
    bool gone = false;
    for (auto until = Clock::now() + seconds(10); !gone && Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(200))) {
      gone = !processRuns(*daemon_, id, "601");
    }
    EXPECT_TRUE(gone) << "the process of a refused session still runs";
  }
  // A terminal a console session opened ends when the session does (logout), within seconds,
  // and its process with it.
  {
    const std::string host = daemon_->url().substr(daemon_->url().find("://") + 3);
    const uint16_t port = static_cast<uint16_t>(std::stoi(host.substr(host.rfind(':') + 1)));
    const std::string body = json{{"api_key", daemon_->key()}}.dump();
    UniqueFd login_fd = testsupport::connectRaw(port, seconds(10));
    testsupport::sendRaw(login_fd.get(), "POST /ui/session HTTP/1.1\r\nHost: " + host + "\r\nOrigin: http://" + host +
                                             "\r\nContent-Type: application/json\r\nContent-Length: " +
                                             std::to_string(body.size()) + "\r\n\r\n" + body);
    const std::string login = testsupport::readUntilClosed(login_fd.get());
    ASSERT_NE(login.find("HTTP/1.1 200"), std::string::npos) << login;
    const size_t at = login.find("space_session=");
    ASSERT_NE(at, std::string::npos) << login;
    const std::string cookie = "Cookie: " + login.substr(at, login.find(';', at) - at) + "\r\n";
    const std::string csrf = json::parse(login.substr(login.find("\r\n\r\n") + 4))["csrf_token"];
    int fd = -1;
    std::string got =
        rawTerminal(*daemon_, id, "arg=sleep&arg=606", fd, false, cookie + "Origin: http://" + host + "\r\n");
    UniqueFd owned(fd);
    ASSERT_NE(got.find("\"started\""), std::string::npos) << got;
    // Another site's page gets no terminal with that cookie.
    int evil_fd = -1;
    std::string evil =
        rawTerminal(*daemon_, id, "arg=sleep&arg=607", evil_fd, false, cookie + "Origin: http://evil.example\r\n");
    UniqueFd evil_owned(evil_fd);
    EXPECT_NE(evil.find("HTTP/1.1 403"), std::string::npos) << evil;
    UniqueFd logout_fd = testsupport::connectRaw(port, seconds(10));
    testsupport::sendRaw(logout_fd.get(), "DELETE /ui/session HTTP/1.1\r\nHost: " + host + "\r\n" + cookie +
                                              "X-CSRF-Token: " + csrf + "\r\nContent-Length: 0\r\n\r\n");
    EXPECT_NE(testsupport::readUntilClosed(logout_fd.get()).find("HTTP/1.1 204"), std::string::npos);
    const auto logged_out = Clock::now();
    std::string rest = testsupport::readUntilClosed(fd);
    EXPECT_NE(rest.find("unauthenticated"), std::string::npos) << rest;
    EXPECT_LT(Clock::now() - logged_out, seconds(12));
    bool gone = false;
    for (auto until = Clock::now() + seconds(10); !gone && Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(200))) {
      gone = !processRuns(*daemon_, id, "606");
    }
    EXPECT_TRUE(gone) << "the process of a logged-out terminal still runs";
  }
  // A client that goes away hangs the terminal up: its process ends.
  {
    int fd = -1;
    std::string got = rawTerminal(*daemon_, id, "arg=sleep&arg=602", fd);
    ASSERT_NE(got.find("\"started\""), std::string::npos) << got;
    ASSERT_TRUE(processRuns(*daemon_, id, "602"));
    ::close(fd);
    bool gone = false;
    for (auto until = Clock::now() + seconds(10); !gone && Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(200))) {
      gone = !processRuns(*daemon_, id, "602");
    }
    EXPECT_TRUE(gone) << "the process of a dropped session still runs";
  }

  // A client that stops reading while the process floods its terminal: the session ends as too
  // slow once the bounded queue and backlog are full, and the process goes with it.
  {
    const size_t log_from = readSmallFile(logPath(), 64 << 20).value().size();
    int fd = -1;
    std::string got = rawTerminal(*daemon_, id, "arg=yes&arg=flood-605", fd, true);
    UniqueFd owned(fd);
    ASSERT_NE(got.find("\"started\""), std::string::npos) << got;
    EXPECT_TRUE(waitForLog("ended: client_too_slow", log_from, seconds(40))) << daemon_->log();
    bool gone = false;
    for (auto until = Clock::now() + seconds(10); !gone && Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(200))) {
      gone = !processRuns(*daemon_, id, "flood-605");
    }
    EXPECT_TRUE(gone) << "the flooding process of a too slow session still runs";
  }

  // spacectl shell in a real terminal (tmux): type, resize, a full-screen program, exit.
  const std::string sock = dir_->path() + "/tmux.sock";
  auto tmux = [&](const std::string& args) {
    const std::string out = dir_->path() + "/tmux.out";
    int rc = std::system(("tmux -S " + sock + " " + args + " > " + out + " 2>&1").c_str());
    auto text = readSmallFile(out, 1 << 20);
    EXPECT_EQ(rc, 0) << args << ": " << (text.ok() ? text.value() : "");
    return text.ok() ? text.value() : std::string();
  };
  auto screenShows = [&](const std::string& text) {
    std::string screen;
    for (auto until = Clock::now() + seconds(20); Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(200))) {
      screen = tmux("capture-pane -p -t shell");
      if (screen.find(text) != std::string::npos) return true;
    }
    ADD_FAILURE() << "the screen never showed \"" << text << "\":\n" << screen;
    return false;
  };
  tmux("new-session -d -s shell -x 100 -y 30 '" + std::string(SPACECTL_BIN) + " --data-dir " + data_dir_ + " shell " +
       id + "; echo spacectl-exit=$?; sleep 60'");
  if (!screenShows(":~$")) {
    tmux("kill-server");
    return;
  }
  tmux("send-keys -t shell 'echo hi-$((6*7)); stty size' Enter");
  EXPECT_TRUE(screenShows("hi-42"));
  EXPECT_TRUE(screenShows("30 100"));
  tmux("resize-window -t shell -x 120 -y 40");
  tmux("send-keys -t shell 'stty size' Enter");
  EXPECT_TRUE(screenShows("40 120"));
  tmux("send-keys -t shell top Enter");
  EXPECT_TRUE(screenShows("load average"));
  tmux("send-keys -t shell q");
  tmux("send-keys -t shell 'clear; exit 7' Enter");
  EXPECT_TRUE(screenShows("spacectl-exit=7"));
  tmux("kill-server");

  // What the sandbox cost meanwhile (sampled every 5 s; it has run for well over that): through
  // the API, spacectl top and the node's Prometheus series.
  json series = daemon_->callJson("GET", "/v1/sandboxes/" + id + "/metrics", json(), 200);
  ASSERT_TRUE(series["metrics"].is_array() && !series["metrics"].empty()) << series;
  const json last = series["metrics"].back();
  EXPECT_EQ(last["cpu_count"], 1) << last;
  EXPECT_EQ(last["mem_total_bytes"], 256u << 20) << last;
  EXPECT_GT(last["mem_used_bytes"].get<uint64_t>(), 0u) << last;
  EXPECT_GE(last["cpu_used_pct"].get<double>(), 0.0) << last;
  // The guest's own view, from its agent: memory in use within its RAM, its root filesystem's
  // size and use; and live: 64 MiB written in the guest show in a later sample.
  auto latestGuestSample = [&](const std::function<bool(const json&)>& good) {
    json sample;
    for (int i = 0; i < 60; ++i) {
      json all = daemon_->callJson("GET", "/v1/sandboxes/" + id + "/metrics", json(), 200)["metrics"];
      if (!all.empty() && all.back().contains("guest_mem_used_bytes")) {
        sample = all.back();
        if (good(sample)) break;
      }
      std::this_thread::sleep_for(milliseconds(500));
    }
    return sample;
  };
  const json guest = latestGuestSample([](const json&) { return true; });
  ASSERT_TRUE(guest.contains("guest_mem_used_bytes")) << "no sample with the guest's figures";
  EXPECT_GT(guest["guest_mem_used_bytes"].get<uint64_t>(), 8u << 20) << guest;
  EXPECT_LT(guest["guest_mem_used_bytes"].get<uint64_t>(), 256u << 20) << guest;
  EXPECT_LT(guest["guest_mem_cache_bytes"].get<uint64_t>(), 256u << 20) << guest;
  const uint64_t disk_used = guest["guest_disk_used_bytes"].get<uint64_t>();
  EXPECT_GT(disk_used, 100u << 20) << guest;  // the image's own files
  EXPECT_GT(guest["guest_disk_total_bytes"].get<uint64_t>(), disk_used) << guest;
  ASSERT_EQ(
      execJson(*daemon_, id, json{{"command", "head -c 67108864 /dev/zero > /home/user/big && sync"}})["exit_code"], 0);
  const json grown = latestGuestSample(
      [&](const json& s) { return s["guest_disk_used_bytes"].get<uint64_t>() >= disk_used + (60u << 20); });
  EXPECT_GE(grown.value("guest_disk_used_bytes", uint64_t{0}), disk_used + (60u << 20)) << grown;
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + id + "/metrics?start=1&end=2", json(), 200)["metrics"].size(),
            0u);
  EXPECT_EQ(daemon_->call("GET", "/v1/sandboxes/" + id + "/metrics?start=yesterday").status, 400);
  EXPECT_EQ(daemon_->call("GET", "/v1/sandboxes/sb_00000000000000000000000000/metrics").status, 404);
  const std::string top_out = dir_->path() + "/top.json";
  auto top = ChildProcess::spawn({SPACECTL_BIN, "--data-dir", data_dir_, "top", "--once", "--json"},
                                 SpawnOptions{top_out, dir_->path() + "/top.err", true});
  ASSERT_TRUE(top.ok());
  auto top_status = top->waitFor(seconds(30));
  ASSERT_TRUE(top_status && top_status->exit_code == 0);
  auto top_text = readSmallFile(top_out, 1 << 20);
  json topped = json::parse(top_text.ok() ? top_text.value() : "", nullptr, false);
  ASSERT_EQ(topped["sandboxes"].size(), 1u) << topped;
  EXPECT_EQ(topped["sandboxes"][0]["id"], id);
  EXPECT_EQ(topped["sandboxes"][0]["metrics"]["mem_total_bytes"], 256u << 20) << topped;
  const std::string prometheus = daemon_->call("GET", "/metrics").body;
  EXPECT_NE(prometheus.find("space_sandbox_memory_bytes{tenant=\"default\",sandbox=\"" + id + "\"} 268435456\n"),
            std::string::npos)
      << prometheus;
  EXPECT_NE(prometheus.find("space_sandbox_guest_memory_used_bytes{tenant=\"default\",sandbox=\"" + id + "\"} "),
            std::string::npos)
      << prometheus;
}

// Every spacectl command a user relies on, against the real daemon, found the way a user finds
// it: through <data-dir>/spaced.json and the key file next to it (no --api, no key given).
size_t threadsOf(pid_t pid) {
  auto status = readSmallFile("/proc/" + std::to_string(pid) + "/status", 1 << 16);
  if (!status.ok()) return 0;
  const size_t at = status.value().find("\nThreads:");
  return at == std::string::npos ? 0 : std::stoul(status.value().substr(at + 9));
}

// Terminals hold no thread of the daemon's (one loop serves them all), a tenant holds at most a
// quarter of --max-terminals, and keystrokes still go through while the others sit open.
TEST_F(SpacedTest, OpenTerminalsHoldNoThreadAndATenantHoldsAQuarterOfThem) {
  daemon_ = Daemon::start(data_dir_, {"--max-terminals", "40"});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  auto api = apiclient::Client::create(apiclient::Endpoint{daemon_->url(), "", daemon_->key(), "test"});
  ASSERT_TRUE(api.ok());
  // `may_be_busy`: a refusal for want of a place is no failure (the caller tries again).
  auto typeInto = [&](const std::string& word, bool may_be_busy = false) {
    int keys[2];
    EXPECT_EQ(::pipe2(keys, O_CLOEXEC), 0);
    const std::string typed = word + "\r";
    EXPECT_EQ(::write(keys[1], typed.data(), typed.size()), static_cast<ssize_t>(typed.size()));
    apiclient::TerminalOptions options;
    options.argv = {"/bin/sh", "-c", "read x; echo got-$x"};
    std::string output;
    apiclient::TerminalIo io;
    io.input_fd = keys[0];
    io.on_output = [&output](std::string_view data) { output += data; };
    auto end = apiclient::runTerminal(api.value(), id, options, io);
    ::close(keys[0]);
    ::close(keys[1]);
    const bool busy = !end.ok() && end.error().reason == "terminals_busy";
    EXPECT_TRUE(end.ok() || (may_be_busy && busy)) << (end.ok() ? "" : end.error().message);
    return output;
  };
  EXPECT_NE(typeInto("first").find("got-first"), std::string::npos);
  const size_t threads_before = threadsOf(daemon_->pid());
  ASSERT_GT(threads_before, 0u);
  std::vector<UniqueFd> open;
  for (int i = 0; i < 10; ++i) {  // the tenant's quarter of 40
    int fd = -1;
    std::string got = rawTerminal(*daemon_, id, "arg=sleep&arg=" + std::to_string(700 + i), fd);
    open.emplace_back(fd);
    ASSERT_NE(got.find("\"started\""), std::string::npos) << i << ": " << got;
  }
  const size_t threads_open = threadsOf(daemon_->pid());
  EXPECT_LE(threads_open, threads_before + 3) << "ten open terminals took threads";
  {
    int fd = -1;
    std::string refused = rawTerminal(*daemon_, id, "arg=sleep&arg=799", fd);
    UniqueFd owned(fd);
    EXPECT_NE(refused.find("HTTP/1.1 429"), std::string::npos) << refused;
    EXPECT_NE(refused.find("terminals_busy"), std::string::npos) << refused;
    EXPECT_FALSE(processRuns(*daemon_, id, "799")) << "a refused terminal started its process";
  }
  {
    // An upgrade without what its handshake needs (here the key) is refused before anything starts.
    const uint16_t port = static_cast<uint16_t>(std::stoi(daemon_->url().substr(daemon_->url().rfind(':') + 1)));
    UniqueFd raw = testsupport::connectRaw(port, seconds(10));
    testsupport::sendRaw(raw.get(), "GET /v1/sandboxes/" + id +
                                        "/pty?arg=sleep&arg=798 HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer " +
                                        daemon_->key() +
                                        "\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\n"
                                        "Sec-WebSocket-Version: 13\r\n\r\n");
    const std::string answer = testsupport::readUntilClosed(raw.get());
    EXPECT_NE(answer.find("HTTP/1.1 400"), std::string::npos) << answer;
    EXPECT_FALSE(processRuns(*daemon_, id, "798")) << "a failed handshake started its process";
  }
  // One closed gives its place back (once its session noticed), and a terminal typed into
  // works beside the nine still open.
  open.pop_back();
  std::string output;
  for (auto until = Clock::now() + seconds(10); Clock::now() < until; std::this_thread::sleep_for(milliseconds(200))) {
    output = typeInto("second", true);
    if (output.find("got-second") != std::string::npos) break;
  }
  EXPECT_NE(output.find("got-second"), std::string::npos) << output;
  EXPECT_TRUE(processRuns(*daemon_, id, "700"));
  open.clear();
  bool gone = false;
  for (auto until = Clock::now() + seconds(10); !gone && Clock::now() < until;
       std::this_thread::sleep_for(milliseconds(200))) {
    gone = !processRuns(*daemon_, id, "700") && !processRuns(*daemon_, id, "708");
  }
  EXPECT_TRUE(gone) << "the processes of closed terminals still run";
}

TEST_F(SpacedTest, SpacectlCommandsAgainstTheDaemonFoundThroughItsDataDir) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  ::unsetenv("SPACE_API");
  ::unsetenv("SPACE_API_KEY");
  ::unsetenv("SPACE_DATA_DIR");
  int calls = 0;
  // Runs spacectl --data-dir <data dir> ARGS; its exit code and its stdout (stderr apart).
  auto spacectl = [&](std::vector<std::string> args, int want_exit = 0) {
    const std::string base = dir_->path() + "/ctl" + std::to_string(++calls);
    args.insert(args.begin(), {SPACECTL_BIN, "--data-dir", data_dir_});
    auto p = ChildProcess::spawn(args, SpawnOptions{base + ".out", base + ".err", true});
    EXPECT_TRUE(p.ok());
    auto status = p->waitFor(seconds(60));
    auto err = readSmallFile(base + ".err", 1 << 16);
    EXPECT_TRUE(status && status->exit_code == want_exit)
        << args[3] << ": exit " << (status ? status->exit_code : -1) << "\n"
        << (err.ok() ? err.value() : "");
    auto text = readSmallFile(base + ".out", 1 << 20);
    return text.ok() ? text.value() : std::string();
  };
  auto firstLine = [](const std::string& s) { return s.substr(0, s.find('\n')); };

  const std::string id = firstLine(spacectl({"create", "--cpus", "1", "--memory", "256", "--metadata", "task=cli"}));
  ASSERT_EQ(id.substr(0, 3), "sb_") << id;
  EXPECT_EQ(readSmallFile(dir_->path() + "/ctl1.err", 4096).value(), "") << "a progress line where no terminal is";

  // Completion in bash: commands and options at each level, and the tenant's sandbox ids.
  const std::string script = dir_->path() + "/completion.bash";
  { std::ofstream(script) << spacectl({"completion", "bash"}); }
  int completions = 0;
  auto complete = [&](const std::string& words) {
    const std::string out = dir_->path() + "/completed" + std::to_string(++completions) + ".txt";
    auto bash = ChildProcess::spawn(
        {"/bin/bash", "-c",
         "source " + script + "; COMP_WORDS=(" + words + "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _spacectl; " +
             "printf '%s\\n' \"${COMPREPLY[@]}\""},
        SpawnOptions{out, dir_->path() + "/completed.err", true});
    EXPECT_TRUE(bash.ok());
    auto status = bash->waitFor(seconds(30));
    EXPECT_TRUE(status && status->exit_code == 0);
    auto text = readSmallFile(out, 1 << 16);
    return text.ok() ? text.value() : std::string();
  };
  EXPECT_EQ(complete(std::string(SPACECTL_BIN) + " sh"), "shell\n");
  EXPECT_EQ(complete(std::string(SPACECTL_BIN) + " snapshot cr"), "create\n");
  EXPECT_EQ(complete(std::string(SPACECTL_BIN) + " exec --tt"), "--tty\n");
  EXPECT_EQ(complete(std::string(SPACECTL_BIN) + " --data-dir " + data_dir_ + " exec sb_"), id + "\n");
  json listed = json::parse(spacectl({"ls", "--json", "--metadata", "task=cli"}), nullptr, false);
  ASSERT_EQ(listed["sandboxes"].size(), 1u) << listed;
  EXPECT_EQ(listed["sandboxes"][0]["id"], id);
  EXPECT_EQ(json::parse(spacectl({"ls", "--json", "--metadata", "task=other"}))["sandboxes"].size(), 0u);
  json got = json::parse(spacectl({"get", id, "--json"}), nullptr, false);
  EXPECT_EQ(got["state"], "running");
  EXPECT_EQ(got["metadata"]["task"], "cli");
  EXPECT_NE(spacectl({"get", id}).find(id), std::string::npos);
  spacectl({"get", "sb_00000000000000000000000000", "--json"}, 1);

  // cp both ways, through a file and through stdout.
  const std::string local = dir_->path() + "/in.txt", back = dir_->path() + "/back.txt";
  { std::ofstream(local) << "bytes from the host\n"; }
  spacectl({"cp", local, id + ":/home/user/in.txt"});
  spacectl({"cp", id + ":/home/user/in.txt", back});
  EXPECT_EQ(readSmallFile(back, 4096).value(), "bytes from the host\n");
  EXPECT_EQ(spacectl({"cp", id + ":/home/user/in.txt", "-"}), "bytes from the host\n");
  EXPECT_EQ(spacectl({"exec", id, "--", "cat /home/user/in.txt"}), "bytes from the host\n");
  spacectl({"cp", id + ":/home/user/missing.txt", back}, 1);

  // timeout: expires_at moves to about now + 900 s.
  spacectl({"timeout", id, "900"});
  EXPECT_NEAR(secondsUntil(json::parse(spacectl({"get", id, "--json"})).value("expires_at", "")), 900, 10);

  // logs: the console, with what the guest wrote to it.
  execJson(*daemon_, id, json{{"command", "echo cli-console-marker > /dev/console"}, {"user", "root"}});
  EXPECT_NE(spacectl({"logs", id}).find("cli-console-marker"), std::string::npos);

  // ps lists a process started in the background; pause, suspend and resume change the state.
  spacectl({"exec", id, "--", "true"});
  {
    auto client = http::Client::create(daemon_->url());
    ASSERT_TRUE(client.ok());
    (void)client->requestStreaming(
        "POST", "/v1/sandboxes/" + id + "/exec", {{"Authorization", "Bearer " + daemon_->key()}},
        json{{"argv", {"sleep", "301"}}, {"stream", true}}.dump(),
        [](const http::ClientResponse&) { return okStatus(); },
        [](std::string_view) -> Status { return makeError(ErrorCode::kCanceled, "detach"); });
  }
  const std::string ps = spacectl({"ps", id});
  EXPECT_NE(ps.find("sleep 301"), std::string::npos) << ps;
  EXPECT_EQ(json::parse(spacectl({"ps", id, "--json"}))["processes"].size(), 1u);
  spacectl({"pause", id});
  EXPECT_EQ(json::parse(spacectl({"get", id, "--json"}))["state"], "paused");
  spacectl({"resume", id});
  EXPECT_EQ(json::parse(spacectl({"get", id, "--json"}))["state"], "running");
  // On a terminal (script(1) gives it one) a long operation draws a progress line on stderr,
  // erased before the answer.
  const std::string typescript = dir_->path() + "/suspend.typescript";
  ASSERT_EQ(runCommand({"script", "-qec",
                        "env TERM=xterm " + std::string(SPACECTL_BIN) + " --data-dir " + data_dir_ + " suspend " + id,
                        typescript},
                       dir_->path() + "/script.out"),
            0);
  const std::string drawn = readSmallFile(typescript, 1 << 20).value();
  const size_t line = drawn.find("| suspending " + id + "... 0.");
  EXPECT_NE(line, std::string::npos) << drawn;
  EXPECT_NE(drawn.find("\r\x1b[K" + id + " suspended", line), std::string::npos) << drawn;
  EXPECT_EQ(json::parse(spacectl({"get", id, "--json"}))["state"], "suspended");
  spacectl({"resume", id});
  EXPECT_EQ(json::parse(spacectl({"get", id, "--json"}))["state"], "running");
  EXPECT_NE(spacectl({"ps", id}).find("sleep 301"), std::string::npos) << "the process lived through it";

  // create --snapshot: a new sandbox from a snapshot of this one, with its files.
  const std::string snap = firstLine(spacectl({"snapshot", "create", id}));
  ASSERT_EQ(snap.substr(0, 5), "snap_") << snap;
  const std::string child = firstLine(spacectl({"create", "--snapshot", snap}));
  ASSERT_EQ(child.substr(0, 3), "sb_") << child;
  EXPECT_EQ(spacectl({"exec", child, "--", "cat /home/user/in.txt"}), "bytes from the host\n");

  spacectl({"rm", id, child});
  spacectl({"snapshot", "rm", snap});
  EXPECT_EQ(json::parse(spacectl({"get", id, "--json"}))["state"], "deleted");
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  // Without the data dir's files, spacectl fails and says where it looked.
  const std::string nowhere_out = dir_->path() + "/nowhere.out";
  EXPECT_EQ(runCommand({SPACECTL_BIN, "--data-dir", dir_->path() + "/nowhere", "ls"}, nowhere_out), 1);
  EXPECT_NE(readSmallFile(nowhere_out, 1 << 16).value().find("/nowhere"), std::string::npos)
      << readSmallFile(nowhere_out, 1 << 16).value();
}

// A sandbox whose VM cannot boot (here: its kernel is not a kernel) is recorded failed, with
// the reason, and leaves no QEMU and no run directory.
TEST_F(SpacedTest, AVmThatCannotBootLeavesAFailedSandbox) {
  const std::string bogus = dir_->path() + "/not-a-kernel";
  { std::ofstream(bogus) << "this is not an ELF kernel\n"; }
  std::filesystem::create_directories(data_dir_);
  std::vector<std::string> argv = {SPACED_BIN,    "--listen", "127.0.0.1:0",
                                   "--data-dir",  data_dir_,  "--kernel",
                                   bogus,         "--rootfs", kImages + "/rootfs.ext4",
                                   "--warm-pool", "0",        "--on-shutdown",
                                   "stop"};
  for (const std::string& arg : isolatedNetworkArgs()) argv.push_back(arg);
  auto p = ChildProcess::spawn(argv, SpawnOptions{data_dir_ + ".log", "", true});
  ASSERT_TRUE(p.ok());
  std::string url;
  for (auto until = Clock::now() + seconds(30); Clock::now() < until && url.empty();) {
    if (auto endpoint = readSmallFile(data_dir_ + "/spaced.json", 4096); endpoint.ok()) {
      url = json::parse(endpoint.value())["url"].get<std::string>();
    } else {
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  ASSERT_FALSE(url.empty()) << readFileTail(data_dir_ + ".log", 4096).value();
  const std::string key = readSmallFile(data_dir_ + "/api-key", 4096).value().substr(0, 64);
  auto client = http::Client::create(url);
  ASSERT_TRUE(client.ok());
  const std::map<std::string, std::string> auth{{"Authorization", "Bearer " + key.substr(0, key.find('\n'))},
                                                {"Content-Type", "application/json"}};
  auto r = client->request("POST", "/v1/sandboxes", auth, json{{"cpus", 1}, {"memory_mb", 256}}.dump(), seconds(60));
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->status, 500) << r->body;
  auto failed = client->request("GET", "/v1/sandboxes?state=failed", auth, "", seconds(10));
  ASSERT_TRUE(failed.ok());
  json list = json::parse(failed->body);
  ASSERT_EQ(list["sandboxes"].size(), 1u) << failed->body;
  EXPECT_FALSE(list["sandboxes"][0].value("state_reason", "").empty()) << list;
  const std::string id = list["sandboxes"][0]["id"];
  EXPECT_FALSE(std::filesystem::exists(sandboxDir(id)));
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  ::kill(p->pid(), SIGTERM);
  auto stopped = p->waitFor(seconds(30));
  EXPECT_TRUE(stopped && stopped->exit_code == 0);
}

// space-vm run: the command's exit code and output, --json, and usage errors (exit 2).
TEST_F(SpacedTest, SpaceVmRunOptionsAndExitCodes) {
  const std::string out = dir_->path() + "/space-vm.out";
  const std::vector<std::string> base = {
      SPACE_VM_BIN, "run",      "--kernel", kImages + "/vmlinux", "--rootfs",  kImages + "/rootfs.ext4", "--cpus",
      "1",          "--memory", "256",      "--run-dir",          dir_->path()};
  auto with = [&](std::vector<std::string> extra) {
    auto argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  EXPECT_EQ(runCommand(with({"--", "echo hello; exit 7"}), out), 7);
  EXPECT_NE(readSmallFile(out, 1 << 16).value().find("hello"), std::string::npos);
  EXPECT_EQ(runCommand(with({"--json", "--", "echo out; echo err >&2; exit 3"}), out), 3);
  auto text = readSmallFile(out, 1 << 16).value();
  json j = json::parse(text.substr(text.find('{')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << text;
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["stdout"], "out\n");
  EXPECT_EQ(j["stderr"], "err\n");
  EXPECT_EQ(runCommand({SPACE_VM_BIN, "run", "--kernel", kImages + "/vmlinux", "--rootfs", kImages + "/rootfs.ext4",
                        "--memory", "64", "--run-dir", dir_->path(), "--", "true"},
                       out),
            2)
      << "below the 128 MiB minimum: " << readSmallFile(out, 1 << 16).value();
  EXPECT_EQ(runCommand({SPACE_VM_BIN, "run", "--bogus-flag", "--", "true"}, out), 2);
  EXPECT_EQ(runCommand(with({"--memory", "512", "--", "true"}), out), 2) << "an option given twice";
  EXPECT_EQ(runCommand({SPACE_VM_BIN, "--help"}, out), 0);
  EXPECT_NE(readSmallFile(out, 1 << 16).value().find("run"), std::string::npos);
  EXPECT_TRUE(qemuProcessesUnder(dir_->path()).empty());
}

// spacectl's snapshot and branch commands against the real daemon: ids on stdout for scripts.
TEST_F(SpacedTest, SpacectlSnapshotsAndBranches) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  setenv("SPACE_API", daemon_->url().c_str(), 1);
  setenv("SPACE_API_KEY", daemon_->key().c_str(), 1);
  int calls = 0;
  auto spacectl = [&](std::vector<std::string> args) {
    const std::string out = dir_->path() + "/spacectl" + std::to_string(++calls) + ".out";
    args.insert(args.begin(), SPACECTL_BIN);
    auto p = ChildProcess::spawn(args, SpawnOptions{out, out, true});
    EXPECT_TRUE(p.ok());
    auto status = p->waitFor(seconds(120));
    EXPECT_TRUE(status && status->exit_code == 0) << readSmallFile(out, 1 << 20).value();
    auto text = readSmallFile(out, 1 << 20);
    return text.ok() ? text.value() : std::string();
  };
  std::string id = spacectl({"create", "--cpus", "1", "--memory", "256"});
  id = id.substr(0, id.find('\n'));
  ASSERT_EQ(id.substr(0, 3), "sb_");
  spacectl({"exec", id, "--", "echo from-parent > /home/user/p.txt"});
  std::string snap = spacectl({"snapshot", "create", id, "--name", "cli"});
  snap = snap.substr(0, snap.find('\n'));
  ASSERT_EQ(snap.substr(0, 5), "snap_") << snap;
  EXPECT_NE(spacectl({"snapshot", "ls"}).find(snap), std::string::npos);
  json listed = json::parse(spacectl({"snapshot", "ls", "--json"}), nullptr, false);
  ASSERT_FALSE(listed.is_discarded());
  EXPECT_EQ(listed["snapshots"][0]["name"], "cli");
  std::string children = spacectl({"branch", snap, "-n", "2"});
  std::vector<std::string> ids;
  for (size_t at = 0; at < children.size();) {
    size_t nl = children.find('\n', at);
    ids.push_back(children.substr(at, nl - at));
    at = nl == std::string::npos ? children.size() : nl + 1;
  }
  ASSERT_EQ(ids.size(), 2u) << children;
  for (const auto& child : ids) {
    EXPECT_EQ(spacectl({"exec", child, "--", "cat /home/user/p.txt"}), "from-parent\n");
  }
  spacectl({"snapshot", "rm", snap});
  spacectl({"rm", id, ids[0], ids[1]});
  EXPECT_TRUE(qemuProcessesUnder(data_dir_).empty());
  unsetenv("SPACE_API");
  unsetenv("SPACE_API_KEY");
}

// Hostile API clients against the real daemon (issue 15, item 2): what they send cannot grow
// spaced's memory or lock out other requests and tenants. No VM is needed: all of it happens
// before a sandbox would be touched.
uint16_t portOf(const std::string& url) { return static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))); }

TEST_F(SpacedTest, HostileClientsNeitherGrowTheDaemonNorLockOthersOut) {
  // The tenant may run 8 requests: the 8 concurrent bodies below all run, and 8 held requests
  // then fill its share.
  constexpr int kPerTenant = 8;
  daemon_ = Daemon::start(data_dir_, {"--max-requests-per-tenant", std::to_string(kPerTenant)});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const uint16_t port = portOf(d.url());
  const std::string auth = "Authorization: Bearer " + d.key() + "\r\n";

  // 1 GB of trailer: the connection is closed long before, and spaced's memory barely moves.
  testsupport::resetPeakResident(d.pid());
  size_t before = testsupport::peakResidentBytes(d.pid());
  auto [sent, answer] = testsupport::flood(
      port, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n",
      "X-Trailer: " + std::string(64 * 1024, 'a') + "\r\n", size_t{1} << 30);
  EXPECT_LT(sent, size_t{1} << 30);
  EXPECT_LT(testsupport::peakGrowth(before, d.pid()), size_t{64} << 20);

  // Eight concurrent 16 MiB bodies of nested arrays (chunked: no length to refuse them by): 400
  // each, refused from their first bytes.
  testsupport::resetPeakResident(d.pid());
  before = testsupport::peakResidentBytes(d.pid());
  std::vector<std::future<testsupport::Flood>> nested;
  for (int i = 0; i < 8; ++i) {
    nested.push_back(std::async(std::launch::async, [&] {
      return testsupport::flood(
          port, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n1000000\r\n",
          std::string(64 * 1024, '['), 16 << 20);
    }));
  }
  for (auto& f : nested) {
    std::string text = f.get().answer;
    EXPECT_NE(text.find("HTTP/1.1 400"), std::string::npos) << text.substr(0, 300);
    EXPECT_NE(text.find("nests deeper than 32 levels"), std::string::npos) << text.substr(0, 300);
  }
  EXPECT_LT(testsupport::peakGrowth(before, d.pid()), size_t{100} << 20);

  // Answers without a tenant's ticket close the connection: nobody keeps a thread busy with a
  // stream of cheap requests read slowly.
  {
    auto [sent_health, health] = testsupport::flood(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "", 0);
    EXPECT_NE(health.find("HTTP/1.1 200"), std::string::npos) << health;
    EXPECT_NE(health.find("Connection: close"), std::string::npos) << health;
  }

  // 256 idle sockets from this client do not lock out a valid request from it.
  {
    std::vector<UniqueFd> idle;
    for (int i = 0; i < 256; ++i) idle.push_back(testsupport::connectRaw(port, seconds(20)));
    EXPECT_EQ(d.call("GET", "/v1/sandboxes").status, 200);
  }

  // A tenant at its limit of running requests gets 429 with Retry-After; another tenant does
  // not notice. Creates whose bodies never arrive are running requests: each one's
  // "100 Continue" says its handler runs (and holds its place) before the test goes on.
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  std::vector<UniqueFd> stalled;
  for (int i = 0; i < kPerTenant; ++i) {
    stalled.push_back(testsupport::connectRaw(port, seconds(20)));
    std::string head =
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n" + auth + "Expect: 100-continue\r\nContent-Length: 100\r\n\r\n";
    ASSERT_GT(send(stalled.back().get(), head.data(), head.size(), MSG_NOSIGNAL), 0);
    char buf[256];
    ssize_t n = recv(stalled.back().get(), buf, sizeof buf, 0);  // SO_RCVTIMEO: 20 s
    ASSERT_GT(n, 0) << "the daemon did not start request " << i;
    ASSERT_TRUE(std::string(buf, static_cast<size_t>(n)).starts_with("HTTP/1.1 100"))
        << std::string(buf, static_cast<size_t>(n));
    ASSERT_GT(send(stalled.back().get(), "{", 1, MSG_NOSIGNAL), 0);
  }
  http::ClientResponse refused;
  for (auto until = Clock::now() + seconds(10); Clock::now() < until; std::this_thread::sleep_for(milliseconds(50))) {
    refused = d.call("GET", "/v1/sandboxes");
    if (refused.status == 429) break;
  }
  EXPECT_EQ(refused.status, 429) << refused.body;
  EXPECT_EQ(refused.headers["retry-after"], "1");
  EXPECT_EQ(json::parse(refused.body)["error"]["code"], "too_many_requests");
  EXPECT_EQ(d.call("GET", "/v1/sandboxes", "", bob).status, 200);
  stalled.clear();  // their requests end; the tenant is served again
  http::ClientResponse served;
  for (auto until = Clock::now() + seconds(10); Clock::now() < until; std::this_thread::sleep_for(milliseconds(50))) {
    served = d.call("GET", "/v1/sandboxes");
    if (served.status == 200) break;
  }
  EXPECT_EQ(served.status, 200) << served.body;
}

// Keys stay off the command line, key files stay private, the plaintext API stays on loopback,
// and node-wide figures are the operator's.
TEST_F(SpacedTest, SecretsStayOffTheCommandLineAndNodeFiguresAreTheOperators) {
  auto refused = [&](std::vector<std::string> args, const std::string& needle) {
    const std::string out = dir_->path() + "/refused.log";
    args.insert(args.begin(), {SPACED_BIN, "--data-dir", data_dir_});
    auto p = ChildProcess::spawn(args, SpawnOptions{out, "", true});
    ASSERT_TRUE(p.ok());
    auto status = p->waitFor(seconds(30));
    ASSERT_TRUE(status);
    EXPECT_EQ(status->exit_code, 2);
    auto text = readSmallFile(out, 64 * 1024);
    const std::string said = text.ok() ? text.value() : "";
    EXPECT_NE(said.find(needle), std::string::npos) << said;
  };
  refused({"--api-key", "sk_0123456789abcdef0123"}, "--api-key-file");
  refused({"--listen", "0.0.0.0:0"}, "--tls-cert");
  refused({"--listen", "0.0.0.0:0"}, "--allow-plaintext-remote");

  // The key comes from a file; the kept copy, made world-readable meanwhile, is made private.
  const std::string key_file = dir_->path() + "/operator.key";
  { std::ofstream(key_file) << "sk_operatorkeyfromafile0123\n"; }
  daemon_ = Daemon::start(data_dir_, {"--api-key-file", key_file});
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->key(), "sk_operatorkeyfromafile0123");
  EXPECT_EQ(daemon_->call("GET", "/metrics").status, 200);
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  auto denied = daemon_->call("GET", "/metrics", "", bob);
  EXPECT_EQ(denied.status, 403);
  EXPECT_EQ(json::parse(denied.body)["error"]["code"], "permission_denied");
  daemon_.reset();
  ::chmod((data_dir_ + "/api-key").c_str(), 0644);
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  struct stat st {};
  ASSERT_EQ(::stat((data_dir_ + "/api-key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(daemon_->key(), "sk_operatorkeyfromafile0123");

  // Or from SPACE_API_KEY, which replaces it, and which spaced takes out of the environment its
  // QEMUs inherit.
  daemon_.reset();
  ::setenv("SPACE_API_KEY", "sk_operatorkeyfromtheenv0123", 1);
  daemon_ = Daemon::start(data_dir_);
  ::unsetenv("SPACE_API_KEY");
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->key(), "sk_operatorkeyfromtheenv0123");
  EXPECT_EQ(daemon_->call("GET", "/metrics").status, 200);
  EXPECT_EQ(daemon_->call("GET", "/metrics", "", "sk_operatorkeyfromafile0123").status, 401);
  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  auto qemu = qemuProcessesUnder(sandboxDir(id));
  ASSERT_EQ(qemu.size(), 1u);
  auto environment = readSmallFile("/proc/" + std::to_string(qemu[0]) + "/environ", 1 << 20);
  ASSERT_TRUE(environment.ok());
  EXPECT_EQ(environment->find("sk_operatorkeyfromtheenv0123"), std::string::npos);
  EXPECT_EQ(environment->find("SPACE_API_KEY"), std::string::npos);
}

// With --tls-cert, every listener speaks HTTPS only: the API (a command's output, a stream),
// spacectl through the data dir (it trusts the certificate spaced names there), the E2B front
// ends; nothing in clear. A key that does not match its certificate stops spaced at start.
TEST_F(SpacedTest, WithACertificateEveryListenerServesHttpsOnly) {
  const std::string cert = dir_->path() + "/node.crt", key = dir_->path() + "/node.key";
  const std::string make =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "
      "/CN=space-test -addext subjectAltName=IP:127.0.0.1 -keyout " +
      key + " -out " + cert + " 2>/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0);
  ::chmod(key.c_str(), 0600);
  daemon_ = Daemon::start(data_dir_, {"--tls-cert", cert, "--tls-key", key});
  ASSERT_TRUE(daemon_);
  ASSERT_EQ(daemon_->url().rfind("https://127.0.0.1:", 0), 0u) << daemon_->url();
  auto written = json::parse(readSmallFile(data_dir_ + "/spaced.json", 4096).value());
  EXPECT_EQ(written.value("e2b_api_url", "").rfind("https://", 0), 0u) << written;
  EXPECT_EQ(written.value("e2b_sandbox_url", "").rfind("https://", 0), 0u) << written;

  const std::string id = daemon_->create();
  ASSERT_FALSE(id.empty());
  json ran = execJson(*daemon_, id, json{{"command", "head -c 2000000 /dev/zero | base64 | wc -c; echo done"}});
  EXPECT_EQ(ran.value("stdout", ""), "2701756\ndone\n") << ran;
  // spacectl finds the url and the certificate in spaced.json.
  const std::string out = dir_->path() + "/spacectl.out";
  auto spacectl = ChildProcess::spawn({SPACECTL_BIN, "--data-dir", data_dir_, "exec", id, "--", "echo", "via spacectl"},
                                      SpawnOptions{out, "", true});
  ASSERT_TRUE(spacectl.ok());
  auto done = spacectl->waitFor(seconds(60));
  ASSERT_TRUE(done);
  EXPECT_EQ(done->exit_code, 0) << readSmallFile(out, 65536).value();
  EXPECT_NE(readSmallFile(out, 65536).value().find("via spacectl"), std::string::npos);
  // The E2B control plane over TLS, and nothing in clear on any port.
  auto e2b = http::Client::create(written.value("e2b_api_url", ""), cert);
  ASSERT_TRUE(e2b.ok());
  auto listed = e2b->request("GET", "/sandboxes", {{"X-API-Key", daemon_->key()}});
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  EXPECT_EQ(listed->status, 200) << listed->body;
  for (const std::string& url :
       {daemon_->url(), written.value("e2b_api_url", ""), written.value("e2b_sandbox_url", "")}) {
    auto plain = http::Client::create("http://" + url.substr(8));
    ASSERT_TRUE(plain.ok());
    auto answer = plain->request("GET", "/healthz", {}, {}, seconds(5));
    EXPECT_FALSE(answer.ok() && answer->status != 0) << url << " answered in clear";
  }
  daemon_->callJson("DELETE", "/v1/sandboxes/" + id, nullptr, 204);
  daemon_.reset();

  const std::string other_key = dir_->path() + "/other.key";
  ASSERT_EQ(
      std::system(("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out " + other_key + " 2>/dev/null")
                      .c_str()),
      0);
  const std::string log = dir_->path() + "/mismatch.log";
  auto mismatch = ChildProcess::spawn({SPACED_BIN, "--data-dir", data_dir_, "--tls-cert", cert, "--tls-key", other_key},
                                      SpawnOptions{log, "", true});
  ASSERT_TRUE(mismatch.ok());
  auto status = mismatch->waitFor(seconds(30));
  ASSERT_TRUE(status);
  EXPECT_EQ(status->exit_code, 2);
  EXPECT_NE(readSmallFile(log, 65536).value().find("does not belong to the certificate"), std::string::npos)
      << readSmallFile(log, 65536).value();
}

// A tenant's secrets go in and never come out: not in an answer, the daemon's log, or the
// state database; the sealed copies need the node's key file, and spacectl reads values only
// from stdin or a file.
TEST_F(SpacedTest, SecretsAreSealedPerTenantAndNeverShown) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  struct stat st {};
  ASSERT_EQ(::stat((data_dir_ + "/secret-key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string v1 = "ghp_FirstValueOfTheToken0123456789";
  const std::string v2 = "ghp_SecondValueOfTheToken987654321";
  std::vector<std::string> answers;
  auto call = [&](const std::string& method, const std::string& target, const json& body, int want,
                  const std::string& key = "\x01") {
    auto r = daemon_->call(method, target, body.is_null() ? "" : body.dump(), key);
    EXPECT_EQ(r.status, want) << method << " " << target << ": " << r.body;
    answers.push_back(r.body);
    return r.body.empty() ? json() : json::parse(r.body, nullptr, false);
  };
  json created = call("POST", "/v1/secrets", json{{"name", "gh"}, {"value", v1}}, 201);
  EXPECT_EQ(created["name"], "gh");
  EXPECT_EQ(created["version"], 1);
  EXPECT_FALSE(created.contains("value"));
  // POST never overwrites; PUT rotates.
  EXPECT_EQ(call("POST", "/v1/secrets", json{{"name", "gh"}, {"value", v2}}, 409)["error"]["code"], "already_exists");
  json rotated = call("PUT", "/v1/secrets/gh", json{{"value", v2}}, 200);
  EXPECT_EQ(rotated["version"], 2);
  EXPECT_EQ(call("GET", "/v1/secrets/gh", nullptr, 200)["version"], 2);
  // Bad input: a clear 400, and nothing changes.
  call("PUT", "/v1/secrets/gh", json{{"value", "two\nlines"}}, 400);
  call("PUT", "/v1/secrets/gh", json{{"value", v1}, {"extra", 1}}, 400);
  call("PUT", "/v1/secrets/gh", json{{"value", 42}}, 400);
  call("PUT", "/v1/secrets/gh", json{{"value", std::string(16 * 1024 + 1, 'x')}}, 400);
  call("PUT", "/v1/secrets/bad%20name", json{{"value", v1}}, 400);
  call("POST", "/v1/secrets", json{{"value", v1}}, 400);
  auto malformed = daemon_->call("PUT", "/v1/secrets/gh", "{\"value\": \"" + v1);
  EXPECT_EQ(malformed.status, 400) << malformed.body;
  EXPECT_EQ(call("GET", "/v1/secrets/gh", nullptr, 200)["version"], 2);
  call("GET", "/v1/secrets/nope", nullptr, 404);
  call("DELETE", "/v1/secrets/nope", nullptr, 404);

  // Another tenant neither sees nor touches them, and has its own namespace of names.
  const std::string bob = addTenant("bob");
  ASSERT_FALSE(bob.empty());
  EXPECT_EQ(call("GET", "/v1/secrets", nullptr, 200, bob)["secrets"].size(), 0u);
  call("GET", "/v1/secrets/gh", nullptr, 404, bob);
  call("DELETE", "/v1/secrets/gh", nullptr, 404, bob);
  EXPECT_EQ(call("PUT", "/v1/secrets/gh", json{{"value", "bobs-own-value"}}, 201, bob)["version"], 1);
  EXPECT_EQ(call("GET", "/v1/secrets/gh", nullptr, 200)["version"], 2);

  // spacectl: the value from a pipe or a file, one trailing newline dropped.
  int calls = 0;
  auto spacectl = [&](std::vector<std::string> args, const std::string& stdin_text, int want_exit = 0) {
    const std::string base = dir_->path() + "/ctl" + std::to_string(++calls);
    { std::ofstream(base + ".in") << stdin_text; }
    int in = ::open((base + ".in").c_str(), O_RDONLY | O_CLOEXEC);
    args.insert(args.begin(), {SPACECTL_BIN, "--data-dir", data_dir_});
    SpawnOptions options{base + ".out", base + ".err", true};
    options.pass_fds = {{in, 0}};
    auto p = ChildProcess::spawn(args, options);
    ::close(in);
    EXPECT_TRUE(p.ok());
    auto status = p->waitFor(seconds(30));
    auto err = readSmallFile(base + ".err", 1 << 16);
    EXPECT_TRUE(status && status->exit_code == want_exit)
        << args[3] << ": exit " << (status ? status->exit_code : -1) << "\n"
        << (err.ok() ? err.value() : "");
    auto out = readSmallFile(base + ".out", 1 << 20);
    answers.push_back(out.ok() ? out.value() : "");
    answers.push_back(err.ok() ? err.value() : "");
    return out.ok() ? out.value() : std::string();
  };
  EXPECT_EQ(spacectl({"secret", "set", "model"}, "sk-model-value-from-a-pipe\n"), "created model (version 1)\n");
  const std::string key_file = dir_->path() + "/model.key";
  { std::ofstream(key_file) << "sk-model-value-from-a-file\n"; }
  EXPECT_EQ(spacectl({"secret", "set", "model", "--from-file", key_file}, ""), "rotated model (version 2)\n");
  spacectl({"secret", "set", "empty"}, "", 1);
  json listed = json::parse(spacectl({"secret", "ls", "--json"}, ""), nullptr, false);
  ASSERT_EQ(listed["secrets"].size(), 2u) << listed;
  EXPECT_EQ(listed["secrets"][0]["name"], "gh");
  EXPECT_EQ(listed["secrets"][1]["name"], "model");
  EXPECT_NE(spacectl({"secret", "ls"}, "").find("model"), std::string::npos);
  EXPECT_EQ(spacectl({"secret", "rm", "model"}, ""), "model\n");
  spacectl({"secret", "rm", "model"}, "", 1);

  // A tenant removed and added again under the same name starts with no secrets.
  {
    const std::string out = dir_->path() + "/tenant-rm.log";
    auto rm =
        ChildProcess::spawn({SPACED_BIN, "tenant", "rm", "bob", "--data-dir", data_dir_}, SpawnOptions{out, "", true});
    ASSERT_TRUE(rm.ok());
    auto removed = rm->waitFor(seconds(30));
    auto said = readSmallFile(out, 4096);
    ASSERT_TRUE(removed && removed->exit_code == 0 && said.ok());
    EXPECT_NE(said->find("1 secret(s)"), std::string::npos) << said.value();
  }
  const std::string bob_again = addTenant("bob");
  ASSERT_FALSE(bob_again.empty());
  EXPECT_EQ(call("GET", "/v1/secrets", nullptr, 200, bob_again)["secrets"].size(), 0u);

  // Kept across a restart, under the same key.
  daemon_.reset();
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(call("GET", "/v1/secrets/gh", nullptr, 200)["version"], 2);
  EXPECT_EQ(call("DELETE", "/v1/secrets/gh", nullptr, 204), json());
  call("GET", "/v1/secrets/gh", nullptr, 404);
  daemon_.reset();

  // Nowhere in clear: the answers, spacectl's output, the daemon's log, the database.
  std::string everything;
  for (const auto& a : answers) everything += a;
  for (const std::string& file : {logPath(), data_dir_ + "/state.db", data_dir_ + "/state.db-wal"}) {
    auto bytes = readSmallFile(file, 64 << 20);
    if (bytes.ok()) everything += bytes.value();
  }
  EXPECT_NE(everything.find("created secret gh (version 1)"), std::string::npos) << "the log was not read";
  for (const std::string& secret : {v1, v2, std::string("bobs-own-value"), std::string("sk-model-value-from")}) {
    EXPECT_EQ(everything.find(secret), std::string::npos) << secret;
  }
}

}  // namespace

// --- network: every sandbox behind its own gateway, against a fake internet -------------------
// The gateways' upstream side runs in the fake internet's namespace, which routes nowhere else.

class SpacedNetworkTest : public SpacedTest {
 protected:
  void SetUp() override {
    SpacedTest::SetUp();
    auto net = testsupport::FakeInternet::start("spnet" + std::to_string(::getpid()));
    ASSERT_TRUE(net.ok()) << net.error().message;
    internet_ = std::move(net.value());
  }
  void TearDown() override {
    SpacedTest::TearDown();
    internet_.reset();
  }
  // A small sandbox whose policy allows allowed.test alone.
  inline static const json kAllowedTestOnly{
      {"cpus", 1}, {"memory_mb", 256}, {"network", {{"egress", "policy"}, {"allow", {"allowed.test"}}}}};
  // Its gateway's pid, as attachment.json records it (-1: none recorded).
  int gatewayPidOf(const std::string& id) const {
    auto attachment = readSmallFile(data_dir_ + "/network/" + id + "/attachment.json", 4096);
    return attachment.ok() ? json::parse(attachment.value()).value("gateway_pid", -1) : -1;
  }
  // The control group the gateway `pid` runs in, as /proc/PID/cgroup names it (the memory
  // hierarchy's on cgroup v1), when it is one of this daemon's gateway groups in every
  // hierarchy spaced limits it in (memory, pids and cpu on v1); else empty.
  std::string gatewayGroupOf(int pid) const {
    auto text = readSmallFile("/proc/" + std::to_string(pid) + "/cgroup", 1 << 16);
    if (!text.ok()) return "";
    const std::string ours = "/gateways/space-" + sha256Hex(data_dir_).substr(0, 8) + "-";
    std::map<std::string, std::string> paths;  // controller ("" for v2's unified line) -> path
    std::istringstream lines(text.value());
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find(':');
      const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      std::istringstream controllers(line.substr(a + 1, b - a - 1));
      std::string controller;
      bool any = false;
      while (std::getline(controllers, controller, ',')) {
        paths[controller] = line.substr(b + 1);
        any = true;
      }
      if (!any) paths[""] = line.substr(b + 1);
    }
    const std::vector<std::string> wanted =
        paths.count("memory") != 0 ? std::vector<std::string>{"memory", "pids", "cpu"} : std::vector<std::string>{""};
    for (const std::string& c : wanted) {
      if (paths.count(c) == 0 || paths[c].find(ours) == std::string::npos) return "";
    }
    return paths[wanted.front()];
  }
  std::vector<std::string> networkArgs() const {
    return {"--gateway-upstream-netns", internet_->upstreamNetnsPath(), "--gateway-upstream-dns",
            internet_->dnsServer(),     "--gateway-upstream-ca",        internet_->caPath()};
  }
  // Runs a shell command in the guest; its exit code and output.
  static std::pair<int, std::string> sh(const Daemon& d, const std::string& id, const std::string& command) {
    json r = execJson(d, id, json{{"command", command}, {"timeout_s", 60}});
    return {r.value("exit_code", -1), r.value("stdout", std::string()) + r.value("stderr", std::string())};
  }
  static json auditLog(const Daemon& d, const std::string& id) {
    return d.callJson("GET", "/v1/sandboxes/" + id + "/network/log", json(), 200)["entries"];
  }
  static bool logged(const json& entries, const std::string& field, const std::string& value, bool allowed) {
    for (const auto& e : entries) {
      if (e.value(field, std::string()) == value && e.value("allowed", !allowed) == allowed) return true;
    }
    return false;
  }
  std::unique_ptr<testsupport::FakeInternet> internet_;
};

// A credential rule adds the tenant's secret to the guest's requests on the gateway, for its
// host only, at its pinned address only, with the secret's current value; the guest never holds
// it, and a missing secret is a clear 502, never a request without it.
TEST_F(SpacedNetworkTest, CredentialRulesAddTheSecretOnlyWhereItBelongs) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string first = "ghp_FirstInjectedValue0123456789";
  const std::string second = "ghp_SecondInjectedValue987654321";
  const json rules = {
      {"egress", "policy"},
      {"allow", {"other.test", "allowed.test:9000"}},
      {"credentials",
       {{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}, {"plain_http", true}}}}};
  // A rule naming a secret that does not exist is refused before anything starts.
  json refused = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}, {"network", rules}}, 400);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("no secret named gh"), std::string::npos) << refused;
  d.callJson("PUT", "/v1/secrets/gh", json{{"value", first}}, 201);
  const std::string id = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"network", rules}});
  ASSERT_FALSE(id.empty());
  auto digest = [](const std::string& value) { return sha256Hex("Bearer " + value); };

  // Its host gets it, once, in place of what the guest sent, on a connection told to close.
  auto [rc, out] = sh(d, id, "curl -sS -m 20 -H 'Authorization: Bearer guess' http://allowed.test/auth");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("authorization 1 " + digest(first) + " connection close"), std::string::npos) << out;
  // Another host does not, nor does the rule's name sent to another address (a spoofed Host).
  auto [other_rc, other_out] = sh(d, id, "curl -sS -m 20 http://other.test/auth");
  EXPECT_NE(other_out.find("authorization 0"), std::string::npos) << other_out;
  // A redirect from the rule's host to another is followed without it.
  auto [redirect_rc, redirect_out] = sh(d, id, "curl -sS -L -m 20 http://allowed.test/redirect/other.test/auth");
  EXPECT_NE(redirect_out.find("authorization 0"), std::string::npos) << redirect_out;
  auto [spoof_rc, spoof_out] = sh(d, id, "curl -sS -m 20 -H 'Host: allowed.test' http://other.test/auth");
  EXPECT_NE(spoof_rc, 0) << spoof_out;
  EXPECT_EQ(spoof_out.find("authorization 1"), std::string::npos) << spoof_out;

  // Nor another port of the rule's host (an echo service there would hand it back), nor a
  // method a server answers by reflecting the request.
  auto [echo_rc, echo_out] = sh(d, id,
                                // Everything the echo sends back within a quiet second, not only its first segment.
                                "python3 - <<'EOF'\n"
                                "import socket\n"
                                "s = socket.create_connection(('allowed.test', 9000), 10)\n"
                                "s.sendall(b'GET /auth HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n')\n"
                                "got = b''\n"
                                "try:\n"
                                "    while True:\n"
                                "        part = s.recv(4096)\n"
                                "        if not part: break\n"
                                "        got += part; s.settimeout(1)\n"
                                "except OSError:\n"
                                "    pass\n"
                                "print(got)\n"
                                "EOF");
  EXPECT_NE(echo_out.find("Host: allowed.test"), std::string::npos) << echo_out;
  EXPECT_EQ(echo_out.find("Bearer"), std::string::npos) << echo_out;
  auto [trace_rc, trace_out] = sh(d, id, "curl -sS -m 20 -X TRACE -w ' status %{http_code}' http://allowed.test/auth");
  EXPECT_NE(trace_out.find("status 502"), std::string::npos) << trace_out;
  EXPECT_NE(trace_out.find("method TRACE"), std::string::npos) << trace_out;

  // A rotation applies to the next request; the guest's environment never held a value.
  d.callJson("PUT", "/v1/secrets/gh", json{{"value", second}}, 200);
  auto [rotated_rc, rotated_out] = sh(d, id, "curl -sS -m 20 http://allowed.test/auth; env; cat /proc/1/environ");
  EXPECT_NE(rotated_out.find("authorization 1 " + digest(second)), std::string::npos) << rotated_out;
  EXPECT_EQ(rotated_out.find(second), std::string::npos);

  // Without plain_http the rule sends nothing over plain HTTP.
  json strict = rules;
  strict["credentials"][0]["plain_http"] = false;
  d.callJson("PUT", "/v1/sandboxes/" + id + "/network", strict, 200);
  auto [strict_rc, strict_out] = sh(d, id, "curl -sS -m 20 http://allowed.test/auth");
  EXPECT_NE(strict_out.find("authorization 0"), std::string::npos) << strict_out;
  // Back through spacectl, whose --credential makes the same rule.
  {
    const std::string out = dir_->path() + "/net-set.out";
    auto set = ChildProcess::spawn({SPACECTL_BIN, "--data-dir", data_dir_, "net", "set", id, "--allow", "other.test",
                                    "--allow", "allowed.test:9000", "--credential",
                                    "allowed.test=Authorization: Bearer {{secret:gh}}", "--credential-plain-http"},
                                   SpawnOptions{out, "", true});
    ASSERT_TRUE(set.ok());
    auto status = set->waitFor(seconds(30));
    auto said = readSmallFile(out, 1 << 16);
    ASSERT_TRUE(status && status->exit_code == 0 && said.ok()) << (said.ok() ? said.value() : "");
    EXPECT_NE(said->find("credential: allowed.test Authorization: Bearer {{secret:gh}}  (also plain HTTP)"),
              std::string::npos)
        << said.value();
  }
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id + "/network", json(), 200)["credentials"],
            net::toJson(net::parsePolicy(rules).value())["credentials"]);

  // A snapshot of it holds no trace of the value, in its memory or anywhere else.
  json snap = d.callJson("POST", "/v1/sandboxes/" + id + "/snapshots", json::object(), 201);
  const std::string snap_id = snap.value("id", "");
  ASSERT_FALSE(snap_id.empty()) << snap;
  size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(data_dir_ + "/snapshots")) {
    if (!entry.is_regular_file()) continue;
    ++files;
    auto bytes = readSmallFile(entry.path().string(), size_t{2} << 30);
    ASSERT_TRUE(bytes.ok()) << entry.path();
    EXPECT_EQ(bytes->find(second), std::string::npos) << entry.path();
    EXPECT_EQ(bytes->find(first), std::string::npos) << entry.path();
  }
  EXPECT_GT(files, 2u);
  // Its children get the rules, and with them the secret's value at request time.
  json children = d.callJson("POST", "/v1/snapshots/" + snap_id + "/branch", json{{"count", 1}}, 201);
  ASSERT_EQ(children["sandboxes"].size(), 1u) << children;
  const std::string child = children["sandboxes"][0].value("id", "");
  d.callJson("PUT", "/v1/secrets/gh", json{{"value", first}}, 200);
  auto [child_rc, child_out] = sh(d, child, "curl -sS -m 20 http://allowed.test/auth");
  EXPECT_NE(child_out.find("authorization 1 " + digest(first)), std::string::npos) << child_out;
  d.callJson("DELETE", "/v1/sandboxes/" + child, json(), 204);

  // Deleted: a clear refusal from the gateway, and nothing reaches the host.
  d.callJson("DELETE", "/v1/secrets/gh", json(), 204);
  auto [gone_rc, gone_out] = sh(d, id, "curl -sS -m 20 -w ' status %{http_code}' http://allowed.test/auth");
  EXPECT_NE(gone_out.find("secret gh"), std::string::npos) << gone_out;
  EXPECT_NE(gone_out.find("status 502"), std::string::npos) << gone_out;
  EXPECT_EQ(gone_out.find("authorization"), std::string::npos) << gone_out;

  // The audit log names the secret, never its value.
  json log = auditLog(d, id);
  EXPECT_TRUE(logged(log, "kind", "credential", true)) << log.dump().substr(0, 2000);
  bool audited = false;
  for (const auto& e : log) {
    if (e.value("kind", "") != "credential") continue;
    audited = audited ||
              (e.value("status", 0) == 200 && e["secrets"] == json{"gh"} && e.value("method", "") == "GET" &&
               e.value("path", "") == "/auth" && e.value("host", "") == "allowed.test" && e.value("bytes_in", 0) > 0);
  }
  EXPECT_TRUE(audited) << log.dump().substr(0, 3000);
  EXPECT_TRUE(logged(log, "reason", "credential-missing", false)) << log.dump().substr(0, 2000);
  const std::string text = log.dump();
  EXPECT_EQ(text.find(first), std::string::npos);
  EXPECT_EQ(text.find(second), std::string::npos);
  auto daemon_log = readSmallFile(logPath(), 64 << 20);
  ASSERT_TRUE(daemon_log.ok());
  EXPECT_EQ(daemon_log->find(second), std::string::npos);
  EXPECT_EQ(daemon_log->find(first), std::string::npos);
}

// Over HTTPS, the gateway terminates the guest's TLS to a rule's host with a certificate of the
// sandbox's own CA, which the guest trusts from its create on: what agents use (curl, Python,
// Node, git, pip, npm) works with no CA option, and the servers get the header. A rule added
// later (PUT network) has the guest trust the CA from then on.
TEST_F(SpacedNetworkTest, TheGuestsToolsTrustTheGatewayOnCredentialHosts) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string value = "ghp_TlsInjectedValue0123456789";
  d.callJson("PUT", "/v1/secrets/gh", json{{"value", value}}, 201);
  auto rule = [](const std::string& host) {
    return json{{"host", host}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}};
  };
  const json network = {{"egress", "policy"},
                        {"allow", json::array()},
                        {"credentials", {rule("allowed.test"), rule("git.test"), rule("pypi.test"), rule("npm.test")}},
                        {"placeholders", {{"GH_TOKEN", "gh"}}}};
  const std::string id = d.create(json{{"cpus", 1}, {"memory_mb", 512}, {"network", network}});
  ASSERT_FALSE(id.empty()) << d.log();
  const std::string authorized = "authorization 1 " + sha256Hex("Bearer " + value);

  auto [curl_rc, curl_out] =
      sh(d, id,
         "curl -sS -m 20 https://allowed.test/auth && wget -q -T 20 -O - https://allowed.test/auth "
         "&& openssl s_client -connect allowed.test:443 -servername allowed.test "
         "-verify_return_error -brief </dev/null 2>&1 | grep -c 'Verification: OK'");
  EXPECT_EQ(curl_rc, 0) << curl_out;
  EXPECT_NE(curl_out.find(authorized), curl_out.rfind(authorized)) << "curl and wget: " << curl_out;
  EXPECT_NE(curl_out.find("\n1\n"), std::string::npos) << "openssl verified: " << curl_out;
  // The guest's stand-in for the secret: in its env, becoming the value only on the way to a
  // rule's host (whose echo of it comes back masked).
  auto [ph_rc, ph_out] = sh(d, id,
                            "echo \"token=$GH_TOKEN\"; curl -sS -m 20 -H \"X-Token: $GH_TOKEN\" "
                            "https://allowed.test/headers");
  EXPECT_EQ(ph_rc, 0) << ph_out;
  EXPECT_NE(ph_out.find("token=space-secret-gh-"), std::string::npos) << ph_out;
  EXPECT_NE(ph_out.find("X-Token: " + std::string(value.size(), '*')), std::string::npos) << ph_out;
  EXPECT_EQ(ph_out.find(value), std::string::npos) << ph_out;
  auto [py_rc, py_out] = sh(d, id,
                            "python3 -c \"import urllib.request as u; print(u.urlopen('https://allowed.test/auth')"
                            ".read().decode())\" && python3 -c \"from pip._vendor import requests; "
                            "print(requests.get('https://allowed.test/auth').text)\"");
  EXPECT_EQ(py_rc, 0) << py_out;
  EXPECT_NE(py_out.find(authorized), py_out.rfind(authorized)) << "both clients: " << py_out;
  auto [node_rc, node_out] =
      sh(d, id,
         "node -e \"require('https').get('https://allowed.test/auth', r => r.pipe(process.stdout))"
         ".on('error', e => { console.error(e.message); process.exit(1); })\" && "
         "node -e \"fetch('https://allowed.test/auth').then(r => r.text()).then(t => console.log(t), "
         "e => { console.error(String(e.cause || e)); process.exit(1); })\"");
  EXPECT_EQ(node_rc, 0) << node_out;
  EXPECT_NE(node_out.find(authorized), node_out.rfind(authorized)) << "both clients: " << node_out;
  auto [git_rc, git_out] = sh(d, id, "git clone -q https://git.test/demo.git && cat demo/README");
  EXPECT_EQ(git_rc, 0) << git_out;
  EXPECT_NE(git_out.find("hello from git.test"), std::string::npos) << git_out;
  auto [pip_rc, pip_out] = sh(d, id,
                              "pip install -q --disable-pip-version-check --index-url https://pypi.test/simple/ "
                              "spacedemo && spacedemo");
  EXPECT_EQ(pip_rc, 0) << pip_out;
  EXPECT_NE(pip_out.find("hello from pypi.test"), std::string::npos) << pip_out;
  auto [npm_rc, npm_out] =
      sh(d, id,
         "mkdir app && cd app && npm install --no-audit --no-fund --no-update-notifier "
         "--registry https://npm.test/ spacedemo && node -e 'console.log(require(\"spacedemo\"))'");
  EXPECT_EQ(npm_rc, 0) << npm_out;
  EXPECT_NE(npm_out.find("hello from npm.test"), std::string::npos) << npm_out;
  // The guest holds the CA's certificate, never its key, and no value.
  auto [trust_rc, trust_out] =
      sh(d, id,
         "grep -c 'BEGIN SPACE credential CA' /etc/ssl/certs/ca-certificates.crt; "
         "grep -rl 'PRIVATE KEY' /etc/space /etc/ssl 2>/dev/null | wc -l; echo $NODE_EXTRA_CA_CERTS; "
         "grep -rl " +
             value + " /etc /home /root /tmp 2>/dev/null | wc -l");
  EXPECT_EQ(trust_out, "1\n0\n/etc/space/credential-ca.pem\n0\n") << trust_out;
  json entries = auditLog(d, id);
  for (const std::string host : {"allowed.test", "git.test", "pypi.test", "npm.test"}) {
    bool injected = false;
    for (const auto& e : entries) {
      injected = injected || (e.value("kind", "") == "credential" && e.value("sni", "") == host &&
                              e.value("tls", "") == "terminated" && e.value("status", 0) == 200);
    }
    EXPECT_TRUE(injected) << host << " " << entries.dump(1);
  }

  // A sandbox given its rule later trusts the CA from then on.
  const std::string later = d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"network", {{"egress", "policy"}}}});
  ASSERT_FALSE(later.empty());
  auto [before_rc, before_out] = sh(d, later, "grep -c 'SPACE credential CA' /etc/ssl/certs/ca-certificates.crt");
  EXPECT_EQ(before_out, "0\n") << before_out;
  d.callJson("PUT", "/v1/sandboxes/" + later + "/network",
             json{{"egress", "policy"}, {"credentials", {rule("allowed.test")}}}, 200);
  auto [later_rc, later_out] = sh(d, later, "curl -sS -m 20 https://allowed.test/auth");
  EXPECT_EQ(later_rc, 0) << later_out;
  EXPECT_NE(later_out.find(authorized), std::string::npos) << later_out;
}

// The guest resolves and reaches what its policy allows, over HTTP and HTTPS, and gets a fast,
// clear refusal (NXDOMAIN, a reset) for the rest, each decision in its audit log; a policy
// change applies to the next connection.
TEST_F(SpacedNetworkTest, ASandboxReachesWhatItsPolicyAllowsAndNothingElse) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id =
      d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"network", {{"egress", "policy"}, {"allow", {"allowed.test"}}}}});
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id + "/network", json(), 200)["allow"], json({"allowed.test"}));
  {
    // Its QEMU runs in one of the node's network slots, not in the host's namespace.
    auto qemu = qemuProcessesUnder(sandboxDir(id));
    ASSERT_EQ(qemu.size(), 1u);
    struct stat qemu_ns {
    }, host_ns{};
    ASSERT_EQ(::stat(("/proc/" + std::to_string(qemu[0]) + "/ns/net").c_str(), &qemu_ns), 0);
    ASSERT_EQ(::stat("/proc/self/ns/net", &host_ns), 0);
    EXPECT_NE(qemu_ns.st_ino, host_ns.st_ino);
    bool in_a_slot = false;
    std::error_code ec;
    for (const auto& slot : std::filesystem::directory_iterator("/run/space/netns", ec)) {
      struct stat st {};
      in_a_slot |= ::stat(slot.path().c_str(), &st) == 0 && st.st_dev == qemu_ns.st_dev && st.st_ino == qemu_ns.st_ino;
    }
    EXPECT_TRUE(in_a_slot) << "its QEMU's network namespace is none of /run/space/netns";
  }

  auto [http_rc, http_out] = sh(d, id, "curl -sS -m 10 http://allowed.test/");
  EXPECT_EQ(http_rc, 0) << http_out;
  EXPECT_NE(http_out.find("host allowed.test"), std::string::npos) << http_out;
  // HTTPS with the fake internet's CA, uploaded for the test (the guest's own store is untouched).
  auto ca = readSmallFile(internet_->caPath(), 1 << 20);
  ASSERT_TRUE(ca.ok());
  auto up = d.call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/ca.pem", ca.value());
  ASSERT_EQ(up.status, 200) << up.body;
  auto [https_rc, https_out] = sh(d, id, "curl -sS -m 10 --cacert /tmp/ca.pem https://allowed.test/");
  EXPECT_EQ(https_rc, 0) << https_out;

  // Denials are fast: measured in the guest, far below any timeout.
  auto [denied_rc, denied_out] =
      sh(d, id,
         "s=$(date +%s%N); curl -sS -m 20 http://denied.test/; a=$?; "
         "curl -sS -m 20 http://198.51.100.20/; b=$?; curl -sS -m 20 http://169.254.169.254/; c=$?; "
         "curl -sS -m 20 --cacert /tmp/ca.pem --resolve allowed.test:443:198.51.100.20 https://allowed.test/; e=$?; "
         "echo codes $a $b $c $e ms $(( ($(date +%s%N) - s) / 1000000 ))");
  EXPECT_NE(denied_out.find("codes 6 56 56 35"), std::string::npos) << denied_out;
  auto ms_at = denied_out.rfind("ms ");
  ASSERT_NE(ms_at, std::string::npos) << denied_out;
  EXPECT_LT(std::stoi(denied_out.substr(ms_at + 3)), 5000) << "denials must be fast: " << denied_out;
  // Other protocols: UDP other than DNS goes nowhere, and no IPv6 at all.
  auto [udp_rc, udp_out] =
      sh(d, id,
         "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); "
         "s.sendto(b'x', ('198.51.100.10', 7)); print(s.recv(10))\"");
  EXPECT_NE(udp_rc, 0) << udp_out;
  EXPECT_NE(udp_out.find("timed out"), std::string::npos) << udp_out;

  // What crossed the guest's NIC shows in its metrics, as the guest sees it: what it sent counts
  // even where the slot's rules then drop it (2 MB of UDP to nowhere); what it received includes
  // a 3 MB download. Sampled every 5 s.
  auto [moved_rc, moved_out] =
      sh(d, id,
         "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
         "[s.sendto(b'x' * 1000, ('198.51.100.10', 7)) for _ in range(2000)]\" && "
         "curl -sS -m 20 -o /dev/null -w 'got %{size_download}' http://allowed.test/bytes/3000000");
  EXPECT_NE(moved_out.find("got 3000000"), std::string::npos) << moved_out;
  json counted;
  for (auto until = Clock::now() + seconds(15); Clock::now() < until; std::this_thread::sleep_for(milliseconds(500))) {
    json series = d.callJson("GET", "/v1/sandboxes/" + id + "/metrics", json(), 200)["metrics"];
    if (!series.is_array() || series.empty()) continue;
    counted = series.back();
    if (counted.value("net_sent_bytes", 0u) >= 2000000u && counted.value("net_received_bytes", 0u) >= 3000000u) break;
  }
  EXPECT_GE(counted.value("net_sent_bytes", 0u), 2000000u) << counted;
  EXPECT_LT(counted.value("net_sent_bytes", 0u), 3000000u) << counted;  // its own bytes, not the slot's history
  EXPECT_GE(counted.value("net_received_bytes", 0u), 3000000u) << counted;
  EXPECT_LT(counted.value("net_received_bytes", 0u), 4000000u) << counted;
  EXPECT_NE(d.call("GET", "/metrics")
                .body.find("space_sandbox_network_received_bytes_total{tenant=\"default\",sandbox=\"" + id + "\"} "),
            std::string::npos);
  // Whatever the guest tried, its gateway refused it before dialling: the kernel's table of
  // gateways' egress (which counts what a compromised gateway would send) refused nothing.
  EXPECT_EQ(metric("space_gateway_egress_refused_packets_total"), 0);
  EXPECT_EQ(metric("space_gateway_resolver_stale"), 0);  // given by flag: never stale

  json entries = auditLog(d, id);
  EXPECT_TRUE(logged(entries, "name", "denied.test", false)) << entries.dump(1);
  EXPECT_TRUE(logged(entries, "destination", "198.51.100.20", false)) << entries.dump(1);
  EXPECT_TRUE(logged(entries, "destination", "169.254.169.254", false)) << entries.dump(1);
  EXPECT_TRUE(logged(entries, "sni", "allowed.test", true) || logged(entries, "name", "allowed.test", true))
      << entries.dump(1);
  // Filters and paging: only denials, only one kind, only what is newer or older than a time.
  const std::string log_path = "/v1/sandboxes/" + id + "/network/log";
  json denials = d.callJson("GET", log_path + "?allowed=false", json(), 200)["entries"];
  EXPECT_GE(denials.size(), 3u);
  for (const auto& e : denials) EXPECT_EQ(e["allowed"], false) << e.dump();
  json dns = d.callJson("GET", log_path + "?kind=dns&limit=2", json(), 200)["entries"];
  ASSERT_EQ(dns.size(), 2u);
  for (const auto& e : dns) EXPECT_EQ(e["kind"], "dns") << e.dump();
  const int64_t newest = entries.back()["time_ms"].get<int64_t>();
  EXPECT_TRUE(d.callJson("GET", log_path + "?after_ms=" + std::to_string(newest), json(), 200)["entries"].empty());
  json older = d.callJson("GET", log_path + "?before_ms=" + std::to_string(newest), json(), 200)["entries"];
  EXPECT_FALSE(older.empty());
  for (const auto& e : older) EXPECT_LT(e["time_ms"].get<int64_t>(), newest);
  EXPECT_EQ(d.call("GET", log_path + "?allowed=maybe").status, 400);
  EXPECT_EQ(d.call("GET", log_path + "?kind=udp").status, 400);

  // A new policy applies to the next connection; invalid ones change nothing.
  EXPECT_EQ(d.call("PUT", "/v1/sandboxes/" + id + "/network", R"({"egress":"policy","allow":["*.test:80"],"deny":[1]})")
                .status,
            400);
  d.callJson("PUT", "/v1/sandboxes/" + id + "/network",
             json{{"egress", "policy"}, {"allow", {"denied.test:80"}}, {"deny", {"allowed.test"}}}, 200);
  auto [after_rc, after_out] =
      sh(d, id, "curl -sS -m 10 http://denied.test/; echo; curl -sS -m 10 http://allowed.test/");
  EXPECT_NE(after_out.find("host denied.test"), std::string::npos) << after_out;
  EXPECT_EQ(after_out.find("host allowed.test"), std::string::npos) << after_out;
  EXPECT_NE(after_rc, 0) << after_out;

  // spacectl shows and changes it, and prints the log.
  auto spacectl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {SPACECTL_BIN, "--data-dir", data_dir_});
    const std::string out = dir_->path() + "/spacectl.out";
    std::filesystem::remove(out);
    EXPECT_EQ(runCommand(args, out), 0) << args[3];
    auto text = readSmallFile(out, 1 << 20);
    return text.ok() ? text.value() : std::string();
  };
  EXPECT_NE(spacectl({"net", "show", id}).find("allow:  denied.test:80"), std::string::npos);
  EXPECT_NE(spacectl({"net", "set", id, "--allow", "other.test"}).find("egress: policy"), std::string::npos);
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id + "/network", json(), 200)["allow"], json({"other.test"}));
  EXPECT_NE(spacectl({"net", "log", id, "--limit", "50"}).find("DENY "), std::string::npos);
  EXPECT_EQ(spacectl({"net", "log", id, "--denied"}).find("allow  "), std::string::npos);
}

// Children of one snapshot: the same guest address, but each in its own slot with its own
// gateway, policy and audit log; a child may be given a stricter policy than the parent's.
TEST_F(SpacedNetworkTest, BranchedChildrenCarryThePolicyInSeparateSlots) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string parent =
      d.create(json{{"cpus", 1}, {"memory_mb", 256}, {"network", {{"egress", "policy"}, {"allow", {"*.test"}}}}});
  ASSERT_FALSE(parent.empty());
  const std::string snap = d.callJson("POST", "/v1/sandboxes/" + parent + "/snapshots", json::object(), 201)["id"];
  json children = d.callJson("POST", "/v1/snapshots/" + snap + "/branch", json{{"count", 2}}, 201);
  ASSERT_EQ(children["sandboxes"].size(), 2u) << children;
  const std::string a = children["sandboxes"][0]["id"], b = children["sandboxes"][1]["id"];
  const std::string stricter = d.create(json{{"snapshot", snap}, {"network", {{"egress", "deny"}}}});
  ASSERT_FALSE(stricter.empty());
  for (const std::string& child : {a, b}) {
    EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + child + "/network", json(), 200)["allow"], json({"*.test"}));
    auto [rc, out] = sh(d, child, "ip -4 -o addr show eth0 | awk '{print $4}'; curl -sS -m 10 http://other.test/");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("169.254.0.2/30"), std::string::npos) << out;
  }
  sh(d, a, "curl -sS -m 10 http://allowed.test/ >/dev/null");
  EXPECT_TRUE(logged(auditLog(d, a), "name", "allowed.test", true));
  EXPECT_FALSE(logged(auditLog(d, b), "name", "allowed.test", true)) << "one child's traffic in the other's log";
  auto [strict_rc, strict_out] = sh(d, stricter, "curl -sS -m 10 http://other.test/");
  EXPECT_NE(strict_rc, 0) << strict_out;
  // Separate slots: each running sandbox holds one of this daemon's namespaces.
  std::set<std::string> slots;
  for (const std::string& id : {parent, a, b, stricter}) {
    auto attachment = readSmallFile(data_dir_ + "/network/" + id + "/attachment.json", 4096);
    ASSERT_TRUE(attachment.ok()) << id;
    slots.insert(std::to_string(json::parse(attachment.value())["slot"].get<int>()));
  }
  EXPECT_EQ(slots.size(), 4u);
}

// kill -9 of a gateway: the sandbox loses its connections, not its policy; spaced notices,
// starts a new one and says so in the sandbox's audit log. kill -9 of spaced: the next start
// re-adopts the sandbox with its slot, and removes every other slot the dead one had made.
// The gateways follow the host's resolver (--gateway-resolv-conf): a sandbox whose DNS fails
// because the host's resolver moved gets it back without a restart of spaced, once housekeeping
// has restarted its gateway with the new one.
TEST_F(SpacedNetworkTest, SandboxesFollowTheHostsResolverWhenItChanges) {
  const std::string resolv_conf = dir_->path() + "/resolv.conf";
  ASSERT_TRUE(writeFileAtomic(resolv_conf, "nameserver 192.0.2.99\n").ok());  // nothing answers there
  daemon_ =
      Daemon::start(data_dir_, {"--gateway-upstream-netns", internet_->upstreamNetnsPath(), "--gateway-resolv-conf",
                                resolv_conf, "--gateway-upstream-ca", internet_->caPath()});
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create(kAllowedTestOnly);
  ASSERT_FALSE(id.empty());
  const int first = gatewayPidOf(id);
  ASSERT_GT(first, 0);
  auto [failed_rc, failed] = sh(*daemon_, id, "getent hosts allowed.test");
  EXPECT_NE(failed_rc, 0) << failed;
  ASSERT_TRUE(writeFileAtomic(resolv_conf, std::string("nameserver ") + testsupport::FakeInternet::kDnsIp + "\n").ok());
  // Two checks 10 s apart, then housekeeping's next round.
  bool restarted = false;
  for (auto until = Clock::now() + seconds(40); Clock::now() < until && !restarted;
       std::this_thread::sleep_for(milliseconds(200))) {
    restarted = gatewayPidOf(id) > 0 && gatewayPidOf(id) != first;
  }
  ASSERT_TRUE(restarted) << daemon_->log();
  EXPECT_TRUE(waitForLog("its network gateway was restarted to ask the host's new resolver", 0, seconds(5)))
      << daemon_->log();
  auto [rc, out] = sh(*daemon_, id, "getent hosts allowed.test && curl -sS -m 10 http://allowed.test/");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("host allowed.test"), std::string::npos) << out;
  EXPECT_EQ(metric("space_gateway_resolver_stale"), 0);
}

TEST_F(SpacedNetworkTest, KilledGatewaysAndDaemonsLeaveNoHoleAndNoLeftovers) {
  std::vector<std::string> args = networkArgs();
  args.insert(args.end(), {"--on-shutdown", "keep"});
  daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create(kAllowedTestOnly);
  ASSERT_FALSE(id.empty());
  auto gatewayPid = [&] { return gatewayPidOf(id); };
  const int first = gatewayPid();
  ASSERT_GT(first, 0);
  // It runs in a control group of its slot's (CPU, memory, one task).
  const std::string group = gatewayGroupOf(first);
  EXPECT_FALSE(group.empty()) << readSmallFile("/proc/" + std::to_string(first) + "/cgroup", 1 << 16).value();
  const std::string group_dir =
      (std::filesystem::exists("/sys/fs/cgroup/memory") ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup") + group;
  EXPECT_TRUE(std::filesystem::is_directory(group_dir)) << group_dir;
  // A process left as the gateway's uid (a gateway of an earlier version could fork) goes with
  // it: it would otherwise signal the next one.
  auto uid = processUid(first);
  ASSERT_TRUE(uid.ok());
  pid_t leftover = fork();
  if (leftover == 0) {
    if (setgroups(0, nullptr) == 0 && setresgid(uid.value(), uid.value(), uid.value()) == 0 &&
        setresuid(uid.value(), uid.value(), uid.value()) == 0) {
      pause();
    }
    _exit(1);
  }
  ASSERT_GT(leftover, 0);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  bool restarted = false;
  for (auto until = Clock::now() + seconds(20); Clock::now() < until && !restarted;
       std::this_thread::sleep_for(milliseconds(100))) {
    restarted = gatewayPid() > 0 && gatewayPid() != first;
  }
  ASSERT_TRUE(restarted) << daemon_->log();
  EXPECT_NE(daemon_->log().find("its network gateway exited; restarted"), std::string::npos) << daemon_->log();
  EXPECT_EQ(gatewayGroupOf(gatewayPid()), group);
  auto [rc, out] = sh(*daemon_, id, "curl -sS -m 10 http://allowed.test/ && curl -sS -m 10 http://other.test/");
  EXPECT_NE(out.find("host allowed.test"), std::string::npos) << out;
  EXPECT_NE(rc, 0) << "the restarted gateway forgot the policy: " << out;
  EXPECT_TRUE(logged(auditLog(*daemon_, id), "reason", "gateway-restarted", false));
  int status = 0;
  ASSERT_EQ(waitpid(leftover, &status, 0), leftover);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_TRUE(waitForLog("network: killed process " + std::to_string(leftover) + " of slot ", 0, seconds(1)));

  // The daemon dies with the sandbox running; its spare slots are leftovers for the next one.
  const std::string prefix = "space-" + sha256Hex(data_dir_).substr(0, 8) + "-";
  auto slotsOnHost = [&] {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/run/space/netns", ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
    }
    return n;
  };
  EXPECT_GE(slotsOnHost(), 2u);  // the sandbox's and the spares
  daemon_->stop(SIGKILL);
  daemon_ = Daemon::start(data_dir_, {networkArgs()[0], networkArgs()[1], networkArgs()[2], networkArgs()[3],
                                      "--spare-slots", "0", "--on-shutdown", "stop"});
  ASSERT_TRUE(daemon_);
  EXPECT_EQ(daemon_->callJson("GET", "/v1/sandboxes/" + id, json(), 200)["state"], "running");
  EXPECT_EQ(slotsOnHost(), 1u) << "the dead daemon's spare slots were not reclaimed";
  EXPECT_FALSE(waitForLog("runs another program than", 0, milliseconds(1))) << "the same program's gateway is kept";
  EXPECT_FALSE(waitForLog("runs outside its control group", 0, milliseconds(1))) << "it is kept in its group";
  EXPECT_EQ(gatewayGroupOf(gatewayPid()), group);
  auto [again_rc, again_out] = sh(*daemon_, id, "curl -sS -m 10 http://allowed.test/");
  EXPECT_EQ(again_rc, 0) << again_out;
  daemon_->stop(SIGTERM);  // --on-shutdown stop: the sandbox goes, and its slot with it
  EXPECT_EQ(slotsOnHost(), 0u);
  EXPECT_FALSE(std::filesystem::exists(group_dir)) << "the gateway's group outlived it";
}

// After an upgrade with sandboxes kept running, an adopted gateway that runs another program
// than the installed one (an earlier version's, without what this one is confined by) is
// replaced by the installed one, and the sandbox's network works on under its policy.
TEST_F(SpacedNetworkTest, AnAdoptedGatewayOfAnEarlierProgramIsReplaced) {
  const std::string installed = (std::filesystem::path(SPACED_BIN).parent_path() / "space-gateway").string();
  const std::string earlier = dir_->path() + "/earlier-space-gateway";
  std::filesystem::copy_file(installed, earlier);
  std::vector<std::string> args = networkArgs();
  args.insert(args.end(), {"--on-shutdown", "keep", "--gateway-binary", earlier});
  daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  const std::string id = daemon_->create(kAllowedTestOnly);
  ASSERT_FALSE(id.empty());
  auto gatewayPid = [&] { return gatewayPidOf(id); };
  const int first = gatewayPid();
  ASSERT_GT(first, 0);
  daemon_->stop(SIGKILL);
  args = networkArgs();
  args.insert(args.end(), {"--on-shutdown", "stop"});
  const size_t log_from = logSize();
  daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  EXPECT_TRUE(waitForLog("runs another program than " + installed + " (an earlier version's); restarting it", log_from,
                         seconds(1)));
  const int second = gatewayPid();
  EXPECT_GT(second, 0);
  EXPECT_NE(second, first);
  bool stopped = false;  // and reaped by whoever inherited it, in a moment
  for (auto until = Clock::now() + seconds(5); Clock::now() < until && !stopped;
       std::this_thread::sleep_for(milliseconds(50))) {
    stopped = ::kill(first, 0) != 0;
  }
  EXPECT_TRUE(stopped) << "the earlier gateway was stopped";
  std::error_code ec;
  EXPECT_TRUE(std::filesystem::equivalent("/proc/" + std::to_string(second) + "/exe", installed, ec)) << ec.message();
  auto [rc, out] = sh(*daemon_, id, "curl -sS -m 10 http://allowed.test/ && curl -sS -m 10 http://other.test/");
  EXPECT_NE(out.find("host allowed.test"), std::string::npos) << out;
  EXPECT_NE(rc, 0) << "the new gateway forgot the policy: " << out;
  EXPECT_TRUE(logged(auditLog(*daemon_, id), "reason", "gateway-restarted", false));

  // One whose attachment does not record this version's confinement is restarted too, even
  // where its program file is the installed one.
  daemon_->stop(SIGKILL);
  const std::string attachment_path = data_dir_ + "/network/" + id + "/attachment.json";
  auto attachment = readSmallFile(attachment_path, 4096);
  ASSERT_TRUE(attachment.ok());
  json recorded = json::parse(attachment.value());
  ASSERT_TRUE(recorded.contains("gateway_confinement")) << recorded;
  recorded.erase("gateway_confinement");
  ASSERT_TRUE(writeFileAtomic(attachment_path, recorded.dump(), 0600).ok());
  const size_t again_from = logSize();
  daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  EXPECT_TRUE(waitForLog("was started by an earlier version (confinement unrecorded, now ", again_from, seconds(1)));
  EXPECT_NE(gatewayPid(), second);
  auto [again_rc, again_out] = sh(*daemon_, id, "curl -sS -m 10 http://allowed.test/");
  EXPECT_EQ(again_rc, 0) << again_out;
}

// A node that turns networking on keeps what it made without: sandboxes suspended and
// snapshots taken then resume and restore without a NIC (their saved devices have none), and
// new sandboxes get one.
TEST_F(SpacedNetworkTest, WhatANodeMadeWithoutNetworkingStillResumesAndRestores) {
  std::vector<std::string> off = {"--network", "off", "--on-shutdown", "keep"};
  daemon_ = Daemon::start(data_dir_, off);
  ASSERT_TRUE(daemon_);
  const std::string old = daemon_->create();
  ASSERT_FALSE(old.empty());
  const std::string snap = daemon_->callJson("POST", "/v1/sandboxes/" + old + "/snapshots", json::object(), 201)["id"];
  daemon_->callJson("POST", "/v1/sandboxes/" + old + "/suspend", json(), 200);
  daemon_->stop(SIGTERM);
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  auto [resumed_rc, resumed_out] = sh(d, old, "test -e /sys/class/net/eth0 && echo nic || echo none");
  EXPECT_NE(resumed_out.find("none"), std::string::npos) << resumed_out;
  const std::string child = d.create(json{{"snapshot", snap}});
  ASSERT_FALSE(child.empty()) << d.log();
  auto [child_rc, child_out] = sh(d, child, "test -e /sys/class/net/eth0 && echo nic || echo none");
  EXPECT_NE(child_out.find("none"), std::string::npos) << child_out;
  const std::string fresh = d.create();
  ASSERT_FALSE(fresh.empty());
  auto [fresh_rc, fresh_out] = sh(d, fresh, "curl -sS -m 10 http://allowed.test/");
  EXPECT_EQ(fresh_rc, 0) << fresh_out;
}

// What a sandbox's user does first, against the fake internet's package sources (git.test,
// pypi.test, npm.test: see fake_internet.h), one test each: a VM boot and one tool under TCG
// each take a good part of a test's time (npm alone 20-35 s). The sandbox's policy names the
// three sources; HTTPS uses the fake internet's CA, uploaded to /tmp/ca.pem.
static std::string packageSandbox(const Daemon& d, const testsupport::FakeInternet& internet) {
  const std::string id =
      d.create(json{{"cpus", 1},
                    {"memory_mb", 256},
                    {"network", {{"egress", "policy"}, {"allow", {"git.test", "pypi.test", "npm.test"}}}}});
  if (id.empty()) return "";
  auto ca = readSmallFile(internet.caPath(), 1 << 20);
  EXPECT_TRUE(ca.ok());
  if (!ca.ok()) return "";
  auto up = d.call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/ca.pem", ca.value());
  EXPECT_EQ(up.status, 200) << up.body;
  return up.status == 200 ? id : "";
}

TEST_F(SpacedNetworkTest, GitCloneOverHttpsWorks) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  const std::string id = packageSandbox(*daemon_, *internet_);
  ASSERT_FALSE(id.empty());
  auto [rc, out] = sh(*daemon_, id,
                      "git -c http.sslCAInfo=/tmp/ca.pem clone -q https://git.test/demo.git && "
                      "cat demo/README && git -C demo log --format=%s");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("hello from git.test\nfirst commit"), std::string::npos) << out;
  EXPECT_TRUE(logged(auditLog(*daemon_, id), "reason", "allow:git.test", true));
}

// A plain `pip install` as the default user (no --user, no --break-system-packages, no venv):
// Debian's PEP 668 marker would refuse it; the image's /etc/pip.conf lets it install into
// ~/.local, whose bin/ is on PATH in the same command and whose packages import in the next.
TEST_F(SpacedNetworkTest, PipInstallWorksAsTheDefaultUser) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  const std::string id = packageSandbox(*daemon_, *internet_);
  ASSERT_FALSE(id.empty());
  auto [rc, out] = sh(*daemon_, id,
                      "id -un && pip install --disable-pip-version-check --cert /tmp/ca.pem "
                      "--index-url https://pypi.test/simple/ spacedemo && spacedemo");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.rfind("user\n", 0), 0u) << "not exec's default user: " << out;
  EXPECT_EQ(out.find("externally-managed-environment"), std::string::npos) << out;
  EXPECT_EQ(out.find("not on PATH"), std::string::npos) << out;
  EXPECT_NE(out.find("hello from pypi.test"), std::string::npos) << out;
  auto [import_rc, import_out] =
      sh(*daemon_, id, "python3 -c 'import spacedemo; print(spacedemo.GREETING, spacedemo.__file__)'");
  EXPECT_EQ(import_rc, 0) << import_out;
  EXPECT_NE(import_out.find("hello from pypi.test /home/user/.local/lib/python3"), std::string::npos) << import_out;
  EXPECT_TRUE(logged(auditLog(*daemon_, id), "reason", "allow:pypi.test", true));
}

TEST_F(SpacedNetworkTest, NpmInstallWorks) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  const std::string id = packageSandbox(*daemon_, *internet_);
  ASSERT_FALSE(id.empty());
  auto [rc, out] = sh(*daemon_, id,
                      "mkdir app && cd app && npm install --no-audit --no-fund --no-update-notifier "
                      "--cafile /tmp/ca.pem --registry https://npm.test/ spacedemo && "
                      "node -e 'console.log(require(\"spacedemo\"))'");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("hello from npm.test"), std::string::npos) << out;
  EXPECT_TRUE(logged(auditLog(*daemon_, id), "reason", "allow:npm.test", true));
}

// Every bypass class the network issue lists, tried from inside a real guest as root with a
// policy that allows one name: each probe must get nothing from anywhere else. The script prints
// one line per probe, "blocked <name>" or "LEAK <name>: <what came back>".
constexpr const char* kBypassProbes = R"PY(
import socket, ssl, struct, sys
ALLOWED, DENIED, OTHER, PRIVATE, META = "198.51.100.10", "198.51.100.20", "203.0.113.30", "10.0.0.5", "169.254.169.254"
FOREIGN = ["server " + ip for ip in (DENIED, OTHER, PRIVATE, META)]
results = []
def report(name, leaked, detail=""):
    results.append(("LEAK %s: %r" % (name, detail)) if leaked else ("blocked " + name))
def read_reply(s):
    # A reply may come in several segments (headers, then body): read to the end, a quiet
    # second, or 64 KiB. Nothing at all is the caller's "blocked".
    got = b""
    while len(got) < 65536:
        try:
            part = s.recv(4096)
        except (socket.timeout, ssl.SSLError, OSError):
            if got: break
            raise
        if not part: break
        got += part
        s.settimeout(1)
    return got
def tcp(name, ip, port, payload=b"", wrap=None, family=socket.AF_INET):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect((ip, port))
        if wrap: s = wrap(s)
        if payload: s.sendall(payload)
        got = read_reply(s)
    except Exception as e:
        return report(name, False)
    # Any answer from a server the policy does not allow, or any answer at all where none may come.
    report(name, any(f.encode() in got for f in FOREIGN) or (wrap is None and not payload and got != b""), got[:80])
def dns_query(name, qtype=1):
    return struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(
        bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1)
def dns_udp(name, server, qname, qtype=1):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
        s.sendto(dns_query(qname, qtype), (server, 53)); got = s.recv(4096)
    except Exception:
        return report(name, False)
    answers = struct.unpack(">H", got[6:8])[0]; rcode = got[3] & 15
    report(name, answers > 0, "rcode %d answers %d" % (rcode, answers))
def dns_tcp(name, server, qname):
    try:
        s = socket.create_connection((server, 53), 3); q = dns_query(qname)
        s.sendall(struct.pack(">H", len(q)) + q); got = read_reply(s)[2:]
    except Exception:
        return report(name, False)
    report(name, len(got) >= 8 and struct.unpack(">H", got[6:8])[0] > 0, got[:40])
def tls(sni):
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    return lambda s: ctx.wrap_socket(s, server_hostname=sni)
get = lambda host: ("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode()

try:  # control: the allowed server answers, so "blocked" below is the gateway's doing
    c = socket.create_connection((ALLOWED, 80), 3); c.sendall(get("allowed.test")); got = read_reply(c)
    results.append("control " + ("reached" if ("server " + ALLOWED).encode() in got else "FAILED %r" % got[:60]))
except Exception as e:
    results.append("control FAILED %r" % e)
try:
    socket.getaddrinfo("c2VjcmV0LWV4ZmlsCg.denied.test", 80); report("dns exfiltration via subdomain", True)
except socket.gaierror:
    report("dns exfiltration via subdomain", False)
dns_udp("dns to an external resolver over udp", "192.0.2.53", "denied.test")
dns_udp("dns to another resolver address over udp", "8.8.8.8", "exfil.other.test")
dns_udp("dns TXT for a denied zone", "192.0.2.53", "data.denied.test", 16)
dns_tcp("dns to an external resolver over tcp", "192.0.2.53", "denied.test")
tcp("DoT on 853", "192.0.2.53", 853, b"\x16\x03\x01")
tcp("DoH to a denied host", DENIED, 443, get("denied.test"), tls("denied.test"))
tcp("sni allowed, destination not its pinned address", DENIED, 443, get("allowed.test"), tls("allowed.test"))
tcp("sni allowed, Host denied", ALLOWED, 443, get("denied.test"), tls("allowed.test"))
tcp("tls without sni", DENIED, 443, get("denied.test"), tls(None))
tcp("oversized ClientHello", DENIED, 443, b"\x16\x03\x01\xff\xff" + b"\x01" * 70000)
tcp("Host allowed, destination elsewhere", DENIED, 80, get("allowed.test"))
tcp("CONNECT smuggling", ALLOWED, 80, b"CONNECT denied.test:80 HTTP/1.1\r\nHost: denied.test:80\r\n\r\n" + get("denied.test"))
tcp("absolute-URI smuggling", DENIED, 80, b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
tcp("oversized Host", DENIED, 80, b"GET / HTTP/1.1\r\nHost: " + b"a" * 70000 + b"\r\n\r\n")
tcp("malformed Host", DENIED, 80, b"GET / HTTP/1.1\r\nHost: allowed.test\x00.denied.test\r\n\r\n")
for port in (80, 22, 5432, 8443):
    tcp("ip literal port %d" % port, OTHER, port, get(OTHER))
tcp("metadata", META, 80, get("meta.test"))
tcp("private range", PRIVATE, 80, get("rebind.test"))
tcp("the gateway's own other port", "169.254.0.1", 15053, get("x"))
tcp("the gateway's address, port 22", "169.254.0.1", 22, b"SSH-2.0-x\r\n")
for ip6 in ("::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2001:db8::1", "fe80::1%eth0"):
    tcp("ipv6 " + ip6, ip6, 80, get("meta.test"), family=socket.AF_INET6)
for port in (443, 7, 53000):
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
        u.sendto(b"\xc0\x00\x00\x00\x01" + b"q" * 1200, (ALLOWED, port)); got = u.recv(4096)
        report("udp %d (QUIC)" % port, True, got[:40])
    except Exception:
        report("udp %d (QUIC)" % port, False)
try:
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); r.settimeout(2)
    body = b"exfil-payload" * 8
    header = struct.pack(">BBHHH", 8, 0, 0, 0x77, 1)
    csum = sum(struct.unpack(">%dH" % ((len(header + body)) // 2), header + body)); csum = (csum >> 16) + (csum & 0xffff)
    r.sendto(struct.pack(">BBHHH", 8, 0, ~(csum + (csum >> 16)) & 0xffff, 0x77, 1) + body, (ALLOWED, 0))
    while True:
        got, src = r.recvfrom(4096)
        if got[20] == 0: report("icmp echo with payload", True, src); break
except Exception:
    report("icmp echo with payload", False)
try:
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, 253); raw.sendto(b"raw-ip", (ALLOWED, 0))
    report("raw ip protocol 253 (sent; nothing can answer)", False)
except Exception:
    report("raw ip protocol 253", False)
print("\n".join(results))
)PY";

TEST_F(SpacedNetworkTest, EveryBypassFromGuestRootFails) {
  daemon_ = Daemon::start(data_dir_, networkArgs());
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  const std::string id =
      d.create(json{{"cpus", 1},
                    {"memory_mb", 256},
                    {"network", {{"egress", "policy"}, {"allow", {"allowed.test", "rebind.test"}}}}});
  ASSERT_FALSE(id.empty());
  // The guest learns allowed.test's address the legitimate way first (it is then pinned); an
  // allowed name whose answer points into a private range (rebinding) resolves to nothing.
  auto [resolved_rc, resolved] = sh(d, id, "getent hosts allowed.test && ! getent hosts rebind.test");
  ASSERT_EQ(resolved_rc, 0) << resolved;
  const int queries = internet_->dnsQueries();
  auto up = d.call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/probes.py", kBypassProbes);
  ASSERT_EQ(up.status, 200) << up.body;
  // Root turns IPv6 back on with a global address and a default route, as an attacker would.
  json run = execJson(d, id,
                      json{{"command",
                            "sysctl -qw net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.eth0.disable_ipv6=0; "
                            "ip -6 addr add 2001:db8::2/64 dev eth0 nodad; ip -6 route add default dev eth0; "
                            "python3 /tmp/probes.py"},
                           {"user", "root"},
                           {"timeout_s", 80}});
  const std::string out = run.value("stdout", std::string());
  EXPECT_EQ(run.value("exit_code", -1), 0) << out << run.value("stderr", std::string());
  EXPECT_EQ(out.find("LEAK"), std::string::npos) << out;
  EXPECT_NE(out.find("control reached"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 34) << "a probe did not report:\n" << out;
  // No denied name reached the real resolver (exfiltration through names).
  EXPECT_EQ(internet_->dnsQueries(), queries);
  json entries = auditLog(d, id);
  EXPECT_TRUE(logged(entries, "destination", "169.254.169.254", false)) << entries.dump(1);
  EXPECT_TRUE(logged(entries, "sni", "denied.test", false)) << entries.dump(1);
}

// --- ingress: a guest's HTTP server and WebSocket, through spaced --------------------------

// A web app for the guest: GET answers what it was asked and with what credentials, POST echoes
// its body, and a WebSocket upgrade echoes text frames (frames under 126 bytes: enough here).
constexpr const char* kGuestWebApp = R"PY(
import base64, hashlib, http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            key = self.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
            self.end_headers()
            self.wfile.flush()
            while True:
                head = self.rfile.read(2)
                if len(head) < 2 or head[0] & 15 == 8:
                    return
                mask = self.rfile.read(4)
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(head[1] & 127)))
                out = b"echo:" + data
                self.wfile.write(bytes([0x81, len(out)]) + out)
                self.wfile.flush()
        cookie = " cookie=%s" % self.headers.get("Cookie") if self.headers.get("Cookie") is not None else ""
        self.answer(("path=%s auth=%s token=%s prefix=%s%s\n" % (self.path, self.headers.get("Authorization"),
            self.headers.get("X-Space-Access-Token"), self.headers.get("X-Forwarded-Prefix"), cookie)).encode())
    def do_POST(self):
        self.answer(b"got:" + self.rfile.read(int(self.headers.get("Content-Length", "0"))))
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
)PY";

class SpacedIngressTest : public SpacedTest {
 protected:
  // A raw exchange with the daemon (Host and methods the API client would not send).
  std::string raw(const std::string& request) {
    const std::string& url = daemon_->url();
    UniqueFd fd =
        testsupport::connectRaw(static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))), seconds(20));
    testsupport::sendRaw(fd.get(), request);
    return testsupport::readUntilClosed(fd.get());
  }
  http::ClientResponse get(const std::string& target, std::map<std::string, std::string> headers) {
    auto client = http::Client::create(daemon_->url());
    EXPECT_TRUE(client.ok());
    auto r = client->request("GET", target, headers, "", seconds(30));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? r.value() : http::ClientResponse{};
  }
};

// A server in the guest answers through spaced by path and by host, to the owner's key, the
// sandbox's token or (once made public) anyone; nothing else gets in, the key never reaches
// the guest, and a WebSocket echoes both ways.
TEST_F(SpacedIngressTest, AGuestsWebServerAndWebSocketAreReachableWithTheRightCredentials) {
  // A tenant may hold a quarter of the node's proxied connections: 8 here.
  daemon_ = Daemon::start(data_dir_, {"--ingress-domain", "preview.test", "--ingress-max-connections", "32"});
  ASSERT_TRUE(daemon_);
  auto& d = *daemon_;
  json sb = d.callJson("POST", "/v1/sandboxes", json{{"cpus", 1}, {"memory_mb", 256}}, 201);
  const std::string id = sb.value("id", "");
  const std::string token = sb.value("access_token", "");
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(token.size(), 64u) << sb.dump();
  auto up = d.call("PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/app.py", kGuestWebApp);
  ASSERT_EQ(up.status, 200) << up.body;
  json started = execJson(d, id,
                          json{{"command",
                                "(setsid python3 /tmp/app.py >/tmp/app.log 2>&1 &); for i in $(seq 100); do "
                                "curl -s -o /dev/null localhost:8080/ && exit 0; sleep 0.1; done; cat /tmp/app.log; "
                                "exit 1"},
                               {"timeout_s", 30}});
  ASSERT_EQ(started.value("exit_code", -1), 0) << started.dump();
  const std::string ports = "/v1/sandboxes/" + id + "/ports/";

  // The owner's key: the guest gets the rest of the target, never the key.
  auto owner = d.call("GET", ports + "8080/hello?x=1");
  EXPECT_EQ(owner.status, 200) << owner.body;
  EXPECT_EQ(owner.body, "path=/hello?x=1 auth=None token=None prefix=" + ports + "8080\n");
  // A console session's cookie is spaced's credential too: the guest gets the other cookies only.
  auto with_cookies = get(ports + "8080/c", {{"Authorization", "Bearer " + d.key()},
                                             {"Cookie", "theme=dark; space_session=0123456789abcdef; lang=en"}});
  EXPECT_EQ(with_cookies.body, "path=/c auth=None token=None prefix=" + ports + "8080 cookie=theme=dark; lang=en\n");
  auto only_session = get(ports + "8080/c", {{"Authorization", "Bearer " + d.key()}, {"Cookie", "space_session=x"}});
  EXPECT_EQ(only_session.body, "path=/c auth=None token=None prefix=" + ports + "8080\n");
  auto posted = d.call("POST", ports + "8080/echo", R"({"a":1})");
  EXPECT_EQ(posted.body, R"(got:{"a":1})");
  auto bare = d.call("GET", ports + "8080");
  EXPECT_EQ(bare.status, 308);
  EXPECT_EQ(bare.headers["location"], ports + "8080/");

  // The token, and nothing: only the token opens it (and only this sandbox's).
  auto by_token = get(ports + "8080/t", {{"X-Space-Access-Token", token}});
  EXPECT_EQ(by_token.status, 200) << by_token.body;
  EXPECT_EQ(by_token.body.rfind("path=/t auth=None token=None", 0), 0u) << by_token.body;
  EXPECT_EQ(get(ports + "8080/", {}).status, 401);
  EXPECT_EQ(get(ports + "8080/", {{"X-Space-Access-Token", std::string(64, '0')}}).status, 401);
  const std::string other_key = addTenant("other");
  EXPECT_EQ(get(ports + "8080/", {{"Authorization", "Bearer " + other_key}}).status, 404);
  auto closed = d.call("GET", ports + "8081/");
  EXPECT_EQ(closed.status, 502) << closed.body;
  EXPECT_NE(closed.body.find("nothing listens on port 8081"), std::string::npos) << closed.body;
  EXPECT_EQ(d.call("GET", ports + "0/").status, 400);

  // By host, the same server.
  std::string host = id;
  std::replace(host.begin(), host.end(), '_', '-');
  std::string by_host = raw("GET /from-host HTTP/1.1\r\nHost: 8080-" + host +
                            ".preview.test\r\nX-Space-Access-Token: " + token + "\r\n\r\n");
  EXPECT_EQ(by_host.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << by_host;
  EXPECT_NE(by_host.find("path=/from-host auth=None token=None prefix=None"), std::string::npos) << by_host;

  // A WebSocket, through the key, with a masked frame each way.
  // The head of the answer to a WebSocket upgrade; `early`: what followed it.
  auto upgrade = [&](const std::string& url, const std::string& request, std::string& early) {
    UniqueFd fd =
        testsupport::connectRaw(static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))), seconds(20));
    testsupport::sendRaw(fd.get(),
                         request +
                             "Connection: Upgrade\r\nUpgrade: websocket\r\n"
                             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    std::string got;
    char buf[4096];
    while (got.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    early = got.find("\r\n\r\n") == std::string::npos ? "" : got.substr(got.find("\r\n\r\n") + 4);
    return std::make_pair(std::move(fd), got.substr(0, got.find("\r\n\r\n")));
  };
  auto openWebSocket = [&](std::string& early) {
    auto [fd, head] = upgrade(
        d.url(), "GET " + ports + "8080/ws HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + d.key() + "\r\n", early);
    EXPECT_EQ(head.rfind("HTTP/1.1 101", 0), 0u) << head;
    EXPECT_NE(head.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos) << head;
    return std::move(fd);
  };
  {
    std::string reply;
    UniqueFd fd = openWebSocket(reply);
    const std::string text = "hi there";
    std::string frame = {static_cast<char>(0x81), static_cast<char>(0x80 | text.size()), 1, 2, 3, 4};
    for (size_t i = 0; i < text.size(); ++i) frame += static_cast<char>(text[i] ^ (1 + i % 4));
    testsupport::sendRaw(fd.get(), frame);
    char buf[4096];
    while (reply.size() < 2 + 13) {
      ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << reply;
      reply.append(buf, static_cast<size_t>(n));
    }
    EXPECT_EQ(reply, std::string("\x81\x0d", 2) + "echo:hi there");
  }

  // An open WebSocket keeps its tenant's place for as long as it lasts (the event loop relays
  // it; the handler has returned): with 8 open, the next is refused, and one ending frees a place.
  {
    std::vector<UniqueFd> sockets;
    for (int i = 0; i < 8; ++i) {
      std::string early;
      sockets.push_back(openWebSocket(early));
    }
    auto busy = get(ports + "8080/busy", {{"Authorization", "Bearer " + d.key()}});
    EXPECT_EQ(busy.status, 503) << busy.body;
    EXPECT_NE(busy.body.find("ingress_busy"), std::string::npos) << busy.body;
    sockets.pop_back();
    int status = 0;
    for (int i = 0; i < 50 && status != 200; ++i, std::this_thread::sleep_for(milliseconds(100))) {
      status = get(ports + "8080/freed", {{"Authorization", "Bearer " + d.key()}}).status;
    }
    EXPECT_EQ(status, 200) << "a place freed when a WebSocket ended";
  }
  // The same through E2B's front (its traffic token is the access token): 429 past the tenant's share.
  {
    auto endpoint = json::parse(readSmallFile(data_dir_ + "/spaced.json", 4096).value());
    const std::string e2b_url = endpoint["e2b_sandbox_url"].get<std::string>();
    const std::string request = "GET /ws HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: " + id +
                                "\r\nE2b-Sandbox-Port: 8080\r\ne2b-traffic-access-token: " + token + "\r\n";
    std::vector<UniqueFd> sockets;
    for (int i = 0; i < 8; ++i) {
      std::string early;
      auto [fd, head] = upgrade(e2b_url, request, early);
      EXPECT_EQ(head.rfind("HTTP/1.1 101", 0), 0u) << i << ": " << head;
      sockets.push_back(std::move(fd));
    }
    std::string early;
    auto refused = upgrade(e2b_url, request, early);
    EXPECT_EQ(refused.second.rfind("HTTP/1.1 429", 0), 0u) << refused.second;
  }

  // Public ports: anyone, no key or token; the policy says so and can take it back.
  d.callJson("PUT", "/v1/sandboxes/" + id + "/network", json{{"egress", "allow"}, {"public_ports", true}}, 200);
  EXPECT_EQ(d.callJson("GET", "/v1/sandboxes/" + id + "/network", json(), 200)["public_ports"], true);
  auto anyone = get(ports + "8080/public", {});
  EXPECT_EQ(anyone.status, 200) << anyone.body;
  // Another tenant's key sent along is still spaced's secret, not the guest's to see.
  auto other_tenant = get(ports + "8080/k", {{"Authorization", "Bearer " + other_key}});
  EXPECT_EQ(other_tenant.status, 200) << other_tenant.body;
  EXPECT_EQ(other_tenant.body.rfind("path=/k auth=None", 0), 0u) << other_tenant.body;
  d.callJson("PUT", "/v1/sandboxes/" + id + "/network", json{{"egress", "allow"}}, 200);
  EXPECT_EQ(get(ports + "8080/public", {}).status, 401);

  // Suspended: the token does not wake it (only the tenant's key does), and after the key did,
  // the guest's server answers from where it was.
  d.callJson("POST", "/v1/sandboxes/" + id + "/suspend", json(), 200);
  auto asleep = get(ports + "8080/", {{"X-Space-Access-Token", token}});
  EXPECT_EQ(asleep.status, 409) << asleep.body;
  EXPECT_NE(asleep.body.find("suspended"), std::string::npos) << asleep.body;
  auto woken = d.call("GET", ports + "8080/woken");
  EXPECT_EQ(woken.status, 200) << woken.body;
  EXPECT_EQ(woken.body.rfind("path=/woken", 0), 0u) << woken.body;

  // Connections still open end with the sandbox: its slot may serve another tenant's next.
  std::string early;
  UniqueFd open_socket = openWebSocket(early);
  auto deleted_at = Clock::now();
  EXPECT_EQ(d.call("DELETE", "/v1/sandboxes/" + id).status, 204);
  char byte;
  EXPECT_LE(recv(open_socket.get(), &byte, 1, 0), 0) << "the connection outlived its sandbox";
  EXPECT_LT(Clock::now() - deleted_at, seconds(10));
}

// The E2B front ends, at the edges the SDK suite (tests/e2b) does not reach: who is refused,
// what a malformed call gets, and the raw Connect and multipart shapes on the wire.
TEST_F(SpacedTest, TheE2bFrontEndsRefuseStrangersAndSpeakConnect) {
  daemon_ = Daemon::start(data_dir_);
  ASSERT_TRUE(daemon_);
  auto endpoint = json::parse(readSmallFile(data_dir_ + "/spaced.json", 4096).value());
  auto api = http::Client::create(endpoint["e2b_api_url"].get<std::string>());
  auto envd = http::Client::create(endpoint["e2b_sandbox_url"].get<std::string>());
  ASSERT_TRUE(api.ok() && envd.ok());
  const std::map<std::string, std::string> key{{"X-API-KEY", daemon_->key()}, {"Content-Type", "application/json"}};

  // The control plane: E2B's key header, E2B's error bodies.
  auto anonymous = api->request("GET", "/v2/sandboxes");
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(anonymous->status, 401);
  EXPECT_EQ(json::parse(anonymous->body)["code"], 401);
  auto unknown = api->request("GET", "/sandboxes/sb_nosuchsandbox0000000", key);
  EXPECT_EQ(json::parse(unknown->body)["code"], 404);
  auto refused = api->request("POST", "/v2/sandboxes", key, R"({"templateID":"base","volumeMounts":[{}]})");
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("volumeMounts"), std::string::npos) << refused->body;
  auto created = api->request("POST", "/v2/sandboxes", key, R"({"templateID":"base","timeout":300})");
  ASSERT_EQ(created->status, 201) << created->body;
  json sandbox = json::parse(created->body);
  const std::string id = sandbox["sandboxID"], token = sandbox["envdAccessToken"];
  EXPECT_EQ(sandbox["envdVersion"], "0.6.13");
  EXPECT_EQ(token.size(), 64u);
  // SDKs up to 2.50 create on /sandboxes with secure and allow_internet_access always set, and
  // connect on /sandboxes/{id}/connect with a timeout: 200 for a running sandbox.
  auto legacy = api->request("POST", "/sandboxes", key,
                             R"({"templateID":"base","timeout":300,"secure":true,"allow_internet_access":true})");
  ASSERT_EQ(legacy->status, 201) << legacy->body;
  const std::string legacy_id = json::parse(legacy->body)["sandboxID"];
  EXPECT_EQ(api->request("POST", "/sandboxes/" + legacy_id + "/connect", key, R"({"timeout":300})")->status, 200);
  EXPECT_EQ(api->request("DELETE", "/sandboxes/" + legacy_id, key)->status, 204);

  auto envdCall = [&](const std::string& target, std::map<std::string, std::string> headers, const std::string& body,
                      const std::string& method = "POST") {
    headers.emplace("E2b-Sandbox-Id", id);
    headers.emplace("E2b-Sandbox-Port", "49983");
    auto r = envd->request(method, target, headers, body, seconds(60));
    EXPECT_TRUE(r.ok());
    return r.ok() ? r.value() : http::ClientResponse{};
  };
  const std::map<std::string, std::string> unary{{"X-Access-Token", token}, {"Content-Type", "application/json"}};
  EXPECT_EQ(envdCall("/health", {}, "", "GET").status, 204);
  // No token, a wrong one, another sandbox's id: refused before anything reaches the guest.
  EXPECT_EQ(envdCall("/process.Process/List", {{"Content-Type", "application/json"}}, "{}").status, 401);
  EXPECT_EQ(envdCall("/process.Process/List", {{"X-Access-Token", std::string(64, 'a')}}, "{}").status, 401);
  auto stranger = envd->request("GET", "/health", {{"E2b-Sandbox-Id", "sb_nosuchsandbox0000000"}});
  EXPECT_EQ(stranger->status, 502);
  EXPECT_EQ(json::parse(stranger->body)["message"], "The sandbox was not found");
  // Only envd's own calls are forwarded.
  auto shutdown = envdCall("/agent.Agent/Shutdown", unary, "{}");
  EXPECT_EQ(shutdown.status, 404);
  EXPECT_EQ(json::parse(shutdown.body)["code"], "unimplemented");
  auto deep = envdCall("/filesystem.Filesystem/Stat", unary, std::string(5000, '[') + std::string(5000, ']'));
  EXPECT_EQ(deep.status, 400) << deep.body;
  auto missing = envdCall("/filesystem.Filesystem/Stat", unary, R"({"path":"/no/such/file"})");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(json::parse(missing.body)["code"], "not_found");

  // A stream: one request envelope in, envelopes out, EndStream last.
  auto frame = [](const std::string& payload) {
    std::string out(5, '\0');
    for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<char>((payload.size() >> (24 - 8 * i)) & 0xff);
    return out + payload;
  };
  auto frames = [](const std::string& body) {
    std::vector<std::pair<int, json>> out;
    size_t pos = 0;
    while (pos + 5 <= body.size()) {
      size_t n = 0;
      for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<unsigned char>(body[pos + i]);
      out.emplace_back(static_cast<unsigned char>(body[pos]), json::parse(body.substr(pos + 5, n), nullptr, false));
      pos += 5 + n;
    }
    return out;
  };
  const std::map<std::string, std::string> streaming{
      {"X-Access-Token", token}, {"Content-Type", "application/connect+json"}, {"Connect-Timeout-Ms", "30000"}};
  auto started =
      envdCall("/process.Process/Start", streaming,
               frame(R"({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi; whoami"]},"stdin":false})"));
  ASSERT_EQ(started.status, 200);
  auto events = frames(started.body);
  ASSERT_GE(events.size(), 3u) << started.body;
  EXPECT_TRUE(events.front().second["event"].contains("start"));
  EXPECT_EQ(events.back().first, 2);
  EXPECT_EQ(events.back().second, json::object());
  std::string out;
  for (const auto& [flags, m] : events) {
    if (flags == 0 && m["event"].contains("data")) {
      out += *agentproto::base64Decode(m["event"]["data"].value("stdout", std::string()));
    }
  }
  EXPECT_EQ(out, "hi\nuser\n");
  // A malformed envelope is an EndStream error with HTTP 200, as Connect wants.
  auto truncated = envdCall("/process.Process/Start", streaming, std::string("\0\0\0\0\x50{}", 7));
  EXPECT_EQ(truncated.status, 200);
  auto bad = frames(truncated.body);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].first, 2);
  EXPECT_EQ(bad[0].second["error"]["code"], "invalid_argument");

  // Files: two parts in one multipart body, each named by its filename; then read back.
  const std::string multipart =
      "--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/one.txt\"\r\n\r\nfirst\r\n"
      "--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"two.txt\"\r\n\r\nsecond\r\n"
      "--b0undary--\r\n";
  auto uploaded = envdCall(
      "/files", {{"X-Access-Token", token}, {"Content-Type", "multipart/form-data; boundary=b0undary"}}, multipart);
  ASSERT_EQ(uploaded.status, 200) << uploaded.body;
  EXPECT_EQ(json::parse(uploaded.body), json::parse(R"([{"path":"/tmp/one.txt","name":"one.txt","type":"file"},
                            {"path":"/home/user/two.txt","name":"two.txt","type":"file"}])"));
  auto read = envdCall("/files?path=two.txt", {{"X-Access-Token", token}}, "", "GET");
  EXPECT_EQ(read.status, 200);
  EXPECT_EQ(read.body, "second");
  auto nofile = envdCall("/files?path=nope.txt", {{"X-Access-Token", token}}, "", "GET");
  EXPECT_EQ(nofile.status, 404);
  EXPECT_EQ(json::parse(nofile.body)["code"], 404);
  // A signature made with the wrong token reads nothing.
  auto forged = envd->request("GET", "/files?path=two.txt&signature=v1_AAAA&signature_expiration=9999999999");
  EXPECT_EQ(forged->status, 400);  // it signs for no sandbox at all

  // Killed: envd answers 502 on every path, the control plane 404.
  EXPECT_EQ(api->request("DELETE", "/sandboxes/" + id, key)->status, 204);
  EXPECT_EQ(envdCall("/health", {}, "", "GET").status, 502);
  EXPECT_EQ(envdCall("/process.Process/List", unary, "{}").status, 502);
  EXPECT_EQ(json::parse(api->request("DELETE", "/sandboxes/" + id, key)->body)["code"], 404);
}

// Issue 15, item 7: kill -9 of spaced, a QEMU or a gateway at a random instant of a random
// lifecycle operation, again and again; now and then spaced restarts armed to kill itself at a
// named fault point (common/fault.h) instead. After every round: each sandbox is running (and
// runs a command), paused, suspended or failed with a reason; a snapshot restores; no QEMU,
// gateway, network slot or cgroup is left without a live sandbox to own it. At the end, with
// everything deleted and spaced stopped, nothing of it is left on the host. CI runs a few rounds;
// by hand: SPACE_SOAK_ROUNDS=200 [SPACE_SOAK_SEED=n] bin/space_spaced_tests
// --gtest_filter='SpacedSoakTest.*' (make soak). A failure names its seed and round.
class SpacedSoakTest : public SpacedTest {
 protected:
  static int envNumber(const char* name, int fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 1000000000) {
      ADD_FAILURE() << name << "=" << v << " is not a number";
      return fallback;
    }
    return static_cast<int>(n);
  }
  // A request that may die with its daemon: no expectation on it, only its answer if any.
  static std::optional<http::ClientResponse> tryCall(const std::string& url, const std::string& key,
                                                     const std::string& method, const std::string& target,
                                                     const std::string& body = "") {
    auto client = http::Client::create(url);
    if (!client.ok()) return std::nullopt;
    std::map<std::string, std::string> headers{{"Authorization", "Bearer " + key}};
    if (!body.empty()) headers["Content-Type"] = "application/json";
    auto r = client->request(method, target, headers, body, seconds(90));
    if (!r.ok()) return std::nullopt;
    return r.value();
  }
  json list(const std::string& what) const {
    const std::string target = what == "sandboxes"
                                   ? "/v1/sandboxes?state=creating,running,paused,suspended,failed&limit=1000"
                                   : "/v1/snapshots?limit=1000";
    return daemon_->callJson("GET", target, nullptr, 200)[what];
  }
  // The node's own things on the host, found the way an operator would find them.
  std::string slotPrefix() const { return "space-" + sha256Hex(data_dir_).substr(0, 8) + "-"; }
  size_t slotsOnHost() const {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/run/space/netns", ec)) {
      if (e.path().filename().string().rfind(slotPrefix(), 0) == 0) ++n;
    }
    return n;
  }
  size_t mountsOfThisNode() const {
    auto text = readFileTail("/proc/self/mountinfo", 1 << 22);
    size_t n = 0;
    std::istringstream lines(text.ok() ? text.value() : "");
    for (std::string line; std::getline(lines, line);) {
      if (line.find(slotPrefix()) != std::string::npos || line.find(data_dir_) != std::string::npos) ++n;
    }
    return n;
  }
  // spaced's cgroup root for its VMs (src/jail/cgroup.h): <our group>/space/spaced-<hash>; its
  // memory hierarchy on v1, the unified one on v2.
  std::string cgroupRoot() const {
    auto text = readSmallFile("/proc/self/cgroup", 1 << 16);
    std::istringstream lines(text.ok() ? text.value() : "");
    std::string v2;
    const std::string tail = "/space/spaced-" + sha256Hex(data_dir_).substr(0, 8);
    for (std::string line; std::getline(lines, line);) {
      auto first = line.find(':'), second = line.find(':', first + 1);
      if (first == std::string::npos || second == std::string::npos) continue;
      std::string controllers = line.substr(first + 1, second - first - 1);
      std::string path = line.substr(second + 1);
      if (path == "/") path.clear();
      if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        return "/sys/fs/cgroup/memory" + path + tail;
      }
      if (controllers.empty()) v2 = "/sys/fs/cgroup" + path + tail;
    }
    return v2;
  }
  // VM groups with no process in them: a group must go with its QEMU.
  std::vector<std::string> emptyVmGroups() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cgroupRoot(), ec)) {
      if (!e.is_directory() || e.path().filename() == "spaced") continue;
      if (e.path().filename() == jail::kGatewayGroups) {
        // Each holds a gateway of a live sandbox (one that stays empty is a leftover).
        for (const auto& g : std::filesystem::directory_iterator(e.path(), ec)) {
          auto procs = readSmallFile(g.path().string() + "/cgroup.procs", 1 << 16);
          if (g.is_directory() && procs.ok() && procs->empty()) {
            out.push_back(std::string(jail::kGatewayGroups) + "/" + g.path().filename().string());
          }
        }
        continue;
      }
      auto procs = readSmallFile(e.path().string() + "/cgroup.procs", 1 << 16);
      if (procs.ok() && procs->empty()) out.push_back(e.path().filename().string());
    }
    return out;
  }
  // What of the host belongs to no live sandbox: "" if nothing. QEMUs and gateways must belong
  // to a running or paused sandbox, slots to one of those or to the spares, groups to a QEMU.
  std::string strays(const json& sandboxes, size_t spare_slots) const {
    std::set<std::string> live;
    for (const auto& sb : sandboxes) {
      if (sb["state"] == "running" || sb["state"] == "paused") live.insert(sb["id"].get<std::string>());
    }
    std::ostringstream out;
    for (pid_t pid : qemuProcessesUnder(data_dir_)) {
      bool mine = false;
      for (const auto& id : live) {
        for (pid_t p : qemuProcessesUnder(sandboxDir(id) + "/")) mine = mine || p == pid;
      }
      if (!mine) out << "QEMU " << pid << " owned by no running or paused sandbox; ";
    }
    for (pid_t pid : processesUnder(data_dir_, "space-gateway")) {
      bool mine = false;
      for (const auto& id : live) {
        for (pid_t p : processesUnder(data_dir_ + "/network/" + id + "/", "space-gateway")) mine = mine || p == pid;
      }
      if (!mine) out << "gateway " << pid << " owned by no running or paused sandbox; ";
    }
    if (slotsOnHost() > live.size() + spare_slots) {
      out << slotsOnHost() << " slots for " << live.size() << " live sandboxes and " << spare_slots << " spares; ";
    }
    for (const auto& group : emptyVmGroups()) out << "empty VM cgroup " << group << "; ";
    return out.str();
  }
};

TEST_F(SpacedSoakTest, RandomKillsLeaveEverySandboxUsableAndNothingBehind) {
  const int rounds = envNumber("SPACE_SOAK_ROUNDS", 6);
  const unsigned seed =
      static_cast<unsigned>(envNumber("SPACE_SOAK_SEED", static_cast<int>(std::random_device{}() >> 1)));
  std::cout << "soak: " << rounds << " rounds, SPACE_SOAK_SEED=" << seed << std::endl;
  std::mt19937 rng(seed);
  auto chance = [&](int percent) { return std::uniform_int_distribution<int>(0, 99)(rng) < percent; };
  auto anyOf = [&](const std::vector<std::string>& from) {
    return from.empty() ? std::string() : from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
  };
  const size_t spare_slots = 1;
  const std::vector<std::string> args = {"--on-shutdown", "keep", "--spare-slots", std::to_string(spare_slots)};
  const std::vector<std::string> faults = {"create.inserted",      "create.configured", "create.recorded",
                                           "delete.vm_removed",    "suspend.saved",     "suspend.recorded",
                                           "resume.restored",      "resume.recorded",   "resume.state_removed",
                                           "snapshot.disk_frozen", "snapshot.captured", "snapshot.sandbox_released",
                                           "snapshot.published",   "snapshot.recorded"};
  daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  // The template is built, and a snapshot taken, before anything is killed: a build cut short
  // on every round would leave nothing else to exercise.
  const std::string first = daemon_->create();
  ASSERT_FALSE(first.empty());
  daemon_->callJson("POST", "/v1/sandboxes/" + first + "/snapshots", json::object(), 201);
  int spaced_kills = 0, qemu_kills = 0, gateway_kills = 0, fault_deaths = 0, restored = 0, failed_seen = 0;

  for (int round = 0; round < rounds; ++round) {
    json sandboxes = list("sandboxes"), snapshots = list("snapshots");
    std::vector<std::string> running, paused, suspended, failed, snaps;
    for (const auto& sb : sandboxes) {
      const std::string id = sb["id"], state = sb["state"];
      (state == "running"     ? running
       : state == "paused"    ? paused
       : state == "suspended" ? suspended
                              : failed)
          .push_back(id);
    }
    for (const auto& snap : snapshots) snaps.push_back(snap["id"]);
    const size_t live = running.size() + paused.size() + suspended.size();

    // One operation, drawn by weight among those the node's state allows. Bounded: at most 4
    // live sandboxes and 3 snapshots, so the node never runs out and every round is a real
    // attempt; the weights keep every kind of operation common.
    std::string method = "POST", target, body, subject, what;
    std::vector<std::string> active = running;
    active.insert(active.end(), paused.begin(), paused.end());
    std::vector<std::string> any_live = active;
    any_live.insert(any_live.end(), suspended.begin(), suspended.end());
    const std::vector<std::pair<std::string, int>> weights = {
        {"delete failed", failed.empty()      ? 0
                          : failed.size() > 2 ? 6
                                              : 2},
        {"create", live == 0  ? 100
                   : live < 4 ? 3
                              : 0},
        {"delete", live >= 4  ? 6
                   : live > 0 ? 1
                              : 0},
        // The last snapshot stays: every round checks that one restores.
        {"delete snapshot", snaps.size() >= 3  ? 3
                            : snaps.size() < 2 ? 0
                                               : 1},
        {"branch", !snaps.empty() && live <= 2 ? 2 : 0},
        {"snapshot", !active.empty() && snaps.size() < 3 ? 3 : 0},
        {"suspend", active.empty() ? 0 : 2},
        {"resume suspended", suspended.empty() ? 0 : 3},
        {"pause", running.empty() ? 0 : 1},
        {"resume paused", paused.empty() ? 0 : 2},
        {"exec", running.empty() ? 0 : 2},
    };
    int total = 0;
    for (const auto& [name, weight] : weights) total += weight;
    for (int at = std::uniform_int_distribution<int>(0, total - 1)(rng); const auto& [name, weight] : weights) {
      if (at < weight) {
        what = name;
        break;
      }
      at -= weight;
    }
    if (what == "delete failed") {
      subject = anyOf(failed), method = "DELETE", target = "/v1/sandboxes/" + subject;
    } else if (what == "create") {
      const std::string from = snaps.empty() || chance(50) ? "" : anyOf(snaps);
      target = "/v1/sandboxes", what = from.empty() ? "create" : "create from " + from;
      body = (from.empty() ? json{{"cpus", 1}, {"memory_mb", 256}} : json{{"snapshot", from}}).dump();
    } else if (what == "delete") {
      subject = anyOf(any_live), method = "DELETE", target = "/v1/sandboxes/" + subject;
    } else if (what == "delete snapshot") {
      subject = anyOf(snaps), method = "DELETE", target = "/v1/snapshots/" + subject;
    } else if (what == "branch") {
      subject = anyOf(snaps), target = "/v1/snapshots/" + subject + "/branch", body = json{{"count", 2}}.dump();
    } else if (what == "snapshot") {
      subject = anyOf(active), target = "/v1/sandboxes/" + subject + "/snapshots", body = "{}";
    } else if (what == "suspend") {
      subject = anyOf(active), target = "/v1/sandboxes/" + subject + "/suspend";
    } else if (what == "resume suspended") {
      subject = anyOf(suspended), target = "/v1/sandboxes/" + subject + "/resume";
    } else if (what == "pause") {
      subject = anyOf(running), target = "/v1/sandboxes/" + subject + "/pause";
    } else if (what == "resume paused") {
      subject = anyOf(paused), target = "/v1/sandboxes/" + subject + "/resume";
    } else {
      subject = anyOf(running), target = "/v1/sandboxes/" + subject + "/exec";
      body = json{{"command", "echo round >> /home/user/rounds && sync"}}.dump();
    }

    // Who dies, and when: spaced most often (its recovery is what this exercises), else the
    // QEMU or the gateway of the operation's sandbox; in one round of five nobody, so that
    // what the operations make accumulates. Or, for an operation with named fault points,
    // spaced restarts armed to die at one of them: the steps a random instant rarely hits.
    std::vector<std::string> points;
    const std::string kind = what.substr(0, what.find(' '));
    for (const auto& f : faults) {
      if (f.rfind(kind + ".", 0) == 0 && what != "delete failed" && what != "delete snapshot" &&
          what != "resume paused") {
        points.push_back(f);
      }
    }
    const std::string fault = !points.empty() && chance(25) ? anyOf(points) : "";
    const int victim = fault.empty() ? std::uniform_int_distribution<int>(0, 99)(rng) : 100;
    const auto delay = milliseconds(fault.empty() ? std::uniform_int_distribution<int>(0, 1500)(rng) : 0);
    const std::string victim_name = !fault.empty() ? "spaced at " + fault
                                    : victim < 50  ? "spaced"
                                    : victim < 70  ? "qemu"
                                    : victim < 80  ? "gateway"
                                                   : "nobody";
    SCOPED_TRACE("round " + std::to_string(round) + " (SPACE_SOAK_SEED=" + std::to_string(seed) + "): " + what + " " +
                 subject + ", kill -9 of " + victim_name + " after " + std::to_string(delay.count()) + " ms");
    if (!fault.empty()) {
      daemon_->stop(SIGTERM);  // --on-shutdown keep: the sandboxes stay as they are
      ::setenv("SPACE_FAULT", fault.c_str(), 1);
      daemon_ = Daemon::start(data_dir_, args);
      ::unsetenv("SPACE_FAULT");
      ASSERT_TRUE(daemon_) << "spaced did not come back";
    }

    // Whoever else was usable before the round must still be after it (unless a QEMU or
    // gateway not the subject's was the one killed): a kill or fault in one sandbox's operation
    // must not fail the others.
    std::map<std::string, std::string> bystanders;
    for (const auto& sb : sandboxes) {
      if (sb["id"] != subject && sb["state"] != "failed") bystanders[sb["id"]] = sb["state"];
    }
    const std::string url = daemon_->url(), key = daemon_->key();
    auto request = std::async(std::launch::async, [=] { return tryCall(url, key, method, target, body); });
    std::this_thread::sleep_for(delay);
    bool spaced_killed = false;
    if (victim >= 80) {
      // nobody, or spaced itself at its fault point
    } else if (victim < 50) {
      if (daemon_->alive()) {
        daemon_->stop(SIGKILL);
        ++spaced_kills;
      } else if (request.wait_for(seconds(0)) != std::future_status::ready) {
        ADD_FAILURE() << "spaced died on its own before it was killed:\n" << daemon_->log();
      }
      spaced_killed = true;
    } else {
      // The subject's own process if it has one, else any of its kind on this node.
      const bool qemu = victim < 70;
      std::vector<pid_t> pids;
      if (!subject.empty() && subject.rfind("snap_", 0) != 0) {
        pids = qemu ? qemuProcessesUnder(sandboxDir(subject) + "/")
                    : processesUnder(data_dir_ + "/network/" + subject + "/", "space-gateway");
      }
      if (pids.empty()) {
        pids = qemu ? qemuProcessesUnder(data_dir_) : processesUnder(data_dir_, "space-gateway");
        bystanders.clear();  // the one killed may be anyone's
      }
      if (!pids.empty()) {
        ::kill(pids[std::uniform_int_distribution<size_t>(0, pids.size() - 1)(rng)], SIGKILL);
        ++(qemu ? qemu_kills : gateway_kills);
      }
    }
    ASSERT_EQ(request.wait_for(seconds(120)), std::future_status::ready) << "the request never ended";
    auto answer = request.get();
    std::cout << "soak round " << round << ": " << what << " " << subject << " -> "
              << (answer ? std::to_string(answer->status) : std::string("no answer")) << "; kill -9 " << victim_name
              << " at " << delay.count() << " ms" << std::endl;
    if (!fault.empty()) {
      if (daemon_->alive()) {
        daemon_->stop(SIGTERM);  // the operation ended before its fault point (refused, say)
      } else {
        // Dead at its fault point, and nowhere else: a crash must not pass for one.
        EXPECT_NE(daemon_->log().find("fault point reached, killing myself: " + fault), std::string::npos)
            << "spaced died, but not at " << fault << ":\n"
            << daemon_->log();
        ++fault_deaths;
      }
      spaced_killed = true;
    } else if (!spaced_killed) {
      EXPECT_TRUE(daemon_->alive()) << "spaced died on its own:\n" << daemon_->log();
      if (victim >= 80) {  // nobody killed: the operation answers, and not with an internal error
        EXPECT_TRUE(answer && answer->status != 500) << (answer ? answer->body : std::string("no answer")) << "\n"
                                                     << daemon_->log();
      }
    }
    if (spaced_killed) {
      daemon_ = Daemon::start(data_dir_, args);
      ASSERT_TRUE(daemon_) << "spaced did not come back";
    }

    // Every sandbox is in a state it can be used in, or failed with its reason.
    json settled;
    for (auto until = Clock::now() + seconds(20);;) {
      settled = list("sandboxes");
      bool creating = false;
      for (const auto& sb : settled) creating = creating || sb["state"] == "creating";
      if (!creating || Clock::now() > until) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
    for (const auto& sb : settled) {
      const std::string id = sb["id"], state = sb["state"];
      ASSERT_NE(state, "creating") << sb;
      if (auto was = bystanders.find(id); was != bystanders.end()) {
        EXPECT_NE(state, "failed") << "sandbox " << id << " was " << was->second
                                   << ", not the round's subject, and failed: " << sb << "\n"
                                   << daemon_->log();
      }
      if (state == "failed") {
        EXPECT_FALSE(sb.value("state_reason", std::string()).empty()) << sb;
        ++failed_seen;
        continue;
      }
      if (state != "running" && state != "paused") continue;
      // Usable, or (its QEMU was killed) failed within a few seconds: never a VM that is gone
      // behind a sandbox that looks alive.
      std::string now = state;
      bool usable = false;
      for (auto until = Clock::now() + seconds(15); !usable && now != "failed" && Clock::now() < until;) {
        if (now == "running") {
          auto r = tryCall(daemon_->url(), daemon_->key(), "POST", "/v1/sandboxes/" + id + "/exec",
                           json{{"command", "true"}, {"timeout_s", 30}}.dump());
          usable = r && r->status == 200 && json::parse(r->body, nullptr, false).value("exit_code", -1) == 0;
        } else {
          usable = !qemuProcessesUnder(sandboxDir(id) + "/").empty();
        }
        if (usable) break;
        std::this_thread::sleep_for(milliseconds(250));
        now = daemon_->callJson("GET", "/v1/sandboxes/" + id, nullptr, 200).value("state", "");
      }
      EXPECT_TRUE(usable || now == "failed") << "sandbox " << id << " was " << state << " but its VM is gone:\n"
                                             << daemon_->log();
    }
    // Nothing on the host without a live sandbox to own it (what is being torn down goes within
    // a few seconds).
    std::string left;
    for (auto until = Clock::now() + seconds(15); Clock::now() < until;
         std::this_thread::sleep_for(milliseconds(250))) {
      left = strays(list("sandboxes"), spare_slots);
      if (left.empty()) break;
    }
    EXPECT_EQ(left, "") << daemon_->log();
    // A snapshot that was recorded restores.
    json recorded = list("snapshots");
    if (!recorded.empty()) {
      const std::string snap = recorded[std::uniform_int_distribution<size_t>(0, recorded.size() - 1)(rng)]["id"];
      json child = daemon_->callJson("POST", "/v1/sandboxes", json{{"snapshot", snap}}, 201);
      ASSERT_EQ(child.value("state", ""), "running") << child;
      EXPECT_EQ(execJson(*daemon_, child["id"], json{{"command", "true"}}).value("exit_code", -1), 0);
      daemon_->callJson("DELETE", "/v1/sandboxes/" + child["id"].get<std::string>(), nullptr, 204);
      ++restored;
    }
    if (HasFatalFailure() || (HasFailure() && rounds > 20)) break;
  }
  std::cout << "soak: killed spaced " << spaced_kills << ", QEMU " << qemu_kills << ", gateway " << gateway_kills
            << "; died at a fault point " << fault_deaths << "; snapshots restored " << restored
            << "; failed sandboxes seen " << failed_seen << std::endl;

  // Everything deleted and spaced stopped: nothing of this node is left on the host.
  if (!daemon_->alive()) daemon_ = Daemon::start(data_dir_, args);
  ASSERT_TRUE(daemon_);
  // First, after the last round, every snapshot on record restores, not only a round's pick.
  int restored_at_end = 0;
  for (const auto& snap : list("snapshots")) {
    json child = daemon_->callJson("POST", "/v1/sandboxes", json{{"snapshot", snap["id"]}}, 201);
    ASSERT_EQ(child.value("state", ""), "running") << child;
    EXPECT_EQ(execJson(*daemon_, child["id"], json{{"command", "true"}}).value("exit_code", -1), 0);
    daemon_->callJson("DELETE", "/v1/sandboxes/" + child["id"].get<std::string>(), nullptr, 204);
    ++restored_at_end;
  }
  EXPECT_GE(restored_at_end, 1) << "the soak keeps its last snapshot";
  for (const auto& sb : list("sandboxes")) {
    daemon_->callJson("DELETE", "/v1/sandboxes/" + sb["id"].get<std::string>(), nullptr, 204);
  }
  for (const auto& snap : list("snapshots")) {
    daemon_->callJson("DELETE", "/v1/snapshots/" + snap["id"].get<std::string>(), nullptr, 204);
  }
  // Layers no snapshot or disk uses any more go in housekeeping's next pass.
  for (auto until = Clock::now() + seconds(30); Clock::now() < until; std::this_thread::sleep_for(milliseconds(200))) {
    std::error_code ec;
    if (!std::filesystem::exists(data_dir_ + "/layers", ec) || std::filesystem::is_empty(data_dir_ + "/layers", ec)) {
      break;
    }
  }
  ExitStatus stopped = daemon_->stop(SIGTERM);
  EXPECT_TRUE(!stopped.signaled && stopped.exit_code == 0) << stopped.describe();
  EXPECT_TRUE(qemuProcessesUnder(dir_->path()).empty());
  EXPECT_TRUE(processesUnder(dir_->path(), "space-gateway").empty());
  EXPECT_EQ(slotsOnHost(), 0u);
  EXPECT_EQ(mountsOfThisNode(), 0u);
  EXPECT_FALSE(std::filesystem::exists(cgroupRoot())) << cgroupRoot();
  for (const char* dir : {"sandboxes", "snapshots", "layers", "network"}) {
    std::string held;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(data_dir_ + "/" + dir, ec)) {
      held += e.path().filename().string() + " ";
    }
    EXPECT_EQ(held, "") << dir << " still holds these";
  }
}

}  // namespace space
