// The network of running sandboxes on one node: slots made ahead of need, and one gateway
// process per sandbox that holds its policy and writes its audit log. Knows nothing of VMs:
// the sandbox layer asks for an attachment, starts QEMU in its slot, and drops it at teardown.
//
// A sandbox's network files live in its own directory (`state_dir`), which outlives any one
// VM of it (suspend, resume). It is root's and holds what only spaced writes: gateway.log and
// attachment.json (slot and gateway process, for re-adoption by the next spaced). Its gw/
// subdirectory, root's too, is the gateway's working directory: policy.json (written by
// spaced, atomically: the gateway applies it to its next connection) and audit.jsonl (+ .1,
// opened by the gateway while root, and bounded by it). The gateway writes those two files and
// makes none. spaced reads what is in gw/ as a hostile file: no symlinks followed, regular
// files only, bounded.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/process.h"
#include "common/result.h"
#include "common/unix_socket.h"
#include "jail/cgroup.h"
#include "net/gateway_egress.h"
#include "net/policy.h"
#include "net/slot.h"
#include "net/tls_ca.h"

namespace space::net {

struct NetworkOptions {
  std::string gateway_binary;
  std::string netns_dir = "/run/space/netns";
  std::string slot_prefix = "space";
  // The namespace the gateways' upstream side runs in (tests: a fake internet); empty: ours.
  std::string upstream_netns;
  // The resolver the gateways ask, IP[:PORT]; empty: the host's, the first IPv4 nameserver of
  // resolv_conf, followed when it changes (every gateway is given the same one, which the
  // gateways' egress table lets through).
  std::string upstream_dns;
  // Where the host's nameserver is read (when upstream_dns is empty): when the pool is made,
  // and again with each egress check (checkResolver).
  std::string resolv_conf = "/etc/resolv.conf";
  // The least time between two follows of the host's resolver: each costs every sandbox its
  // open connections, so a file that flips between two values is not followed each time.
  std::chrono::milliseconds resolver_follow_gap{std::chrono::minutes(5)};
  // The certificates (a PEM file) the gateways verify credential rules' hosts against when they
  // terminate TLS; empty: the host's trust store.
  std::string upstream_ca;
  // Each slot's gateway runs as uid (and gid) gateway_uid_base + slot index (below
  // kMaxSlots), an id no account has, so gateways cannot signal one another. 0: as
  // gateway_user instead.
  uint32_t gateway_uid_base = 1500000000;
  std::string gateway_user = "nobody";
  // Where each slot's gateway finds the values of its sandbox's credential secrets
  // (<slot name>.json, owned by that gateway's uid, mode 0400). On tmpfs: never at rest.
  std::string credentials_dir = "/run/space/credentials";
  // Private ranges tenant allow CIDRs may open (net::Policy::openable); default none.
  std::vector<std::string> openable_cidrs;
  // Slots kept made and scrubbed, ready for the next sandbox.
  int spare_slots = 2;
  std::chrono::milliseconds gateway_ready_timeout{5000};
  // How often the pool checks that the gateways' egress table is still loaded as it loaded it
  // (and loads it again if another program removed or changed it); and, sooner, the least time
  // between checks when the namespace's nftables change: a change is checked at once, or this
  // long after the last check (at most five checks a second by default).
  std::chrono::milliseconds egress_check_interval{10000};
  std::chrono::milliseconds egress_check_after_change{200};
  // The limits of each gateway's control group (NetworkPool::useCgroups). CPU in percent of one
  // core: a gateway runs one thread, so 100 takes nothing it could use, and a lower value keeps
  // a busy sandbox's gateway from a core of the host. Memory: the pages charged to it, its own
  // (which RLIMIT_AS bounds too, 64 MiB + 1 MiB per connection: 320 MiB at its default 256),
  // the page cache it fills, and on cgroup v2 its sockets' buffers, which no rlimit counts.
  uint32_t gateway_cpu_percent = 100;
  uint64_t gateway_memory_mb = 384;
};

class NetworkPool;

// Slots one pool makes at most: their gateways' uids are a range of this size, which the
// gateways' egress table (net/gateway_egress.h) holds.
inline constexpr int kMaxSlots = 65536;

// The connections into one sandbox's guest that are open now (ingress), so that they end with
// its attachment: once the slot is scrubbed it may serve another tenant's guest, and a socket
// left open would then reach that guest.
class GuestConnections {
 public:
  explicit GuestConnections(size_t max_open) : max_open_(max_open) {}
  // Registers `fd`; false when the attachment has ended or max_open are open already.
  bool add(int fd);
  void remove(int fd);
  // Shuts every registered socket down (their owners see the end and close them) and refuses
  // new ones.
  void endAll();
  // connect(2) for a registered socket, started under the lock so that endAll() either comes
  // first (and nothing starts: shutdown does nothing to a socket not yet connecting) or finds
  // it connecting or connected (and ends it). -1 with errno set as connect(2) sets it.
  int startConnect(int fd, const sockaddr* to, socklen_t length);
  bool ended();

