// Network gateway benchmark (issue 12): what a sandbox's space-gateway adds to its guest's
// traffic, and what an idle one holds. No VM and no packet off the machine: the "guest" is a
// namespace at the far end of a veth that replaces the slot's tap (as SlotTrafficTest does), the
// slot is a real one (SlotManager: namespace, sysctls, the product's nftables ruleset), the
// gateway is the real binary started as spaced starts it (NetworkPool::spawnGateway: its argv,
// its own uid, its directory owned by that uid, waiting for "ready"), and its upstream side is
// the fake internet of the tests (tests/support/fake_internet.h).
//
//   guest ns (eth0 169.254.0.2) --veth-- slot ns (tap0, slot rules, gateway listeners)
//     space-gateway ... upstream sockets in the fake internet's upstream ns --veth-- servers' ns
//
// Every baseline is measured in the same run, interleaved round by round with what it is
// compared to: the same requests to the same servers from the gateway's own upstream namespace
// (the path's last leg without the guest link, the redirect and the gateway).
//
// Usage: space-net-bench [--connections N] [--rounds N] [--dns-queries N] [--mib N]
//                        [--transfers N] [--echo-mib N] [--sandboxes N] [--settle-s N] [--raw DIR]
// On a VM whose cross-CPU wake-ups are slow, `taskset -c 0 space-net-bench` shows the gateway's
// own cost (bench/RESULTS.md, issue 12's entry).
// Needs root. Everything it makes is named netbench<pid>-* and removed on exit (also on
// SIGINT/SIGTERM); a start removes what a crashed earlier run left.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/process.h"
#include "common/unix_socket.h"
#include "net/addressing.h"
#include "net/dns_message.h"
#include "net/slot.h"
#include "net/tls_ca.h"
#include "percentiles.h"  // next to this file
#include "support/fake_internet.h"

namespace {

using namespace space;
using testsupport::FakeInternet;
using Clock = std::chrono::steady_clock;
using Ms = std::chrono::duration<double, std::milli>;
using bench::Stats;
using bench::stats;

// Slot bind mounts of this benchmark (never spaced's /run/space/netns).
constexpr const char* kNetnsDir = "/run/netbench";
// spaced gives slot i's gateway uid 1500000000 + i; this benchmark's gateways get ids apart
// from those, so they share none with the gateways of a spaced running on the same host.
constexpr uid_t kGatewayUidBase = 1500900000;

std::atomic<bool> g_stop{false};

struct Fatal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void checkStop() {
  if (g_stop.load()) throw Fatal("interrupted");
}

std::string prefix() { return "netbench" + std::to_string(getpid()); }

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void run(const std::vector<std::string>& argv) {
  testsupport::CommandResult r = testsupport::runCommand(argv, std::chrono::seconds(20));
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    throw Fatal(cmd + "failed: " + r.output);
  }
}

