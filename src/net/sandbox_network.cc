#include "net/sandbox_network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "common/bounded_json.h"
#include "common/fs.h"
#include "common/unix_socket.h"
#include "net/addressing.h"

namespace space::net {

namespace {

constexpr const char* kGatewayLog = "gateway.log";

// The gateway's directory is root's: its user may find the policy there (search, no listing)
// and read it, and writes only the audit log's two files, which it opened as root before it
// dropped privileges (gateway/audit_log.h). It makes no file anywhere, so that a compromised
// gateway cannot fill the disk (earlier versions gave it the directory, to rotate by rename).
Status keepDirectoryFromGateway(const std::string& dir) {
  if (::chown(dir.c_str(), 0, 0) != 0 || ::chmod(dir.c_str(), 0711) != 0) {
    return makeError(ErrorCode::kInternal, "cannot make " + dir + " root's: " + strerror(errno));
  }
  return Ok{};
}

// The gateway's stderr, kept for its next start: past this, the previous one becomes .1 (the
// gateway's own writes are bounded by its RLIMIT_FSIZE, gateway/confinement.h).
constexpr off_t kGatewayLogMaxBytes = 1 << 20;
// spaced's own lines in a gateway's audit log stop past this (the gateway rotates it at 1 MiB).
constexpr off_t kAuditAppendMaxBytes = 8 << 20;

// A file the gateway's user could have replaced: no symlink followed (unless `follow_links`: a
// host file that is usually a link, resolv.conf), no FIFO opened for reading (it would block),
// at most `max_bytes` from its end.
Result<std::string> readHostileTail(const std::string& path, size_t max_bytes, bool follow_links = false) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (follow_links ? 0 : O_NOFOLLOW)));
  if (!fd.valid())
    return makeError(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kInternal,
                     "cannot open " + path + ": " + strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return makeError(ErrorCode::kInternal, path + " is not a regular file");
  }
  off_t start = st.st_size > static_cast<off_t>(max_bytes) ? st.st_size - static_cast<off_t>(max_bytes) : 0;
  std::string out(static_cast<size_t>(st.st_size - start), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::pread(fd.get(), out.data() + got, out.size() - got, start + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

// The gateways' confinement as this version makes it (gateway/confinement.h), recorded in
// attachment.json with each gateway: one adopted from an attachment without it, or with
// another, was started by an earlier version and is restarted. 2: confine() in one function,
// no files made, RLIMIT_FSIZE and RLIMIT_NOFILE, no fallocate, IPv4 and routing sockets only.
// 3: no bind, IPv4 sockets only (no netlink).
constexpr int kGatewayConfinement = 3;

// Whether process `pid` runs the program file at `path` (the same file, not one of the same
// name: an upgrade replaces it). Where that cannot be read, it is taken to.
bool runsProgram(pid_t pid, const std::string& path) {
  struct stat running {
  }, installed{};
  if (::stat(("/proc/" + std::to_string(pid) + "/exe").c_str(), &running) != 0 ||
      ::stat(path.c_str(), &installed) != 0) {
    return true;
  }
  return running.st_dev == installed.st_dev && running.st_ino == installed.st_ino;
}

// Kills every process whose network namespace is the one bind-mounted at `netns_path`: what an
// earlier run left in a slot it no longer owns (its gateway, a QEMU the orphan sweep missed).
// Unmounting alone would leave them running, holding the namespace and its upstream side.
size_t killProcessesIn(const std::string& netns_path) {
  struct stat ns {};
  if (::stat(netns_path.c_str(), &ns) != 0) return 0;
  size_t killed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid_text = entry.path().filename().string();
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    struct stat theirs {};
    if (::stat((entry.path() / "ns/net").c_str(), &theirs) != 0) continue;
    if (theirs.st_dev == ns.st_dev && theirs.st_ino == ns.st_ino) {
      const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
      if (pid != ::getpid() && ::kill(pid, SIGKILL) == 0) ++killed;
    }
  }
  return killed;
}

}  // namespace

// ---- SandboxNetwork

bool GuestConnections::add(int fd) {
  std::lock_guard lock(mu_);
  if (ended_ || fds_.size() >= max_open_) return false;
  fds_.insert(fd);
  return true;
}

void GuestConnections::remove(int fd) {
  std::lock_guard lock(mu_);
  fds_.erase(fd);
}

int GuestConnections::startConnect(int fd, const sockaddr* to, socklen_t length) {
  std::lock_guard lock(mu_);
  if (ended_) {
    errno = ECONNABORTED;
    return -1;
  }
  return ::connect(fd, to, length);
}

bool GuestConnections::ended() {
  std::lock_guard lock(mu_);
  return ended_;
}

