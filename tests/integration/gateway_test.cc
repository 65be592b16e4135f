// space-gateway end to end: the real binary between a "guest" namespace and a fake internet
// (tests/support/fake_internet.h), behind the very nftables ruleset slots load. Needs root.
//
//   guest ns (eth0 169.254.0.2/30) --veth-- slot ns (tap0 169.254.0.1/30, slot rules,
//   gateway listeners) ... gateway's upstream sockets in the fake internet's ns.
//
// Namespaces are named gwtest<pid>-*, so runs by others never collide; every test removes what
// it made in TearDown, and a suite start sweeps what crashed runs of this binary left.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/digest.h"
#include "common/fs.h"
#include "common/process.h"
#include "common/scope_guard.h"
#include "common/unix_socket.h"
#include "jail/cgroup.h"
#include "net/addressing.h"
#include "net/dns_message.h"
#include "net/gateway_egress.h"
#include "net/policy.h"
#include "net/sandbox_network.h"
#include "net/slot.h"
#include "net/tls_ca.h"
#include "support/fake_internet.h"

namespace space::net {
namespace {

using testsupport::CommandResult;
using testsupport::FakeInternet;
using testsupport::inNetns;
using testsupport::runCommand;
using Json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

double msSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string prefix() { return "gwtest" + std::to_string(getpid()); }

// What a guest TCP connection saw.
struct Probe {
  bool connected = false;
  std::string received;
  bool reset = false;      // ECONNRESET (the gateway's denial) or similar
  bool eof = false;        // orderly close
  bool timed_out = false;  // neither within the read limit
  double ms = 0;           // from connect until the close (or the limit)
};

// Reads until EOF, an error or `limit`; fills the outcome in `probe`.
void readToEnd(int fd, Probe& probe, std::chrono::milliseconds limit, SteadyClock::time_point start) {
  auto deadline = SteadyClock::now() + limit;
  for (;;) {
    int left = pollTimeoutMs(deadline);
    pollfd p{fd, POLLIN, 0};
    if (left == 0 || poll(&p, 1, left) == 0) {
      probe.timed_out = true;
      break;
    }
    char buf[65536];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      probe.received.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0)
      probe.eof = true;
    else
      probe.reset = true;
    break;
  }
  probe.ms = msSince(start);
}

class GatewayTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    sweepLeftovers();
    auto inet = FakeInternet::start(prefix());
    ASSERT_TRUE(inet.ok()) << inet.error().message;
    inet_ = inet.value().release();
  }
  static void TearDownTestSuite() {
    delete inet_;
    inet_ = nullptr;
  }

  // Namespaces of earlier runs of this binary that died before their TearDown (their pid is gone).
  static void sweepLeftovers() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
      std::string name = entry.path().filename();
      if (name.rfind("gwtest", 0) != 0) continue;
      std::string digits = name.substr(6, name.find('-') == std::string::npos ? std::string::npos : name.find('-') - 6);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
      if (kill(std::stoi(digits), 0) == 0 || errno != ESRCH) continue;
      runCommand({"ip", "netns", "delete", name});
      std::filesystem::remove_all("/etc/netns/" + name, ec);
    }
  }

  void SetUp() override {
    ASSERT_NE(inet_, nullptr);
    static int counter = 0;
    std::string base = prefix() + "-" + std::to_string(++counter);
    slot_ = base + "-slot";
    guest_ = base + "-guest";
    char dir[] = "/tmp/gwtest-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    // The gateway runs as nobody: it must read the policy. Its audit log's directory is root's,
    // as spaced makes it: the gateway opens both files of the log as root and rotates through
    // them, with no right to make a file (AuditLogIsBoundedByRotation).
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((dir_ + "/audit").c_str(), 0711), 0);
    policy_path_ = dir_ + "/policy.json";
    audit_path_ = dir_ + "/audit/audit.jsonl";

    sh({"ip", "netns", "add", slot_});
    slot_created_ = true;
    sh({"ip", "netns", "add", guest_});
    guest_created_ = true;
    sh({"ip", "link", "add", kTapName, "netns", slot_, "type", "veth", "peer", "name", "eth0", "netns", guest_});
    sh({"ip", "-n", slot_, "link", "set", "lo", "up"});
    sh({"ip", "-n", slot_, "link", "set", kTapName, "address", kTapMac});
    sh({"ip", "-n", slot_, "addr", "add", std::string(kGatewayIp) + "/" + std::to_string(kPrefixLength), "dev",
        kTapName});
    sh({"ip", "-n", slot_, "link", "set", kTapName, "up"});
    sh({"ip", "-n", guest_, "link", "set", "lo", "up"});
    sh({"ip", "-n", guest_, "link", "set", "eth0", "address", kGuestMac});
    sh({"ip", "-n", guest_, "addr", "add", std::string(kGuestIp) + "/" + std::to_string(kPrefixLength), "dev", "eth0"});
    sh({"ip", "-n", guest_, "link", "set", "eth0", "up"});
    sh({"ip", "-n", guest_, "route", "add", "default", "via", kGatewayIp});
    const std::string rules = dir_ + "/slot.nft";
    std::ofstream(rules) << SlotManager::rulesetText();
    sh({"ip", "netns", "exec", slot_, "nft", "-f", rules});
    // `ip netns exec` bind-mounts this over /etc/resolv.conf: the guest asks the gateway.
    std::filesystem::create_directories("/etc/netns/" + guest_);
    std::ofstream("/etc/netns/" + guest_ + "/resolv.conf") << "nameserver " << kGatewayIp << "\n";
  }

  void TearDown() override {
    if (gateway_) {
      if (HasFailure()) std::cerr << "--- gateway log ---\n" << readFile(dir_ + "/gateway.log") << "---\n";
      gateway_->kill();
      gateway_.reset();
    }
    if (guest_created_) runCommand({"ip", "netns", "delete", guest_});
    if (slot_created_) runCommand({"ip", "netns", "delete", slot_});
    std::error_code ec;
    if (!guest_.empty()) std::filesystem::remove_all("/etc/netns/" + guest_, ec);
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Runs a set-up command, failing the test if it fails.
  void sh(const std::vector<std::string>& argv) {
    CommandResult r = runCommand(argv);
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    ASSERT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
  }

  // As spaced does: write a temporary file, rename it over the policy.
  void writePolicy(const std::string& text) {
    const std::string tmp = policy_path_ + ".tmp";
    {
      std::ofstream out(tmp);
      out << text;
    }
    ASSERT_EQ(chmod(tmp.c_str(), 0644), 0);
    ASSERT_EQ(rename(tmp.c_str(), policy_path_.c_str()), 0);
  }
  void writePolicy(const Json& policy) { writePolicy(policy.dump()); }

  Result<ChildProcess> spawnGateway(const std::vector<std::string>& extra, int ready_fd) {
    std::vector<std::string> argv = {SPACE_GATEWAY_BIN,
                                     "--slot-netns",
                                     "/run/netns/" + slot_,
                                     "--upstream-netns",
                                     inet_->upstreamNetnsPath(),
                                     "--upstream-dns",
                                     inet_->dnsServer(),
                                     "--policy",
                                     policy_path_,
                                     "--audit",
                                     audit_path_,
                                     "--log-level",
                                     "debug"};
    if (ready_fd >= 0) {
      argv.push_back("--ready-fd");
      argv.push_back("3");
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    SpawnOptions options;
    options.stdout_path = dir_ + "/gateway.log";
    if (ready_fd >= 0) options.pass_fds = {{ready_fd, 3}};
    return ChildProcess::spawn(argv, options);
  }

  // Starts the gateway and waits for its "ready" line.
  void startGateway(const std::vector<std::string>& extra = {}) {
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
    UniqueFd read_end(fds[0]), write_end(fds[1]);
    auto child = spawnGateway(extra, write_end.get());
    ASSERT_TRUE(child.ok()) << child.error().message;
    write_end.reset();
    gateway_ = std::make_unique<ChildProcess>(std::move(child.value()));
    pollfd p{read_end.get(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1) << "no ready line: " << readFile(dir_ + "/gateway.log");
    char buf[16] = {};
    ssize_t n = read(read_end.get(), buf, sizeof buf);
    ASSERT_EQ(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), "ready\n") << readFile(dir_ + "/gateway.log");
  }

  std::vector<Json> audit(const std::string& path = "") const {
    std::vector<Json> out;
    std::istringstream lines(readFile(path.empty() ? audit_path_ : path));
    std::string line;
    while (std::getline(lines, line)) {
      Json j = Json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
      if (!j.is_discarded()) out.push_back(j);
    }
    return out;
  }

  // Waits (a few seconds at most) for an audit entry whose fields include all of `fields`.
  Json waitForAudit(const Json& fields) const {
    auto deadline = SteadyClock::now() + std::chrono::seconds(5);
    for (;;) {
      for (const auto& entry : audit()) {
        bool match = true;
        for (const auto& [key, value] : fields.items()) match = match && entry.contains(key) && entry[key] == value;
        if (match) return entry;
      }
      if (SteadyClock::now() > deadline) {
        ADD_FAILURE() << "no audit entry with " << fields.dump() << " in:\n" << readFile(audit_path_);
        return Json();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // --- What the guest does ---

  // A TCP socket of the guest connected to ip:port (through the slot's redirect to the gateway).
  UniqueFd guestConnect(const std::string& ip, uint16_t port) {
    UniqueFd fd;
    inNetns("/run/netns/" + guest_, [&] {
      fd = UniqueFd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      timeval limit{3, 0};
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fd.reset();
    });
    return fd;
  }

  // Connects, sends `data` (if any; then half-closes if `shut`), reads until the end.
  Probe probe(const std::string& ip, uint16_t port, const std::string& data,
              std::chrono::milliseconds limit = std::chrono::seconds(3), bool shut = false) {
    Probe out;
    auto start = SteadyClock::now();
    UniqueFd fd = guestConnect(ip, port);
    out.connected = fd.valid();
    if (!fd.valid()) return out;
    if (!data.empty()) send(fd.get(), data.data(), data.size(), MSG_NOSIGNAL);
    if (shut) shutdown(fd.get(), SHUT_WR);
    readToEnd(fd.get(), out, limit, start);
    return out;
  }

  static std::string httpGet(const std::string& host, const std::string& path = "/") {
    return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  }

  struct DnsReply {
    bool answered = false;
    int rcode = -1;
    int answers = 0;
    std::vector<std::string> ips;
    uint32_t ttl = 0;
    double ms = 0;
  };

  // One DNS question from the guest to `server` (any address: the slot redirects port 53).
  DnsReply query(const std::string& name, uint16_t qtype = dns::kTypeA, const std::string& server = kGatewayIp,
                 bool tcp = false) {
    DnsReply out;
    const uint16_t id = 0x4242;
    std::vector<uint8_t> message = buildQuery(id, name, qtype);
    std::vector<uint8_t> answer(kMaxDnsMessage);
    size_t got = 0;
    auto start = SteadyClock::now();
    inNetns("/run/netns/" + guest_, [&] {
      UniqueFd fd(socket(AF_INET, (tcp ? SOCK_STREAM : SOCK_DGRAM) | SOCK_CLOEXEC, 0));
      timeval limit{4, 0};
      setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(53);
      inet_pton(AF_INET, server.c_str(), &addr.sin_addr);
      if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
      std::vector<uint8_t> wire = message;
      if (tcp) {
        wire.insert(wire.begin(), {static_cast<uint8_t>(message.size() >> 8), static_cast<uint8_t>(message.size())});
      }
      if (send(fd.get(), wire.data(), wire.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(wire.size())) return;
      if (!tcp) {
        ssize_t n = recv(fd.get(), answer.data(), answer.size(), 0);
        got = n > 0 ? static_cast<size_t>(n) : 0;
        return;
      }
      uint8_t length[2];
      if (recv(fd.get(), length, 2, MSG_WAITALL) != 2) return;
      size_t want = (size_t{length[0]} << 8) | length[1];
      if (want > answer.size()) return;
      ssize_t n = recv(fd.get(), answer.data(), want, MSG_WAITALL);
      got = n == static_cast<ssize_t>(want) ? want : 0;
    });
    out.ms = msSince(start);
    if (got < 12) return out;
    out.answered = true;
    out.rcode = answer[3] & 0x0f;
    out.answers = (answer[6] << 8) | answer[7];
    if (qtype == dns::kTypeA && out.rcode == dns::kNoError) {
      auto parsed = parseAResponse(std::span<const uint8_t>(answer.data(), got), id, name);
      EXPECT_TRUE(parsed.ok()) << (parsed.ok() ? "" : parsed.error().message);
      if (parsed.ok()) {
        for (uint32_t ip : parsed->ipv4) out.ips.push_back(ipv4ToString(ip));
        out.ttl = parsed->ttl;
      }
    }
    return out;
  }

  // curl in the guest, with its resolv.conf (hence DNS through the gateway).
  CommandResult curl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"ip", "netns", "exec", guest_, "curl", "-sS", "--max-time", "5"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCommand(argv, std::chrono::seconds(15));
  }

  static Json policyMode(std::vector<std::string> allow, std::vector<std::string> deny = {}) {
    return Json{{"egress", "policy"}, {"allow", allow}, {"deny", deny}};
  }

  static inline FakeInternet* inet_ = nullptr;
  std::string slot_, guest_, dir_, policy_path_, audit_path_;
  bool slot_created_ = false, guest_created_ = false;
  std::unique_ptr<ChildProcess> gateway_;
};

// --- Allowed traffic ---

TEST_F(GatewayTest, AllowedNameOverHttp) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  CommandResult r = curl({"http://allowed.test/"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "server 198.51.100.10:80 host allowed.test\n");
  Json closed = waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"host", "allowed.test"}});
  EXPECT_EQ(closed["destination"], "198.51.100.10");
  EXPECT_EQ(closed["port"], 80);
  EXPECT_GT(closed["bytes_in"].get<int>(), 40);
  EXPECT_GT(closed["bytes_out"].get<int>(), 40);
  EXPECT_TRUE(closed.contains("duration_ms"));
  waitForAudit({{"kind", "dns"}, {"name", "allowed.test"}, {"allowed", true}});
}

TEST_F(GatewayTest, AllowedNameOverHttps) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  CommandResult r = curl({"--cacert", inet_->caPath(), "https://allowed.test/"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "server 198.51.100.10:443 host allowed.test\n");
  waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"sni", "allowed.test"}, {"port", 443}});
}

