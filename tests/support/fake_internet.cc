#include "support/fake_internet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "net/dns_message.h"
#include "net/policy.h"

namespace space::testsupport {

namespace {

// One python3 process serves every TCP/UDP server of the fake internet, one thread each.
constexpr const char* kServersPy = R"PY(
import socket, socketserver, ssl, sys, threading, http.server

cert, key = sys.argv[1], sys.argv[2]
HTTP = ["198.51.100.10", "198.51.100.20", "203.0.113.30", "10.0.0.5", "169.254.169.254"]
HTTPS = ["198.51.100.10", "198.51.100.20"]
BANNER = b"SSH-2.0-fake-banner\r\n"

class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        ip, port = self.connection.getsockname()[:2]
        if self.path.startswith("/bytes/"):
            body = b"x" * min(int(self.path[7:]), 100 << 20)
        else:
            body = ("server %s:%d host %s\n" % (ip, port, self.headers.get("Host", ""))).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(cert, key)

class Https(Http):
    def setup(self):
        # The handshake runs on the connection's own thread, never in accept().
        self.request = tls.wrap_socket(self.request, server_side=True)
        super().setup()

class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

class Banner(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.sendall(BANNER)
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)

class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)

class Tcp(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

class UdpEcho(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(data, self.client_address)

servers = [Server((ip, 80), Http) for ip in HTTP] + [Server((ip, 443), Https) for ip in HTTPS]
servers += [Tcp(("198.51.100.10", 2222), Banner), Tcp(("198.51.100.10", 9000), Echo)]
servers += [socketserver.UDPServer(("198.51.100.10", 7), UdpEcho)]
for s in servers:
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
)PY";

struct Entry {
  std::vector<uint32_t> ips;
  uint32_t ttl = 300;
};

const std::map<std::string, Entry>& table() {
  static const std::map<std::string, Entry> t = [] {
    std::map<std::string, Entry> out;
    for (const auto& n : FakeInternet::names()) {
      Entry e;
      for (const auto& ip : n.ips) e.ips.push_back(*net::parseIpv4(ip));
      out[n.name] = e;
    }
    out["short-ttl.test"] = Entry{{*net::parseIpv4(FakeInternet::kAllowedIp)}, 1};
    return out;
  }();
  return t;
}

Status sysError(const std::string& what) { return makeError(ErrorCode::kInternal, what + ": " + strerror(errno)); }

Status run(const std::vector<std::string>& argv) {
  CommandResult r = runCommand(argv);
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    return makeError(ErrorCode::kInternal, cmd + "failed: " + r.output);
  }
  return okStatus();
}

// Whether a TCP connection to ip:port succeeds now (called inside the namespace).
bool accepts(const std::string& ip, uint16_t port) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

}  // namespace

void inNetns(const std::string& netns_path, const std::function<void()>& fn) {
  std::thread t([&] {
    UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns.valid() || setns(ns.get(), CLONE_NEWNET) != 0) {
      ADD_FAILURE() << "cannot enter " << netns_path << ": " << strerror(errno);
      return;
    }
    fn();
  });
  t.join();
}

CommandResult runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                         const std::string& netns_path) {
  CommandResult out;
  char path[] = "/tmp/gwtest-cmd-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) {
    out.output = "mkstemp failed";
    return out;
  }
  ::close(fd);
  SpawnOptions options;
  options.stdout_path = path;
  options.netns_path = netns_path;
  auto child = ChildProcess::spawn(argv, options);
  if (!child.ok()) {
    ::unlink(path);
    out.output = child.error().message;
    return out;
  }
  auto status = child->waitFor(timeout);
  if (!status) status = child->kill();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  out.output = text.str();
  ::unlink(path);
  out.exit_code = status->signaled ? -1 : status->exit_code;
  return out;
}

std::vector<FakeInternet::Name> FakeInternet::names() {
  return {
      {"allowed.test", {kAllowedIp}},     {"denied.test", {kDeniedIp}}, {"other.test", {kOtherIp}},
      {"rebind.test", {kPrivateIp}},      {"meta.test", {kMetadataIp}}, {"mixed.test", {kAllowedIp, kPrivateIp}},
      {"www.allowed.test", {kAllowedIp}},
  };
}