void GuestConnections::endAll() {
  std::lock_guard lock(mu_);
  ended_ = true;
  // Under the lock: an owner closes its descriptor only after remove(), so none of these has
  // been closed (and its number reused) yet.
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

SandboxNetwork::~SandboxNetwork() {
  // Before anything else: the slot must carry nothing of this sandbox's when it is reused.
  guest_connections_->endAll();
  if (detached_) return;
  if (gateway_) gateway_->terminate(std::chrono::milliseconds(500));
  gateway_.reset();
  pool_->endGatewayGroup(slot_.name);
  ::unlink(credentialsPath().c_str());
  ::unlink((state_dir_ + "/" + kAttachmentFile).c_str());
  pool_->releaseSlot(slot_);
}

Result<GuestConnection> SandboxNetwork::socketToGuest() {
  // A socket belongs to the namespace it was made in, so only its creation needs the slot;
  // connecting and all later I/O work from any thread.
  UniqueFd fd;
  SPACE_TRY(runInNetns(slot_.netns_path, [&]() -> Status {
    fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    return fd.valid() ? okStatus()
                      : makeError(ErrorCode::kInternal, "socket in slot " + slot_.name + ": " + strerror(errno));
  }));
  // Registered before it connects: a pending connection counts against the cap, and one the
  // sandbox's end finds still connecting is aborted with the rest.
  if (!guest_connections_->add(fd.get())) {
    return makeError(ErrorCode::kResourceExhausted,
                     "this sandbox has " + std::to_string(kMaxGuestConnections) +
                         " connections to its ports open already; retry when one has ended",
                     "too_many_connections");
  }
  return GuestConnection(guest_connections_, std::move(fd));
}

Status GuestConnection::connect(uint16_t port, Clock::time_point deadline) const {
  sockaddr_in guest{};
  guest.sin_family = AF_INET;
  guest.sin_port = htons(port);
  ::inet_pton(AF_INET, kGuestIp, &guest.sin_addr);
  const std::string where = std::string(kGuestIp) + ":" + std::to_string(port);
  int err = 0;
  if (registry_->startConnect(fd(), reinterpret_cast<const sockaddr*>(&guest), sizeof guest) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd(), POLLOUT, 0};
      int ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, 24 * 3600 * 1000)));
      if (ready == 0) return makeError(ErrorCode::kDeadlineExceeded, "connecting to " + where + " timed out");
      socklen_t len = sizeof err;
      if (ready < 0 || ::getsockopt(fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
  }
  if (err == ECONNREFUSED) {
    return makeError(ErrorCode::kUnavailable, "nothing listens on port " + std::to_string(port) + " of the guest");
  }
  if (err != 0) return makeError(ErrorCode::kUnavailable, "connecting to " + where + ": " + strerror(err));
  // Belt and braces: ended while connecting (a shut-down connect fails anyway).
  if (registry_->ended()) return makeError(ErrorCode::kUnavailable, "the sandbox stopped running");
  int one = 1;
  ::setsockopt(fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return okStatus();
}

Status SandboxNetwork::setPolicy(const Policy& policy, bool durable) {
  return NetworkPool::writePolicy(NetworkPool::gatewayDir(state_dir_), policy, durable);
}

std::string SandboxNetwork::credentialsPath() const {
  return pool_->options().credentials_dir + "/" + slot_.name + ".json";
}

void SandboxNetwork::dropCredentials() { ::unlink(credentialsPath().c_str()); }

Status SandboxNetwork::setCredentials(const std::map<std::string, std::string>& values, const CaMaterial* ca,
                                      const std::map<std::string, std::string>& placeholders) {
  nlohmann::json file{{"secrets", nlohmann::json::object()}};
  if (!placeholders.empty()) file["placeholders"] = placeholders;
  for (const auto& [name, value] : values) file["secrets"][name] = value;
  if (ca != nullptr) file["tls"] = {{"ca_cert", ca->cert_pem}, {"ca_key", ca->key_pem}};
  std::string text = file.dump();
  // The json's copies of the values and the key go with it.
  for (auto& [name, value] : file["secrets"].items()) {
    explicit_bzero(value.get_ref<std::string&>().data(), value.get_ref<std::string&>().size());
  }
  if (ca != nullptr) {
    auto& key = file["tls"]["ca_key"].get_ref<std::string&>();
    explicit_bzero(key.data(), key.size());
  }
  const std::string path = credentialsPath();
  const std::string temp = path + ".tmp";
  ::unlink(temp.c_str());
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0400));
  auto fail = [&](const std::string& what) {
    int err = errno;
    explicit_bzero(text.data(), text.size());
    ::unlink(temp.c_str());
    return makeError(ErrorCode::kInternal, what + " " + temp + ": " + strerror(err));
  };
  if (!fd.valid()) return fail("cannot create");
  // The gateway's own uid reads it, and nobody else but root.
  auto [uid, gid] = pool_->gatewayIds(slot_);
  if (::fchown(fd.get(), uid, gid) != 0) return fail("cannot chown");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("cannot write");
    done += static_cast<size_t>(n);
  }
  explicit_bzero(text.data(), text.size());
  fd.reset();
  if (::rename(temp.c_str(), path.c_str()) != 0) return fail("cannot rename");
  return okStatus();
}

Status SandboxNetwork::persistPolicy() const {
  const std::string dir = NetworkPool::gatewayDir(state_dir_);
  SPACE_TRY(fsyncPath(dir + "/" + kPolicyFile));
  return fsyncPath(dir);
}

bool SandboxNetwork::gatewayExited() {
  if (!gateway_) return true;
  return gateway_->reaped() || gateway_->tryWait().has_value();
}

bool SandboxNetwork::gatewayOutdated() const { return gateway_ && gateway_resolver_ != pool_->gatewayResolver(); }

