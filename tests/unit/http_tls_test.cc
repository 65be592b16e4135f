// The server's TLS (http/tls_relay.h) with real certificates made by the openssl tool, against
// the client's TLS and raw sockets.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../support/raw_http.h"
#include "common/fs.h"
#include "http/client.h"
#include "http/server.h"
#include "http/tls_relay.h"

namespace space::http {
namespace {

using namespace std::chrono_literals;
using testsupport::connectRaw;
using testsupport::readUntilClosed;
using testsupport::sendRaw;

// A self-signed certificate and key for the given subjectAltName, in `dir`.
TlsFiles makeCertificate(const std::string& dir, const std::string& name, const std::string& san) {
  TlsFiles files{dir + "/" + name + ".crt", dir + "/" + name + ".key"};
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "
      "/CN=space-test -addext subjectAltName=" +
      san + " -keyout " + files.key_file + " -out " + files.cert_file + " 2>/dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return files;
}

class HttpsServer : public testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-tls-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    files_ = makeCertificate(dir_->path(), "node", "IP:127.0.0.1,DNS:localhost");
  }
  std::unique_ptr<Server> start(Handler handler, ServerLimits limits = {}) {
    auto context = serverTlsContext(files_);
    EXPECT_TRUE(context.ok()) << context.error().message;
    if (!context.ok()) return nullptr;
    auto server = Server::start("127.0.0.1:0", std::move(handler), limits, context.value());
    EXPECT_TRUE(server.ok()) << server.error().message;
    return server.ok() ? std::move(server.value()) : nullptr;
  }
  Client client(const Server& server, const std::string& ca_file = "") const {
    auto made = Client::create(server.url(), ca_file.empty() ? files_.cert_file : ca_file);
    EXPECT_TRUE(made.ok()) << made.error().message;
    return std::move(made.value());
  }

  std::optional<TempDir> dir_;
  TlsFiles files_;
};