Result<std::unique_ptr<FakeInternet>> FakeInternet::start(const std::string& prefix) {
  std::unique_ptr<FakeInternet> inet(new FakeInternet(prefix + "-inet"));
  SPACE_TRY(inet->build());
  return inet;
}

Status FakeInternet::build() {
  char dir[] = "/tmp/gwtest-inet-XXXXXX";
  if (!mkdtemp(dir)) return sysError("mkdtemp");
  dir_ = dir;
  SPACE_TRY(run({"ip", "netns", "add", name_}));
  netns_created_ = true;
  SPACE_TRY(run({"ip", "-n", name_, "link", "set", "lo", "up"}));
  // A dummy interface holds the addresses where the kernel has the driver; lo otherwise. Both
  // make them local to the namespace, and neither gives it a route anywhere else.
  std::string dev = "inet0";
  if (runCommand({"ip", "-n", name_, "link", "add", dev, "type", "dummy"}).exit_code == 0) {
    SPACE_TRY(run({"ip", "-n", name_, "link", "set", dev, "up"}));
  } else {
    dev = "lo";
  }
  for (const char* ip : {kDnsIp, kAllowedIp, kDeniedIp, kOtherIp, kPrivateIp, kMetadataIp}) {
    SPACE_TRY(run({"ip", "-n", name_, "addr", "add", std::string(ip) + "/32", "dev", dev}));
  }
  // The gateways' side: a namespace of its own whose only route is a veth into the servers'
  // one, as a host's uplink would be. (A gateway refuses addresses local to its own namespace,
  // so the servers cannot live there.)
  SPACE_TRY(run({"ip", "netns", "add", upstreamName()}));
  upstream_created_ = true;
  SPACE_TRY(run({"ip", "-n", upstreamName(), "link", "set", "lo", "up"}));
  SPACE_TRY(
      run({"ip", "-n", upstreamName(), "link", "add", "up0", "type", "veth", "peer", "name", "in0", "netns", name_}));
  SPACE_TRY(run({"ip", "-n", upstreamName(), "addr", "add", std::string(kUplinkIp) + "/30", "dev", "up0"}));
  SPACE_TRY(run({"ip", "-n", name_, "addr", "add", std::string(kUplinkPeerIp) + "/30", "dev", "in0"}));
  SPACE_TRY(run({"ip", "-n", upstreamName(), "link", "set", "up0", "up"}));
  SPACE_TRY(run({"ip", "-n", name_, "link", "set", "in0", "up"}));
  // A route to each server and to nothing else: an address the fake internet lacks is
  // unreachable at once, as a dead host would be (not a silent drop and a timeout).
  for (const char* ip : {kDnsIp, kAllowedIp, kDeniedIp, kOtherIp, kPrivateIp, kMetadataIp}) {
    SPACE_TRY(run({"ip", "-n", upstreamName(), "route", "add", std::string(ip) + "/32", "via", kUplinkPeerIp}));
  }
  SPACE_TRY(makeCertificates());
  SPACE_TRY(startDns());
  SPACE_TRY(startServers());
  return okStatus();
}