Status SandboxNetwork::restartGateway(const std::string& why) {
  std::string how = "was not running";
  if (gateway_) {
    auto status = gateway_->reaped() ? *gateway_->exitStatus() : gateway_->terminate(std::chrono::milliseconds(200));
    how = status.known ? "exited (" + status.describe() + ")" : "exited";
  }
  gateway_.reset();
  pool_->killLeftoversOf(slot_);
  // In the sandbox's audit log, where its owner looks for why connections broke. O_APPEND:
  // the gateway appends there too, one whole line per write.
  nlohmann::json entry{{"time_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count()},
                       {"kind", "gateway"},
                       {"allowed", false},
                       {"reason", "gateway-restarted"},
                       {"detail", (why.empty() ? "the gateway " + how : why) + "; open connections were lost"}};
  // The directory is root's first (an earlier version gave it to the gateway), and the file
  // written only if it has no other name (a hard link to a file elsewhere).
  SPACE_TRY(keepDirectoryFromGateway(NetworkPool::gatewayDir(state_dir_)));
  UniqueFd audit(::open((NetworkPool::gatewayDir(state_dir_) + "/" + kAuditFile).c_str(),
                        O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat st {};
  // Bounded too: a gateway that dies at every start would otherwise grow it a line at a time.
  if (audit.valid() && ::fstat(audit.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
      st.st_size < kAuditAppendMaxBytes) {
    std::string line = entry.dump() + "\n";
    if (::write(audit.get(), line.data(), line.size()) < 0) spdlog::warn("network: audit append: {}", strerror(errno));
  }
  const std::string resolver = pool_->gatewayResolver();
  auto child = pool_->spawnGateway(slot_, state_dir_, resolver);
  if (!child.ok()) return child.error();
  gateway_resolver_ = resolver;
  gateway_.emplace(std::move(child.value()));
  return writeAttachment();
}

void SandboxNetwork::detach() {
  detached_ = true;
  if (gateway_) gateway_->disown();
  gateway_.reset();
}

Status SandboxNetwork::writeAttachment() const {
  nlohmann::json a = {{"slot", slot_.index},
                      {"gateway_pid", gateway_ ? gateway_->pid() : -1},
                      {"tap_sent_at_attach", tap_baseline_.guest_sent},
                      {"tap_received_at_attach", tap_baseline_.guest_received},
                      {"gateway_confinement", kGatewayConfinement},
                      {"gateway_resolver", gateway_resolver_}};
  if (gateway_) {
    if (auto started = processStartTime(gateway_->pid()); started.ok()) a["gateway_start"] = started.value();
  }
  return writeFileAtomic(state_dir_ + "/" + kAttachmentFile, a.dump() + "\n", 0600);
}

// ---- NetworkPool

std::shared_ptr<NetworkPool> NetworkPool::create(NetworkOptions options) {
  return std::shared_ptr<NetworkPool>(new NetworkPool(std::move(options)));
}

NetworkPool::NetworkPool(NetworkOptions options)
    : options_(std::move(options)), slots_(options_.slot_prefix, options_.netns_dir) {
  // Once, for every gateway of this pool (adopted ones restarted before start() too).
  if (options_.gateway_uid_base != 0) {
    // The probe's uid (the one below the range) too: it runs the gateway's code.
    egress_.first_uid = options_.gateway_uid_base - 1;
    egress_.last_uid = options_.gateway_uid_base + (kMaxSlots - 1);
  } else {
    // Gateways share a user (embedders only; spaced gives each its own uid): whatever else runs
    // as that user is held too.
    egress_.first_uid = egress_.last_uid = gatewayIds(slots_.slotAt(0)).first;
  }
  egress_.table = gatewayEgressTableName(egress_.first_uid);
  // The one resolver every gateway is given, and the table lets through.
  Result<Ipv4Endpoint> resolver = makeError(ErrorCode::kInternal, "");
  if (!options_.upstream_dns.empty()) {
    resolver = parseResolver(options_.upstream_dns);
    if (!resolver.ok()) config_error_ = "--gateway-upstream-dns: " + resolver.error().message;
  } else {
    auto text = readSmallFile(options_.resolv_conf, 64 << 10);
    resolver = text.ok() ? resolverOfResolvConf(text.value()) : Result<Ipv4Endpoint>(text.error());
    if (!resolver.ok()) {
      config_error_ = "the host's resolver: " + resolver.error().message + " (give --gateway-upstream-dns)";
    }
  }
  if (resolver.ok()) {
    egress_.resolver = resolver.value();
    resolver_now_ = formatEndpoint(resolver.value());
  }
  for (const std::string& cidr : options_.openable_cidrs) {
    auto rule = parseRule(cidr);
    if (!rule.ok() || rule->kind != Rule::Kind::kCidr || rule->port) {
      config_error_ = "--tenant-openable-cidrs: " + cidr + " is not an IPv4 CIDR without a port";
      continue;
    }
    egress_.openable.push_back({rule->network, rule->prefix_length});
  }
  if (options_.gateway_cpu_percent < 1 || options_.gateway_cpu_percent > 100) {
    config_error_ = "--gateway-cpu-percent: " + std::to_string(options_.gateway_cpu_percent) +
                    " is not a percent of one core (1..100)";
  }
  if (options_.gateway_memory_mb < 128 || options_.gateway_memory_mb > (uint64_t{1} << 20)) {
    config_error_ =
        "--gateway-memory-mb: " + std::to_string(options_.gateway_memory_mb) + " MiB is not within 128 MiB..1 TiB";
  }
}

NetworkPool::~NetworkPool() {
  stop();
  for (const Slot& s : spare_) (void)slots_.destroy(s);
}

Status NetworkPool::start(const std::set<std::string>& keep) {
  // Before any slot (adopted gateways restarted earlier have loaded it already).
  SPACE_TRY(holdGatewayEgress());
  std::error_code ec;
  std::filesystem::create_directories(options_.netns_dir, ec);
  ::chmod(options_.netns_dir.c_str(), 0700);
  size_t reclaimed = 0;
  for (const Slot& s : slots_.existing()) {
    {
      std::lock_guard lock(mu_);
      if (used_.count(s.index) != 0) continue;  // re-adopted already (adopt())
      if (keep.count(s.name) != 0) {
        used_.insert(s.index);
        continue;
      }
    }
    if (size_t killed = killProcessesIn(s.netns_path); killed > 0) {
      spdlog::info("network: killed {} process(es) left in slot {}", killed, s.name);
    }
    if (auto done = slots_.destroy(s); !done.ok()) {
      spdlog::warn("network: cannot remove slot {} left by a previous run: {}", s.name, done.error().message);
      std::lock_guard lock(mu_);
      used_.insert(s.index);  // never hand it out
      continue;
    }
    ++reclaimed;
  }
  if (reclaimed > 0) spdlog::info("network: removed {} slot(s) a previous run left", reclaimed);
  // Credential files of slots nobody holds now (a previous run's) go too.
  std::filesystem::create_directories(options_.credentials_dir, ec);
  ::chmod(options_.credentials_dir.c_str(), 0711);  // gateways reach their own file by name only
  std::set<std::string> held;
  for (const Slot& s : slots_.existing()) {
    std::lock_guard lock(mu_);
    if (used_.count(s.index) != 0) held.insert(s.name + ".json");
  }
  for (const auto& entry : std::filesystem::directory_iterator(options_.credentials_dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(options_.slot_prefix + "-", 0) == 0 && held.count(file) == 0) ::unlink(entry.path().c_str());
  }
  // So do gateway groups of slots nobody holds, and whatever is left in them.
  if (gateway_cgroups_) {
    std::set<std::string> groups;
    for (const auto& root : gateway_cgroups_->roots) {
      for (const auto& entry : std::filesystem::directory_iterator(root.dir, ec)) {
        if (entry.is_directory(ec)) groups.insert(entry.path().filename().string());
      }
    }
    for (const std::string& name : groups) {
      if (held.count(name + ".json") == 0) endGatewayGroup(name);
    }
  }
  try {
    refill_ = std::thread([this] { refillLoop(); });
  } catch (const std::system_error& e) {
    // Out of threads: a start-up failure to report, not an exception to die of.
    return makeError(ErrorCode::kResourceExhausted, std::string("cannot start the network slot thread: ") + e.what());
  }
  // Another program's change to the egress table is undone within the check after a change,
  // not the next periodic one.
  auto changes = NftablesChanges::open(options_.upstream_netns);
  stop_watching_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!changes.ok() || !stop_watching_.valid()) {
    spdlog::warn("network: cannot watch nftables changes ({}); the gateways' egress table is checked every {} ms only",
                 changes.ok() ? std::string("eventfd: ") + strerror(errno) : changes.error().message,
                 options_.egress_check_interval.count());
  } else {
    try {
      watch_egress_ =
          std::thread([this, watcher = std::move(changes.value())]() mutable { watchEgressLoop(std::move(watcher)); });
    } catch (const std::system_error& e) {
      spdlog::warn("network: cannot start the nftables watch thread ({}); the egress table is checked every {} ms only",
                   e.what(), options_.egress_check_interval.count());
    }
  }
  return Ok{};
}

void NetworkPool::watchEgressLoop(NftablesChanges changes) {
  while (true) {
    pollfd fds[2] = {{changes.fd(), POLLIN, 0}, {stop_watching_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::warn("network: the nftables watch stopped: {}; the egress table is checked every {} ms only",
                   strerror(errno), options_.egress_check_interval.count());
      return;
    }
    if (fds[1].revents != 0) return;
    // An overflow of its queue shows as POLLERR (ENOBUFS), which the drain reads and clears.
    if (fds[0].revents & POLLNVAL) errno = EBADF;
    const auto drained = fds[0].revents & POLLNVAL ? NftablesChanges::Drained::kFailed : changes.drain();
    if (drained == NftablesChanges::Drained::kFailed) {
      spdlog::warn("network: the nftables watch stopped: {}; the egress table is checked every {} ms only",
                   strerror(errno), options_.egress_check_interval.count());
      return;
    }
    if (drained == NftablesChanges::Drained::kNothing) continue;
    {
      std::lock_guard lock(mu_);
      egress_changed_ = true;
    }
    cv_.notify_all();
  }
}

void NetworkPool::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (refill_.joinable()) refill_.join();
  if (watch_egress_.joinable()) {
    const uint64_t one = 1;
    if (::write(stop_watching_.get(), &one, sizeof one) != sizeof one) {
      spdlog::warn("network: cannot stop the nftables watch: {}", strerror(errno));
    }
    watch_egress_.join();
  }
}

Status NetworkPool::loadEgressLocked(const GatewayEgress& table) {
  if (auto loaded = loadGatewayEgress(table, options_.upstream_netns); !loaded.ok()) {
    return makeError(loaded.error().code,
                     "cannot load the gateways' egress table " + table.table + ": " + loaded.error().message);
  }
  auto listed = listGatewayEgress(table, options_.upstream_netns);
  if (!listed.ok()) return listed.error();
  egress_listing_ = std::move(listed->rules);
  egress_counted_ = listed->refused_packets;
  return okStatus();
}

void NetworkPool::countEgressRefusalsLocked(uint64_t counted) {
  // The table's counters start at 0 with each load; what they add is the gateways'.
  if (counted <= egress_counted_) return;
  const uint64_t added = counted - egress_counted_;
  egress_counted_ = counted;
  egress_refused_ += added;
  spdlog::warn(
      "network: the gateways' egress table refused {} packet(s) ({} since start): a gateway sent what its "
      "own policy refuses (compromised by its guest, or a defect); its sandbox's gateway.log and audit "
      "log may say which",
      added, egress_refused_.load());
}

uint64_t NetworkPool::egressRefusedPackets() {
  std::lock_guard lock(egress_mu_);
  if (!egress_listing_.empty()) {
    if (auto listed = listGatewayEgress(egress_, options_.upstream_netns);
        listed.ok() && listed->rules == egress_listing_) {
      countEgressRefusalsLocked(listed->refused_packets);
    }
  }
  return egress_refused_;
}

Status NetworkPool::holdGatewayEgress() {
  std::lock_guard lock(egress_mu_);
  if (!egress_listing_.empty()) return okStatus();
  // Without a resolver, every gateway would read /etc/resolv.conf for itself, whose resolver
  // the table may refuse (127.0.0.53, a cloud's 169.254.169.253).
  if (!config_error_.empty()) return makeError(ErrorCode::kInvalidArgument, config_error_);
  const GatewayEgress& table = egress_;
  SPACE_TRY(loadEgressLocked(table));
  spdlog::info(
      "network: gateways' upstream sockets (uids {}-{}) held by nftables table inet {} in {}: TCP only, "
      "not through loopback, to no address of the namespace itself, no never-reachable or forbidden "
      "range{}, no IPv6; resolver {} (UDP and TCP)",
      table.first_uid, table.last_uid, table.table,
      options_.upstream_netns.empty() ? std::string("spaced's namespace") : options_.upstream_netns,
      options_.openable_cidrs.empty() ? std::string() : " outside the openable ones", formatEndpoint(*table.resolver));
  return okStatus();
}

bool NetworkPool::keepGatewayEgress() {
  std::lock_guard lock(egress_mu_);
  if (egress_listing_.empty()) return false;
  const GatewayEgress& table = egress_;
  auto listed = listGatewayEgress(table, options_.upstream_netns);
  if (listed.ok() && listed->rules == egress_listing_) {
    countEgressRefusalsLocked(listed->refused_packets);
    return false;
  }
  // Another program removed or changed it (`nft flush ruleset`: Debian's nftables.conf starts
  // with one; a second daemon with the same gateway uids loads its own).
  if (auto loaded = loadEgressLocked(table); loaded.ok()) {
    spdlog::warn("network: the gateways' egress table {} was {} (by another program?); loaded again", table.table,
                 listed.ok() ? "changed" : "gone");
  } else {
    spdlog::error("network: the gateways' egress table {} is gone or changed and cannot be loaded again: {}",
                  table.table, loaded.error().message);
  }
  return true;
}

std::string NetworkPool::gatewayResolver() const {
  std::lock_guard lock(resolver_mu_);
  return resolver_now_;
}

void NetworkPool::checkResolver() {
  if (!options_.upstream_dns.empty()) return;
  // Without waiting: a FIFO there would stop the refill thread.
  auto text = readHostileTail(options_.resolv_conf, 64 << 10, /*follow_links=*/true);
  auto now = text.ok() ? resolverOfResolvConf(text.value()) : Result<Ipv4Endpoint>(text.error());
  // A file being rewritten, or none for a moment, says nothing about the resolver.
  if (!now.ok()) return;
  const std::string found = formatEndpoint(now.value()), given = gatewayResolver();
  if (given.empty()) return;
  if (found == given) {
    resolver_stale_ = false;
    resolver_pending_.clear();
    return;
  }
  resolver_stale_ = true;
  // Followed once it has stayed a check interval (one reading may be a file a DHCP client is
  // halfway through rewriting; checks come 200 ms apart while nftables change), and at most
  // once per resolver_follow_gap: each follow costs every sandbox its open connections.
  const auto now_time = std::chrono::steady_clock::now();
  if (found != resolver_pending_) {
    resolver_pending_ = found;
    resolver_pending_since_ = now_time;
    resolver_wait_said_ = false;
    spdlog::info("network: the host's resolver is now {} ({}); the gateways follow it if it stays", found,
                 options_.resolv_conf);
    return;
  }
  if (now_time - resolver_pending_since_ < options_.egress_check_interval) return;
  if (resolver_followed_at_ && now_time - *resolver_followed_at_ < options_.resolver_follow_gap) {
    if (!resolver_wait_said_) {
      spdlog::warn(
          "network: the host's resolver changed again ({}), within {} s of the last change the gateways "
          "followed; they keep asking {} until then",
          found, std::chrono::duration_cast<std::chrono::seconds>(options_.resolver_follow_gap).count(), given);
      resolver_wait_said_ = true;
    }
    return;
  }
  resolver_pending_.clear();
  std::lock_guard lock(egress_mu_);
  GatewayEgress next = egress_;
  next.resolver = now.value();
  if (!egress_listing_.empty()) {
    if (auto loaded = loadEgressLocked(next); !loaded.ok()) {
      spdlog::error(
          "network: the host's resolver is now {}, but the gateways' egress table cannot let it through ({}); "
          "the gateways keep asking {}",
          found, loaded.error().message, given);
      return;
    }
  }
  egress_ = std::move(next);
  {
    std::lock_guard resolver_lock(resolver_mu_);
    resolver_now_ = found;
  }
  resolver_followed_at_ = now_time;
  resolver_stale_ = false;
  spdlog::warn(
      "network: the host's resolver changed from {} to {}: the gateways' egress table lets {} through now, and each "
      "sandbox's gateway is restarted to ask it (their open connections are lost)",
      given, found, found);
}

Result<Slot> NetworkPool::newSlot() {
  int index = 0;
  {
    std::lock_guard lock(mu_);
    while (used_.count(index) != 0 ||
           std::any_of(spare_.begin(), spare_.end(), [&](const Slot& s) { return s.index == index; })) {
      ++index;
    }
    // Past it, a gateway's uid would be outside what the egress table holds.
    if (index >= kMaxSlots) {
      return makeError(ErrorCode::kResourceExhausted,
                       "no network slot left (" + std::to_string(kMaxSlots) + " in use)");
    }
    used_.insert(index);  // reserved while it is being made
  }
  auto made = slots_.create(index);
  if (!made.ok()) {
    std::lock_guard lock(mu_);
    used_.erase(index);
  }
  return made;
}

void NetworkPool::refillLoop() {
  std::unique_lock lock(mu_);
  auto last_check = std::chrono::steady_clock::now();
  auto next_check = last_check + options_.egress_check_interval;
  // Reloads within the last interval: past a few, changes wait for the periodic check, or a
  // second daemon loading its own table over this one's (other options) would start a fight of
  // reloads, each waking the other.
  constexpr size_t kQuickReloads = 4;
  std::deque<std::chrono::steady_clock::time_point> reloads;
  std::chrono::steady_clock::time_point retry_slots_at{};
  while (!stopping_) {
    if (egress_changed_) {
      egress_changed_ = false;
      const auto now = std::chrono::steady_clock::now();
      while (!reloads.empty() && now - reloads.front() >= options_.egress_check_interval) reloads.pop_front();
      // Soon, but not more often than that however fast another program changes its own tables.
      if (reloads.size() < kQuickReloads) {
        next_check = std::min(next_check, last_check + options_.egress_check_after_change);
      }
    }
    if (std::chrono::steady_clock::now() >= next_check) {
      lock.unlock();
      const bool reloaded = keepGatewayEgress();
      checkResolver();
      lock.lock();
      last_check = std::chrono::steady_clock::now();
      if (reloaded) reloads.push_back(last_check);
      if (reloads.size() > kQuickReloads) reloads.pop_front();
      next_check = last_check + options_.egress_check_interval;
      continue;
    }
    // After a failure, the next spare slot waits 5 s, whatever wakes this thread meanwhile
    // (nftables notices, a slot taken).
    if (static_cast<int>(spare_.size()) >= options_.spare_slots || std::chrono::steady_clock::now() < retry_slots_at) {
      cv_.wait_until(lock, static_cast<int>(spare_.size()) >= options_.spare_slots
                               ? next_check
                               : std::min(next_check, retry_slots_at));
      continue;
    }
    lock.unlock();
    auto made = newSlot();
    lock.lock();
    if (!made.ok()) {
      spdlog::warn("network: cannot make a spare slot: {}", made.error().message);
      retry_slots_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      continue;
    }
    used_.erase(made->index);
    spare_.push_back(std::move(made.value()));
  }
}

Result<Slot> NetworkPool::takeSlot() {
  {
    std::lock_guard lock(mu_);
    if (!spare_.empty()) {
      Slot s = std::move(spare_.back());
      spare_.pop_back();
      used_.insert(s.index);
      cv_.notify_all();
      return s;
    }
  }
  cv_.notify_all();
  return newSlot();
}

void NetworkPool::releaseSlot(const Slot& slot) {
  // A used slot is scrubbed before anyone else gets it: no conntrack entry or neighbour of
  // the previous guest survives. One that cannot be scrubbed is destroyed instead.
  bool keep = false;
  {
    std::lock_guard lock(mu_);
    keep = !stopping_ && static_cast<int>(spare_.size()) < options_.spare_slots;
  }
  if (keep) {
    if (auto scrubbed = slots_.scrub(slot); !scrubbed.ok()) {
      spdlog::warn("network: cannot scrub slot {}: {}", slot.name, scrubbed.error().message);
      keep = false;
    }
  }
  if (!keep) {
    if (auto gone = slots_.destroy(slot); !gone.ok()) {
      spdlog::warn("network: cannot remove slot {}: {}", slot.name, gone.error().message);
    }
  }
  std::lock_guard lock(mu_);
  used_.erase(slot.index);
  if (keep) spare_.push_back(slot);
}

size_t NetworkPool::slotsInUse() const {
  std::lock_guard lock(mu_);
  return used_.size();
}

size_t NetworkPool::spareSlots() const {
  std::lock_guard lock(mu_);
  return spare_.size();
}

std::pair<uid_t, gid_t> NetworkPool::gatewayIds(const Slot& slot) const {
  if (options_.gateway_uid_base != 0) {
    uid_t id = options_.gateway_uid_base + static_cast<uid_t>(slot.index);
    return {id, id};
  }
  passwd* pw = getpwnam(options_.gateway_user.c_str());
  return pw ? std::make_pair(pw->pw_uid, pw->pw_gid) : std::make_pair(uid_t{65534}, gid_t{65534});
}

Status NetworkPool::useCgroups(const jail::CgroupLayout& layout) {
  auto nested = jail::nestedLayout(layout, jail::kGatewayGroups);
  if (!nested.ok()) return nested.error();
  gateway_cgroups_base_ = layout;
  gateway_cgroups_ = std::move(nested.value());
  return okStatus();
}

jail::CgroupLimits NetworkPool::gatewayLimits() const {
  jail::CgroupLimits limits;
  limits.memory_bytes = options_.gateway_memory_mb << 20;
  // One task: the gateway runs one thread and makes none (RLIMIT_NPROC says so too, per uid;
  // the group says so for the process, whatever user it runs as).
  limits.pids = 1;
  limits.cpu_quota_us = uint64_t{options_.gateway_cpu_percent} * limits.cpu_period_us / 100;
  return limits;
}

jail::VmCgroup NetworkPool::gatewayGroup(const Slot& slot) const {
  return gateway_cgroups_ ? jail::VmCgroup::existing(*gateway_cgroups_, slot.name) : jail::VmCgroup();
}

namespace {

// Kills every process in `group`: each through a pidfd taken before a second look that its pid
// is still in the group, so that a pid reused meanwhile (one init reaped) is never signalled.
// 0 is skipped: on v2 it names a process outside our PID namespace (and kill(0) our own group).
void killProcessesInGroup(const jail::VmCgroup& group, const std::string& slot_name) {
  for (pid_t pid : group.processes()) {
    if (pid <= 0 || pid == ::getpid()) continue;
    auto process = ChildProcess::adopt(pid);
    if (!process.ok()) continue;  // gone already
    if (!group.holds(pid)) {
      process->disown();
      continue;
    }
    process->kill();
    spdlog::warn("network: killed process {} left in slot {}'s gateway group", pid, slot_name);
  }
}

}  // namespace

void NetworkPool::endGatewayGroup(const std::string& slot_name) const {
  if (!gateway_cgroups_) return;
  jail::VmCgroup group = jail::VmCgroup::existing(*gateway_cgroups_, slot_name);
  killProcessesInGroup(group, slot_name);
  if (auto removed = group.remove(); !removed.ok()) spdlog::warn("network: {}", removed.error().message);
}

void NetworkPool::killLeftoversOf(const Slot& slot) const {
  // The group holds only the slot's gateways, whatever user they run as.
  killProcessesInGroup(gatewayGroup(slot), slot.name);
  // Only a uid of the slot's own: a user that gateways share may run anything else too.
  if (options_.gateway_uid_base == 0) return;
  const uid_t uid = gatewayIds(slot).first;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (auto owner = processUid(pid); owner.ok() && owner.value() == uid && ::kill(pid, SIGKILL) == 0) {
      spdlog::warn("network: killed process {} of slot {}'s gateway uid {}, left by an earlier gateway", pid, slot.name,
                   uid);
    }
  }
}

std::string NetworkPool::gatewayUser(const Slot& slot) const {
  if (options_.gateway_uid_base == 0) return options_.gateway_user;
  return "#" + std::to_string(gatewayIds(slot).first);
}

Result<ChildProcess> NetworkPool::spawnGateway(const Slot& slot, const std::string& state_dir,
                                               const std::string& resolver) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return makeError(ErrorCode::kInternal, std::string("pipe: ") + strerror(errno));
  UniqueFd read_end(ready[0]);
  UniqueFd write_end(ready[1]);
  const std::string gw = gatewayDir(state_dir);
  // Held from its first socket on, also where recovery restarts an adopted gateway before start().
  SPACE_TRY(holdGatewayEgress());
  // At every start, restarts of adopted sandboxes included: an earlier version gave it to the gateway.
  SPACE_TRY(keepDirectoryFromGateway(gw));
  std::vector<std::string> argv = {options_.gateway_binary,
                                   "--slot-netns",
                                   slot.netns_path,
                                   "--policy",
                                   gw + "/" + kPolicyFile,
                                   "--audit",
                                   gw + "/" + kAuditFile,
                                   "--credentials",
                                   options_.credentials_dir + "/" + slot.name + ".json",
                                   "--ready-fd",
                                   "3",
                                   "--user",
                                   gatewayUser(slot)};
  for (const std::string& cidr : options_.openable_cidrs) argv.insert(argv.end(), {"--openable-cidr", cidr});
  if (gateway_cgroups_) {
    // Made again if missing: spaced's sweep of empty VM groups removes an empty gateways/.
    auto nested = jail::nestedLayout(*gateway_cgroups_base_, jail::kGatewayGroups);
    if (!nested.ok()) return nested.error();
    auto group = jail::VmCgroup::create(nested.value(), slot.name, gatewayLimits());
    if (!group.ok()) return group.error();
    for (const std::string& procs : group->procsFiles()) argv.insert(argv.end(), {"--cgroup-procs", procs});
  }
  if (!options_.upstream_netns.empty()) argv.insert(argv.end(), {"--upstream-netns", options_.upstream_netns});
  if (!resolver.empty()) argv.insert(argv.end(), {"--upstream-dns", resolver});
  if (!options_.upstream_ca.empty()) argv.insert(argv.end(), {"--upstream-ca", options_.upstream_ca});
  const std::string log = state_dir + "/" + kGatewayLog;
  if (struct stat st{}; ::lstat(log.c_str(), &st) == 0 && st.st_size > kGatewayLogMaxBytes) {
    if (::rename(log.c_str(), (log + ".1").c_str()) != 0) {
      spdlog::warn("network: cannot rotate {}: {}", log, strerror(errno));
    }
  }
  SpawnOptions spawn{log, "", true};
  spawn.pass_fds = {{write_end.get(), 3}};
  auto child = ChildProcess::spawn(argv, spawn);
  write_end.reset();
  if (!child.ok()) return child.error();
  // "ready\n" once it listens in the slot; EOF or a timeout means it did not make it.
  pollfd p{read_end.get(), POLLIN, 0};
  int waited = ::poll(&p, 1, static_cast<int>(options_.gateway_ready_timeout.count()));
  char buf[8] = {};
  ssize_t n = waited > 0 ? ::read(read_end.get(), buf, sizeof buf) : 0;
  if (n < 5 || std::string_view(buf, 5) != "ready") {
    child->terminate(std::chrono::milliseconds(100));
    std::string tail;
    if (auto log = readFileTail(state_dir + "/" + kGatewayLog, 2048); log.ok()) tail = log.value();
    return makeError(ErrorCode::kUnavailable, "the network gateway did not start (" +
                                                  std::string(waited > 0 ? "it exited" : "no answer in time") +
                                                  "): " + tail);
  }
  return child;
}

Result<nlohmann::json> NetworkPool::probeGatewayConfinement(const std::string& scratch_dir) const {
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir, ec);
  if (!std::filesystem::create_directories(scratch_dir, ec) || ec) {
    return makeError(ErrorCode::kInternal, "cannot make " + scratch_dir + ": " + ec.message());
  }
  const std::string report_path = scratch_dir + ".json";
  const std::string log_path = scratch_dir + ".log";
  auto cleanUp = [&] {
    std::filesystem::remove_all(scratch_dir, ec);
    ::unlink(report_path.c_str());
    ::unlink(log_path.c_str());
  };
  ::unlink(report_path.c_str());
  ::unlink(log_path.c_str());
  // A uid no gateway has (the one below their range), so that no gateway, compromised, can
  // signal the probe; where gateways share a user, that user.
  const std::string user =
      options_.gateway_uid_base > 1 ? "#" + std::to_string(options_.gateway_uid_base - 1) : options_.gateway_user;
  SpawnOptions spawn{report_path, log_path, true};
  auto child = ChildProcess::spawn(
      {options_.gateway_binary, "--probe-confinement", scratch_dir, "--user", user, "--log-level", "warn"}, spawn);
  if (!child.ok()) {
    cleanUp();
    return child.error();
  }
  auto status = child->waitFor(options_.gateway_ready_timeout);
  if (!status) {
    child->kill();
    cleanUp();
    return makeError(ErrorCode::kUnavailable, options_.gateway_binary + " --probe-confinement did not finish in time");
  }
  std::filesystem::remove_all(scratch_dir, ec);
  auto text = readFileTail(report_path, 64 << 10);
  std::string tail;
  if (auto log = readFileTail(log_path, 2048); log.ok()) tail = log.value();
  ::unlink(report_path.c_str());
  ::unlink(log_path.c_str());
  auto report = text.ok() ? parseJsonBounded(text.value()) : Result<nlohmann::json>(text.error());
  if (!report.ok() || !report->is_object() || !report->contains("confined") || !(*report)["confined"].is_boolean() ||
      !report->contains("checks") || !(*report)["checks"].is_object() || !report->contains("works") ||
      !(*report)["works"].is_boolean() || !report->contains("landlock_abi") ||
      !(*report)["landlock_abi"].is_number_integer()) {
    return makeError(ErrorCode::kUnavailable, options_.gateway_binary + " --probe-confinement " + status->describe() +
                                                  " without a report: " + tail);
  }
  return report.value();
}