// Runs `fn` on a fresh thread that entered the network namespace at `path`; rethrows what it
// threw. Sockets made there stay in that namespace, so the timing loops run on that thread.
void inNs(const std::string& path, const std::function<void()>& fn) {
  std::exception_ptr error;
  std::thread t([&] {
    try {
      UniqueFd ns(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!ns.valid() || setns(ns.get(), CLONE_NEWNET) != 0)
        throw Fatal("cannot enter " + path + ": " + strerror(errno));
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
}

sockaddr_in addr4(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

UniqueFd tcpSocket() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Fatal(std::string("socket: ") + strerror(errno));
  timeval limit{5, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  return fd;
}

// ---- TCP connection set-up: connect, one HTTP request, its answer's first byte, then the rest.

struct ConnSample {
  double connect_ms = 0;     // connect() returned
  double first_byte_ms = 0;  // first byte of the HTTP answer (from before connect)
  double done_ms = 0;        // the server's close
};

bool httpConnection(const char* ip, const std::string& request, ConnSample* out) {
  UniqueFd fd = tcpSocket();
  sockaddr_in to = addr4(ip, 80);
  auto t0 = Clock::now();
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return false;
  out->connect_ms = Ms(Clock::now() - t0).count();
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
    return false;
  char buf[4096];
  ssize_t n = recv(fd.get(), buf, sizeof buf, 0);
  if (n <= 0) return false;
  out->first_byte_ms = Ms(Clock::now() - t0).count();
  std::string answer(buf, static_cast<size_t>(n));
  while ((n = recv(fd.get(), buf, sizeof buf, 0)) > 0) answer.append(buf, static_cast<size_t>(n));
  if (n < 0) return false;
  out->done_ms = Ms(Clock::now() - t0).count();
  return answer.rfind("HTTP/1.1 200", 0) == 0 && answer.find("host allowed.test") != std::string::npos;
}

// An HTTPS connection to allowed.test:443 (SNI and certificate name allowed.test, verified against
// `ca_file`): connect + TLS handshake + GET `path` + the first byte of the answer, then the rest.
// `body_bytes` (if not null) gets the answer's body size; `first_body` when the first body byte came.
bool httpsConnection(const std::string& ca_file, const std::string& path, ConnSample* out,
                     uint64_t* body_bytes = nullptr, Clock::time_point* first_body = nullptr) {
  static SSL_CTX* ctx = nullptr;
  static std::string ctx_ca;
  if (ctx == nullptr || ctx_ca != ca_file) {
    if (ctx != nullptr) SSL_CTX_free(ctx);
    ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) throw Fatal("cannot load " + ca_file);
    ctx_ca = ca_file;
  }
  UniqueFd fd = tcpSocket();
  sockaddr_in to = addr4(FakeInternet::kAllowedIp, 443);
  auto t0 = Clock::now();
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return false;
  out->connect_ms = Ms(Clock::now() - t0).count();
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx), SSL_free);
  SSL_set_fd(ssl.get(), fd.get());
  SSL_set_tlsext_host_name(ssl.get(), "allowed.test");
  SSL_set1_host(ssl.get(), "allowed.test");
  if (SSL_connect(ssl.get()) != 1) return false;
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n";
  if (SSL_write(ssl.get(), request.data(), static_cast<int>(request.size())) != static_cast<int>(request.size()))
    return false;
  std::vector<char> buf(64 * 1024);
  std::string head;
  uint64_t body = 0;
  for (;;) {
    int n = SSL_read(ssl.get(), buf.data(), static_cast<int>(buf.size()));
    if (n <= 0) break;  // close_notify, or a close without it: the answer's end either way
    if (out->first_byte_ms == 0) out->first_byte_ms = Ms(Clock::now() - t0).count();
    if (head.find("\r\n\r\n") == std::string::npos) {
      head.append(buf.data(), static_cast<size_t>(n));
      if (auto end = head.find("\r\n\r\n"); end != std::string::npos) {
        body = head.size() - end - 4;
        if (first_body) *first_body = Clock::now();
      }
    } else {
      body += static_cast<uint64_t>(n);
    }
  }
  out->done_ms = Ms(Clock::now() - t0).count();
  if (body_bytes) *body_bytes = body;
  return head.rfind("HTTP/1.1 200", 0) == 0;
}

// ---- Throughput

struct Transfer {
  double mb_per_s = 0;  // body bytes (10^6) per second, first body byte to last
  double total_ms = 0;  // request sent -> last byte
};

// GET /bytes/N from allowed.test:80.
Transfer download(uint64_t bytes) {
  UniqueFd fd = tcpSocket();
  sockaddr_in to = addr4(FakeInternet::kAllowedIp, 80);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) throw Fatal("download: connect failed");
  const std::string request =
      "GET /bytes/" + std::to_string(bytes) + " HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n";
  auto t0 = Clock::now();
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
    throw Fatal("download: send failed");
  std::vector<char> buf(256 * 1024);
  std::string head;
  uint64_t body = 0;
  Clock::time_point first{};
  for (;;) {
    ssize_t n = recv(fd.get(), buf.data(), buf.size(), 0);
    if (n < 0) throw Fatal(std::string("download: recv: ") + strerror(errno));
    if (n == 0) break;
    if (first == Clock::time_point{}) first = Clock::now();
    if (head.find("\r\n\r\n") == std::string::npos) {
      head.append(buf.data(), static_cast<size_t>(n));
      if (auto end = head.find("\r\n\r\n"); end != std::string::npos) body = head.size() - end - 4;
    } else {
      body += static_cast<uint64_t>(n);
    }
  }
  auto t1 = Clock::now();
  if (body != bytes) throw Fatal("download: got " + std::to_string(body) + " of " + std::to_string(bytes) + " bytes");
  return Transfer{static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(t1 - first).count(),
                  Ms(t1 - t0).count()};
}

// GET /bytes/N from allowed.test:443 (as httpsConnection).
Transfer downloadTls(const std::string& ca_file, uint64_t bytes) {
  ConnSample c;
  uint64_t got = 0;
  Clock::time_point first{};
  auto t0 = Clock::now();
  if (!httpsConnection(ca_file, "/bytes/" + std::to_string(bytes), &c, &got, &first) || got != bytes)
    throw Fatal("TLS download: got " + std::to_string(got) + " of " + std::to_string(bytes) + " bytes");
  auto t1 = Clock::now();
  return Transfer{static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(t1 - first).count(),
                  Ms(t1 - t0).count()};
}

// Sends `bytes` to the echo server (allowed.test:9000) while reading them back: both directions
// of the relay at once. MB/s each way.
Transfer echo(uint64_t bytes) {
  UniqueFd fd = tcpSocket();
  sockaddr_in to = addr4(FakeInternet::kAllowedIp, FakeInternet::kEchoPort);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) throw Fatal("echo: connect failed");
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  std::vector<char> out(256 * 1024, 'e'), in(256 * 1024);
  uint64_t sent = 0, received = 0;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::seconds(60);
  while (received < bytes) {
    if (Clock::now() > deadline) throw Fatal("echo: no end within 60 s");
    pollfd p{fd.get(), static_cast<short>(POLLIN | (sent < bytes ? POLLOUT : 0)), 0};
    if (poll(&p, 1, 1000) < 0 && errno != EINTR) throw Fatal("echo: poll");
    if (p.revents & POLLOUT) {
      ssize_t n = send(fd.get(), out.data(), std::min<uint64_t>(out.size(), bytes - sent), MSG_NOSIGNAL);
      if (n > 0) sent += static_cast<uint64_t>(n);
      if (n < 0 && errno != EAGAIN) throw Fatal(std::string("echo: send: ") + strerror(errno));
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(fd.get(), in.data(), in.size(), 0);
      if (n == 0) throw Fatal("echo: closed early");
      if (n > 0) received += static_cast<uint64_t>(n);
      if (n < 0 && errno != EAGAIN) throw Fatal(std::string("echo: recv: ") + strerror(errno));
    }
  }
  auto t1 = Clock::now();
  return Transfer{static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(t1 - t0).count(),
                  Ms(t1 - t0).count()};
}

// ---- DNS