Status FakeInternet::makeCertificates() {
  const std::string ca_key = dir_ + "/ca.key", ca = dir_ + "/ca.pem", key = dir_ + "/server.key",
                    csr = dir_ + "/server.csr", cert = dir_ + "/server.pem", ext = dir_ + "/server.ext";
  std::ofstream(ext) << "subjectAltName=DNS:allowed.test,DNS:denied.test,DNS:other.test\n"
                        "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
  SPACE_TRY(run({"openssl",
                 "req",
                 "-x509",
                 "-newkey",
                 "ec",
                 "-pkeyopt",
                 "ec_paramgen_curve:prime256v1",
                 "-nodes",
                 "-keyout",
                 ca_key,
                 "-out",
                 ca,
                 "-days",
                 "2",
                 "-subj",
                 "/CN=gwtest CA",
                 "-addext",
                 "basicConstraints=critical,CA:TRUE",
                 "-addext",
                 "keyUsage=critical,keyCertSign"}));
  SPACE_TRY(run({"openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                 key, "-out", csr, "-subj", "/CN=allowed.test"}));
  SPACE_TRY(run({"openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext}));
  return okStatus();
}

Status FakeInternet::startDns() {
  stop_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC));
  if (!stop_fd_.valid()) return sysError("eventfd");
  // The socket is made inside the namespace; the loop may then run on any thread.
  Status made = makeError(ErrorCode::kInternal, "dns socket not made");
  int fd = -1;
  inNetns(netnsPath(), [&] {
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(53);
    inet_pton(AF_INET, kDnsIp, &addr.sin_addr);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
      made = okStatus();
    else
      made = sysError("dns socket");
  });
  if (!made.ok()) {
    if (fd >= 0) ::close(fd);
    return made;
  }
  dns_thread_ = std::thread([this, fd] {
    dnsLoop(fd);
    ::close(fd);
  });
  return okStatus();
}

void FakeInternet::dnsLoop(int fd) {
  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    uint8_t buf[net::kMaxDnsMessage];
    sockaddr_in from{};
    socklen_t from_len = sizeof from;
    ssize_t n = recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n <= 0) continue;
    ++dns_queries_;
    auto q = net::parseQuery(std::span<const uint8_t>(buf, static_cast<size_t>(n)));
    if (!q.ok()) continue;
    std::vector<uint8_t> answer;
    if (q->name == "silent.test") continue;
    if (q->name == "servfail.test") {
      answer = net::buildEmptyAnswer(*q, net::dns::kServFail);
    } else if (auto it = table().find(q->name); it == table().end()) {
      answer = net::buildEmptyAnswer(*q, net::dns::kNxDomain);
    } else if (q->qtype != net::dns::kTypeA) {
      answer = net::buildEmptyAnswer(*q, net::dns::kNoError);
    } else {
      answer = net::buildAAnswer(*q, it->second.ips, it->second.ttl);
    }
    sendto(fd, answer.data(), answer.size(), 0, reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

Status FakeInternet::startServers() {
  const std::string script = dir_ + "/servers.py";
  std::ofstream(script) << kServersPy;
  SpawnOptions options;
  options.stdout_path = dir_ + "/servers.log";
  options.netns_path = netnsPath();
  auto child = ChildProcess::spawn({"/usr/bin/python3", script, dir_ + "/server.pem", dir_ + "/server.key"}, options);
  if (!child.ok()) return child.error();
  servers_ = std::make_unique<ChildProcess>(std::move(child.value()));
  // Ready when every TCP server accepts (the UDP one is bound before any of them serves).
  const std::vector<std::pair<std::string, uint16_t>> ports = {
      {kAllowedIp, 80}, {kDeniedIp, 80},           {kOtherIp, 80},
      {kPrivateIp, 80}, {kMetadataIp, 80},         {kAllowedIp, 443},
      {kDeniedIp, 443}, {kAllowedIp, kBannerPort}, {kAllowedIp, kEchoPort}};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  bool ready = false;
  while (!ready && std::chrono::steady_clock::now() < deadline) {
    if (auto exited = servers_->tryWait()) {
      std::ifstream log(dir_ + "/servers.log");
      std::stringstream text;
      text << log.rdbuf();
      return makeError(ErrorCode::kInternal, "the fake servers exited (" + exited->describe() + "): " + text.str());
    }
    inNetns(netnsPath(), [&] {
      ready = true;
      for (const auto& [ip, port] : ports) ready = ready && accepts(ip, port);
    });
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!ready) return makeError(ErrorCode::kDeadlineExceeded, "the fake servers did not start within 15 s");
  return okStatus();
}

FakeInternet::~FakeInternet() {
  if (dns_thread_.joinable()) {
    uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof one);
    dns_thread_.join();
  }
  if (servers_) servers_->kill();
  if (upstream_created_) runCommand({"ip", "netns", "delete", upstreamName()});
  if (netns_created_) runCommand({"ip", "netns", "delete", name_});
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

}  // namespace space::testsupport
