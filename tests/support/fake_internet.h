// The fake internet of network tests: a network namespace ("<prefix>-inet") holding a few
// "public" addresses (documentation ranges), a private one and a metadata one, with servers on
// them, and no route to anywhere else: a gateway whose upstream side runs in it can reach these
// servers and nothing outside the machine.
//
//   192.0.2.53:53        DNS (in-process, answers from a fixed table; see kNames)
//   198.51.100.10        allowed.test: HTTP :80, HTTPS :443 (test CA), banner :2222 (server
//                        speaks first, then echoes), echo :9000 (client speaks first), UDP echo :7
//   198.51.100.20        denied.test: HTTP :80, HTTPS :443
//   203.0.113.30         other.test: HTTP :80
//   10.0.0.5             rebind.test (private): HTTP :80
//   169.254.169.254      meta.test (metadata): HTTP :80
//   198.51.100.40        git.test, pypi.test, npm.test: package sources, HTTP :80 and HTTPS :443
// HTTP answers "server IP:PORT host HOST\n" (GET /bytes/N answers N bytes instead; GET /auth
// answers "authorization COUNT SHA256-HEX... connection VALUE\n" for the request's Authorization
// headers, so a test sees what a gateway added without the guest seeing it; GET /headers echoes
// the request's header fields, GET /chunked-headers/N the same in chunks of N bytes (or gzipped
// for N = gzip); GET /redirect/HOST/PATH answers 302 to http://HOST/PATH). The HTTPS
// certificate covers allowed.test, denied.test, other.test, git.test, pypi.test and npm.test.
//
// The package sources serve static files by Host, made when the fake internet starts (by its
// python3, without git, pip or npm on the host), each holding one small thing:
//   https://git.test/demo.git        a git repository (dumb HTTP protocol), one commit on `main`
//                                    with a file README: "hello from git.test"
//   https://pypi.test/simple/        a PEP 503 index: spacedemo 1.0.0, a pure-Python wheel
//                                    (spacedemo.GREETING == "hello from pypi.test", and a console
//                                    script `spacedemo` printing it)
//   https://npm.test/                an npm registry: spacedemo 1.0.0 (require("spacedemo") ==
//                                    "hello from npm.test")
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/result.h"
#include "common/unix_socket.h"

namespace space::testsupport {

// Runs `fn` on a fresh thread that entered the network namespace at `netns_path` (setns moves
// only the calling thread), and waits for it. Fails the test if the namespace cannot be entered.
void inNetns(const std::string& netns_path, const std::function<void()>& fn);

struct CommandResult {
  int exit_code = -1;  // -1: killed (timeout or signal)
  std::string output;  // stdout and stderr together
};
// Runs a command (in `netns_path` if not empty), killing it after `timeout`.
CommandResult runCommand(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10),
                         const std::string& netns_path = "");

class FakeInternet {
 public:
  static constexpr const char* kDnsIp = "192.0.2.53";
  static constexpr const char* kAllowedIp = "198.51.100.10";
  static constexpr const char* kDeniedIp = "198.51.100.20";
  static constexpr const char* kOtherIp = "203.0.113.30";
  static constexpr const char* kPrivateIp = "10.0.0.5";
  static constexpr const char* kMetadataIp = "169.254.169.254";
  static constexpr const char* kPackagesIp = "198.51.100.40";
  static constexpr uint16_t kBannerPort = 2222;
  static constexpr uint16_t kEchoPort = 9000;
  static constexpr uint16_t kUdpEchoPort = 7;
  static constexpr const char* kBanner = "SSH-2.0-fake-banner\r\n";

  // The DNS table. Besides these names: short-ttl.test (198.51.100.10, TTL 1), servfail.test
  // (SERVFAIL), silent.test (never answered); anything else is NXDOMAIN; other types NODATA.
  struct Name {
    std::string name;
    std::vector<std::string> ips;
  };
  static std::vector<Name> names();

  // Builds it all and waits until every server accepts connections.
  static Result<std::unique_ptr<FakeInternet>> start(const std::string& prefix);
  ~FakeInternet();
  FakeInternet(const FakeInternet&) = delete;
  FakeInternet& operator=(const FakeInternet&) = delete;

  const std::string& name() const { return name_; }
  // The servers' namespace (for probes "from the internet itself", e.g. baselines).
  std::string netnsPath() const { return "/run/netns/" + name_; }
  // Where a gateway's upstream side belongs: a namespace whose only route leads into the
  // servers' one, over a veth (kUplinkIp, peer kUplinkPeerIp).
  std::string upstreamNetnsPath() const { return "/run/netns/" + upstreamName(); }
  static constexpr const char* kUplinkIp = "192.0.2.2";
  static constexpr const char* kUplinkPeerIp = "192.0.2.1";
  std::string dnsServer() const { return std::string(kDnsIp) + ":53"; }
  std::string caPath() const { return dir_ + "/ca.pem"; }
  // Questions the fake resolver received so far.
  int dnsQueries() const { return dns_queries_.load(); }

 private:
  explicit FakeInternet(std::string name) : name_(std::move(name)) {}
  Status build();
  Status makeCertificates();
  Status startDns();
  Status startServers();
  void dnsLoop(int fd);

  std::string upstreamName() const { return name_ + "-up"; }
  std::string name_;
  std::string dir_;
  bool netns_created_ = false;
  bool upstream_created_ = false;
  UniqueFd stop_fd_;
  std::thread dns_thread_;
  std::atomic<int> dns_queries_{0};
  std::unique_ptr<ChildProcess> servers_;
};

}  // namespace space::testsupport