// One UDP question on a fresh socket (as a stub resolver asks); the answer's rcode and answer
// count, or false on no answer within 3 s.
bool dnsQuery(const char* server, const std::string& name, uint16_t qtype, double* ms, int* rcode, int* answers) {
  static thread_local std::mt19937 random(std::random_device{}());
  const auto id = static_cast<uint16_t>(random());
  std::vector<uint8_t> q = net::buildQuery(id, name, qtype);
  UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  timeval limit{3, 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sockaddr_in to = addr4(server, 53);
  auto t0 = Clock::now();
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return false;
  if (send(fd.get(), q.data(), q.size(), 0) != static_cast<ssize_t>(q.size())) return false;
  uint8_t answer[net::kMaxDnsMessage];
  for (;;) {
    ssize_t n = recv(fd.get(), answer, sizeof answer, 0);
    if (n < 12) return false;
    if (((answer[0] << 8) | answer[1]) != id) continue;
    *ms = Ms(Clock::now() - t0).count();
    *rcode = answer[3] & 0x0f;
    *answers = (answer[6] << 8) | answer[7];
    return true;
  }
}

// ---- /proc

std::map<std::string, long> kbFields(const std::string& path) {
  std::map<std::string, long> out;
  std::istringstream lines(readText(path));
  std::string line;
  while (std::getline(lines, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream value(line.substr(colon + 1));
    long kb = 0;
    if (value >> kb) out[line.substr(0, colon)] = kb;
  }
  return out;
}

// CPU time of a process so far, all its threads (schedstat: nanoseconds, not clock ticks), ms.
double cpuMs(pid_t pid) {
  double ns = 0;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::istringstream fields(readText(task.path().string() + "/schedstat"));
    double on_cpu = 0;
    if (fields >> on_cpu) ns += on_cpu;
  }
  return ns / 1e6;
}

// Kernel memory that namespaces, devices, rulesets and sockets take (kB).
long kernelKb() {
  auto m = kbFields("/proc/meminfo");
  return m["Slab"] + m["KernelStack"] + m["PageTables"] + m["Percpu"];
}

// ---- The sandboxes: slot + guest + gateway, torn down by the destructor whatever happened.

struct Sandbox {
  net::Slot slot;
  std::string guest;  // "ip netns" name
  std::string gw_dir;
  std::unique_ptr<ChildProcess> gateway;
  std::string guestPath() const { return "/run/netns/" + guest; }
};

class Env {
 public:
  Env() : slots_(prefix(), kNetnsDir) {
    std::string dir = "/tmp/" + prefix() + "-XXXXXX";
    if (!mkdtemp(dir.data())) throw Fatal("mkdtemp failed");
    dir_ = dir;
  }
  ~Env() {
    for (auto& s : sandboxes) {
      if (s.gateway) s.gateway->terminate(std::chrono::milliseconds(500));
    }
    for (auto& s : sandboxes) {
      if (!s.guest.empty()) testsupport::runCommand({"ip", "netns", "delete", s.guest});
      if (s.slot.index >= 0) {
        if (Status st = slots_.destroy(s.slot); !st.ok())
          fprintf(stderr, "space-net-bench: %s\n", st.error().message.c_str());
      }
    }
    inet.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  const std::string& dir() const { return dir_; }

  // A slot with a "guest" at the end of its tap, and its gateway; `slot_ms` and `gateway_ms`
  // time SlotManager::create and spawn -> "ready".
  // `credentials_json`: the values file spaced would give the gateway ("" = none).
  Sandbox& add(const std::string& policy_json, double* slot_ms, double* gateway_ms,
               const std::string& credentials_json = "") {
    const int index = static_cast<int>(sandboxes.size());
    sandboxes.emplace_back();
    Sandbox& s = sandboxes.back();
    auto t0 = Clock::now();
    auto slot = slots_.create(index);
    *slot_ms = Ms(Clock::now() - t0).count();
    if (!slot.ok()) throw Fatal("slot: " + slot.error().message);
    s.slot = slot.value();

    s.guest = prefix() + "-g" + std::to_string(index);
    run({"ip", "netns", "add", s.guest});
    const std::string tap = net::kTapName;
    run({"nsenter", "--net=" + s.slot.netns_path, "sh", "-ec",
         "ip link del " + tap + "; ip link add " + tap + " address " + net::kTapMac +
             " mtu 1500 type veth peer name eth0 address " + net::kGuestMac + "; ip link set eth0 netns " + s.guest +
             "; ip addr add " + net::kGatewayIp + "/" + std::to_string(net::kPrefixLength) + " dev " + tap +
             "; ip link set " + tap + " up"});
    run({"nsenter", "--net=" + s.guestPath(), "sh", "-ec",
         std::string("ip link set lo up; ip addr add ") + net::kGuestIp + "/" + std::to_string(net::kPrefixLength) +
             " dev eth0; ip link set eth0 up; ip route add default via " + net::kGatewayIp});

    // As NetworkPool::spawnGateway: <state>/gw root's, 0711 (the gateway makes no file there);
    // the policy written by root with temp + rename; the gateway's log beside gw/.
    const std::string state = dir_ + "/" + std::to_string(index);
    s.gw_dir = state + "/gw";
    std::filesystem::create_directories(s.gw_dir);
    const uid_t uid = kGatewayUidBase + static_cast<uid_t>(index);
    if (chmod(s.gw_dir.c_str(), 0711) != 0) throw Fatal("chmod gw dir");
    setPolicy(s, policy_json);
    const std::string credentials = s.gw_dir + "/credentials.json";
    if (!credentials_json.empty()) {
      // As SandboxNetwork::setCredentials: the gateway's uid, 0400.
      if (Status st = writeFileAtomic(credentials, credentials_json, 0400); !st.ok()) throw Fatal(st.error().message);
      if (chown(credentials.c_str(), uid, uid) != 0) throw Fatal("chown credentials");
    }

    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) throw Fatal("pipe");
    UniqueFd read_end(ready[0]), write_end(ready[1]);
    std::vector<std::string> argv = {SPACE_GATEWAY_BIN,
                                     "--slot-netns",
                                     s.slot.netns_path,
                                     "--policy",
                                     s.gw_dir + "/policy.json",
                                     "--audit",
                                     s.gw_dir + "/audit.jsonl",
                                     "--credentials",
                                     credentials,
                                     "--ready-fd",
                                     "3",
                                     "--user",
                                     "#" + std::to_string(uid),
                                     "--upstream-netns",
                                     inet->upstreamNetnsPath(),
                                     "--upstream-dns",
                                     inet->dnsServer(),
                                     "--upstream-ca",
                                     inet->caPath()};
    SpawnOptions spawn{state + "/gateway.log", "", true};
    spawn.pass_fds = {{write_end.get(), 3}};
    t0 = Clock::now();
    auto child = ChildProcess::spawn(argv, spawn);
    write_end.reset();
    if (!child.ok()) throw Fatal("gateway: " + child.error().message);
    s.gateway = std::make_unique<ChildProcess>(std::move(child.value()));
    pollfd p{read_end.get(), POLLIN, 0};
    char buf[8] = {};
    ssize_t n = poll(&p, 1, 10000) == 1 ? read(read_end.get(), buf, sizeof buf) : 0;
    *gateway_ms = Ms(Clock::now() - t0).count();
    if (n < 5 || std::string(buf, 5) != "ready")
      throw Fatal("the gateway did not start: " + readText(state + "/gateway.log"));
    return s;
  }

  static void setPolicy(const Sandbox& s, const std::string& policy_json) {
    if (Status st = writeFileAtomic(s.gw_dir + "/policy.json", policy_json + "\n", 0644); !st.ok())
      throw Fatal(st.error().message);
  }

  std::unique_ptr<FakeInternet> inet;
  std::vector<Sandbox> sandboxes;

 private:
  net::SlotManager slots_;
  std::string dir_;
};

// What crashed earlier runs of this benchmark left (their pid is gone): the processes they
// started (the fake internet's servers, the gateways: each lives in one of that run's
// namespaces, matched by the namespace's inode), their slots, namespaces and directory. (The
// fake internet's own /tmp/gwtest-inet-* directory of such a run stays.)
void sweepLeftovers() {
  auto deadRun = [](const std::string& name, std::string* run_prefix) {
    if (name.rfind("netbench", 0) != 0) return false;
    size_t end = name.find('-');
    std::string digits = name.substr(8, end == std::string::npos ? std::string::npos : end - 8);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      return false;
    *run_prefix = "netbench" + digits;
    return kill(std::stoi(digits), 0) != 0 && errno == ESRCH;
  };
  std::error_code ec;
  std::vector<std::string> stale_netns;
  std::vector<ino_t> stale_inodes;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    std::string run_prefix;
    if (!deadRun(entry.path().filename(), &run_prefix)) continue;
    stale_netns.push_back(entry.path().filename());
    struct stat st {};
    if (stat(entry.path().c_str(), &st) == 0) stale_inodes.push_back(st.st_ino);
  }
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, ec)) {
    std::string run_prefix;
    if (!deadRun(entry.path().filename(), &run_prefix)) continue;
    struct stat st {};
    if (stat(entry.path().c_str(), &st) == 0) stale_inodes.push_back(st.st_ino);
  }
  if (!stale_inodes.empty()) {
    for (const auto& proc : std::filesystem::directory_iterator("/proc", ec)) {
      std::string pid = proc.path().filename();
      if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
      struct stat st {};
      if (stat((proc.path().string() + "/ns/net").c_str(), &st) != 0) continue;
      if (std::find(stale_inodes.begin(), stale_inodes.end(), st.st_ino) != stale_inodes.end()) {
        fprintf(stderr, "space-net-bench: removing process %s left by a crashed run\n", pid.c_str());
        kill(std::stoi(pid), SIGKILL);
      }
    }
  }
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, ec)) {
    std::string run_prefix;
    if (!deadRun(entry.path().filename(), &run_prefix)) continue;
    std::string rest = entry.path().filename().string().substr(run_prefix.size() + 1);
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos) continue;
    net::SlotManager stale(run_prefix, kNetnsDir);
    if (Status st = stale.destroy(stale.slotAt(std::stoi(rest))); !st.ok())
      fprintf(stderr, "space-net-bench: leftover %s: %s\n", rest.c_str(), st.error().message.c_str());
  }
  for (const auto& name : stale_netns) testsupport::runCommand({"ip", "netns", "delete", name});
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    std::string run_prefix;
    if (entry.is_directory(ec) && deadRun(entry.path().filename(), &run_prefix))
      std::filesystem::remove_all(entry.path(), ec);
  }
}