TEST_F(GatewayTest, ServerSpeaksFirstProtocolIsDecidedByAddressAndRelayed) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  UniqueFd fd = guestConnect(FakeInternet::kAllowedIp, FakeInternet::kBannerPort);
  ASSERT_TRUE(fd.valid());
  auto start = SteadyClock::now();
  std::string banner(strlen(FakeInternet::kBanner), '\0');
  timeval limit{3, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ASSERT_EQ(recv(fd.get(), banner.data(), banner.size(), MSG_WAITALL), static_cast<ssize_t>(banner.size()));
  EXPECT_EQ(banner, FakeInternet::kBanner);
  // Decided after the 300 ms of silence, not after the handshake timeout.
  EXPECT_LT(msSince(start), 1500);
  ASSERT_EQ(send(fd.get(), "abc", 3, MSG_NOSIGNAL), 3);
  char echo[3];
  ASSERT_EQ(recv(fd.get(), echo, 3, MSG_WAITALL), 3);
  EXPECT_EQ(std::string(echo, 3), "abc");
}

TEST_F(GatewayTest, HalfCloseIsRelayedAndBytesAreAudited) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  // Client speaks first with bytes that are neither TLS nor HTTP.
  const std::string data = "\x01\x02 ping";
  Probe p = probe(FakeInternet::kAllowedIp, FakeInternet::kEchoPort, data, std::chrono::seconds(3), true);
  ASSERT_TRUE(p.connected);
  EXPECT_EQ(p.received, data);
  EXPECT_TRUE(p.eof) << "the server's close must arrive as a FIN";
  Json closed = waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"port", FakeInternet::kEchoPort}});
  EXPECT_EQ(closed["bytes_out"], data.size());
  EXPECT_EQ(closed["bytes_in"], data.size());
  EXPECT_EQ(closed["end"], "closed");
}

// --- DNS ---

TEST_F(GatewayTest, DeniedNameIsNxdomainAtOnceAndAudited) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  int asked_before = inet_->dnsQueries();
  DnsReply r = query("denied.test");
  ASSERT_TRUE(r.answered);
  EXPECT_EQ(r.rcode, dns::kNxDomain);
  EXPECT_LT(r.ms, 1000);
  EXPECT_EQ(inet_->dnsQueries(), asked_before) << "a denied name must not reach the upstream resolver";
  waitForAudit({{"kind", "dns"}, {"allowed", false}, {"name", "denied.test"}, {"qtype", dns::kTypeA}});
  CommandResult c = curl({"http://denied.test/"});
  EXPECT_EQ(c.exit_code, 6) << "curl: could not resolve: " << c.output;
}

TEST_F(GatewayTest, AllowedNameResolvesAndOtherTypesGetNoData) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  DnsReply a = query("allowed.test");
  ASSERT_TRUE(a.answered);
  EXPECT_EQ(a.rcode, dns::kNoError);
  EXPECT_EQ(a.ips, std::vector<std::string>{FakeInternet::kAllowedIp});
  DnsReply aaaa = query("allowed.test", dns::kTypeAaaa);
  ASSERT_TRUE(aaaa.answered);
  EXPECT_EQ(aaaa.rcode, dns::kNoError);
  EXPECT_EQ(aaaa.answers, 0);
  DnsReply refused = query("bad_name!.test");
  ASSERT_TRUE(refused.answered);
  EXPECT_EQ(refused.rcode, dns::kRefused);
}

TEST_F(GatewayTest, AnswerTtlIsClampedToAtLeastThirtySeconds) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  DnsReply r = query("short-ttl.test");
  ASSERT_EQ(r.rcode, dns::kNoError);
  EXPECT_EQ(r.ttl, 30u);
}

TEST_F(GatewayTest, UpstreamFailureIsServfail) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  DnsReply failed = query("servfail.test");
  ASSERT_TRUE(failed.answered);
  EXPECT_EQ(failed.rcode, dns::kServFail);
  DnsReply silent = query("silent.test");
  ASSERT_TRUE(silent.answered) << "the gateway answers even when its resolver does not";
  EXPECT_EQ(silent.rcode, dns::kServFail);
  EXPECT_GT(silent.ms, 1500);
  EXPECT_LT(silent.ms, 3500);
  DnsReply missing = query("nonexistent.test");
  EXPECT_EQ(missing.rcode, dns::kNxDomain);
}

TEST_F(GatewayTest, RebindingAnswersAreFiltered) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  DnsReply rebind = query("rebind.test");
  ASSERT_TRUE(rebind.answered);
  EXPECT_EQ(rebind.rcode, dns::kNxDomain);
  EXPECT_TRUE(rebind.ips.empty());
  DnsReply meta = query("meta.test");
  EXPECT_EQ(meta.rcode, dns::kNxDomain);
  DnsReply mixed = query("mixed.test");
  ASSERT_EQ(mixed.rcode, dns::kNoError);
  EXPECT_EQ(mixed.ips, std::vector<std::string>{FakeInternet::kAllowedIp});
  waitForAudit({{"kind", "dns"}, {"name", "rebind.test"}, {"allowed", false}, {"reason", "rebinding"}});
  Json partial = waitForAudit({{"kind", "dns"}, {"name", "mixed.test"}, {"allowed", true}});
  EXPECT_EQ(partial["filtered"], Json::array({FakeInternet::kPrivateIp}));
}

TEST_F(GatewayTest, DnsToAnyResolverAddressIsAnsweredByTheGateway) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  // A resolver the guest picked itself (a documentation address: nothing is sent anywhere).
  const std::string elsewhere = "203.0.113.53";
  DnsReply udp = query("allowed.test", dns::kTypeA, elsewhere);
  ASSERT_TRUE(udp.answered);
  EXPECT_EQ(udp.ips, std::vector<std::string>{FakeInternet::kAllowedIp});
  DnsReply denied = query("denied.test", dns::kTypeA, elsewhere);
  EXPECT_EQ(denied.rcode, dns::kNxDomain);
  DnsReply tcp = query("allowed.test", dns::kTypeA, elsewhere, true);
  ASSERT_TRUE(tcp.answered) << "DNS over TCP";
  EXPECT_EQ(tcp.ips, std::vector<std::string>{FakeInternet::kAllowedIp});
  DnsReply tcp_denied = query("denied.test", dns::kTypeA, elsewhere, true);
  EXPECT_EQ(tcp_denied.rcode, dns::kNxDomain);
}

// --- Policy ---

TEST_F(GatewayTest, PolicyModeAllowsOnlyTheAllowList) {
  writePolicy(policyMode({"allowed.test", "www.allowed.test"}, {}));
  startGateway();
  EXPECT_EQ(curl({"http://allowed.test/"}).exit_code, 0);
  EXPECT_EQ(curl({"http://www.allowed.test/"}).exit_code, 0);
  CommandResult other = curl({"http://other.test/"});
  EXPECT_EQ(other.exit_code, 6) << other.output;
  waitForAudit({{"kind", "dns"}, {"allowed", false}, {"name", "other.test"}, {"reason", "not-allowed"}});
}

TEST_F(GatewayTest, PolicyChangeAppliesToTheNextConnection) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  EXPECT_EQ(curl({"http://other.test/"}).exit_code, 6);
  writePolicy(policyMode({"allowed.test", "other.test"}));
  CommandResult now_allowed = curl({"http://other.test/"});
  EXPECT_EQ(now_allowed.exit_code, 0) << now_allowed.output;
  EXPECT_EQ(now_allowed.output, "server 203.0.113.30:80 host other.test\n");
  // A broken file keeps the policy in force, and says so once.
  writePolicy(std::string("{\"egress\": \"sideways\""));
  EXPECT_EQ(curl({"http://other.test/"}).exit_code, 0);
  EXPECT_EQ(curl({"http://allowed.test/"}).exit_code, 0);
  waitForAudit({{"kind", "gateway"}, {"reason", "policy-reload-failed"}});
  int failures = 0;
  for (const auto& e : audit()) failures += e["reason"] == "policy-reload-failed";
  EXPECT_EQ(failures, 1);
  writePolicy(Json{{"egress", "deny"}});
  EXPECT_NE(curl({"http://allowed.test/"}).exit_code, 0);
  Probe p = probe(FakeInternet::kAllowedIp, 80, httpGet("allowed.test"));
  EXPECT_TRUE(p.received.empty());
}

TEST_F(GatewayTest, DomainFrontingIsDeniedInPolicyMode) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  // Control: the claimed name towards its own pinned address passes.
  CommandResult honest = curl(
      {"--cacert", inet_->caPath(), "--connect-to", "allowed.test:443:198.51.100.10:443", "https://allowed.test/"});
  EXPECT_EQ(honest.exit_code, 0) << honest.output;
  // SNI allowed.test towards denied.test's address (its server would accept it: the
  // certificate covers both names).
  CommandResult fronted = curl(
      {"--cacert", inet_->caPath(), "--connect-to", "allowed.test:443:198.51.100.20:443", "https://allowed.test/"});
  EXPECT_NE(fronted.exit_code, 0) << fronted.output;
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"sni", "allowed.test"}, {"destination", "198.51.100.20"}});
  // Host allowed.test towards another address.
  Probe host = probe(FakeInternet::kOtherIp, 80, httpGet("allowed.test"));
  ASSERT_TRUE(host.connected);
  EXPECT_TRUE(host.received.empty()) << host.received;
  EXPECT_TRUE(host.reset);
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"host", "allowed.test"}, {"destination", "203.0.113.30"}});
}

// A client that stays silent past the quiet window is decided by address, but the name its
// first bytes then claim is judged all the same: waiting buys no way around the name check.
TEST_F(GatewayTest, AClaimMadeAfterTheQuietWindowIsStillJudged) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  auto lateRequest = [&](const std::string& host) {
    UniqueFd fd = guestConnect(FakeInternet::kAllowedIp, 80);
    EXPECT_TRUE(fd.valid());
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // past the 300 ms window
    const std::string request = httpGet(host);
    EXPECT_EQ(send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
    timeval limit{3, 0};
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd.get(), buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  };
  EXPECT_NE(lateRequest("allowed.test").find("host allowed.test"), std::string::npos);
  waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"host", "allowed.test"}, {"destination", "198.51.100.10"}});
  EXPECT_EQ(lateRequest("denied.test"), "");
  Json denied = waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"host", "denied.test"}});
  EXPECT_NE(denied.value("detail", "").find("claimed after the quiet window"), std::string::npos) << denied.dump();
}