 private:
  std::mutex mu_;
  std::set<int> fds_;
  size_t max_open_;
  bool ended_ = false;
};

// An open connection into a guest; closing it (destruction) unregisters it.
class GuestConnection {
 public:
  GuestConnection() = default;
  GuestConnection(std::shared_ptr<GuestConnections> registry, UniqueFd fd)
      : registry_(std::move(registry)), fd_(std::move(fd)) {}
  GuestConnection(GuestConnection&&) = default;
  GuestConnection& operator=(GuestConnection&& other) {
    reset();
    registry_ = std::move(other.registry_);
    fd_ = std::move(other.fd_);
    return *this;
  }
  ~GuestConnection() { reset(); }
  int fd() const { return fd_.get(); }
  // Connects to `port` of the guest within the deadline (the socket stays non-blocking).
  // kUnavailable when nothing listens there (the guest refused), or the sandbox ended meanwhile.
  Status connect(uint16_t port, Clock::time_point deadline) const;

 private:
  void reset() {
    if (registry_ && fd_.valid()) registry_->remove(fd_.get());
    fd_ = UniqueFd();  // closed only once no teardown can shut it down any more
    registry_.reset();
  }
  std::shared_ptr<GuestConnections> registry_;
  UniqueFd fd_;
};

// Open ingress connections one sandbox may have at once.
inline constexpr size_t kMaxGuestConnections = 64;

// One sandbox's attachment: its slot and the gateway serving it. Destroying it stops the
// gateway and gives the slot back (scrubbed) for another sandbox.
class SandboxNetwork {
 public:
  ~SandboxNetwork();
  SandboxNetwork(const SandboxNetwork&) = delete;
  SandboxNetwork& operator=(const SandboxNetwork&) = delete;

  const Slot& slot() const { return slot_; }
  const std::string& stateDir() const { return state_dir_; }
  pid_t gatewayPid() const { return gateway_ ? gateway_->pid() : -1; }
  // The slot's tap counters when this sandbox took it (kept in attachment.json across daemon
  // restarts): its own traffic is the counters now minus these.
  const TapBytes& tapBaseline() const { return tap_baseline_; }

  // Writes the policy the gateway applies from its next DNS answer or connection on. Not
  // `durable`: atomic but not yet on disk (persistPolicy() does that), for the create path,
  // where the sandbox cannot outlive a host crash anyway.
  Status setPolicy(const Policy& policy, bool durable = true);
  // Gives the gateway the values of the secrets its credential rules name ({name: value}); it
  // uses them from its next request on. Replaces what it had: a secret left out is gone.
  // `ca`: the sandbox's credential CA, for a gateway that terminates TLS to the rules' hosts.
  // `placeholders`: what the guest sees for a secret -> the secret's name.
  Status setCredentials(const std::map<std::string, std::string>& values, const CaMaterial* ca = nullptr,
                        const std::map<std::string, std::string>& placeholders = {});
  std::string credentialsPath() const;
  // Takes every value away (fail closed: its rules' requests get a 502 from the gateway).
  void dropCredentials();
  // Puts the policy file on disk (before a suspend records that the sandbox can come back).
  Status persistPolicy() const;
  // The gateway exited (killed, crashed): the guest has lost its connections, not its policy.
  bool gatewayExited();
  // The gateway asks another resolver than the pool gives gateways now (the host's changed):
  // its DNS fails, since the egress table lets only the new one through; restart it.
  bool gatewayOutdated() const;
  // Starts a new gateway on the same slot and policy file (ending the one running, if any).
  // `why` goes to the sandbox's audit log; empty: how the previous one ended.
  Status restartGateway(const std::string& why = {});
  // Leaves slot and gateway running for the next daemon (attachment.json says where).
  void detach();
  // A TCP socket in the slot for a connection to the guest (ingress; connect it with
  // GuestConnection::connect, which needs no lock). kResourceExhausted ("too_many_connections")
  // with kMaxGuestConnections open or connecting. It is shut down when this attachment ends
  // (delete, suspend), whoever holds it.
  Result<GuestConnection> socketToGuest();