// ---- Output

void printRow(const std::string& name, const Stats& s, const char* unit = "ms") {
  char p99[32] = "       -";
  if (!std::isnan(s.p99)) snprintf(p99, sizeof p99, "%8.3f", s.p99);
  printf("%-58s p50 %8.3f %s  p90 %8.3f  p99 %s  max %8.3f  (n=%zu)\n", name.c_str(), s.p50, unit, s.p90, p99, s.max,
         s.n);
}

// Runs `per_round` repetitions of each variant, variant after variant, `rounds` times: the
// baseline and what it is compared to see the same moments of a noisy machine.
struct Variant {
  std::string ns;
  std::function<void()> once;
};
void interleave(std::vector<Variant>& variants, int rounds, int per_round) {
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) {
      checkStop();
      inNs(v.ns, [&] {
        for (int i = 0; i < per_round; ++i) v.once();
      });
    }
  }
}

struct Memory {
  long rss = 0, pss = 0, pss_anon = 0, private_kb = 0;
};
Memory memoryOf(pid_t pid) {
  auto m = kbFields("/proc/" + std::to_string(pid) + "/smaps_rollup");
  return Memory{m["Rss"], m["Pss"], m["Pss_Anon"], m["Private_Clean"] + m["Private_Dirty"]};
}
void printMemory(const std::string& name, const std::vector<Memory>& all) {
  Memory sum, max;
  for (const auto& m : all) {
    sum.rss += m.rss, sum.pss += m.pss, sum.pss_anon += m.pss_anon, sum.private_kb += m.private_kb;
    max.rss = std::max(max.rss, m.rss), max.pss = std::max(max.pss, m.pss);
  }
  const double n = static_cast<double>(all.size());
  printf("%-58s RSS %7.0f kB  PSS %7.0f kB (max %ld)  PSS anon %6.0f kB  private %6.0f kB  (n=%zu)\n", name.c_str(),
         static_cast<double>(sum.rss) / n, static_cast<double>(sum.pss) / n, max.pss,
         static_cast<double>(sum.pss_anon) / n, static_cast<double>(sum.private_kb) / n, all.size());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"space-net-bench: the sandbox network gateway against direct connections, on a fake internet"};
  int connections = 500, rounds = 10, dns_queries = 300, mib = 64, transfers = 6, echo_mib = 32, sandboxes = 20;
  int settle_s = 2;
  std::string raw_dir;
  app.add_option("--connections", connections, "HTTP connections per variant (set-up latency)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "rounds the variants alternate in")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dns-queries", dns_queries, "DNS questions per variant (paced under the gateway's 200/s)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--mib", mib, "GET /bytes/N size for throughput, MiB")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--transfers", transfers, "downloads (and echo runs) per variant")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--echo-mib", echo_mib, "bytes through the echo server, MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--sandboxes", sandboxes, "slots + gateways started (idle memory, set-up time, first use)")
      ->check(CLI::Range(3, 200))
      ->capture_default_str();
  app.add_option("--settle-s", settle_s, "idle time before memory is read")
      ->check(CLI::Range(0, 600))
      ->capture_default_str();
  app.add_option("--raw", raw_dir, "write each latency series there, one sample (ms) a line, in run order");
  CLI11_PARSE(app, argc, argv);
  if (geteuid() != 0) {
    fprintf(stderr, "space-net-bench: needs root (namespaces, nftables)\n");
    return 2;
  }

  // SIGINT/SIGTERM/SIGHUP end the run through the normal clean-up (children get the default
  // mask back: ChildProcess::spawn resets it).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, s);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread([stop_signals] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    fprintf(stderr, "space-net-bench: signal %d, cleaning up\n", signal);
    g_stop = true;
  }).detach();

  sweepLeftovers();
  int rc = 0;
  try {
    Env env;
    auto inet = FakeInternet::start(prefix());
    if (!inet.ok()) throw Fatal("fake internet: " + inet.error().message);
    env.inet = std::move(inet.value());
    const std::string upstream = env.inet->upstreamNetnsPath();
    const std::string allow_all = R"({"egress":"allow"})";
    const std::string allow_list = R"({"egress":"policy","allow":["allowed.test"]})";
    // A credential rule for allowed.test over plain HTTP: every request gets a header added.
    const std::string credential_rule = R"({"egress":"policy","credentials":[{"host":"allowed.test","plain_http":true,)"
                                        R"("headers":{"Authorization":"Bearer {{secret:gh}}"}}]})";
    // c's credential CA (as spaced derives one): its gateway terminates TLS to allowed.test.
    net::CaSeed ca_seed;
    ca_seed.fill(7);
    auto ca = net::deriveCredentialCa(ca_seed, "bench");
    if (!ca.ok()) throw Fatal(ca.error().message);
    const std::string credential_values =
        nlohmann::json{{"secrets", {{"gh", "ghp_0123456789abcdef0123456789abcdef0123"}}},
                       {"tls", {{"ca_cert", ca->cert_pem}, {"ca_key", ca->key_pem}}}}
            .dump();

    // --- Set-up of each sandbox's network, and what idle gateways hold.
    const long kernel_before = kernelKb();
    std::vector<double> slot_ms, gateway_ms;
    for (int i = 0; i < sandboxes; ++i) {
      checkStop();
      double s = 0, g = 0;
      if (i == 2) {
        env.add(credential_rule, &s, &g, credential_values);
      } else {
        env.add(i == 1 ? allow_list : allow_all, &s, &g);
      }
      slot_ms.push_back(s);
      gateway_ms.push_back(g);
    }
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));
    const long kernel_after = kernelKb();
    std::vector<Memory> fresh;
    for (const auto& s : env.sandboxes) fresh.push_back(memoryOf(s.gateway->pid()));
    // Baseline: the smallest process there is, of the same run (what any process costs).
    auto sleeper = ChildProcess::spawn({"/bin/sleep", "60"}, SpawnOptions{});
    if (!sleeper.ok()) throw Fatal(sleeper.error().message);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Memory sleep_memory = memoryOf(sleeper->pid());
    sleeper->kill();

    Sandbox& a = env.sandboxes[0];  // egress allow (the node default)
    Sandbox& b = env.sandboxes[1];  // egress policy, allow ["allowed.test"]
    const std::string request = "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n";
    int failures = 0;

    // --- First use of a fresh gateway (every sandbox but a, b and c): a DNS answer, a connection.
    std::vector<double> first_dns, first_conn, second_conn;
    for (size_t i = 3; i < env.sandboxes.size(); ++i) {
      checkStop();
      inNs(env.sandboxes[i].guestPath(), [&] {
        double ms = 0;
        int rcode = -1, answers = 0;
        if (dnsQuery(net::kGatewayIp, "allowed.test", net::dns::kTypeA, &ms, &rcode, &answers) && rcode == 0 &&
            answers == 1) {
          first_dns.push_back(ms);
        } else {
          ++failures;
        }
        ConnSample c;
        if (httpConnection(FakeInternet::kAllowedIp, request, &c))
          first_conn.push_back(c.first_byte_ms);
        else
          ++failures;
        if (httpConnection(FakeInternet::kAllowedIp, request, &c))
          second_conn.push_back(c.first_byte_ms);
        else
          ++failures;
      });
    }

    // --- DNS: through b's gateway (policy allowing allowed.test) vs the resolver directly.
    // Paced at one question per 6 ms (~166/s): the gateway answers 200/s (burst 400) at most.
    std::vector<double> dns_direct, dns_gw_a, dns_gw_aaaa, dns_gw_denied;
    auto paced = [&](std::vector<double>& into, const char* server, const char* name, uint16_t qtype, int want_rcode,
                     int want_answers) {
      return [&into, server, name, qtype, want_rcode, want_answers, &failures] {
        auto t0 = Clock::now();
        double ms = 0;
        int rcode = -1, answers = -1;
        if (dnsQuery(server, name, qtype, &ms, &rcode, &answers) && rcode == want_rcode && answers == want_answers)
          into.push_back(ms);
        else
          ++failures;
        std::this_thread::sleep_until(t0 + std::chrono::milliseconds(6));
      };
    };
    double dns_first_b = 0;
    inNs(b.guestPath(), [&] {
      int rcode = -1, answers = 0;
      if (!dnsQuery(net::kGatewayIp, "allowed.test", net::dns::kTypeA, &dns_first_b, &rcode, &answers) || rcode != 0)
        throw Fatal("b: allowed.test did not resolve");
    });
    const int dns_upstream_before = env.inet->dnsQueries();
    const double b_cpu_dns0 = cpuMs(b.gateway->pid());
    {
      std::vector<Variant> v = {
          {upstream, paced(dns_direct, FakeInternet::kDnsIp, "allowed.test", net::dns::kTypeA, 0, 1)},
          {b.guestPath(), paced(dns_gw_a, net::kGatewayIp, "allowed.test", net::dns::kTypeA, 0, 1)},
          {b.guestPath(), paced(dns_gw_aaaa, net::kGatewayIp, "allowed.test", net::dns::kTypeAaaa, 0, 0)},
          {b.guestPath(), paced(dns_gw_denied, net::kGatewayIp, "denied.test", net::dns::kTypeA, 3, 0)},
      };
      interleave(v, rounds, std::max(1, dns_queries / rounds));
    }
    const double b_cpu_dns = cpuMs(b.gateway->pid()) - b_cpu_dns0;
    const int dns_upstream = env.inet->dnsQueries() - dns_upstream_before;

    // --- TCP set-up: connect + request + first byte of the answer, then the rest.
    std::vector<ConnSample> tcp_direct, tcp_gw_allow, tcp_gw_pinned, tcp_gw_credential;
    Sandbox& c = env.sandboxes[2];  // a credential rule for allowed.test (plain HTTP)
    inNs(c.guestPath(), [&] {
      double ms = 0;
      int rcode = -1, answers = 0;
      if (!dnsQuery(net::kGatewayIp, "allowed.test", net::dns::kTypeA, &ms, &rcode, &answers) || rcode != 0)
        throw Fatal("c: allowed.test did not resolve");
    });
    auto connection = [&](std::vector<ConnSample>& into) {
      return [&into, &request, &failures] {
        ConnSample c;
        if (httpConnection(FakeInternet::kAllowedIp, request, &c))
          into.push_back(c);
        else
          ++failures;
      };
    };
    const double a_cpu_tcp0 = cpuMs(a.gateway->pid()), b_cpu_tcp0 = cpuMs(b.gateway->pid()),
                 c_cpu_tcp0 = cpuMs(c.gateway->pid());
    {
      std::vector<Variant> v = {{upstream, connection(tcp_direct)},
                                {a.guestPath(), connection(tcp_gw_allow)},
                                {b.guestPath(), connection(tcp_gw_pinned)},
                                {c.guestPath(), connection(tcp_gw_credential)}};
      interleave(v, rounds, std::max(1, connections / rounds));
    }
    const double a_cpu_tcp = cpuMs(a.gateway->pid()) - a_cpu_tcp0, b_cpu_tcp = cpuMs(b.gateway->pid()) - b_cpu_tcp0,
                 c_cpu_tcp = cpuMs(c.gateway->pid()) - c_cpu_tcp0;
    // Every one of c's requests must have had its header added (else the variant measures nothing).
    if (readText(c.gw_dir + "/audit.jsonl").find("\"kind\":\"credential\"") == std::string::npos)
      throw Fatal("c: no credential was added; its audit log: " + readText(c.gw_dir + "/audit.jsonl").substr(0, 2000) +
                  "\ngateway log: " + readText(c.gw_dir + "/../gateway.log").substr(0, 2000));

    // --- HTTPS set-up: direct, spliced by SNI (a), terminated with the header added (c).
    const std::string guest_ca = env.dir() + "/guest-ca.pem";
    if (Status st = writeFileAtomic(guest_ca, ca->cert_pem, 0644); !st.ok()) throw Fatal(st.error().message);
    std::vector<ConnSample> tls_direct, tls_gw_spliced, tls_gw_terminated;
    auto tls_connection = [&](std::vector<ConnSample>& into, const std::string& ca_file) {
      return [&into, ca_file, &failures] {
        ConnSample c;
        if (httpsConnection(ca_file, "/", &c))
          into.push_back(c);
        else
          ++failures;
      };
    };
    const double a_cpu_tls0 = cpuMs(a.gateway->pid()), c_cpu_tls0 = cpuMs(c.gateway->pid());
    {
      std::vector<Variant> v = {{upstream, tls_connection(tls_direct, env.inet->caPath())},
                                {a.guestPath(), tls_connection(tls_gw_spliced, env.inet->caPath())},
                                {c.guestPath(), tls_connection(tls_gw_terminated, guest_ca)}};
      interleave(v, rounds, std::max(1, connections / rounds));
    }
    const double a_cpu_tls = cpuMs(a.gateway->pid()) - a_cpu_tls0, c_cpu_tls = cpuMs(c.gateway->pid()) - c_cpu_tls0;
    if (readText(c.gw_dir + "/audit.jsonl").find("\"tls\":\"terminated\"") == std::string::npos)
      throw Fatal("c: no TLS connection was terminated; its audit log: " +
                  readText(c.gw_dir + "/audit.jsonl").substr(0, 2000));

    // --- Throughput: one download of --mib MiB per turn, and the echo both ways.
    const uint64_t bytes = static_cast<uint64_t>(mib) << 20, echo_bytes = static_cast<uint64_t>(echo_mib) << 20;
    std::vector<double> dl_direct, dl_gw, echo_direct, echo_gw;
    const double a_cpu_dl0 = cpuMs(a.gateway->pid());
    {
      std::vector<Variant> v = {{upstream, [&] { dl_direct.push_back(download(bytes).mb_per_s); }},
                                {a.guestPath(), [&] { dl_gw.push_back(download(bytes).mb_per_s); }}};
      interleave(v, transfers, 1);
    }
    const double a_cpu_dl = cpuMs(a.gateway->pid()) - a_cpu_dl0;
    std::vector<double> tls_dl_direct, tls_dl_spliced, tls_dl_terminated;
    const double c_cpu_tls_dl0 = cpuMs(c.gateway->pid());
    {
      std::vector<Variant> v = {
          {upstream, [&] { tls_dl_direct.push_back(downloadTls(env.inet->caPath(), bytes).mb_per_s); }},
          {a.guestPath(), [&] { tls_dl_spliced.push_back(downloadTls(env.inet->caPath(), bytes).mb_per_s); }},
          {c.guestPath(), [&] { tls_dl_terminated.push_back(downloadTls(guest_ca, bytes).mb_per_s); }}};
      interleave(v, transfers, 1);
    }
    const double c_cpu_tls_dl = cpuMs(c.gateway->pid()) - c_cpu_tls_dl0;
    const double a_cpu_echo0 = cpuMs(a.gateway->pid());
    {
      std::vector<Variant> v = {{upstream, [&] { echo_direct.push_back(echo(echo_bytes).mb_per_s); }},
                                {a.guestPath(), [&] { echo_gw.push_back(echo(echo_bytes).mb_per_s); }}};
      interleave(v, transfers, 1);
    }
    const double a_cpu_echo = cpuMs(a.gateway->pid()) - a_cpu_echo0;

    // --- Memory of the gateways that carried all this, idle again.
    std::this_thread::sleep_for(std::chrono::seconds(settle_s));
    Memory after_a = memoryOf(a.gateway->pid()), after_b = memoryOf(b.gateway->pid());
    for (const auto& s : env.sandboxes) {
      if (auto exited = s.gateway->tryWait()) throw Fatal("a gateway exited: " + exited->describe());
    }

    // --- Report.
    auto pick = [](const std::vector<ConnSample>& v, double ConnSample::*field) {
      std::vector<double> out;
      for (const auto& c : v) out.push_back(c.*field);
      return out;
    };
    auto need = [&raw_dir](const std::vector<double>& v, const char* what) {
      if (v.empty()) throw Fatal(std::string("no successful sample: ") + what);
      if (!raw_dir.empty()) {
        std::filesystem::create_directories(raw_dir);
        std::string file = what;
        for (char& c : file) c = c == ' ' ? '_' : c;
        std::ofstream out(raw_dir + "/" + file + ".txt");
        for (double x : v) out << x << "\n";
      }
      return stats(v);
    };
    printf(
        "space-net-bench: %d connections, %d DNS questions per variant, %d rounds; %d x %d MiB downloads, "
        "%d x %d MiB echo; %d sandboxes\n",
        connections, dns_queries, rounds, transfers, mib, transfers, echo_mib, sandboxes);
    printf("\nTCP set-up: connect + HTTP GET to allowed.test:80 + first byte of the answer\n");
    printRow("baseline: direct, from the upstream ns", need(pick(tcp_direct, &ConnSample::first_byte_ms), "direct"));
    printRow("gateway, egress allow", need(pick(tcp_gw_allow, &ConnSample::first_byte_ms), "gw allow"));
    printRow("gateway, egress policy (allow list, pinned name)",
             need(pick(tcp_gw_pinned, &ConnSample::first_byte_ms), "gw pinned"));
    printRow("gateway, credential rule (plain HTTP, header added)",
             need(pick(tcp_gw_credential, &ConnSample::first_byte_ms), "gw credential"));
    printRow("  connect() alone: direct", stats(pick(tcp_direct, &ConnSample::connect_ms)));
    printRow("  connect() alone: gateway (answered in the slot)", stats(pick(tcp_gw_allow, &ConnSample::connect_ms)));
    printRow("  to the server's close: direct", stats(pick(tcp_direct, &ConnSample::done_ms)));
    printRow("  to the server's close: gateway, egress allow", stats(pick(tcp_gw_allow, &ConnSample::done_ms)));
    if (sandboxes > 3) {
      printRow("first connection of a fresh gateway (after 1 DNS answer)", need(first_conn, "first conn"));
      printRow("second connection of that gateway", need(second_conn, "second conn"));
    }
    printf("gateway CPU per connection: egress allow %.3f ms, policy %.3f ms, credential rule %.3f ms\n",
           a_cpu_tcp / static_cast<double>(tcp_gw_allow.size()), b_cpu_tcp / static_cast<double>(tcp_gw_pinned.size()),
           c_cpu_tcp / static_cast<double>(tcp_gw_credential.size()));

    printf("\nHTTPS set-up: connect + TLS handshake + GET allowed.test:443 + first byte of the answer\n");
    printRow("baseline: direct, from the upstream ns",
             need(pick(tls_direct, &ConnSample::first_byte_ms), "tls direct"));
    printRow("gateway, spliced by SNI (egress allow)",
             need(pick(tls_gw_spliced, &ConnSample::first_byte_ms), "tls gw spliced"));
    printRow("gateway, terminated for a credential rule (header added)",
             need(pick(tls_gw_terminated, &ConnSample::first_byte_ms), "tls gw terminated"));
    printf("gateway CPU per HTTPS connection: spliced %.3f ms, terminated %.3f ms\n",
           a_cpu_tls / static_cast<double>(tls_gw_spliced.size()),
           c_cpu_tls / static_cast<double>(tls_gw_terminated.size()));

    printf("\nThroughput (MB/s, 10^6 bytes, first byte to last)\n");
    printRow("baseline: GET /bytes/N direct", need(dl_direct, "dl direct"), "MB/s");
    printRow("GET /bytes/N through the gateway", need(dl_gw, "dl gw"), "MB/s");
    printRow("baseline: HTTPS GET /bytes/N direct", need(tls_dl_direct, "tls dl direct"), "MB/s");
    printRow("HTTPS GET /bytes/N spliced by the gateway", need(tls_dl_spliced, "tls dl spliced"), "MB/s");
    printRow("HTTPS GET /bytes/N terminated by the gateway", need(tls_dl_terminated, "tls dl terminated"), "MB/s");
    printf("gateway CPU, terminated HTTPS downloads: %.2f ms/MB\n",
           c_cpu_tls_dl / (static_cast<double>(bytes) * transfers / 1e6));
    printRow("baseline: echo both ways at once, direct (each way)", need(echo_direct, "echo direct"), "MB/s");
    printRow("echo both ways at once, through the gateway (each way)", need(echo_gw, "echo gw"), "MB/s");
    printf(
        "gateway CPU: downloads %.0f ms for %.0f MB (%.2f ms/MB); echo %.0f ms for %.0f MB each way (%.2f ms/MB "
        "relayed)\n",
        a_cpu_dl, static_cast<double>(bytes) * transfers / 1e6,
        a_cpu_dl / (static_cast<double>(bytes) * transfers / 1e6), a_cpu_echo,
        static_cast<double>(echo_bytes) * transfers / 1e6,
        a_cpu_echo / (2 * static_cast<double>(echo_bytes) * transfers / 1e6));

    printf("\nDNS (UDP, a fresh socket per question)\n");
    printRow("baseline: allowed.test A, resolver directly", need(dns_direct, "dns direct"));
    printRow("gateway: allowed.test A (asked upstream every time)", need(dns_gw_a, "dns gw a"));
    printRow("gateway: allowed.test AAAA (NODATA, answered locally)", need(dns_gw_aaaa, "dns gw aaaa"));
    printRow("gateway: denied.test A (NXDOMAIN, answered locally)", need(dns_gw_denied, "dns gw denied"));
    if (sandboxes > 3) printRow("gateway: first question of a fresh gateway", need(first_dns, "first dns"));
    printf(
        "first question to gateway b: %.3f ms; upstream questions during the DNS rounds: %d (direct %zu + "
        "gateway A %zu); gateway CPU %.0f ms for %zu questions\n",
        dns_first_b, dns_upstream, dns_direct.size(), dns_gw_a.size(), b_cpu_dns,
        dns_gw_a.size() + dns_gw_aaaa.size() + dns_gw_denied.size());

    printf("\nSet-up per sandbox (off the create path when pooled)\n");
    printRow("SlotManager::create (namespace, tap, sysctls, nftables)", stats(slot_ms));
    printRow("gateway spawn -> \"ready\"", stats(gateway_ms));

    printf("\nMemory (smaps_rollup, after %d s idle)\n", settle_s);
    printMemory("idle gateway, never used (" + std::to_string(sandboxes) + " running)", fresh);
    printMemory("gateway after the TCP/throughput runs (egress allow)", {after_a});
    printMemory("gateway after the DNS/TCP runs (egress policy)", {after_b});
    printMemory("baseline: /bin/sleep", {sleep_memory});
    printf(
        "kernel memory (Slab+KernelStack+PageTables+Percpu) per sandbox, rough: %.0f kB (%ld kB for %d; "
        "includes the guest end)\n",
        static_cast<double>(kernel_after - kernel_before) / sandboxes, kernel_after - kernel_before, sandboxes);
    printf("\nfailed samples: %d\n", failures);
    if (failures > 0) rc = 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "space-net-bench: %s\n", e.what());
    rc = 1;
  }
  return rc;
}