TEST_F(GatewayTest, IpLiteralIsDeniedInPolicyModeOnAnyPort) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  CommandResult http = curl({"http://198.51.100.10/"});
  EXPECT_NE(http.exit_code, 0) << http.output;
  for (uint16_t port : {uint16_t{80}, uint16_t{443}, FakeInternet::kBannerPort, FakeInternet::kEchoPort}) {
    Probe p = probe(FakeInternet::kAllowedIp, port, port == 80 ? httpGet("198.51.100.10") : "");
    ASSERT_TRUE(p.connected);
    EXPECT_TRUE(p.received.empty()) << port << ": " << p.received;
    EXPECT_TRUE(p.reset || p.eof) << port;
    EXPECT_LT(p.ms, 1000) << port;
    waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"destination", "198.51.100.10"}, {"port", port}});
  }
}

TEST_F(GatewayTest, MetadataAndPrivateRangesAreDeniedEvenInAllowMode) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  // Control: in allow mode an unpinned public address is reachable.
  Probe open = probe(FakeInternet::kOtherIp, 80, httpGet("other.test"));
  EXPECT_EQ(open.received.substr(0, 15), "HTTP/1.1 200 OK") << open.received;
  for (const char* ip : {FakeInternet::kMetadataIp, FakeInternet::kPrivateIp}) {
    Probe p = probe(ip, 80, httpGet(ip));
    ASSERT_TRUE(p.connected);
    EXPECT_TRUE(p.received.empty()) << ip << ": " << p.received;
    EXPECT_TRUE(p.reset) << ip;
    EXPECT_LT(p.ms, 1000) << ip;
    // Link-local (metadata) is never reachable; a private range only where the node opens it.
    const std::string reason = std::string(ip) == FakeInternet::kMetadataIp ? "never-reachable" : "forbidden-range";
    waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"destination", ip}, {"reason", reason}});
  }
  EXPECT_EQ(query("meta.test").rcode, dns::kNxDomain);
}

// A tenant's allow CIDR opens a private range only where the node lets it (--openable-cidr),
// and never the gateway's own host: an address of its upstream namespace is refused whatever
// the policy, since it would reach the host's services over its loopback path.
TEST_F(GatewayTest, TenantCidrsOpenOnlyWhatTheNodeAllowsAndNeverTheHost) {
  writePolicy(Json{{"egress", "policy"}, {"allow", {"0.0.0.0/0"}}});
  startGateway();
  Probe closed = probe(FakeInternet::kPrivateIp, 80, httpGet(FakeInternet::kPrivateIp));
  EXPECT_TRUE(closed.reset);
  waitForAudit(
      {{"kind", "tcp"}, {"allowed", false}, {"destination", FakeInternet::kPrivateIp}, {"reason", "forbidden-range"}});
  Probe host = probe(FakeInternet::kUplinkIp, 80, httpGet(FakeInternet::kUplinkIp));
  EXPECT_TRUE(host.reset);
  waitForAudit(
      {{"kind", "tcp"}, {"allowed", false}, {"destination", FakeInternet::kUplinkIp}, {"reason", "local-address"}});
  gateway_->kill();
  startGateway({"--openable-cidr", "10.0.0.0/24"});
  Probe opened = probe(FakeInternet::kPrivateIp, 80, httpGet(FakeInternet::kPrivateIp));
  EXPECT_EQ(opened.received.substr(0, 15), "HTTP/1.1 200 OK") << opened.received;
}

// --- What the sniffer refuses ---

TEST_F(GatewayTest, TlsWithoutSniIsDeniedInPolicyMode) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  auto openssl = [&](bool sni) {
    std::vector<std::string> argv = {"ip",
                                     "netns",
                                     "exec",
                                     guest_,
                                     "openssl",
                                     "s_client",
                                     "-connect",
                                     "198.51.100.10:443",
                                     "-CAfile",
                                     inet_->caPath(),
                                     "-verify_return_error"};
    if (sni) {
      argv.insert(argv.end(), {"-servername", "allowed.test"});
    } else {
      argv.push_back("-noservername");
    }
    return runCommand(argv, std::chrono::seconds(10));
  };
  CommandResult bare = openssl(false);
  EXPECT_NE(bare.exit_code, 0) << bare.output;
  Json denied = waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"destination", "198.51.100.10"}, {"port", 443}});
  EXPECT_EQ(denied["detail"], "TLS without SNI");
  // Control: with SNI (and the name resolved through the gateway) the handshake completes.
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  CommandResult named = openssl(true);
  EXPECT_EQ(named.exit_code, 0) << named.output;
}

TEST_F(GatewayTest, ConnectMethodIsRefused) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  Probe p = probe(FakeInternet::kAllowedIp, 80, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n");
  EXPECT_TRUE(p.received.empty()) << p.received;
  EXPECT_TRUE(p.reset);
  EXPECT_LT(p.ms, 1000);
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"reason", "malformed"}, {"port", 80}});
}

TEST_F(GatewayTest, OversizedHostIsRefused) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  std::string host(300, 'a');
  host += ".test";
  Probe p = probe(FakeInternet::kAllowedIp, 80, httpGet(host));
  EXPECT_TRUE(p.received.empty()) << p.received;
  EXPECT_TRUE(p.reset);
  EXPECT_LT(p.ms, 1000);
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"reason", "malformed"}});
}

TEST_F(GatewayTest, UpstreamConnectFailureResetsTheGuest) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  // Allowed (a public address), but nothing in the fake internet has it: no route.
  Probe p = probe("203.0.113.99", 80, httpGet("nowhere.test"));
  ASSERT_TRUE(p.connected);
  EXPECT_TRUE(p.received.empty());
  EXPECT_TRUE(p.reset);
  EXPECT_LT(p.ms, 1000);
  Json entry = waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"destination", "203.0.113.99"}});
  EXPECT_NE(entry["end"].get<std::string>().find("connect"), std::string::npos) << entry.dump();
}

// --- Limits ---

TEST_F(GatewayTest, DnsOverTcpFramingIsBounded) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway({"--handshake-timeout-ms", "800"});
  auto closedWithin = [&](const std::string& bytes) {
    UniqueFd fd = guestConnect(kGatewayIp, 53);
    if (!fd.valid()) return -1.0;
    auto start = SteadyClock::now();
    send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    Probe p;
    readToEnd(fd.get(), p, std::chrono::seconds(3), start);
    return p.timed_out || !p.received.empty() ? -1.0 : p.ms;
  };
  // A length past the largest message: closed at once.
  double oversized = closedWithin(std::string("\xff\xff", 2));
  EXPECT_GE(oversized, 0);
  EXPECT_LT(oversized, 300);
  // A length, then nothing: closed at the handshake timeout.
  double stalled = closedWithin(std::string("\x00\x20", 2));
  EXPECT_GT(stalled, 700);
  EXPECT_LT(stalled, 1500);
}

TEST_F(GatewayTest, SlowlorisIsCutAtTheHandshakeTimeout) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway({"--handshake-timeout-ms", "800"});
  UniqueFd fd = guestConnect(FakeInternet::kAllowedIp, 80);
  ASSERT_TRUE(fd.valid());
  auto start = SteadyClock::now();
  const std::string head = httpGet("allowed.test");
  bool cut = false;
  // One byte every 100 ms: the head would take seconds; the gateway must not wait for it.
  for (size_t i = 0; i < head.size() && msSince(start) < 5000; ++i) {
    if (send(fd.get(), &head[i], 1, MSG_NOSIGNAL) != 1) {
      cut = true;
      break;
    }
    pollfd p{fd.get(), POLLIN, 0};
    if (poll(&p, 1, 100) == 1) {
      char c;
      if (recv(fd.get(), &c, 1, MSG_DONTWAIT) <= 0) {
        cut = true;
        break;
      }
    }
  }
  double ms = msSince(start);
  EXPECT_TRUE(cut);
  EXPECT_GT(ms, 700);
  EXPECT_LT(ms, 1500);
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"reason", "handshake-timeout"}});
}

TEST_F(GatewayTest, IdleRelayedConnectionIsClosed) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway({"--idle-timeout-ms", "600"});
  Probe p = probe(FakeInternet::kAllowedIp, FakeInternet::kBannerPort, "", std::chrono::seconds(4));
  EXPECT_EQ(p.received, FakeInternet::kBanner);
  EXPECT_FALSE(p.timed_out);
  // 300 ms of silence to decide, then 600 ms idle.
  EXPECT_GT(p.ms, 800);
  EXPECT_LT(p.ms, 2500);
  waitForAudit({{"kind", "tcp"}, {"allowed", true}, {"end", "idle timeout"}});
}

TEST_F(GatewayTest, MaxConnectionsResetsTheExcessAndRecovers) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway({"--max-connections", "3"});
  auto openWithBanner = [&](UniqueFd& fd) {
    fd = guestConnect(FakeInternet::kAllowedIp, FakeInternet::kBannerPort);
    if (!fd.valid()) return false;
    Probe p;
    std::string banner(strlen(FakeInternet::kBanner), '\0');
    timeval limit{2, 0};
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    return recv(fd.get(), banner.data(), banner.size(), MSG_WAITALL) == static_cast<ssize_t>(banner.size());
  };
  UniqueFd held[3];
  for (auto& fd : held) ASSERT_TRUE(openWithBanner(fd));
  Probe excess = probe(FakeInternet::kAllowedIp, FakeInternet::kBannerPort, "", std::chrono::seconds(2));
  EXPECT_TRUE(excess.received.empty()) << excess.received;
  EXPECT_TRUE(excess.reset);
  EXPECT_LT(excess.ms, 1000);
  waitForAudit({{"kind", "tcp"}, {"allowed", false}, {"reason", "max-connections"}});
  // Freed room is usable again once the gateway has seen the close.
  held[0].reset();
  bool recovered = false;
  for (auto deadline = SteadyClock::now() + std::chrono::seconds(3); !recovered && SteadyClock::now() < deadline;) {
    UniqueFd again;
    recovered = openWithBanner(again);
  }
  EXPECT_TRUE(recovered);
}

// Its address space is bounded (RLIMIT_AS: 64 MiB + 1 MiB per connection), and the bound
// leaves room for its whole maximum of relayed connections: each of 256 gets the server's
// banner. The peak is printed for bench/RESULTS.md.
TEST_F(GatewayTest, ItsMaximumOfConnectionsFitsItsAddressSpace) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();  // the default: 256 connections
  auto statusField = [&](const std::string& name) {
    const std::string status = readFile("/proc/" + std::to_string(gateway_->pid()) + "/status");
    const size_t at = status.find("\n" + name + ":");
    return at == std::string::npos ? std::string() : status.substr(at + 1, status.find('\n', at + 1) - at - 1);
  };
  const std::string idle = statusField("VmPeak");
  // All opened first: the gateway waits a quiet window on each before the server speaks.
  std::vector<UniqueFd> held;
  for (int i = 0; i < 256; ++i) {
    held.push_back(guestConnect(FakeInternet::kAllowedIp, FakeInternet::kBannerPort));
    ASSERT_TRUE(held.back().valid()) << i;
  }
  for (size_t i = 0; i < held.size(); ++i) {
    std::string banner(strlen(FakeInternet::kBanner), '\0');
    timeval limit{10, 0};
    setsockopt(held[i].get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    ASSERT_EQ(recv(held[i].get(), banner.data(), banner.size(), MSG_WAITALL), static_cast<ssize_t>(banner.size())) << i;
  }
  std::cout << "gateway, idle: " << idle << "; with 256 connections: " << statusField("VmPeak") << ", "
            << statusField("VmHWM") << std::endl;
  EXPECT_TRUE(gateway_->tryWait() == std::nullopt) << "the gateway exited: " << readFile(dir_ + "/gateway.log");
}

TEST_F(GatewayTest, BandwidthIsLimited) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway({"--max-bytes-per-s", "1000000"});
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  Probe p = probe(FakeInternet::kAllowedIp, 80, httpGet("allowed.test", "/bytes/2000000"), std::chrono::seconds(8));
  EXPECT_GT(p.received.size(), 2000000u);
  EXPECT_TRUE(p.eof);
  // 2 MB at 1 MB/s, less the 250 KB burst.
  EXPECT_GT(p.ms, 1500);
}