 private:
  friend class NetworkPool;
  SandboxNetwork(std::shared_ptr<NetworkPool> pool, Slot slot, std::string state_dir)
      : pool_(std::move(pool)), slot_(std::move(slot)), state_dir_(std::move(state_dir)) {}
  Status writeAttachment() const;

  std::shared_ptr<NetworkPool> pool_;
  Slot slot_;
  std::string state_dir_;
  std::string gateway_resolver_;  // what its gateway was given (--upstream-dns), recorded with it
  std::optional<ChildProcess> gateway_;
  bool detached_ = false;
  TapBytes tap_baseline_;
  std::shared_ptr<GuestConnections> guest_connections_ = std::make_shared<GuestConnections>(kMaxGuestConnections);
};

class NetworkPool : public std::enable_shared_from_this<NetworkPool> {
 public:
  static std::shared_ptr<NetworkPool> create(NetworkOptions options);
  ~NetworkPool();

  // Every gateway started from now on runs in a control group of its slot's
  // (<root>/gateways/<slot name> in each hierarchy), joined before it reads its policy or opens a socket, limited by
  // gateway_cpu_percent, gateway_memory_mb and to one task; the group goes with its gateway. An
  // adopted gateway found outside its group (started where there were none) is replaced. Call it
  // once, before adopt() and start(); without it gateways run in spaced's own group.
  Status useCgroups(const jail::CgroupLayout& layout);
  // The group `slot`'s gateway runs in (one of no hierarchy without useCgroups).
  jail::VmCgroup gatewayGroup(const Slot& slot) const;

  // Loads the gateways' egress table in their upstream namespace (replacing an earlier
  // run's; it holds adopted gateways too), removes every slot of our prefix that a previous run
  // left, except those adopt()ed already and those in `keep` (slot names), then makes the
  // spare slots in the background.
  Status start(const std::set<std::string>& keep);
  void stop();

  // A slot and a gateway for a sandbox whose files live in `state_dir` (made if missing).
  // `policy` is written first; nullopt keeps the one in state_dir (a resumed sandbox's), or
  // writes `fallback` where there is none.
  Result<std::unique_ptr<SandboxNetwork>> attach(const std::optional<Policy>& policy, const Policy& fallback,
                                                 const std::string& state_dir);
  // The gateway's directory of a sandbox's state_dir (policy.json and the audit log).
  static std::string gatewayDir(const std::string& state_dir) { return state_dir + "/gw"; }
  // The policy.json in `dir` (nullopt: none written yet); writes it atomically.
  static Result<std::optional<Policy>> readPolicy(const std::string& dir);
  static Status writePolicy(const std::string& dir, const Policy& policy, bool durable = true);
  // The newest `max_bytes` or so of a sandbox's audit log (the rotated file's tail, then the
  // current one), read as the gateway's hostile files.
  static std::string readAudit(const std::string& state_dir, size_t max_bytes);
  // What a previous daemon left running for the sandbox of `state_dir` (attachment.json).
  Result<std::unique_ptr<SandboxNetwork>> adopt(const std::string& state_dir);
  // A bare slot with no gateway, for a VM whose guest never runs user code (a template boot,
  // a snapshot being re-saved); give it back with releaseSlot.
  Result<Slot> takeSlot();
  void releaseSlot(const Slot& slot);

  // Runs `space-gateway --probe-confinement` in `scratch_dir` (made, then removed), as the uid
  // below the gateways' range: a gateway confined as every gateway is, which tries what a
  // compromised one would. Its report
  // (gateway/confinement.h: "landlock_abi", "confined", "checks"), or why there is none.
  Result<nlohmann::json> probeGatewayConfinement(const std::string& scratch_dir) const;