Status NetworkPool::writePolicy(const std::string& dir, const Policy& policy, bool durable) {
  const std::string text = toJson(policy).dump() + "\n";
  return durable ? writeFileAtomic(dir + "/" + kPolicyFile, text, 0644)
                 : replaceFile(dir + "/" + kPolicyFile, text, 0644);
}

std::string NetworkPool::readAudit(const std::string& state_dir, size_t max_bytes) {
  // The rotated file first: a guest that floods the log to push entries out must fill both.
  const std::string current = gatewayDir(state_dir) + "/" + kAuditFile;
  auto newest = readHostileTail(current, max_bytes);
  std::string text = newest.ok() ? newest.value() : "";
  if (text.size() < max_bytes) {
    auto older = readHostileTail(current + ".1", max_bytes - text.size());
    if (older.ok()) text = older.value() + (older->empty() || older->back() == '\n' ? "" : "\n") + text;
  }
  return text;
}

Result<std::optional<Policy>> NetworkPool::readPolicy(const std::string& dir) {
  const std::string path = dir + "/" + kPolicyFile;
  auto text = readHostileTail(path, 1 << 20);
  if (!text.ok() && text.error().code == ErrorCode::kNotFound) return std::optional<Policy>();
  if (!text.ok()) return text.error();
  auto json = parseJsonBounded(text.value());
  if (!json.ok()) return makeError(ErrorCode::kInternal, path + ": " + json.error().message);
  auto policy = parsePolicy(json.value());
  if (!policy.ok()) return makeError(ErrorCode::kInternal, path + ": " + policy.error().message);
  return std::optional<Policy>(std::move(policy.value()));
}