TEST_F(GatewayTest, OtherUdpIsDropped) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  bool echoed = true;
  inNetns("/run/netns/" + guest_, [&] {
    UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(FakeInternet::kUdpEchoPort);
    inet_pton(AF_INET, FakeInternet::kAllowedIp, &addr.sin_addr);
    sendto(fd.get(), "x", 1, 0, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    pollfd p{fd.get(), POLLIN, 0};
    echoed = poll(&p, 1, 400) == 1;
  });
  EXPECT_FALSE(echoed);
}

// --- The process ---

TEST_F(GatewayTest, RunsWithoutAnyCapability) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  std::string status = readFile("/proc/" + std::to_string(gateway_->pid()) + "/status");
  auto field = [&](const std::string& name) {
    size_t at = status.find("\n" + name + ":");
    if (at == std::string::npos) return std::string();
    size_t start = status.find_first_not_of(" \t", at + name.size() + 2);
    return status.substr(start, status.find('\n', start) - start);
  };
  EXPECT_EQ(field("CapEff"), "0000000000000000");
  EXPECT_EQ(field("CapPrm"), "0000000000000000");
  EXPECT_EQ(field("CapInh"), "0000000000000000");
  EXPECT_EQ(field("CapBnd"), "0000000000000000");
  EXPECT_EQ(field("CapAmb"), "0000000000000000");
  EXPECT_EQ(field("NoNewPrivs"), "1");
  // Under SPACE's seccomp filter (jail/seccomp_policy.h, tested in SeccompPolicy.*), on every
  // thread: mode 2 is a filter.
  EXPECT_EQ(field("Seccomp"), "2");
  EXPECT_EQ(field("Seccomp_filters"), "1");
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(gateway_->pid()) + "/task")) {
    EXPECT_NE(readFile(task.path().string() + "/status").find("\nSeccomp:\t2\n"), std::string::npos) << task.path();
  }
  // No process of its own (the filter refuses fork) and one task for its uid: soft and hard
  // RLIMIT_NPROC of 1 (no thread either), which a process without capabilities cannot raise;
  // likewise its address space.
  const std::string limits = readFile("/proc/" + std::to_string(gateway_->pid()) + "/limits");
  // A limit's soft and hard values, as /proc/PID/limits shows them.
  auto limit = [&](const std::string& name) {
    std::pair<std::string, std::string> values;
    const size_t at = limits.find(name);
    EXPECT_NE(at, std::string::npos) << name << " in " << limits;
    if (at == std::string::npos) return values;
    std::istringstream fields(limits.substr(at + name.size()));
    fields >> values.first >> values.second;
    return values;
  };
  using Values = std::pair<std::string, std::string>;
  EXPECT_EQ(limit("Max processes"), Values("1", "1"));
  // Its memory: 64 MiB and 1 MiB for each of its (default) 256 connections.
  EXPECT_EQ(limit("Max address space"), Values(std::to_string(320u << 20), std::to_string(320u << 20)));
  // Each file it writes (audit log, its rotation, its own log) at most the audit log's 1 MiB
  // and 4 MiB of room.
  EXPECT_EQ(limit("Max file size"), Values(std::to_string(5u << 20), std::to_string(5u << 20)));
  // Its descriptors (socket buffers are kernel memory): two per connection and 256, soft and hard.
  EXPECT_EQ(limit("Max open files"), Values("768", "768"));
  // Its files confined to reading its own directory (jail/landlock.h, FsConfinementTest.*):
  // it makes no file anywhere.
  EXPECT_NE(readFile(dir_ + "/gateway.log").find("files confined to " + dir_ + " (read), /usr (read)"),
            std::string::npos)
      << readFile(dir_ + "/gateway.log");
  passwd* nobody = getpwnam("nobody");
  ASSERT_NE(nobody, nullptr);
  std::string uid = std::to_string(nobody->pw_uid);
  EXPECT_EQ(field("Uid"), uid + "\t" + uid + "\t" + uid + "\t" + uid);
  EXPECT_EQ(field("Groups"), "");
}