  const NetworkOptions& options() const { return options_; }
  // The resolver gateways are given now (IP:PORT; empty without one): the host's first
  // nameserver, which follows the host's (resolverStale()), or --gateway-upstream-dns.
  std::string gatewayResolver() const;
  // Why these options cannot serve (no resolver, a bad openable range, gateway limits out of
  // range), or empty; start() refuses with it.
  const std::string& configError() const { return config_error_; }
  // Packets the table refused since the pool started, read from it now: 0 on a healthy node
  // (a gateway's own checks refuse first), more where a gateway tried what its policy refuses.
  uint64_t egressRefusedPackets();
  // Whether the host's resolver (resolv_conf's first IPv4 nameserver, at the last egress
  // check) is not the one gateways are given: until a new one has stayed an egress check
  // interval (a file caught while being rewritten is not followed), while the last follow is
  // less than resolver_follow_gap ago, or while the table cannot be loaded with it. Always
  // false with upstream_dns set.
  bool resolverStale() const { return resolver_stale_; }
  // Slots in use and spare, for metrics and tests.
  size_t slotsInUse() const;
  size_t spareSlots() const;

 private:
  friend class SandboxNetwork;
  explicit NetworkPool(NetworkOptions options);
  Result<ChildProcess> spawnGateway(const Slot& slot, const std::string& state_dir, const std::string& resolver);
  std::pair<uid_t, gid_t> gatewayIds(const Slot& slot) const;
  std::string gatewayUser(const Slot& slot) const;
  // Kills what runs as the slot's gateway uid (a gateway is stopped first): what a gateway of
  // an earlier version, which could fork, may have left to signal the next one.
  void killLeftoversOf(const Slot& slot) const;
  // Kills what is left in the group of the slot named `slot_name` (its gateway is stopped) and
  // removes the group.
  void endGatewayGroup(const std::string& slot_name) const;
  jail::CgroupLimits gatewayLimits() const;
  // Loads the gateways' egress table once (start(), or the first gateway spawned before it).
  Status holdGatewayEgress();
  // Loads it again if it is gone or changed (the refill thread: every egress_check_interval,
  // and soon after nftables changed). True if it tried to.
  bool keepGatewayEgress();
  Status loadEgressLocked(const GatewayEgress& table);
  // Adds what the table's counters (`counted`, since its load) say beyond the last reading.
  void countEgressRefusalsLocked(uint64_t counted);
  Result<Slot> newSlot();
  void refillLoop();
  // Wakes the refill thread for a check whenever nftables changes in the upstream namespace.
  void watchEgressLoop(NftablesChanges changes);

  NetworkOptions options_;
  // Made from options_: the table, with the resolver every gateway is given (which follows the
  // host's: checkResolver). Guarded by egress_mu_ once the pool started.
  GatewayEgress egress_;
  std::string config_error_;
  // Where gateways' groups are made (useCgroups: spaced's layout, and its gateways/ group);
  // none: they run in spaced's own.
  std::optional<jail::CgroupLayout> gateway_cgroups_base_;
  std::optional<jail::CgroupLayout> gateway_cgroups_;
  mutable std::mutex egress_mu_;
  // The table as listed after its load (without counter figures); empty: not loaded yet.
  std::string egress_listing_;
  uint64_t egress_counted_ = 0;              // the counters' sum at the last reading
  std::atomic<uint64_t> egress_refused_{0};  // since start, across reloads
  std::atomic<bool> resolver_stale_{false};
  // The refill thread's: a new host resolver seen, since when, and when the last was followed.
  std::string resolver_pending_;
  std::chrono::steady_clock::time_point resolver_pending_since_{};
  std::optional<std::chrono::steady_clock::time_point> resolver_followed_at_;
  bool resolver_wait_said_ = false;
  // egress_.resolver, formatted, for gatewayResolver(): housekeeping asks for each sandbox,
  // and must not wait behind egress_mu_'s nft calls.
  mutable std::mutex resolver_mu_;
  std::string resolver_now_;
  // Reads resolv_conf again (the refill thread, with each egress check); a new resolver that
  // stayed an egress check interval becomes the gateways' (at most once per
  // resolver_follow_gap): the table is loaded with it, and each sandbox's gateway is restarted
  // by housekeeping (SandboxNetwork::gatewayOutdated).
  void checkResolver();
  SlotManager slots_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> used_;       // indices of slots out (sandboxes, bare users)
  std::vector<Slot> spare_;  // made and clean
  bool stopping_ = false;
  bool egress_changed_ = false;  // nftables changed since the last check
  std::thread refill_;
  std::thread watch_egress_;
  UniqueFd stop_watching_;  // an eventfd: written at stop()
};

inline constexpr const char* kPolicyFile = "policy.json";
inline constexpr const char* kAuditFile = "audit.jsonl";
inline constexpr const char* kAttachmentFile = "attachment.json";

}  // namespace space::net
