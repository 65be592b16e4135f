// space-gateway's entry: flags, namespaces and privileges; then Gateway serves.
//
//   space-gateway --slot-netns PATH --policy FILE --audit FILE [--credentials FILE] [--upstream-netns PATH]
//                 [--upstream-dns IP[:PORT]] [--upstream-ca PEM] [--ready-fd N] [--user NAME] [limits...]
//
// Starts as root: enters the upstream namespace (if given), creates the guest-side listeners in
// the slot namespace, returns to the upstream one (where every upstream socket is then made),
// and drops to an unprivileged user with no capabilities before reading a byte from the guest.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/x509.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/fs.h"
#include "common/log.h"
#include "gateway/confinement.h"
#include "gateway/gateway.h"
#include "net/addressing.h"
#include "net/gateway_egress.h"

namespace {

using space::ErrorCode;
using space::makeError;
using space::Result;
using space::Status;
using space::UniqueFd;

std::string errnoText(const std::string& what) { return what + ": " + strerror(errno); }

// The resolver as given ("IP[:PORT]"), or the host's: the first IPv4 nameserver of /etc/resolv.conf.
Result<space::net::Ipv4Endpoint> upstreamResolver(const std::string& given) {
  if (!given.empty()) return space::net::parseResolver(given);
  auto text = space::readSmallFile("/etc/resolv.conf", 64 << 10);
  if (!text.ok()) return text.error();
  return space::net::resolverOfResolvConf(text.value());
}

Status enterNetns(int fd, const std::string& what) {
  if (setns(fd, CLONE_NEWNET) != 0) return makeError(ErrorCode::kInternal, errnoText("cannot enter " + what));
  return space::okStatus();
}

Result<UniqueFd> openNetns(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return makeError(ErrorCode::kInternal, errnoText("cannot open " + path));
  return fd;
}

Result<UniqueFd> listenOn(int type, uint16_t port) {
  const char* what = type == SOCK_STREAM ? "TCP" : "UDP";
  UniqueFd fd(::socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return makeError(ErrorCode::kInternal, errnoText(std::string(what) + " socket"));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, space::net::kGatewayIp, &addr.sin_addr);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return makeError(ErrorCode::kInternal, errnoText(std::string("cannot bind ") + what + " " + space::net::kGatewayIp +
                                                     ":" + std::to_string(port)));
  }
  if (type == SOCK_STREAM && listen(fd.get(), 1024) != 0) return makeError(ErrorCode::kInternal, errnoText("listen"));
  return fd;
}

// The slot's listeners, made inside it; the thread goes back to `upstream` afterwards.
Result<space::gateway::Listeners> makeListeners(const std::string& slot_path, int upstream) {
  auto slot = openNetns(slot_path);
  if (!slot.ok()) return slot.error();
  SPACE_TRY(enterNetns(slot->get(), "the slot namespace " + slot_path));
  auto tcp = listenOn(SOCK_STREAM, space::net::kGatewayTcpPort);
  auto dns_udp = listenOn(SOCK_DGRAM, space::net::kGatewayDnsPort);
  auto dns_tcp = listenOn(SOCK_STREAM, space::net::kGatewayDnsPort);
  // Back first, whatever happened: no upstream socket may ever be made in the slot.
  SPACE_TRY(enterNetns(upstream, "the upstream namespace"));
  if (!tcp.ok()) return tcp.error();
  if (!dns_udp.ok()) return dns_udp.error();
  if (!dns_tcp.ok()) return dns_tcp.error();
  return space::gateway::Listeners{std::move(tcp.value()), std::move(dns_udp.value()), std::move(dns_tcp.value())};
}

int fail(const std::string& message, int code = 1) {
  spdlog::error("space-gateway: {}", message);
  return code;
}