// Everything the plain server does, over TLS: a body each way bigger than the relay's buffers,
// a streamed answer, and a connection a handler takes over; nothing in clear.
TEST_F(HttpsServer, ServesTheSameHttpOverTlsAndNothingInClear) {
  auto server = start([](Request& request, Response& response) {
    if (request.path() == "/echo") {
      auto body = request.readBody(8 << 20);
      if (!body.ok()) return;
      (void)response.send(200, "application/octet-stream", body.value() + body.value());
    } else if (request.path() == "/stream") {
      (void)response.begin(200, "text/plain");
      for (int i = 0; i < 3; ++i) (void)response.write("line " + std::to_string(i) + "\n");
      (void)response.end();
    } else if (request.path() == "/raw") {
      auto taken = response.takeOver(101);
      if (!taken.ok()) return;
      const char reply[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n";
      (void)send(taken->fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
      char buf[64];
      pollfd p{taken->fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) == 1) {
        ssize_t n = recv(taken->fd, buf, sizeof buf, 0);
        if (n > 0) (void)send(taken->fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    } else {
      (void)response.send(200, "text/plain", "hello over tls");
    }
  });
  ASSERT_TRUE(server);
  EXPECT_EQ(server->url().rfind("https://127.0.0.1:", 0), 0u) << server->url();
  Client https = client(*server);

  auto hello = https.request("GET", "/");
  ASSERT_TRUE(hello.ok()) << hello.error().message;
  EXPECT_EQ(hello->status, 200);
  EXPECT_EQ(hello->body, "hello over tls");

  std::string big(3 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
  auto echoed = https.request("POST", "/echo", {{"Content-Type", "application/octet-stream"}}, big, 30s);
  ASSERT_TRUE(echoed.ok()) << echoed.error().message;
  EXPECT_EQ(echoed->body, big + big);

  std::string streamed;
  auto stream = https.requestStreaming(
      "GET", "/stream", {}, {}, [](const ClientResponse&) { return okStatus(); },
      [&](std::string_view chunk) {
        streamed += chunk;
        return okStatus();
      },
      5s);
  ASSERT_TRUE(stream.ok()) << stream.error().message;
  EXPECT_EQ(streamed, "line 0\nline 1\nline 2\n");

  // A taken-over connection is relayed as raw bytes both ways.
  auto raw = https.connect(5s);
  ASSERT_TRUE(raw.ok()) << raw.error().message;
  int flags = fcntl(raw->get(), F_GETFL);
  fcntl(raw->get(), F_SETFL, flags & ~O_NONBLOCK);
  timeval limit{5, 0};
  setsockopt(raw->get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  sendRaw(raw->get(), "GET /raw HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n");
  std::string got;
  char buf[256];
  while (got.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = recv(raw->get(), buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 101", 0), 0u) << got;
  sendRaw(raw->get(), "ping");
  EXPECT_EQ(readUntilClosed(raw->get()), "ping");

  // Plain HTTP to the TLS port gets no answer at all, and the server goes on.
  auto plain = connectRaw(server->port());
  sendRaw(plain.get(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(readUntilClosed(plain.get()).find("hello"), std::string::npos);
  EXPECT_TRUE(https.request("GET", "/").ok());
}

// Key exchange is elliptic-curve only: a client that offers only a finite-field group (8192-bit
// DH took the event loop ~0.1 s per ClientHello) gets no handshake; X25519 does.
TEST_F(HttpsServer, OnlyEllipticCurveKeyExchangeIsOffered) {
  auto server = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server);
  auto handshake = [&](const std::string& options) {
    const std::string command = "timeout 20 openssl s_client -connect 127.0.0.1:" + std::to_string(server->port()) +
                                " " + options + " </dev/null >/dev/null 2>&1";
    return std::system(command.c_str());
  };
  EXPECT_NE(handshake("-tls1_3 -groups ffdhe8192"), 0) << "an 8192-bit DH handshake was accepted";
  EXPECT_NE(handshake("-tls1_3 -groups ffdhe2048"), 0);
  EXPECT_EQ(handshake("-tls1_3 -groups X25519"), 0);
  EXPECT_EQ(handshake("-tls1_2 -groups P-256"), 0);
  EXPECT_TRUE(client(*server).request("GET", "/").ok());
}

// Servers in one process split its descriptors: each takes its share, counted at 11 per TLS
// connection (socket, relay pair, eventfd, a handshake's and a closing relay's, twice over while
// evicted ones close), so all of them full still leave descriptors for the rest of the process.
TEST_F(HttpsServer, ServersTakeTheirShareOfTheProcesssDescriptors) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  rlimit lowered = before;
  lowered.rlim_cur = std::min<rlim_t>(4096 + 512, before.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const size_t budget = lowered.rlim_cur - 512;
  ServerLimits quarter;
  quarter.descriptor_share = 0.25;
  auto small = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, quarter);
  auto whole = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  setrlimit(RLIMIT_NOFILE, &before);
  ASSERT_TRUE(small && whole);
  EXPECT_EQ(small->limits().max_connections, budget / 4 / 11);
  EXPECT_EQ(whole->limits().max_connections, budget / 11);
  EXPECT_TRUE(client(*small).request("GET", "/").ok());
}

TEST_F(HttpsServer, AClientTrustsOnlyItsCaAndTheNameItConnectedTo) {
  auto server = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(server);
  // Another CA: the handshake fails on the certificate.
  TlsFiles other = makeCertificate(dir_->path(), "other", "IP:127.0.0.1");
  auto stranger = client(*server, other.cert_file).request("GET", "/", {}, {}, 5s);
  ASSERT_FALSE(stranger.ok());
  EXPECT_NE(stranger.error().message.find("certificate verify failed"), std::string::npos) << stranger.error().message;
  // A certificate for another name than the one connected to fails the same way.
  TlsFiles named = makeCertificate(dir_->path(), "named", "DNS:node.example");
  auto context = serverTlsContext(named);
  ASSERT_TRUE(context.ok());
  auto misnamed = Server::start(
      "127.0.0.1:0", [](Request&, Response& r) { (void)r.send(200, "", "ok"); }, {}, context.value());
  ASSERT_TRUE(misnamed.ok());
  auto wrong_name = client(*misnamed.value(), named.cert_file).request("GET", "/", {}, {}, 5s);
  ASSERT_FALSE(wrong_name.ok());
  EXPECT_NE(wrong_name.error().message.find("certificate verify failed"), std::string::npos)
      << wrong_name.error().message;
  // A mismatched key and certificate are refused when the server starts.
  auto mismatched = serverTlsContext(TlsFiles{files_.cert_file, other.key_file});
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.error().message.find("does not belong to the certificate"), std::string::npos)
      << mismatched.error().message;
  EXPECT_FALSE(serverTlsContext(TlsFiles{dir_->path() + "/missing.crt", files_.key_file}).ok());
}

// A client that connects and never completes its handshake is dropped at the first request's
// deadline, and holds nothing that would keep stop() waiting; nor does an idle TLS connection.
TEST_F(HttpsServer, AStalledHandshakeIsDroppedAndStopIsPrompt) {
  ServerLimits limits;
  limits.first_request_timeout = 300ms;
  auto server = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  auto started = Clock::now();
  auto silent = connectRaw(server->port());
  EXPECT_EQ(readUntilClosed(silent.get()), "");
  EXPECT_GE(Clock::now() - started, 250ms);
  EXPECT_LT(Clock::now() - started, 3s);

  // With the default deadlines (10 s): a handshake under way and an idle TLS connection.
  auto patient = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); });
  ASSERT_TRUE(patient);
  auto stalled = connectRaw(patient->port());
  auto idle = client(*patient).connect(5s);
  ASSERT_TRUE(idle.ok()) << idle.error().message;
  started = Clock::now();
  patient->stop(5s);
  EXPECT_LT(Clock::now() - started, 2500ms);
  EXPECT_EQ(readUntilClosed(stalled.get()), "");
}

// Connections that never start their handshake take no one's place for good: at the limit the
// oldest one under way makes room for the newest, so a client can always get through.
TEST_F(HttpsServer, HandshakesThatNeverCompleteCannotLockOthersOut) {
  ServerLimits limits;
  limits.max_connections = 8;  // at most 3 handshakes of one client (a quarter, plus one)
  auto server = start([](Request&, Response& response) { (void)response.send(200, "text/plain", "ok"); }, limits);
  ASSERT_TRUE(server);
  std::vector<UniqueFd> stalled;
  for (int i = 0; i < 20; ++i) stalled.push_back(connectRaw(server->port()));
  auto through = client(*server).request("GET", "/", {}, {}, 5s);
  ASSERT_TRUE(through.ok()) << through.error().message;
  EXPECT_EQ(through->body, "ok");
  // The first of the stalled ones were dropped to make room, at once, not at their deadline.
  auto started = Clock::now();
  EXPECT_EQ(readUntilClosed(stalled.front().get()), "");
  EXPECT_LT(Clock::now() - started, 2s);
}

// At the limit of handshakes, the client with the most under way makes room: a flood from a few
// addresses drops its own, not the one slow handshake of someone else (which it used to, as the
// oldest of all).
TEST_F(HttpsServer, AtTheHandshakeLimitTheClientWithTheMostMakesRoom) {
  boost::asio::io_context io;
  auto context = serverTlsContext(files_);
  ASSERT_TRUE(context.ok()) << context.error().message;
  TlsRelayLimits limits;
  limits.max_handshakes = 4;
  limits.max_handshakes_per_client = 3;
  TlsRelays relays(io, context.value(), limits);
  boost::asio::ip::tcp::acceptor acceptor(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  std::vector<UniqueFd> peers;
  auto admit = [&](const std::string& client) {
    peers.push_back(connectRaw(acceptor.local_endpoint().port()));
    relays.accept(acceptor.accept(), "127.0.0.1", client, [](UniqueFd, const std::string&) {});
  };
  auto closed = [](int fd) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) != 1) return false;
    char c;
    return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  };
  admit("slow");
  for (int i = 0; i < 3; ++i) admit("flood-a");
  admit("flood-b");  // the fifth: over the limit of 4
  EXPECT_FALSE(closed(peers[0].get())) << "a slow client's handshake was dropped for a flood's";
  EXPECT_TRUE(closed(peers[1].get())) << "the flood's oldest handshake was kept";
  EXPECT_FALSE(closed(peers[4].get()));
  relays.closeAll();
}

// Listening on every address, the server's URL is one a client on the node can connect to and
// verify (the certificate names 127.0.0.1, not 0.0.0.0).
TEST_F(HttpsServer, AWildcardListenerGivesALoopbackUrl) {
  auto context = serverTlsContext(files_);
  ASSERT_TRUE(context.ok());
  auto server = Server::start(
      "0.0.0.0:0", [](Request&, Response& r) { (void)r.send(200, "text/plain", "ok"); }, {}, context.value());
  ASSERT_TRUE(server.ok()) << server.error().message;
  EXPECT_EQ(server.value()->url(), "https://127.0.0.1:" + std::to_string(server.value()->port()));
  auto answer = client(*server.value()).request("GET", "/", {}, {}, 5s);
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  EXPECT_EQ(answer->body, "ok");
}

}  // namespace
}  // namespace space::http