Result<std::unique_ptr<SandboxNetwork>> NetworkPool::attach(const std::optional<Policy>& policy, const Policy& fallback,
                                                            const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(gatewayDir(state_dir), ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot make " + gatewayDir(state_dir) + ": " + ec.message());
  ::chmod(state_dir.c_str(), 0700);
  auto slot = takeSlot();
  if (!slot.ok()) return slot.error();
  std::unique_ptr<SandboxNetwork> network(new SandboxNetwork(shared_from_this(), std::move(slot.value()), state_dir));
  // Figures only: a slot whose counters cannot be read counts from 0 (a reused one overstates).
  if (auto counters = readTapBytes(network->slot()); counters.ok()) {
    network->tap_baseline_ = counters.value();
  } else {
    spdlog::warn("network: slot {}: tap counters unread: {}", network->slot().name, counters.error().message);
  }
  if (policy) {
    SPACE_TRY(network->setPolicy(*policy));
  } else if (auto kept = readPolicy(gatewayDir(state_dir)); !kept.ok() || !kept.value()) {
    SPACE_TRY(network->setPolicy(fallback));
  }
  const std::string resolver = gatewayResolver();
  auto gateway = spawnGateway(network->slot(), state_dir, resolver);
  if (!gateway.ok()) return gateway.error();  // the destructor gives the slot back
  network->gateway_.emplace(std::move(gateway.value()));
  network->gateway_resolver_ = resolver;
  SPACE_TRY(network->writeAttachment());
  return network;
}

Result<std::unique_ptr<SandboxNetwork>> NetworkPool::adopt(const std::string& state_dir) {
  auto text = readFileTail(state_dir + "/" + kAttachmentFile, 4096);
  if (!text.ok()) return text.error();
  auto a = nlohmann::json::parse(text.value(), nullptr, false);
  if (!a.is_object() || !a.contains("slot") || !a["slot"].is_number_integer()) {
    return makeError(ErrorCode::kInternal, "unreadable " + state_dir + "/" + kAttachmentFile);
  }
  Slot slot = slots_.slotAt(a["slot"].get<int>());
  {
    std::lock_guard lock(mu_);
    used_.insert(slot.index);
  }
  std::unique_ptr<SandboxNetwork> network(new SandboxNetwork(shared_from_this(), slot, state_dir));
  for (auto [field, into] : {std::pair{"tap_sent_at_attach", &network->tap_baseline_.guest_sent},
                             std::pair{"tap_received_at_attach", &network->tap_baseline_.guest_received}}) {
    if (auto it = a.find(field); it != a.end() && it->is_number_unsigned()) *into = it->get<uint64_t>();
  }
  pid_t pid = a.value("gateway_pid", -1);
  std::string start = a.value("gateway_start", "");
  if (pid > 0 && !start.empty()) {
    if (auto now = processStartTime(pid); now.ok() && now.value() == start) {
      if (auto adopted = ChildProcess::adopt(pid); adopted.ok()) network->gateway_.emplace(std::move(adopted.value()));
    }
  }
  if (!network->gateway_) {
    spdlog::warn("network: the gateway of slot {} is gone; starting a new one", slot.name);
    SPACE_TRY(network->restartGateway());
  } else if (const auto made = a.find("gateway_confinement");
             made == a.end() || !made->is_number_integer() || made->get<int>() != kGatewayConfinement) {
    // Also where its program file was replaced in place, or /proc/PID/exe cannot be read.
    spdlog::warn(
        "network: the gateway of slot {} was started by an earlier version (confinement {}, now {}); "
        "restarting it",
        slot.name, made == a.end() ? "unrecorded" : made->dump(), kGatewayConfinement);
    SPACE_TRY(network->restartGateway());
  } else if (const std::string asks = a.value("gateway_resolver", std::string()); asks != gatewayResolver()) {
    // Given another resolver than this daemon's (the host's changed across the restart, or
    // --gateway-upstream-dns): the table lets only this one through, so its DNS would fail.
    spdlog::warn("network: the gateway of slot {} asks the resolver {}, not {}; restarting it", slot.name,
                 asks.empty() ? std::string("(unrecorded)") : asks, gatewayResolver());
    SPACE_TRY(network->restartGateway("the gateway asked another resolver than the node's now"));
  } else if (!runsProgram(pid, options_.gateway_binary)) {
    // Started by an earlier version (spaced was upgraded with its sandboxes kept running): it
    // lacks what this version's gateways are confined by and fixed in, for as long as it would
    // otherwise run. Its open connections end, as at any restart, and its audit log says so.
    spdlog::warn("network: the gateway of slot {} runs another program than {} (an earlier version's); restarting it",
                 slot.name, options_.gateway_binary);
    SPACE_TRY(network->restartGateway());
  } else if (gateway_cgroups_ && !gatewayGroup(slot).holds(pid)) {
    // Started where gateways got no group (no cgroups then, or --jail off): it would run on
    // without the group's limits.
    spdlog::warn("network: the gateway of slot {} runs outside its control group; restarting it", slot.name);
    SPACE_TRY(network->restartGateway());
  } else if (gateway_cgroups_) {
    // In its group: with this daemon's limits from now on (they may have changed across the restart).
    // A limit below what it holds now is refused (v1): it keeps running under the old ones.
    if (auto limited = jail::VmCgroup::create(*gateway_cgroups_, slot.name, gatewayLimits()); !limited.ok()) {
      spdlog::warn("network: the gateway of slot {} keeps its earlier limits: {}", slot.name, limited.error().message);
    }
  }
  if (network->gateway_resolver_.empty() && network->gateway_) network->gateway_resolver_ = gatewayResolver();
  return network;
}

}  // namespace space::net
