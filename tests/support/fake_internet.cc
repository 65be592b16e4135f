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
import base64, gzip, hashlib, io, json, os, socket, socketserver, ssl, sys, tarfile, threading, http.server
import urllib.parse, zipfile, zlib

cert, key, www = sys.argv[1], sys.argv[2], sys.argv[3]
HTTP = ["198.51.100.10", "198.51.100.20", "203.0.113.30", "10.0.0.5", "169.254.169.254"]
HTTPS = ["198.51.100.10", "198.51.100.20"]
PACKAGES = "198.51.100.40"
BANNER = b"SSH-2.0-fake-banner\r\n"

# --- the package sources' files, made here (no git, pip or npm on the host), under www/<host>/
def put(path, data):
    path = os.path.join(www, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)

def b64(data, url=False):
    return (base64.urlsafe_b64encode if url else base64.b64encode)(data).decode()

# git.test/demo.git: a bare repository as git's dumb HTTP protocol reads it, written object by
# object: loose objects, HEAD, refs and what `git update-server-info` adds (info/refs,
# objects/info/packs).
def git_object(kind, body):
    data = b"%s %d\0" % (kind, len(body)) + body
    sha = hashlib.sha1(data).hexdigest()
    put("git.test/demo.git/objects/%s/%s" % (sha[:2], sha[2:]), zlib.compress(data))
    return sha

blob = git_object(b"blob", b"hello from git.test\n")
tree = git_object(b"tree", b"100644 README\0" + bytes.fromhex(blob))
who = b"Fake Internet <fake@git.test> 1700000000 +0000"
commit = git_object(b"commit", b"tree %s\nauthor %s\ncommitter %s\n\nfirst commit\n" % (tree.encode(), who, who))
put("git.test/demo.git/HEAD", b"ref: refs/heads/main\n")
put("git.test/demo.git/refs/heads/main", commit.encode() + b"\n")
put("git.test/demo.git/info/refs", commit.encode() + b"\trefs/heads/main\n")
put("git.test/demo.git/objects/info/packs", b"")