// Moves this process into the control group whose cgroup.procs file `procs` is (as root, right
// after its arguments are parsed): spaced names one per hierarchy, and the group's limits (CPU,
// memory with the kernel's socket buffers on v2, tasks) hold the gateway before it reads its
// policy or opens a socket, so no guest byte reaches it outside them.
int joinCgroup(const std::string& procs) {
  const int fd = ::open(procs.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  const bool joined = fd >= 0 && ::write(fd, "0", 1) == 1;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (joined) return 0;
  std::fprintf(stderr, "space-gateway: cannot join the control group %s: %s\n", procs.c_str(), std::strerror(err));
  return 1;
}

// Whether `path` is a regular file whose every component is no symbolic link (openat2's
// RESOLVE_NO_SYMLINKS, Linux 5.6+; false where the kernel has none).
bool regularFileThroughNoLink(const std::filesystem::path& path) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  const space::UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof how)));
  struct stat st {};
  return fd.valid() && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode);
}

// The plan every gateway confines itself by (and --probe-confinement checks): `dir` is its
// directory, read-only; each file it writes is bounded by its audit log's size and room for
// its own log (stderr, which spaced keeps small: NetworkPool::spawnGateway).
space::gateway::ConfinementPlan confinementPlan(const std::string& dir, const std::string& user, size_t max_connections,
                                                uint64_t audit_max_bytes) {
  space::gateway::ConfinementPlan plan;
  plan.user = user;
  plan.max_connections = max_connections;
  plan.max_file_bytes = audit_max_bytes + (uint64_t{4} << 20);
  plan.reachable = {{dir, false}, {"/usr", false}};
  std::error_code ec;
  if (std::filesystem::is_directory("/etc/ssl", ec)) plan.reachable.push_back({"/etc/ssl", false});
  // And the trust store where OpenSSL looks for it on this host, if elsewhere (its environment
  // variables first, as it reads them; another distribution's default, /etc/pki): the
  // directory of the file its path leads to, since Landlock judges the file a link reaches.
  // Never / (a variable set to it would open every file).
  const auto covered = [&](const std::filesystem::path& where) {
    for (const auto& rule : plan.reachable) {
      const std::filesystem::path base(rule.dir);
      if (std::mismatch(base.begin(), base.end(), where.begin(), where.end()).first == base.end()) return true;
    }
    return false;
  };
  const auto reach = [&](const std::string& path, bool is_dir) {
    const std::filesystem::path real = std::filesystem::canonical(path, ec);
    if (ec) return;  // absent: nothing to read
    const std::filesystem::path where = is_dir ? real : real.parent_path();
    if (where == where.root_path() || !std::filesystem::is_directory(where, ec) || covered(where)) return;
    plan.reachable.push_back({where.string(), false});
  };
  const char* file = std::getenv(X509_get_default_cert_file_env());
  reach(file != nullptr && *file != '\0' ? file : X509_get_default_cert_file(), false);
  // The directory variable is a list, as OpenSSL reads it (':'-separated).
  const char* dirs = std::getenv(X509_get_default_cert_dir_env());
  std::istringstream list(dirs != nullptr && *dirs != '\0' ? dirs : X509_get_default_cert_dir());
  std::vector<std::string> cert_dirs;
  for (std::string dir; std::getline(list, dir, ':');) {
    if (dir.empty()) continue;
    reach(dir, true);
    cert_dirs.push_back(dir);
  }
  // A certificate directory's entries are often links (c_rehash's <hash>.0, update-ca-
  // certificates' links into /usr/share), and Landlock judges the file a link leads to: each
  // that leads outside what is reachable already gets a rule for that one file (its directory
  // would open its neighbours too). Bounded: the directories are the operator's, but a huge
  // one must not hold a gateway's start.
  std::set<std::filesystem::path> linked;
  size_t seen = 0;
  for (const std::string& dir : cert_dirs) {
    const std::filesystem::directory_iterator listed_all;
    for (std::filesystem::directory_iterator it(dir, ec);
         !ec && it != listed_all && ++seen <= space::gateway::kMaxTrustStoreEntries; it.increment(ec)) {
      std::error_code entry_ec;  // a broken link is passed over, not the end of the listing
      if (!it->is_symlink(entry_ec)) continue;
      // Each gateway's start pays for this (Debian has about 290 links, and resolving one whole
      // costs a system call per component), so the common links are settled cheaply first: one to a sibling
      // (c_rehash's <hash>.0 -> name.pem) is judged when the listing reaches the sibling; one
      // whose absolute, plain target lies under a reachable directory and is a regular file
      // reached through no link at all needs no rule (update-ca-certificates' into /usr/share).
      const std::filesystem::path written = std::filesystem::read_symlink(it->path(), entry_ec);
      if (entry_ec || !written.has_parent_path()) continue;
      if (written.is_absolute() && written.lexically_normal() == written && covered(written.parent_path()) &&
          regularFileThroughNoLink(written)) {
        continue;
      }
      const std::filesystem::path target = std::filesystem::canonical(it->path(), entry_ec);
      if (entry_ec || covered(target.parent_path()) || !std::filesystem::is_regular_file(target, entry_ec)) continue;
      if (linked.insert(target).second) plan.reachable.push_back({target.string(), false, true});
    }
  }
  return plan;
}