// The whole of a gateway's confinement, applied by the code every gateway runs
// (gateway/confinement.h), then tried from inside as a compromised gateway would try it: each
// step alone is tested elsewhere, this fails if any is left out of the sequence.
TEST_F(GatewayTest, ItsProbeFindsEveryPartOfItsConfinementInPlace) {
  const std::string scratch = dir_ + "/probe";
  ASSERT_EQ(mkdir(scratch.c_str(), 0700), 0);
  SpawnOptions options;
  options.stdout_path = dir_ + "/probe.json";
  options.stderr_path = dir_ + "/probe.log";
  auto child =
      ChildProcess::spawn({SPACE_GATEWAY_BIN, "--probe-confinement", scratch, "--user", "#1499999999"}, options);
  ASSERT_TRUE(child.ok()) << child.error().message;
  auto status = child->waitFor(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  const std::string text = readFile(dir_ + "/probe.json");
  EXPECT_EQ(status->exit_code, 0) << text << readFile(dir_ + "/probe.log");
  auto report = Json::parse(text, nullptr, false);
  ASSERT_TRUE(report.is_object()) << text << readFile(dir_ + "/probe.log");
  EXPECT_GE(report.value("landlock_abi", 0), 1) << "this kernel has Landlock (FsConfinementTest)";
  EXPECT_EQ(report.value("confined", false), true);
  const std::vector<std::string> expected = {"become_root",
                                             "fork",
                                             "thread",
                                             "exec",
                                             "debug",
                                             "new_namespace",
                                             "listen",
                                             "bind",
                                             "choose_port",
                                             "unix_socket",
                                             "diagnose_sockets",
                                             "routing_netlink",
                                             "more_descriptors",
                                             "async_io",
                                             "shared_memory",
                                             "memory_beyond_its_bound",
                                             "file_beyond_its_bound",
                                             "disk_reserved_by_ioctl",
                                             "disk_reserved_beyond_its_bound",
                                             "make_file_in_own_dir",
                                             "make_file_in_tmp",
                                             "make_file_in_dev_shm",
                                             "read_host_file",
                                             "read_proc"};
  ASSERT_TRUE(report["checks"].is_object()) << text;
  EXPECT_EQ(report["checks"].size(), expected.size()) << text;
  for (const std::string& name : expected) {
    ASSERT_TRUE(report["checks"].contains(name)) << name;
    EXPECT_EQ(report["checks"][name].value("refused", false), true) << name << ": " << report["checks"][name].dump();
  }
  // What a gateway needs stays readable: the host's trust store (where the host has one), which
  // lies in /etc/ssl behind a link from /usr/lib/ssl.
  EXPECT_EQ(report.value("works", false), true) << text;
  const Json& trust_store = report["needs"]["trust_store"];
  ASSERT_TRUE(trust_store.is_object()) << text;
  const std::string path = trust_store.value("path", "");
  EXPECT_FALSE(path.empty()) << text;
  EXPECT_EQ(trust_store.value("readable", false), std::filesystem::exists(path)) << text;
  const std::string dir = report["needs"]["trust_store_dir"].value("path", "");
  EXPECT_FALSE(dir.empty()) << text;
  EXPECT_EQ(report["needs"]["trust_store_dir"].value("readable", false), std::filesystem::is_directory(dir)) << text;
  // It left nothing behind: its file was unnamed, and each file it made it would have removed.
  EXPECT_TRUE(std::filesystem::is_empty(scratch));
}

// A trust store outside /etc/ssl and /usr (SSL_CERT_FILE, as OpenSSL reads it; another
// distribution's default) stays readable to a confined gateway: its directory, where the path's
// links lead, is added to what the gateway may read.
TEST_F(GatewayTest, ATrustStoreElsewhereStaysReadableUnderConfinement) {
  char trust_template[] = "/tmp/space-trust-XXXXXX";
  ASSERT_NE(mkdtemp(trust_template), nullptr);
  const std::string trust = trust_template;
  ScopeGuard trust_goes([&] { std::filesystem::remove_all(trust); });
  ASSERT_EQ(chmod(trust.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((trust + "/real").c_str(), 0755), 0);
  {
    std::ofstream bundle(trust + "/real/bundle.pem");
    bundle << "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  }
  ASSERT_EQ(chmod((trust + "/real/bundle.pem").c_str(), 0644), 0);
  // Reached through a link, as Debian's /usr/lib/ssl/cert.pem is.
  ASSERT_EQ(symlink((trust + "/real/bundle.pem").c_str(), (trust + "/link.pem").c_str()), 0);
  // And a directory of certificates, named in a list (':'-separated, as OpenSSL reads it),
  // whose hashed name links to a sibling that links to a certificate in a directory of its own,
  // as c_rehash and update-ca-certificates make them (that directory's other files stay
  // closed), and a broken link, which is passed over.
  ASSERT_EQ(mkdir((trust + "/hashed").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((trust + "/local").c_str(), 0755), 0);
  for (const char* name : {"/local/ca.pem", "/local/other.pem"}) {
    std::ofstream pem(trust + name);
    pem << "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  }
  ASSERT_EQ(chmod((trust + "/local/ca.pem").c_str(), 0644), 0);
  ASSERT_EQ(chmod((trust + "/local/other.pem").c_str(), 0644), 0);
  ASSERT_EQ(symlink((trust + "/local/ca.pem").c_str(), (trust + "/hashed/ca.pem").c_str()), 0);
  ASSERT_EQ(symlink("ca.pem", (trust + "/hashed/9d66eef0.0").c_str()), 0);
  // And one whose path lies under a reachable directory (real/, the bundle's) but whose file,
  // through a directory link there, does not: it needs its rule.
  ASSERT_EQ(mkdir((trust + "/elsewhere").c_str(), 0755), 0);
  {
    std::ofstream pem(trust + "/elsewhere/x.pem");
    pem << "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  }
  ASSERT_EQ(chmod((trust + "/elsewhere/x.pem").c_str(), 0644), 0);
  ASSERT_EQ(symlink((trust + "/elsewhere").c_str(), (trust + "/real/via").c_str()), 0);
  ASSERT_EQ(symlink((trust + "/real/via/x.pem").c_str(), (trust + "/hashed/22222222.0").c_str()), 0);
  ASSERT_EQ(symlink((trust + "/local/gone.pem").c_str(), (trust + "/hashed/00000000.0").c_str()), 0);
  // And one to root's own file, which the gateway's user could not read unconfined either: not
  // the confinement's doing, so no failure.
  {
    std::ofstream pem(trust + "/local/private.pem");
    pem << "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n";
  }
  ASSERT_EQ(chmod((trust + "/local/private.pem").c_str(), 0600), 0);
  ASSERT_EQ(symlink((trust + "/local/private.pem").c_str(), (trust + "/hashed/11111111.0").c_str()), 0);
  const std::string scratch = dir_ + "/probe";
  ASSERT_EQ(mkdir(scratch.c_str(), 0700), 0);
  SpawnOptions options;
  options.stdout_path = dir_ + "/probe.json";
  options.stderr_path = dir_ + "/probe.log";
  auto child = ChildProcess::spawn({"/usr/bin/env", "SSL_CERT_FILE=" + trust + "/link.pem",
                                    "SSL_CERT_DIR=" + trust + "/nowhere:" + trust + "/hashed", SPACE_GATEWAY_BIN,
                                    "--probe-confinement", scratch, "--user", "#1499999999"},
                                   options);
  ASSERT_TRUE(child.ok()) << child.error().message;
  auto status = child->waitFor(std::chrono::seconds(10));
  ASSERT_TRUE(status.has_value());
  const std::string text = readFile(dir_ + "/probe.json");
  auto report = Json::parse(text, nullptr, false);
  ASSERT_TRUE(report.is_object()) << text << readFile(dir_ + "/probe.log");
  EXPECT_EQ(report["needs"]["trust_store"].value("path", ""), trust + "/link.pem") << text;
  EXPECT_EQ(report["needs"]["trust_store"].value("readable", false), true) << text;
  EXPECT_EQ(report["needs"]["trust_store_dir"].value("readable", false), true) << text;
  // The linked certificates by themselves, not their directory.
  const Json ca_rule = {{"path", trust + "/local/ca.pem"}, {"writable", false}, {"file", true}};
  ASSERT_TRUE(report["reachable"].is_array()) << text;
  size_t ca_rules = 0, local_rules = 0;
  for (const Json& rule : report["reachable"]) {
    ca_rules += rule == ca_rule;
    local_rules += rule.value("path", "").rfind(trust + "/local", 0) == 0;
  }
  EXPECT_EQ(ca_rules, 1u) << text;
  EXPECT_EQ(local_rules, 2u) << text;                        // private.pem's too: the plan does not judge modes
  EXPECT_EQ(report.value("reachable_files", 0), 3) << text;  // and elsewhere/x.pem's
  EXPECT_EQ(report.value("works", false), true) << text;
  EXPECT_EQ(report.value("confined", false), true) << text;
  EXPECT_EQ(status->exit_code, 0) << text;
}

TEST_F(GatewayTest, InvalidPolicyExitsWithTwo) {
  writePolicy(std::string("{\"egress\": \"policy\", \"allow\": [\"*\"]}"));
  auto child = spawnGateway({}, -1);
  ASSERT_TRUE(child.ok());
  auto status = child->waitFor(std::chrono::seconds(5));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->exit_code, 2);
  EXPECT_NE(readFile(dir_ + "/gateway.log").find("policy"), std::string::npos);
}

TEST_F(GatewayTest, KilledGatewayRefusesFastAndARespawnServes) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  ASSERT_EQ(curl({"http://allowed.test/"}).exit_code, 0);
  gateway_->kill();
  gateway_.reset();
  // Nothing listens: the slot's kernel refuses; nothing goes anywhere else.
  Probe dead = probe(FakeInternet::kAllowedIp, 80, httpGet("allowed.test"), std::chrono::seconds(2));
  EXPECT_FALSE(dead.connected);
  EXPECT_LT(dead.ms, 1000);
  startGateway();
  CommandResult again = curl({"http://allowed.test/"});
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

TEST_F(GatewayTest, SigtermExitsCleanly) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  // With connections in every state: relayed, waiting to be decided, and a DNS question upstream.
  UniqueFd relayed = guestConnect(FakeInternet::kAllowedIp, FakeInternet::kBannerPort);
  ASSERT_TRUE(relayed.valid());
  std::string banner(strlen(FakeInternet::kBanner), '\0');
  timeval limit{3, 0};
  setsockopt(relayed.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ASSERT_EQ(recv(relayed.get(), banner.data(), banner.size(), MSG_WAITALL), static_cast<ssize_t>(banner.size()));
  UniqueFd sniffing = guestConnect(FakeInternet::kAllowedIp, 80);
  ASSERT_TRUE(sniffing.valid());
  ASSERT_EQ(send(sniffing.get(), "GET / HT", 8, MSG_NOSIGNAL), 8);
  int asked = inet_->dnsQueries();
  UniqueFd dns;
  inNetns("/run/netns/" + guest_, [&] {
    dns = UniqueFd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(53);
    inet_pton(AF_INET, kGatewayIp, &addr.sin_addr);
    std::vector<uint8_t> q = buildQuery(9, "silent.test", dns::kTypeA);
    sendto(dns.get(), q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  });
  for (auto deadline = SteadyClock::now() + std::chrono::seconds(2);
       inet_->dnsQueries() == asked && SteadyClock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(inet_->dnsQueries(), asked) << "the question reached the upstream resolver";
  ExitStatus status = gateway_->terminate(std::chrono::seconds(3));
  EXPECT_FALSE(status.signaled) << status.describe();
  EXPECT_EQ(status.exit_code, 0);
  gateway_.reset();
}

TEST_F(GatewayTest, DnsQueryRateIsBounded) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway();
  // A burst far past the bucket (400): the excess is dropped, not answered or sent upstream.
  int answered = 0;
  double elapsed_s = 0;
  inNetns("/run/netns/" + guest_, [&] {
    UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    int big = 4 << 20;
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(53);
    inet_pton(AF_INET, kGatewayIp, &addr.sin_addr);
    ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    std::vector<uint8_t> q = buildQuery(7, "denied.test", dns::kTypeA);
    // Batches of 50, each drained before the next, so no socket buffer overflows: only the
    // gateway's bucket decides what goes unanswered.
    auto start = SteadyClock::now();
    char buf[512];
    for (int batch = 0; batch < 20; ++batch) {
      for (int i = 0; i < 50; ++i) send(fd.get(), q.data(), q.size(), MSG_NOSIGNAL);
      for (;;) {
        pollfd p{fd.get(), POLLIN, 0};
        if (poll(&p, 1, 50) != 1 || recv(fd.get(), buf, sizeof buf, 0) <= 0) break;
        ++answered;
      }
    }
    elapsed_s = msSince(start) / 1000;
  });
  EXPECT_GE(answered, 380);
  EXPECT_LE(answered, 400 + 200 * elapsed_s + 10) << "in " << elapsed_s << " s";
  EXPECT_LT(answered, 1000);
  // And the gateway still answers once the bucket refills.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(query("allowed.test").rcode, dns::kNoError);
}

TEST_F(GatewayTest, AuditLogIsBoundedByRotation) {
  writePolicy(policyMode({"allowed.test"}));
  startGateway({"--audit-max-bytes", "2048"});
  for (int i = 0; i < 60; ++i) ASSERT_EQ(query("denied" + std::to_string(i) + ".test").rcode, dns::kNxDomain);
  struct stat current {
  }, previous{};
  ASSERT_EQ(stat(audit_path_.c_str(), &current), 0);
  ASSERT_EQ(stat((audit_path_ + ".1").c_str(), &previous), 0);
  EXPECT_LE(current.st_size, 2048);
  EXPECT_LE(previous.st_size, 2048);
  EXPECT_GT(previous.st_size, 1024);
  // The newest entry is in the current file, whole.
  auto entries = audit();
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.back()["name"], "denied59.test");
  EXPECT_FALSE(audit(audit_path_ + ".1").empty());
}

// How much a connection's setup costs through the gateway: sequential HTTP requests from the
// guest vs the same requests made inside the fake internet (no gateway, no veth).
TEST_F(GatewayTest, ConnectionSetupCost) {
  writePolicy(Json{{"egress", "allow"}});
  startGateway();
  ASSERT_EQ(query("allowed.test").rcode, dns::kNoError);
  constexpr int kRounds = 40;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // The same loop in both namespaces: connect, request, read to the server's close.
  auto rounds = [&](const std::string& netns) {
    std::vector<double> samples;
    inNetns(netns, [&] {
      for (int i = 0; i < kRounds; ++i) {
        auto start = SteadyClock::now();
        UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(80);
        inet_pton(AF_INET, FakeInternet::kAllowedIp, &addr.sin_addr);
        ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
        std::string req = httpGet("allowed.test");
        send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL);
        Probe p;
        readToEnd(fd.get(), p, std::chrono::seconds(3), start);
        ASSERT_TRUE(p.eof);
        ASSERT_NE(p.received.find("server 198.51.100.10:80"), std::string::npos);
        samples.push_back(p.ms);
      }
    });
    return samples;
  };
  std::vector<double> through = rounds("/run/netns/" + guest_);
  std::vector<double> direct = rounds(inet_->netnsPath());
  ASSERT_EQ(through.size(), static_cast<size_t>(kRounds));
  ASSERT_EQ(direct.size(), static_cast<size_t>(kRounds));
  double t = median(through), d = median(direct);
  std::cout << "connection + HTTP request, median of " << kRounds << ": through the gateway " << t << " ms, direct "
            << d << " ms\n";
  RecordProperty("through_gateway_ms", std::to_string(t));
  RecordProperty("direct_ms", std::to_string(d));
  EXPECT_LT(t, d + 20) << "the gateway adds more than 20 ms to a connection";
}

// --- Credential injection ---

class CredentialGatewayTest : public GatewayTest {
 protected:
  static constexpr const char* kValue = "ghp_GatewayTlsValue0123456789";
  static constexpr const char* kPlaceholder = "space-secret-gh-0123456789abcdef0123456789abcdef";

  // A sandbox CA (as spaced derives one), the guest's copy of its certificate, and the
  // credentials file spaced would write for the gateway.
  void SetUp() override {
    GatewayTest::SetUp();
    if (HasFatalFailure()) return;
    CaSeed seed;
    seed.fill(42);
    auto ca = deriveCredentialCa(seed, "gateway-test");
    ASSERT_TRUE(ca.ok()) << ca.error().message;
    guest_ca_ = dir_ + "/guest-ca.pem";
    std::ofstream(guest_ca_) << ca->cert_pem;
    credentials_ = dir_ + "/credentials.json";
    std::ofstream(credentials_) << Json{
        {"secrets", {{"gh", kValue}, {"tiny", "abc1"}}},
        {"tls", {{"ca_cert", ca->cert_pem}, {"ca_key", ca->key_pem}}},
        {"placeholders",
         {{kPlaceholder, "gh"}}}}.dump();
    ASSERT_EQ(chmod(credentials_.c_str(), 0644), 0);  // the test gateway runs as nobody
  }

  void startWithRules(const Json& rules, const std::string& mode = "allow") {
    writePolicy(Json{{"egress", mode}, {"allow", Json::array({"*.test"})}, {"credentials", rules}});
    startGateway({"--credentials", credentials_, "--upstream-ca", inet_->caPath()});
  }

  static std::string authorized(const std::string& value) {
    return "authorization 1 " + sha256Hex("Bearer " + value) + " connection close";
  }

  std::string guest_ca_, credentials_;
};

// The rule's host over HTTPS: the guest talks TLS to the gateway (a certificate of its own
// sandbox CA), the server gets the header over the gateway's verified TLS, the guest never sees
// the value, and every other host's TLS passes through untouched.
TEST_F(CredentialGatewayTest, TlsToTheRulesHostIsTerminatedAndGetsTheHeader) {
  startWithRules(Json::array({{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}}}));
  CommandResult r = curl({"--cacert", guest_ca_, "https://allowed.test/auth"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(authorized(kValue)), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(kValue), std::string::npos);
  Json e = waitForAudit({{"kind", "credential"}, {"sni", "allowed.test"}});
  EXPECT_EQ(e["tls"], "terminated");
  EXPECT_EQ(e["method"], "GET");
  EXPECT_EQ(e["path"], "/auth");
  EXPECT_EQ(e["status"], 200);
  EXPECT_EQ(e["secrets"], Json::array({"gh"}));
  EXPECT_EQ(readFile(audit_path_).find(kValue), std::string::npos);
  // The guest sees the sandbox CA's certificate, not the server's: with only the real
  // server's CA it refuses.
  EXPECT_EQ(curl({"--cacert", inet_->caPath(), "https://allowed.test/auth"}).exit_code, 60);
  // Another host: the server's own certificate, spliced, no header.
  CommandResult other = curl({"--cacert", inet_->caPath(), "https://denied.test/auth"});
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("authorization 0"), std::string::npos) << other.output;
  // POST with a body, and HTTP/1.1 offered by ALPN.
  CommandResult post = curl({"--cacert", guest_ca_, "--http1.1", "-d", "payload", "https://allowed.test/auth"});
  EXPECT_EQ(post.exit_code, 0) << post.output;
}

TEST_F(CredentialGatewayTest, ATlsRequestWhoseHostIsNotItsServerNameIsRefused) {
  startWithRules(Json::array({{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}}}));
  CommandResult r =
      curl({"--cacert", guest_ca_, "-H", "Host: denied.test", "-w", "%{http_code}", "https://allowed.test/auth"});
  EXPECT_NE(r.output.find("421"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("is not the TLS server name allowed.test"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("authorization"), std::string::npos) << r.output;
  waitForAudit({{"reason", "credential-host-mismatch"}, {"allowed", false}});
}

// The rule's name at an address its DNS never gave (curl --resolve): whatever the certificate
// there says, the secret does not go; over plain HTTP a spoofed Host, in mode allow, the same.
TEST_F(CredentialGatewayTest, TheRulesNameAtAnUnpinnedAddressGetsNoSecret) {
  startWithRules(Json::array(
      {{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}, {"plain_http", true}},
       {{"host", "rebind.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}, {"plain_http", true}}}));
  CommandResult tls = curl({"--cacert", guest_ca_, "--resolve", "allowed.test:443:198.51.100.20", "-w", "%{http_code}",
                            "https://allowed.test/auth"});
  EXPECT_NE(tls.output.find("502"), std::string::npos) << tls.output;
  EXPECT_EQ(tls.output.find("authorization"), std::string::npos) << tls.output;
  CommandResult plain = curl({"-H", "Host: allowed.test", "-w", "%{http_code}", "http://other.test/auth"});
  EXPECT_NE(plain.output.find("502"), std::string::npos) << plain.output;
  EXPECT_EQ(plain.output.find("authorization"), std::string::npos) << plain.output;
  waitForAudit({{"reason", "credential-not-pinned"}, {"allowed", false}});
  // Resolved through the gateway, the same request gets it.
  CommandResult honest = curl({"http://allowed.test/auth"});
  EXPECT_NE(honest.output.find(authorized(kValue)), std::string::npos) << honest.output;
}

// One request carries the credential and nothing follows it on that connection: a second
// request pipelined behind it never reaches the server, and a request whose body could end at
// two places is not sent at all.
TEST_F(CredentialGatewayTest, NothingAfterTheCredentialedRequestIsSent) {
  startWithRules(Json::array(
      {{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}, {"plain_http", true}}}));
  ASSERT_EQ(query("allowed.test").ips, std::vector<std::string>{FakeInternet::kAllowedIp});
  const std::string second = "GET /auth HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
  Probe p = probe(FakeInternet::kAllowedIp, 80, "GET /auth HTTP/1.1\r\nHost: allowed.test\r\n\r\n" + second,
                  std::chrono::seconds(3));
  EXPECT_NE(p.received.find(authorized(kValue)), std::string::npos) << p.received;
  EXPECT_EQ(p.received.find("HTTP/1.1", 10), p.received.npos) << "one answer only: " << p.received;
  Json e = waitForAudit({{"kind", "credential"}, {"path", "/auth"}});
  EXPECT_EQ(e.value("dropped_bytes", 0), static_cast<int>(second.size())) << e.dump();
  // chunked and a length, or a coding that is not chunked: refused (when the head is read, a
  // reset; or by the rewrite's own check, a 400: HttpRewrite.RefusesAmbiguousFraming).
  Probe both = probe(FakeInternet::kAllowedIp, 80,
                     "POST /auth HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
                         second);
  EXPECT_EQ(both.received.find("authorization"), std::string::npos) << both.received;
  EXPECT_TRUE(both.reset || both.received.find(" 400 ") != std::string::npos) << both.received;
  Probe coded = probe(FakeInternet::kAllowedIp, 80,
                      "POST /auth HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 4\r\n"
                      "Transfer-Encoding: gzip\r\n\r\nabcd" +
                          second);
  EXPECT_EQ(coded.received.find("authorization"), std::string::npos) << coded.received;
  EXPECT_TRUE(coded.reset || coded.received.find(" 400 ") != std::string::npos) << coded.received;
}

// A server that echoes the request's headers hands back what the gateway added: the value is
// masked on its way to the guest (same length, so the answer's framing holds), over TLS and
// plain HTTP alike.
TEST_F(CredentialGatewayTest, AnEchoOfTheAddedHeaderReachesTheGuestMasked) {
  startWithRules(Json::array(
      {{{"host", "allowed.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}, {"plain_http", true}}}));
  const std::string masked = "Authorization: " + std::string(std::string("Bearer ").size() + strlen(kValue), '*');
  for (const std::string url : {"https://allowed.test/headers", "http://allowed.test/headers"}) {
    CommandResult r = curl({"--cacert", guest_ca_, url});
    ASSERT_EQ(r.exit_code, 0) << url << ": " << r.output;
    EXPECT_EQ(r.output.find(kValue), std::string::npos) << url << ": " << r.output;
    EXPECT_NE(r.output.find(masked), std::string::npos) << url << ": " << r.output;
  }
  Json e = waitForAudit({{"kind", "credential"}, {"path", "/headers"}});
  EXPECT_GE(e.value("masked_in_answer", 0), 1) << e.dump();
  // Chunk boundaries inside the echoed value (every 5 bytes) do not hide it; a compressed echo
  // (the server ignoring Accept-Encoding: identity) is refused whole, with a clear 502.
  CommandResult chunked = curl({"--cacert", guest_ca_, "https://allowed.test/chunked-headers/5"});
  ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
  EXPECT_EQ(chunked.output.find(kValue), std::string::npos) << chunked.output;
  EXPECT_NE(chunked.output.find(masked), std::string::npos) << chunked.output;
  CommandResult zipped =
      curl({"--cacert", guest_ca_, "-w", "%{http_code}", "--compressed", "https://allowed.test/chunked-headers/gzip"});
  EXPECT_NE(zipped.output.find("502"), std::string::npos) << zipped.output;
  EXPECT_NE(zipped.output.find("encoded"), std::string::npos) << zipped.output;
  EXPECT_EQ(zipped.output.find(kValue), std::string::npos) << zipped.output;
}

// The guest's stand-in for a secret becomes the value in its own headers to a rule's host,
// and goes out unchanged, audited, anywhere else.
TEST_F(CredentialGatewayTest, APlaceholderBecomesItsSecretOnlyForTheRulesHost) {
  // allowed.test's rule sends gh; denied.test's rule sends no secret (its host could be one
  // the guest reads what it receives at); other.test has no rule.
  startWithRules(Json::array({{{"host", "allowed.test"}, {"headers", {{"X-Rule", "{{secret:gh}}"}}}},
                              {{"host", "denied.test"}, {"headers", {{"X-Other", "fixed"}}}, {"plain_http", true}}}));
  const std::string with_placeholder = std::string("Authorization: Bearer ") + kPlaceholder;
  const std::string unchanged = "authorization 1 " + sha256Hex(std::string("Bearer ") + kPlaceholder);
  CommandResult r = curl({"--cacert", guest_ca_, "-H", with_placeholder, "https://allowed.test/auth"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(authorized(kValue)), std::string::npos) << r.output;
  Json e = waitForAudit({{"kind", "credential"}, {"path", "/auth"}, {"sni", "allowed.test"}});
  EXPECT_EQ(e["secrets"], Json::array({"gh"})) << e.dump();
  CommandResult other_rule = curl({"-H", with_placeholder, "http://denied.test/auth"});
  ASSERT_EQ(other_rule.exit_code, 0) << other_rule.output;
  EXPECT_NE(other_rule.output.find(unchanged), std::string::npos) << other_rule.output;
  CommandResult elsewhere = curl({"-H", with_placeholder, "http://other.test/auth"});
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find(unchanged), std::string::npos) << elsewhere.output;
  Json seen = waitForAudit({{"kind", "placeholder"}, {"reason", "placeholder-elsewhere"}});
  EXPECT_EQ(seen["host"], "other.test") << seen.dump();
  EXPECT_EQ(seen["secrets"], Json::array({"gh"})) << seen.dump();
}

// A secret too short to be recognised in an echo is never sent: a clear 502 instead.
TEST_F(CredentialGatewayTest, ASecretTooShortToMaskIsNotSent) {
  startWithRules(Json::array({{{"host", "allowed.test"}, {"headers", {{"X-Key", "{{secret:tiny}}"}}}}}));
  CommandResult r = curl({"--cacert", guest_ca_, "-w", "%{http_code}", "https://allowed.test/headers"});
  EXPECT_NE(r.output.find("502"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("too short"), std::string::npos) << r.output;
  waitForAudit({{"reason", "credential-too-short"}});
}

// A server that cannot prove it is the rule's host (its certificate names others): the guest
// gets a clear 502 and the server never sees the request.
TEST_F(CredentialGatewayTest, AnUpstreamWithTheWrongCertificateGetsNothing) {
  startWithRules(Json::array({{{"host", "short-ttl.test"}, {"headers", {{"Authorization", "Bearer {{secret:gh}}"}}}}}));
  CommandResult r = curl({"--cacert", guest_ca_, "-w", "%{http_code}", "https://short-ttl.test/auth"});
  EXPECT_NE(r.output.find("502"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did not prove to be short-ttl.test"), std::string::npos) << r.output;
  Json e = waitForAudit({{"reason", "credential-upstream-unverified"}});
  EXPECT_NE(e["detail"].get<std::string>().find("short-ttl.test"), std::string::npos) << e.dump();
}

// The gateways' egress table (net/gateway_egress.h) as NetworkPool loads it, in a fake
// internet's upstream namespace of its own (GatewayTest's is shared by the suite). What a
// compromised gateway would try is tried as the gateways' uids, and as uids outside their range
// for the baseline: everything tried is reachable from that namespace.
using namespace std::chrono_literals;

class GatewayEgressTest : public ::testing::Test {
 protected:
  static constexpr uint16_t kResolverPort = 5353;            // the "resolver": a TCP listener on loopback
  static constexpr uint16_t kServicePort = 8125;             // a host service on every address of the namespace
  static constexpr uint16_t kClosedPort = 8126;              // nothing listens here
  static constexpr const char* kOwnPrivateIp = "10.0.0.77";  // the namespace's own, in 10.0.0.0/24
  static constexpr uint32_t kBase = 1500000000;

  void SetUp() override {
    auto inet = FakeInternet::start(prefix() + "-egress");
    ASSERT_TRUE(inet.ok()) << inet.error().message;
    inet_ = std::move(inet.value());
    char dir[] = "/tmp/gwegress-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    const std::string ns = inet_->upstreamNetnsPath();
    // An address of its own inside a range a node may open, and ping sockets for every user
    // (systemd's setting), so that a gateway could open one.
    auto added = runCommand({"ip", "addr", "add", std::string(kOwnPrivateIp) + "/32", "dev", "lo"}, 10s, ns);
    ASSERT_EQ(added.exit_code, 0) << added.output;
    auto ping = runCommand({"sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647"}, 10s, ns);
    ASSERT_EQ(ping.exit_code, 0) << ping.output;
    // Listeners made in the upstream namespace (a socket stays in the namespace it was made in);
    // the kernel completes connections to them without an accept.
    ASSERT_TRUE(runInNetns(ns, [&]() -> Status {
                  for (auto [family, port] : {std::pair{AF_INET, kResolverPort}, std::pair{AF_INET, kServicePort},
                                              std::pair{AF_INET6, kServicePort}}) {
                    UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
                    const int one = 1;
                    if (family == AF_INET6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
                    sockaddr_storage address = socketAddress(family == AF_INET ? "0.0.0.0" : "::1", port);
                    if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
                        ::listen(fd.get(), 64) != 0) {
                      return makeError(ErrorCode::kInternal, std::string("listener: ") + strerror(errno));
                    }
                    listeners_.push_back(std::move(fd));
                  }
                  return okStatus();
                }).ok());
  }
  void TearDown() override {
    if (pool_) pool_->stop();
    pool_.reset();
    listeners_.clear();
    inet_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  static sockaddr_storage socketAddress(const std::string& ip, uint16_t port) {
    sockaddr_storage address{};
    if (ip.find(':') != std::string::npos) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&address);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(port);
      EXPECT_EQ(inet_pton(AF_INET6, ip.c_str(), &in6->sin6_addr), 1) << ip;
    } else {
      auto* in = reinterpret_cast<sockaddr_in*>(&address);
      in->sin_family = AF_INET;
      in->sin_port = htons(port);
      EXPECT_EQ(inet_pton(AF_INET, ip.c_str(), &in->sin_addr), 1) << ip;
    }
    return address;
  }

  NetworkOptions poolOptions(std::vector<std::string> openable,
                             const std::string& resolver = "127.0.0.1:" + std::to_string(kResolverPort)) const {
    NetworkOptions options;
    options.gateway_binary = SPACE_GATEWAY_BIN;
    options.netns_dir = dir_ + "/netns";
    options.credentials_dir = dir_ + "/credentials";
    options.slot_prefix = prefix() + "eg";
    options.upstream_netns = inet_->upstreamNetnsPath();
    options.upstream_dns = resolver;
    options.openable_cidrs = std::move(openable);
    options.spare_slots = 0;
    options.egress_check_interval = 100ms;
    return options;
  }

  // A pool as spaced makes one, started: it loads the table.
  Status startPool(std::vector<std::string> openable,
                   const std::string& resolver = "127.0.0.1:" + std::to_string(kResolverPort)) {
    if (pool_) pool_->stop();
    pool_ = NetworkPool::create(poolOptions(std::move(openable), resolver));
    return pool_->start({});
  }

  // Runs `body` in a child process that entered the upstream namespace as `uid` (and gid, no
  // groups); what it returns (an errno, or 0), 254 when it could not become `uid`.
  int asUid(uid_t uid, const std::function<int()>& body) const {
    UniqueFd ns(::open(inet_->upstreamNetnsPath().c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns.valid()) return EBADF;
    const pid_t child = fork();
    if (child == 0) {
      // Only system calls from here on (a forked copy of a threaded process).
      if (setns(ns.get(), CLONE_NEWNET) != 0 || setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
          setresuid(uid, uid, uid) != 0) {
        _exit(254);
      }
      _exit(body());
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return ECHILD;
    return WEXITSTATUS(status);
  }

  // A TCP connect as `uid`: 0 once connected, else the errno it failed with (ETIMEDOUT after
  // 3 s). `device`: bound to that device first (SO_BINDTODEVICE, which needs no privilege).
  // `record_route`: with that IP option (which needs no privilege either).
  int connectAs(uid_t uid, const std::string& ip, uint16_t port, const char* device = nullptr,
                bool record_route = false) const {
    const sockaddr_storage to = socketAddress(ip, port);
    return asUid(uid, [&]() -> int {
      const int fd = ::socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
      if (fd < 0) return errno;
      if (device != nullptr && ::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device, std::strlen(device)) != 0) {
        return 253;
      }
      // Record route (7): length 11, pointer 4, room for two addresses; then end of options.
      const unsigned char options[12] = {7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0};
      if (record_route && ::setsockopt(fd, IPPROTO_IP, IP_OPTIONS, options, sizeof options) != 0) return 252;
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return 0;
      if (errno != EINPROGRESS) return errno;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 3000) != 1) return ETIMEDOUT;
      int error = 0;
      socklen_t size = sizeof error;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      return error;
    });
  }

  // A datagram as `uid` on a connected socket (UDP, or an ICMP echo request on a ping socket),
  // then a wait of up to 1 s for what comes back: the send's errno if it failed, else the
  // receive's (ECONNREFUSED: an ICMP error came back; EAGAIN: nothing did), 0 if an answer came.
  int datagramAs(uid_t uid, const std::string& ip, uint16_t port, bool ping = false,
                 const char* device = nullptr) const {
    const sockaddr_storage to = socketAddress(ip, port);
    return asUid(uid, [&]() -> int {
      const int fd = ::socket(AF_INET, SOCK_DGRAM, ping ? IPPROTO_ICMP : 0);
      if (fd < 0) return errno;
      if (device != nullptr && ::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, device, std::strlen(device)) != 0) {
        return 253;
      }
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(sockaddr_in)) != 0) return errno;
      const timeval wait{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
      const unsigned char echo_request[8] = {8, 0, 0, 0, 0, 0, 0, 1};
      if (::send(fd, echo_request, sizeof echo_request, 0) != sizeof echo_request) return errno;
      char answer[512];
      return ::recv(fd, answer, sizeof answer, 0) >= 0 ? 0 : errno;
    });
  }

  std::string tablesInUpstream() const {
    std::string listed;
    EXPECT_TRUE(runInNetns(inet_->upstreamNetnsPath(), [&]() -> Status {
                  auto out = runNft("list tables");
                  if (!out.ok()) return out.error();
                  listed = out.value();
                  return okStatus();
                }).ok());
    return listed;
  }

  std::unique_ptr<FakeInternet> inet_;
  std::string dir_;
  std::vector<UniqueFd> listeners_;
  std::shared_ptr<NetworkPool> pool_;
};

TEST_F(GatewayEgressTest, AGatewaysUidReachesOnlyWhatAPolicyCouldOpenAndItsResolver) {
  const std::string kMetadata = FakeInternet::kMetadataIp, kPrivate = FakeInternet::kPrivateIp,
                    kPublic = FakeInternet::kAllowedIp, kOwn = FakeInternet::kUplinkIp;
  auto started = startPool({});
  ASSERT_TRUE(started.ok()) << started.error().message;
  // Outside the range (root, and the first uid past the last slot's) everything is reachable:
  // the refusals below are the table's. The kernel's own packets (an ICMP error, with no socket
  // behind it) reach root's socket too.
  for (uid_t uid : {uid_t{0}, uid_t{kBase + kMaxSlots}}) {
    SCOPED_TRACE("uid " + std::to_string(uid));
    for (auto [ip, port] : std::vector<std::pair<std::string, uint16_t>>{{kMetadata, 80},
                                                                         {kPrivate, 80},
                                                                         {kPublic, 80},
                                                                         {"127.0.0.1", kServicePort},
                                                                         {kOwn, kServicePort},
                                                                         {kOwnPrivateIp, kServicePort},
                                                                         {"127.0.0.1", kResolverPort},
                                                                         {"::1", kServicePort}}) {
      EXPECT_EQ(connectAs(uid, ip, port), 0) << ip << ":" << port;
    }
    EXPECT_EQ(datagramAs(uid, "127.0.0.1", kClosedPort), ECONNREFUSED);
    EXPECT_EQ(datagramAs(uid, kPublic, FakeInternet::kUdpEchoPort), 0);
    EXPECT_EQ(datagramAs(uid, kPublic, 0, /*ping=*/true), 0);
    EXPECT_EQ(connectAs(uid, kPublic, 80, nullptr, /*record_route=*/true), 0);
  }
  // Counted as the gateways' refusals: none yet.
  EXPECT_EQ(pool_->egressRefusedPackets(), 0u);

  // The gateways' uids: the first slot's, a later one's, the last one's, and the probe's below them.
  for (uid_t uid : {uid_t{kBase}, uid_t{kBase + 7}, uid_t{kBase + kMaxSlots - 1}, uid_t{kBase - 1}}) {
    SCOPED_TRACE("gateway uid " + std::to_string(uid));
    EXPECT_EQ(connectAs(uid, kPublic, 80), 0);
    // Its resolver, on loopback: at its port only, over TCP and UDP.
    EXPECT_EQ(connectAs(uid, "127.0.0.1", kResolverPort), 0);
    EXPECT_NE(datagramAs(uid, "127.0.0.1", kResolverPort), EPERM);
    EXPECT_EQ(connectAs(uid, "127.0.0.1", kServicePort), ECONNREFUSED);
    // Cloud metadata, a private range, the namespace's own address, IPv6.
    EXPECT_EQ(connectAs(uid, kMetadata, 80), ECONNREFUSED);
    EXPECT_EQ(connectAs(uid, kPrivate, 80), ECONNREFUSED);
    EXPECT_EQ(connectAs(uid, kOwn, kServicePort), ECONNREFUSED);
    EXPECT_EQ(connectAs(uid, "::1", kServicePort), ECONNREFUSED);
    // A public address through the loopback device (delivered to the host's listeners).
    EXPECT_EQ(connectAs(uid, kPublic, kServicePort, "lo"), ECONNREFUSED);
    // No datagram but to the resolver: no UDP service, no ping.
    EXPECT_EQ(datagramAs(uid, kPublic, FakeInternet::kUdpEchoPort), EPERM);
    EXPECT_EQ(datagramAs(uid, kPublic, 0, /*ping=*/true), EPERM);
    // No IP options.
    EXPECT_EQ(connectAs(uid, kPublic, 80, nullptr, /*record_route=*/true), ECONNREFUSED);
  }
  // Each refusal counted (the operator's sign of a compromised gateway): 9 refused tries of 4
  // uids (a TCP one may count a retransmitted SYN too).
  EXPECT_GE(pool_->egressRefusedPackets(), 36u);

  // A node that lets tenants open 10.0.0.0/24: that range opens, but not the namespace's own
  // address in it, and nothing else does. Loading the table again replaces it.
  ASSERT_TRUE(startPool({"10.0.0.0/24"}).ok());
  EXPECT_EQ(connectAs(kBase + 3, kPrivate, 80), 0);
  EXPECT_EQ(connectAs(kBase + 3, kOwnPrivateIp, kServicePort), ECONNREFUSED);
  EXPECT_EQ(connectAs(kBase + 3, kMetadata, 80), ECONNREFUSED);
  EXPECT_EQ(connectAs(kBase + 3, "127.0.0.1", kServicePort), ECONNREFUSED);
  const std::string table = gatewayEgressTableName(kBase - 1);
  std::string tables = tablesInUpstream();
  EXPECT_NE(tables.find(table), std::string::npos) << tables;
  EXPECT_EQ(tables.find(table), tables.rfind(table)) << tables;

  // Another program empties it, or removes it (`nft flush ruleset`): the pool loads it again.
  for (const std::string& command : {"flush table inet " + table, std::string("flush ruleset")}) {
    SCOPED_TRACE(command);
    ASSERT_TRUE(runInNetns(inet_->upstreamNetnsPath(), [&]() -> Status {
                  auto flushed = runNft(command);
                  if (!flushed.ok()) return flushed.error();
                  return okStatus();
                }).ok());
    EXPECT_EQ(connectAs(kBase + 3, kMetadata, 80), 0);
    int refused = 0;
    for (int i = 0; i < 50 && (refused = connectAs(kBase + 3, kMetadata, 80)) == 0; ++i) {
      std::this_thread::sleep_for(100ms);
    }
    EXPECT_EQ(refused, ECONNREFUSED);
  }

  // A resolver that is not the host's: a socket bound to the loopback device sends nothing to it
  // (the kernel would deliver it to the host's own listener on that port), while the resolver
  // is reached the usual way.
  ASSERT_TRUE(startPool({}, FakeInternet::kDnsIp).ok());
  EXPECT_EQ(datagramAs(kBase + 3, FakeInternet::kDnsIp, 53, false, "lo"), EPERM);
  EXPECT_NE(datagramAs(kBase + 3, FakeInternet::kDnsIp, 53), EPERM);

  // A resolver that is no IPv4 endpoint: the pool does not start.
  NetworkOptions bad;
  bad.gateway_binary = SPACE_GATEWAY_BIN;
  bad.upstream_netns = inet_->upstreamNetnsPath();
  bad.upstream_dns = "resolver.example";
  auto refused = NetworkPool::create(bad)->start({});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--gateway-upstream-dns"), std::string::npos) << refused.error().message;

  // Nor with gateway limits no group can take.
  for (auto [cpu, memory_mb, named] : {std::tuple{0u, uint64_t{384}, "--gateway-cpu-percent"},
                                       std::tuple{101u, uint64_t{384}, "--gateway-cpu-percent"},
                                       std::tuple{100u, uint64_t{64}, "--gateway-memory-mb"}}) {
    NetworkOptions limits = poolOptions({});
    limits.gateway_cpu_percent = cpu;
    limits.gateway_memory_mb = memory_mb;
    auto pool = NetworkPool::create(limits);
    EXPECT_NE(pool->configError().find(named), std::string::npos) << pool->configError();
    EXPECT_FALSE(pool->start({}).ok());
  }
}

// A gateway the pool starts runs in a control group of its slot's, with the options' limits,
// from its first instruction (it joins before it runs anything); a restarted one takes its
// place there; an adopted gateway outside the group (started where there were none) is
// replaced; and the group goes with its sandbox's network, or at start when a previous run
// left it.
// Another program's change to the table is undone when nftables says it changed, not at the
// next periodic check (an hour away here): the window in which a gateway's sockets are not held
// is the check's, a fraction of a second.
TEST_F(GatewayEgressTest, AnotherProgramsChangeIsUndoneAtOnceNotAtTheNextCheck) {
  const std::string kMetadata = FakeInternet::kMetadataIp;
  NetworkOptions options = poolOptions({});
  options.egress_check_interval = std::chrono::hours(1);
  pool_ = NetworkPool::create(options);
  auto started = pool_->start({});
  ASSERT_TRUE(started.ok()) << started.error().message;
  EXPECT_EQ(connectAs(kBase + 3, kMetadata, 80), ECONNREFUSED);
  const std::string table = gatewayEgressTableName(kBase - 1);
  for (const std::string& command :
       {"flush table inet " + table, std::string("flush ruleset"), "delete table inet " + table}) {
    SCOPED_TRACE(command);
    const auto changed = std::chrono::steady_clock::now();
    ASSERT_TRUE(runInNetns(inet_->upstreamNetnsPath(), [&]() -> Status {
                  auto done = runNft(command);
                  if (!done.ok()) return done.error();
                  return okStatus();
                }).ok());
    int refused = 0;
    while ((refused = connectAs(kBase + 3, kMetadata, 80)) == 0 &&
           std::chrono::steady_clock::now() - changed < std::chrono::seconds(5)) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(refused, ECONNREFUSED);
    EXPECT_LT(std::chrono::steady_clock::now() - changed, std::chrono::seconds(2));
  }
  // A fourth reload within the interval is quick too; past that, changes wait for the periodic
  // check (two daemons loading different tables over each other would reload without end).
  auto flush = [&] {
    ASSERT_TRUE(runInNetns(inet_->upstreamNetnsPath(), [&]() -> Status {
                  auto done = runNft("flush ruleset");
                  if (!done.ok()) return done.error();
                  return okStatus();
                }).ok());
  };
  flush();
  int refused = 0;
  for (int i = 0; i < 100 && (refused = connectAs(kBase + 3, kMetadata, 80)) == 0; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(refused, ECONNREFUSED);
  flush();
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(connectAs(kBase + 3, kMetadata, 80), 0) << "reloaded a fifth time within the interval";
  pool_->stop();
}

// The gateways follow the host's resolver: a new one that stays in resolv.conf for an egress
// check interval is let through by the table instead of the old one, each running gateway is
// then outdated (housekeeping restarts it with the new one), and a gateway adopted with
// another resolver than the adopting daemon's is restarted. A file caught without a
// nameserver changes nothing, and a second change soon after a follow waits.
TEST_F(GatewayEgressTest, TheGatewaysFollowTheHostsResolver) {
  const std::string resolv_conf = dir_ + "/resolv.conf";
  auto write = [&](const std::string& text) { ASSERT_TRUE(writeFileAtomic(resolv_conf, text).ok()); };
  auto within2s = [&](const std::function<bool()>& done) {
    for (auto until = SteadyClock::now() + 2s; SteadyClock::now() < until; std::this_thread::sleep_for(20ms)) {
      if (done()) return true;
    }
    return false;
  };
  const std::string kOld = "127.0.0.1", kNew = "192.0.2.53";
  write("# made by a test\nnameserver " + kOld + "\n");
  NetworkOptions options = poolOptions({});
  options.upstream_dns.clear();
  options.resolv_conf = resolv_conf;
  pool_ = NetworkPool::create(options);
  auto started = pool_->start({});
  ASSERT_TRUE(started.ok()) << started.error().message;
  EXPECT_EQ(pool_->gatewayResolver(), kOld + ":53");
  const std::string state = dir_ + "/sandbox";
  auto network = pool_->attach(Policy{}, Policy{}, state);
  ASSERT_TRUE(network.ok()) << network.error().message;
  const pid_t first = network.value()->gatewayPid();
  std::this_thread::sleep_for(300ms);  // a few checks
  EXPECT_FALSE(pool_->resolverStale());
  EXPECT_FALSE(network.value()->gatewayOutdated());
  EXPECT_NE(datagramAs(kBase + 3, kOld, 53), EPERM);
  EXPECT_EQ(datagramAs(kBase + 3, kNew, 53), EPERM);

  write("nameserver " + kNew + "\n");
  EXPECT_TRUE(within2s([&] { return pool_->gatewayResolver() == kNew + ":53"; })) << pool_->gatewayResolver();
  EXPECT_FALSE(pool_->resolverStale());
  EXPECT_EQ(datagramAs(kBase + 3, kOld, 53), EPERM);
  EXPECT_NE(datagramAs(kBase + 3, kNew, 53), EPERM);
  EXPECT_TRUE(network.value()->gatewayOutdated());
  ASSERT_TRUE(network.value()->restartGateway("the host's resolver changed").ok());
  EXPECT_NE(network.value()->gatewayPid(), first);
  EXPECT_FALSE(network.value()->gatewayOutdated());
  auto attachment = readSmallFile(state + "/" + kAttachmentFile, 4096);
  ASSERT_TRUE(attachment.ok());
  EXPECT_EQ(Json::parse(attachment.value()).value("gateway_resolver", ""), kNew + ":53") << attachment.value();
  auto audit = readSmallFile(NetworkPool::gatewayDir(state) + "/" + kAuditFile, 1 << 20);
  ASSERT_TRUE(audit.ok());
  EXPECT_NE(audit->find("the host's resolver changed; open connections were lost"), std::string::npos) << *audit;

  // A file without a nameserver for a moment (being rewritten) says nothing.
  write("");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(pool_->gatewayResolver(), kNew + ":53");
  EXPECT_FALSE(pool_->resolverStale());
  // Nor is a second change within resolver_follow_gap (5 minutes) followed: it is said.
  write("nameserver 192.0.2.77\n");
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(pool_->gatewayResolver(), kNew + ":53");
  EXPECT_TRUE(pool_->resolverStale());
  EXPECT_FALSE(network.value()->gatewayOutdated());

  // The next daemon reads the host's resolver afresh (the old one again): the adopted gateway,
  // which asks the other, is restarted.
  const pid_t second = network.value()->gatewayPid();
  const std::set<std::string> keep = {network.value()->slot().name};
  network.value()->detach();
  network.value().reset();
  write("nameserver " + kOld + "\n");
  pool_->stop();
  pool_ = NetworkPool::create(options);
  ASSERT_TRUE(pool_->start(keep).ok());
  auto adopted = pool_->adopt(state);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  EXPECT_NE(adopted.value()->gatewayPid(), second);
  EXPECT_FALSE(adopted.value()->gatewayOutdated());
  // One that asks the same is kept.
  const pid_t third = adopted.value()->gatewayPid();
  adopted.value()->detach();
  adopted.value().reset();
  pool_->stop();
  pool_ = NetworkPool::create(options);
  ASSERT_TRUE(pool_->start(keep).ok());
  adopted = pool_->adopt(state);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  EXPECT_EQ(adopted.value()->gatewayPid(), third);
  adopted.value().reset();

  // Given by flag, it is never followed.
  pool_->stop();
  options.upstream_dns = kOld + ":" + std::to_string(kResolverPort);
  write("nameserver " + kNew + "\n");
  pool_ = NetworkPool::create(options);
  ASSERT_TRUE(pool_->start({}).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(pool_->resolverStale());
  EXPECT_EQ(pool_->gatewayResolver(), kOld + ":" + std::to_string(kResolverPort));
}

TEST_F(GatewayEgressTest, AGatewayRunsInAControlGroupOfItsSlotThatGoesWithIt) {
  auto layout = jail::setUpCgroups("gwtest-" + std::to_string(getpid()));
  ASSERT_TRUE(layout.ok()) << layout.error().message;
  ScopeGuard groups_go([&] {
    for (const auto& root : layout->roots) {
      (void)::rmdir((root.dir + "/gateways").c_str());
      (void)::rmdir(root.dir.c_str());
    }
  });
  NetworkOptions options = poolOptions({});
  options.gateway_cpu_percent = 40;
  options.gateway_memory_mb = 200;
  auto makePool = [&] {
    if (pool_) pool_->stop();
    pool_ = NetworkPool::create(options);
    auto used = pool_->useCgroups(layout.value());
    EXPECT_TRUE(used.ok()) << used.error().message;
  };
  auto readLimit = [](const std::string& file) {
    auto text = readSmallFile(file, 4096);
    return text.ok() ? text.value().substr(0, text.value().find('\n')) : "unread: " + text.error().message;
  };
  // Not a zombie either: a gateway an earlier pool in this process started is this process's
  // child, which nobody reaps here (spaced's successor is not its parent).
  auto running = [](pid_t pid) {
    auto stat = readSmallFile("/proc/" + std::to_string(pid) + "/stat", 4096);
    const size_t end = stat.ok() ? stat.value().rfind(") ") : std::string::npos;
    return end != std::string::npos && end + 2 < stat.value().size() && stat.value()[end + 2] != 'Z';
  };

  makePool();
  ASSERT_TRUE(pool_->start({}).ok());
  const std::string state = dir_ + "/sandbox";
  auto network = pool_->attach(Policy{}, Policy{}, state);
  ASSERT_TRUE(network.ok()) << network.error().message;
  const Slot slot = network.value()->slot();
  const jail::VmCgroup group = pool_->gatewayGroup(slot);
  ASSERT_EQ(group.dirs().size(), layout->roots.size());
  const pid_t first = network.value()->gatewayPid();
  EXPECT_TRUE(group.holds(first));
  EXPECT_EQ(group.processes(), std::vector<pid_t>{first});
  for (size_t i = 0; i < group.dirs().size(); ++i) {
    const std::string& dir = group.dirs()[i];
    EXPECT_EQ(dir, layout->roots[i].dir + "/gateways/" + slot.name);
    const std::string& controller = layout->roots[i].controller;
    if (layout->version == jail::CgroupVersion::kV2) {
      EXPECT_EQ(readLimit(dir + "/memory.max"), std::to_string(200 << 20));
      EXPECT_EQ(readLimit(dir + "/pids.max"), "1");
      EXPECT_EQ(readLimit(dir + "/cpu.max"), "40000 100000");
    } else if (controller == "memory") {
      EXPECT_EQ(readLimit(dir + "/memory.limit_in_bytes"), std::to_string(200 << 20));
    } else if (controller == "pids") {
      EXPECT_EQ(readLimit(dir + "/pids.max"), "1");
    } else if (controller == "cpu") {
      EXPECT_EQ(readLimit(dir + "/cpu.cfs_quota_us"), "40000");
      EXPECT_EQ(readLimit(dir + "/cpu.cfs_period_us"), "100000");
    }
  }

  // A restart: the new gateway alone in the group.
  ASSERT_TRUE(network.value()->restartGateway().ok());
  const pid_t second = network.value()->gatewayPid();
  EXPECT_NE(second, first);
  EXPECT_EQ(group.processes(), std::vector<pid_t>{second});

  // The next daemon's pool adopts it where it runs, with its own limits.
  network.value()->detach();
  network.value().reset();
  options.gateway_cpu_percent = 30;
  makePool();
  auto adopted = pool_->adopt(state);
  ASSERT_TRUE(adopted.ok()) << adopted.error().message;
  EXPECT_EQ(adopted.value()->gatewayPid(), second);
  for (size_t i = 0; i < group.dirs().size(); ++i) {
    if (layout->version == jail::CgroupVersion::kV2) {
      EXPECT_EQ(readLimit(group.dirs()[i] + "/cpu.max"), "30000 100000");
    } else if (layout->roots[i].controller == "cpu") {
      EXPECT_EQ(readLimit(group.dirs()[i] + "/cpu.cfs_quota_us"), "30000");
    }
  }

  // One found outside its group is replaced by one inside it.
  adopted.value()->detach();
  adopted.value().reset();
  auto outside = jail::VmCgroup::create(layout.value(), "outside", {});
  ASSERT_TRUE(outside.ok()) << outside.error().message;
  for (const std::string& procs : outside->procsFiles()) {
    std::ofstream(procs) << second << std::endl;
  }
  EXPECT_FALSE(group.holds(second));
  makePool();
  auto replaced = pool_->adopt(state);
  ASSERT_TRUE(replaced.ok()) << replaced.error().message;
  const pid_t third = replaced.value()->gatewayPid();
  EXPECT_NE(third, second);
  EXPECT_FALSE(running(second));
  EXPECT_EQ(group.processes(), std::vector<pid_t>{third});
  EXPECT_TRUE(outside->remove().ok());

  // A group a previous run left, with a process in it: start() ends both. The adopted slot's
  // group stays.
  auto left =
      jail::VmCgroup::create(jail::nestedLayout(layout.value(), "gateways").value(), options.slot_prefix + "-left", {});
  ASSERT_TRUE(left.ok()) << left.error().message;
  auto stray = ChildProcess::spawn({"sleep", "60"}, SpawnOptions{});
  ASSERT_TRUE(stray.ok()) << stray.error().message;
  for (const std::string& procs : left->procsFiles()) {
    std::ofstream(procs) << stray->pid() << std::endl;
  }
  EXPECT_TRUE(left->holds(stray->pid()));
  ASSERT_TRUE(pool_->start({}).ok());
  auto ended = stray->waitFor(5s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_TRUE(ended->signaled);
  EXPECT_FALSE(std::filesystem::exists(left->dirs().front()));
  EXPECT_EQ(group.processes(), std::vector<pid_t>{third});

  // The sandbox's network ends: its gateway and its group go.
  replaced.value().reset();
  EXPECT_FALSE(running(third));
  for (const std::string& dir : group.dirs()) EXPECT_FALSE(std::filesystem::exists(dir)) << dir;

  // spaced's sweep of empty VM groups takes the empty gateways/ group too: the next gateway
  // gets one again.
  EXPECT_GT(jail::removeEmptyVmGroups(layout.value()), 0);
  EXPECT_FALSE(std::filesystem::exists(layout->roots.front().dir + "/gateways"));
  auto next = pool_->attach(Policy{}, Policy{}, dir_ + "/next");
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_TRUE(pool_->gatewayGroup(next.value()->slot()).holds(next.value()->gatewayPid()));
  next.value().reset();
}

}  // namespace
}  // namespace space::net