# pypi.test: a PEP 503 simple index holding one pure-Python wheel, spacedemo 1.0.0, with a
# console script `spacedemo`.
def wheel():
    files = {
        "spacedemo/__init__.py": b'GREETING = "hello from pypi.test"\n\ndef main():\n    print(GREETING)\n',
        "spacedemo-1.0.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: spacedemo\nVersion: 1.0.0\n",
        "spacedemo-1.0.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: fake-internet\n"
                                           b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        "spacedemo-1.0.0.dist-info/entry_points.txt": b"[console_scripts]\nspacedemo = spacedemo:main\n",
    }
    record = "".join("%s,sha256=%s,%d\n" % (name, b64(hashlib.sha256(data).digest(), True).rstrip("="), len(data))
                     for name, data in files.items())
    files["spacedemo-1.0.0.dist-info/RECORD"] = (record + "spacedemo-1.0.0.dist-info/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return out.getvalue()

whl_name = "spacedemo-1.0.0-py3-none-any.whl"
whl = wheel()
put("pypi.test/packages/" + whl_name, whl)
put("pypi.test/simple/index.html", b'<!DOCTYPE html><html><body><a href="spacedemo/">spacedemo</a></body></html>\n')
put("pypi.test/simple/spacedemo/index.html",
    ('<!DOCTYPE html><html><body><a href="../../packages/%s#sha256=%s">%s</a></body></html>\n'
     % (whl_name, hashlib.sha256(whl).hexdigest(), whl_name)).encode())

# npm.test: a registry holding spacedemo 1.0.0, laid out as the real one (metadata at /NAME,
# tarball at /NAME/-/NAME-VERSION.tgz).
def npm_tarball():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as t:
        for name, data in (("package/package.json", b'{"name": "spacedemo", "version": "1.0.0", "main": "index.js"}\n'),
                           ("package/index.js", b'module.exports = "hello from npm.test";\n')):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1700000000
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()

tgz = npm_tarball()
put("npm.test/spacedemo/-/spacedemo-1.0.0.tgz", tgz)
put("npm.test/spacedemo/index.json", json.dumps({
    "name": "spacedemo", "dist-tags": {"latest": "1.0.0"}, "modified": "2024-01-01T00:00:00.000Z",
    "versions": {"1.0.0": {"name": "spacedemo", "version": "1.0.0", "main": "index.js", "dist": {
        "tarball": "https://npm.test/spacedemo/-/spacedemo-1.0.0.tgz",
        "shasum": hashlib.sha1(tgz).hexdigest(),
        "integrity": "sha512-" + b64(hashlib.sha512(tgz).digest())}}}}).encode())

TYPES = {".html": "text/html", ".json": "application/json"}

# Static files from www/<Host>/; a directory answers with its index.html or index.json (npm's
# /NAME). Anything else is a 404, with a body length so connections stay usable.
class Files(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.serve(True)
    def do_HEAD(self):
        self.serve(False)
    def do_POST(self):  # e.g. npm's audit: nothing here
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(404, "text/plain", b"not found\n", True)
    def serve(self, with_body):
        root = os.path.realpath(os.path.join(www, self.headers.get("Host", "").split(":")[0].lower() or "-"))
        path = os.path.realpath(os.path.join(root, urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")))
        if os.path.dirname(root) != os.path.realpath(www) or not (path + os.sep).startswith(root + os.sep):
            path = ""
        for index in ("index.html", "index.json"):
            if os.path.isdir(path) and os.path.isfile(os.path.join(path, index)):
                path = os.path.join(path, index)
        if not os.path.isfile(path):
            return self.answer(404, "text/plain", b"not found\n", with_body)
        with open(path, "rb") as f:
            data = f.read()
        self.answer(200, TYPES.get(os.path.splitext(path)[1], "application/octet-stream"), data, with_body)
    def answer(self, status, content_type, data, with_body):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if with_body:
            self.wfile.write(data)
    def log_message(self, *args):
        pass

class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        ip, port = self.connection.getsockname()[:2]
        if self.path.startswith("/redirect/"):
            # GET /redirect/HOST/PATH: a 302 to http://HOST/PATH.
            self.send_response(302)
            self.send_header("Location", "http://" + self.path[len("/redirect/"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/chunked-headers/"):
            # The header fields echoed in chunks of N bytes (a server whose chunk boundaries can
            # fall inside an echoed value), or gzip-encoded when N is "gzip".
            body = str(self.headers).encode()
            size = self.path[len("/chunked-headers/"):]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if size == "gzip":
                body = gzip.compress(body)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            n = max(1, int(size))
            for at in range(0, len(body), n):
                piece = body[at:at + n]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path.startswith("/bytes/"):
            body = b"x" * min(int(self.path[7:]), 100 << 20)
        elif self.path.startswith("/headers"):
            # The request's header fields as received: a server that echoes them (httpbin does).
            body = str(self.headers).encode()
        elif self.path.startswith("/auth"):
            # What a credential rule added, as a digest: the guest never sees the value itself.
            got = self.headers.get_all("Authorization") or []
            body = ("authorization %d %s connection %s\n" % (len(got), " ".join(
                hashlib.sha256(v.encode()).hexdigest() for v in got), self.headers.get("Connection", "-"))).encode()
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

class HttpsFiles(Files):
    def setup(self):
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
    request_queue_size = 512  # a burst of connections through a gateway (the default is 5)

class UdpEcho(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(data, self.client_address)

servers = [Server((ip, 80), Http) for ip in HTTP] + [Server((ip, 443), Https) for ip in HTTPS]
servers += [Server((PACKAGES, 80), Files), Server((PACKAGES, 443), HttpsFiles)]
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
      {"www.allowed.test", {kAllowedIp}}, {"git.test", {kPackagesIp}},  {"pypi.test", {kPackagesIp}},
      {"npm.test", {kPackagesIp}},
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
  for (const char* ip : {kDnsIp, kAllowedIp, kDeniedIp, kOtherIp, kPrivateIp, kMetadataIp, kPackagesIp}) {
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
  for (const char* ip : {kDnsIp, kAllowedIp, kDeniedIp, kOtherIp, kPrivateIp, kMetadataIp, kPackagesIp}) {
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
  std::ofstream(ext) << "subjectAltName=DNS:allowed.test,DNS:denied.test,DNS:other.test,DNS:git.test,DNS:pypi.test,"
                        "DNS:npm.test\n"
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
  auto child = ChildProcess::spawn(
      {"/usr/bin/python3", script, dir_ + "/server.pem", dir_ + "/server.key", dir_ + "/www"}, options);
  if (!child.ok()) return child.error();
  servers_ = std::make_unique<ChildProcess>(std::move(child.value()));
  // Ready when every TCP server accepts (the UDP one is bound before any of them serves).
  const std::vector<std::pair<std::string, uint16_t>> ports = {
      {kAllowedIp, 80},        {kDeniedIp, 80},   {kOtherIp, 80},    {kPrivateIp, 80},
      {kMetadataIp, 80},       {kAllowedIp, 443}, {kDeniedIp, 443},  {kAllowedIp, kBannerPort},
      {kAllowedIp, kEchoPort}, {kPackagesIp, 80}, {kPackagesIp, 443}};
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