// --probe-confinement DIR: confines itself as a gateway would, in DIR (an empty scratch
// directory, given to --user), tries what a compromised one would and reads what a gateway
// needs, prints what it found (JSON) and exits: 0 if everything was refused and what it needs
// was read, 3 if not. spaced runs it at start to report (or require) confinement.
int probe(const std::string& dir, const std::string& user, size_t max_connections, uint64_t audit_max_bytes) {
  // Opened as root before the confinement, unnamed (nothing is left behind), for the file-size check.
  space::UniqueFd written(::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!written.valid()) return fail(errnoText("cannot make a file in " + dir));
  // The directory becomes the user's, so that only the confinement can refuse a file made in it.
  auto ids = space::gateway::resolveUser(user);
  if (!ids.ok()) return fail(ids.error().message);
  if (::chown(dir.c_str(), ids->first, ids->second) != 0 || ::chmod(dir.c_str(), 0700) != 0) {
    return fail(errnoText("cannot give " + dir + " to " + user));
  }
  if (chdir(dir.c_str()) != 0) return fail(errnoText("chdir " + dir));
  space::gateway::ConfinementPlan plan = confinementPlan(dir, user, max_connections, audit_max_bytes);
  auto confined = space::gateway::confine(plan);
  if (!confined.ok()) return fail(confined.error().message);
  nlohmann::json report = space::gateway::probeConfinement(plan, confined.value(), written.get());
  // A path that is not UTF-8 is replaced, not thrown at.
  std::printf("%s\n", report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
  return report["confined"].get<bool>() && report["works"].get<bool>() ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"space-gateway: a sandbox's DNS resolver and TCP egress, enforcing its network policy"};
  std::string slot_netns, policy_path, audit_path, credentials_path, upstream_netns, upstream_dns, user = "nobody",
                                                                                                   log_level = "info";
  int ready_fd = -1;
  size_t max_connections = 256;
  int64_t handshake_timeout_ms = 10000, idle_timeout_ms = 600000;
  uint64_t audit_max_bytes = 1 << 20, max_bytes_per_s = 0;
  // Required to serve; --probe-confinement needs none of them.
  app.add_option("--slot-netns", slot_netns, "the slot's network namespace (a bind-mounted nsfs path); required");
  app.add_option("--policy", policy_path, "the egress policy (JSON), re-read when it changes; required");
  app.add_option("--audit", audit_path, "the audit log (JSON lines), rotated to FILE.1; required");
  std::string probe_dir;
  app.add_option("--probe-confinement", probe_dir,
                 "confine itself as a gateway in DIR (an empty scratch directory, given to --user), try what a "
                 "compromised gateway would and read what a gateway needs (the trust store), print what it found "
                 "as JSON and exit: 0 if everything was refused and what it needs read, 3 if not")
      ->check(CLI::ExistingDirectory);
  app.add_option("--credentials", credentials_path,
                 "the values of the policy's credential secrets (JSON), re-read when it changes; absent: none");
  app.add_option("--upstream-netns", upstream_netns, "the namespace of upstream sockets (default: ours)");
  std::string upstream_ca;
  app.add_option("--upstream-ca", upstream_ca,
                 "PEM certificates that credential rules' hosts must chain to (default: the host's trust store)");
  app.add_option("--upstream-dns", upstream_dns, "the resolver, IP[:PORT] (default: /etc/resolv.conf)");
  app.add_option("--ready-fd", ready_fd, "written \"ready\\n\" and closed once serving")->check(CLI::NonNegativeNumber);
  app.add_option("--user", user, "the unprivileged user to run as")->capture_default_str();
  app.add_option("--max-connections", max_connections, "TCP connections at once")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--handshake-timeout-ms", handshake_timeout_ms, "time for a connection's first bytes")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--idle-timeout-ms", idle_timeout_ms, "a relayed connection's longest silence")
      ->check(CLI::Range(int64_t{1}, int64_t{86400000}))
      ->capture_default_str();
  // At most 64 MiB: rotation copies the file, on the gateway's one thread.
  app.add_option("--audit-max-bytes", audit_max_bytes, "the audit log's size before rotation")
      ->check(CLI::Range(uint64_t{1024}, uint64_t{64} << 20))
      ->capture_default_str();
  std::vector<std::string> openable_cidrs;
  app.add_option("--openable-cidr", openable_cidrs,
                 "a private range tenant allow CIDRs may open (repeatable; default: none)");
  app.add_option("--max-bytes-per-s", max_bytes_per_s, "bandwidth of all connections together (0: no limit)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  std::vector<std::string> cgroup_procs;
  app.add_option(
      "--cgroup-procs", cgroup_procs,
      "join the control group of this cgroup.procs file first, before any policy or socket (repeatable: one per "
      "hierarchy on cgroup v1); the start fails if it cannot");
  CLI11_PARSE(app, argc, argv);
  for (const std::string& procs : cgroup_procs) {
    if (int failed = joinCgroup(procs); failed != 0) return failed;
  }
  if (!probe_dir.empty()) {
    if (auto logging = space::initLogging(log_level, false); !logging.ok()) return fail(logging.error().message);
    return probe(std::filesystem::absolute(probe_dir).string(), user, max_connections, audit_max_bytes);
  }
  if (slot_netns.empty() || policy_path.empty() || audit_path.empty()) {
    std::fprintf(stderr, "--slot-netns, --policy and --audit are required\nRun with --help for more information.\n");
    return 2;
  }

  if (auto logging = space::initLogging(log_level, false); !logging.ok()) return fail(logging.error().message);
  // A guest that resets a connection must not kill the gateway with a write to it.
  signal(SIGPIPE, SIG_IGN);

  // The gateway works in its policy's directory (spaced makes one per sandbox, root's, which
  // --user may search) and names its files relative to it: once it has dropped privileges, that
  // directory's ancestors (spaced's private data dir) are closed to it, but its working
  // directory is not.
  const std::filesystem::path work_dir = std::filesystem::absolute(policy_path).parent_path();
  if (chdir(work_dir.c_str()) != 0) return fail(errnoText("chdir " + work_dir.string()));
  for (std::string* path : {&policy_path, &audit_path, &credentials_path}) {
    if (path->empty()) continue;
    std::filesystem::path absolute = std::filesystem::absolute(*path);
    if (absolute.parent_path() == work_dir) *path = absolute.filename().string();
  }
  auto policy = space::gateway::PolicyFile::load(policy_path);
  if (!policy.ok()) return fail("invalid policy: " + policy.error().message, 2);

  if (!upstream_netns.empty()) {
    auto ns = openNetns(upstream_netns);
    if (!ns.ok()) return fail(ns.error().message);
    if (auto entered = enterNetns(ns->get(), "the upstream namespace " + upstream_netns); !entered.ok()) {
      return fail(entered.error().message);
    }
  }
  auto upstream = openNetns("/proc/thread-self/ns/net");
  if (!upstream.ok()) return fail(upstream.error().message);

  space::gateway::GatewayOptions options;
  auto resolver = upstreamResolver(upstream_dns);
  if (!resolver.ok()) return fail("--upstream-dns: " + resolver.error().message);
  options.upstream_dns = boost::asio::ip::udp::endpoint(boost::asio::ip::address_v4(resolver->address), resolver->port);
  options.max_connections = max_connections;
  options.handshake_timeout = std::chrono::milliseconds(handshake_timeout_ms);
  options.idle_timeout = std::chrono::milliseconds(idle_timeout_ms);
  options.max_bytes_per_s = max_bytes_per_s;
  if (!upstream_ca.empty()) {
    // Read as root, before privileges go: the file may be closed to --user.
    auto pem = space::readSmallFile(upstream_ca, 4 << 20);
    if (!pem.ok()) return fail("--upstream-ca: " + pem.error().message, 2);
    options.upstream_ca_pem = std::move(pem.value());
  }
  for (const std::string& text : openable_cidrs) {
    auto rule = space::net::parseRule(text);
    if (!rule.ok() || rule->kind != space::net::Rule::Kind::kCidr || rule->port) {
      return fail("--openable-cidr " + text + ": must be an IPv4 CIDR without a port", 2);
    }
    options.openable.push_back(rule.value());
  }

  // Both of its files opened as root, now: it rotates through them and makes no file (AuditLog).
  auto audit = space::gateway::AuditLog::open(audit_path, audit_max_bytes);
  if (!audit.ok()) return fail(audit.error().message);

  auto listeners = makeListeners(slot_netns, upstream->get());
  if (!listeners.ok()) return fail(listeners.error().message);
  upstream = UniqueFd();

  // What it opens by path once serving: its policy (read again when it changes) in its
  // directory, read-only (the audit log's two files are open already, and it makes no file),
  // its credentials file, and the trust store and the libraries' files: OpenSSL reads its
  // configuration and the certificates as it verifies (Debian's /usr/lib/ssl links into
  // /etc/ssl, whose links lead into /usr/share/ca-certificates). Nothing else of /etc: a host's
  // world-readable configuration is not the gateway's to read. The directories are opened
  // while root reaches them (spaced's data dir is closed to --user).
  space::gateway::ConfinementPlan plan = confinementPlan(work_dir.string(), user, max_connections, audit_max_bytes);
  if (!credentials_path.empty()) {
    std::error_code ec;
    const std::filesystem::path credentials_dir = std::filesystem::absolute(credentials_path).parent_path();
    if (credentials_dir != work_dir && std::filesystem::is_directory(credentials_dir, ec)) {
      plan.reachable.push_back({credentials_dir.string(), false});
    }
  }
  auto confined = space::gateway::confine(plan);
  if (!confined.ok()) return fail(confined.error().message);
  if (confined.value() > 0) {
    std::string dirs;
    size_t files = 0;
    for (const auto& rule : plan.reachable) {
      if (rule.file) ++files;
      if (!rule.file) dirs += (dirs.empty() ? "" : ", ") + rule.dir + (rule.write ? " (read-write)" : " (read)");
    }
    spdlog::info(
        "space-gateway: files confined to {} and {} certificate(s) the trust store links to, by Landlock ABI {}", dirs,
        files, confined.value());
  } else {
    spdlog::warn("space-gateway: files not confined: this kernel has no Landlock (Linux 5.13+, lsm=landlock)");
  }

  spdlog::info("space-gateway: upstream DNS {}:{}, at most {} connections", options.upstream_dns.address().to_string(),
               options.upstream_dns.port(), max_connections);
  space::gateway::Gateway gateway(std::move(options), std::move(policy.value()), std::move(audit.value()),
                                  space::gateway::CredentialsFile(credentials_path));
  if (auto started = gateway.start(std::move(listeners.value())); !started.ok()) return fail(started.error().message);

  if (ready_fd >= 0) {
    static constexpr char kReady[] = "ready\n";
    if (::write(ready_fd, kReady, sizeof kReady - 1) != static_cast<ssize_t>(sizeof kReady - 1)) {
      return fail(errnoText("cannot write to --ready-fd"));
    }
    ::close(ready_fd);
  }
  gateway.run();
  return 0;
}
