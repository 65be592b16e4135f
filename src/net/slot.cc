// Slots built with raw syscalls, rtnetlink/ctnetlink through libmnl and libnftables: no `ip` or
// `nft` process per slot, so a slot costs milliseconds and its failures come back as errors with
// the kernel's reason instead of a child's stderr.
#include "net/slot.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if_tun.h>
#include <linux/neighbour.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <nftables/libnftables.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "common/fs.h"
#include "common/unix_socket.h"
#include "net/addressing.h"

namespace space::net {

namespace {

constexpr const char* kDefaultNetnsDir = "/run/space/netns";

Error sysError(const std::string& what, int err = errno) {
  return makeError(ErrorCode::kInternal, what + ": " + strerror(err));
}

// Namespace membership (unshare, setns) is per thread, so every operation inside a slot runs on
// a thread of its own that dies with the membership: no thread of the process is ever left in
// the wrong namespace.
Status onFreshThread(const std::function<Status()>& fn) {
  Status result = okStatus();
  try {
    std::thread t([&] { result = fn(); });
    t.join();
  } catch (const std::system_error& e) {
    return makeError(ErrorCode::kResourceExhausted, std::string("start namespace thread: ") + e.what());
  }
  return result;
}

// Writes a sysctl of the calling thread's namespace: /proc/sys/net resolves against the netns of
// the task that looks it up (unlike /proc/net, which follows the thread group leader).
Status writeSysctl(const char* name, const char* value) {
  std::string relative = name;
  std::replace(relative.begin(), relative.end(), '.', '/');
  const std::string path = "/proc/sys/" + relative;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return sysError(std::string("open sysctl ") + name);
  size_t len = strlen(value);
  if (::write(fd.get(), value, len) != static_cast<ssize_t>(len)) return sysError(std::string("set sysctl ") + name);
  return okStatus();
}

// One netlink socket (rtnetlink or nfnetlink) of the calling thread's namespace: a socket keeps
// the namespace it was created in.
class Netlink {
 public:
  static Result<Netlink> open(int bus) {
    mnl_socket* nl = mnl_socket_open2(bus, SOCK_CLOEXEC);
    if (nl == nullptr) return sysError("open netlink socket");
    Netlink n(nl);
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) return sysError("bind netlink socket");
    n.portid_ = mnl_socket_get_portid(nl);
    return n;
  }
  Netlink(Netlink&& o) noexcept
      : nl_(std::exchange(o.nl_, nullptr)), portid_(o.portid_), seq_(o.seq_), buf_(std::move(o.buf_)) {}
  Netlink& operator=(Netlink&&) = delete;
  ~Netlink() {
    if (nl_ != nullptr) mnl_socket_close(nl_);
  }

  // A fresh message in the socket's buffer.
  nlmsghdr* message(uint16_t type, uint16_t flags) {
    nlmsghdr* nlh = mnl_nlmsg_put_header(buf_.data());
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | flags;
    nlh->nlmsg_seq = ++seq_;
    return nlh;
  }

  // Sends `nlh` and runs `cb` on every answer until the kernel's ack (or NLMSG_DONE of a dump).
  // Returns the kernel's errno as the error; lastErrno() keeps it for callers that tolerate some.
  Status request(nlmsghdr* nlh, const std::string& what, mnl_cb_t cb = nullptr, void* data = nullptr) {
    last_errno_ = 0;
    if ((nlh->nlmsg_flags & NLM_F_DUMP) != NLM_F_DUMP) nlh->nlmsg_flags |= NLM_F_ACK;
    if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) return fail(what + " (send)");
    const unsigned seq = nlh->nlmsg_seq;
    for (;;) {
      ssize_t n = mnl_socket_recvfrom(nl_, buf_.data(), buf_.size());
      if (n < 0) return fail(what + " (receive)");
      int rc = mnl_cb_run(buf_.data(), static_cast<size_t>(n), seq, portid_, cb, data);
      if (rc == MNL_CB_ERROR) return fail(what);
      if (rc == MNL_CB_STOP) return okStatus();
    }
  }
  int lastErrno() const { return last_errno_; }

 private:
  explicit Netlink(mnl_socket* nl) : nl_(nl), buf_(kBufferSize) {}
  Error fail(const std::string& what) {
    last_errno_ = errno;
    return sysError(what, last_errno_);
  }
  // Large enough for a dump's multi-part answers (libmnl's MNL_SOCKET_DUMP_SIZE).
  static constexpr size_t kBufferSize = 32768;
  mnl_socket* nl_;
  unsigned portid_ = 0;
  unsigned seq_ = 0;
  int last_errno_ = 0;
  std::vector<char> buf_;
};

Status setLink(Netlink& nl, int ifindex, const std::string& what, const uint8_t* mac, int mtu) {
  nlmsghdr* nlh = nl.message(RTM_NEWLINK, 0);
  auto* ifm = static_cast<ifinfomsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
  ifm->ifi_family = AF_UNSPEC;
  ifm->ifi_index = ifindex;
  ifm->ifi_flags = IFF_UP;
  ifm->ifi_change = IFF_UP;
  if (mac != nullptr) mnl_attr_put(nlh, IFLA_ADDRESS, 6, mac);
  if (mtu > 0) mnl_attr_put_u32(nlh, IFLA_MTU, static_cast<uint32_t>(mtu));
  return nl.request(nlh, what);
}

Status addAddress(Netlink& nl, int ifindex) {
  in_addr addr{};
  if (inet_pton(AF_INET, kGatewayIp, &addr) != 1) return makeError(ErrorCode::kInternal, "bad kGatewayIp");
  nlmsghdr* nlh = nl.message(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = kPrefixLength;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = static_cast<unsigned>(ifindex);
  mnl_attr_put(nlh, IFA_LOCAL, sizeof(addr), &addr);
  mnl_attr_put(nlh, IFA_ADDRESS, sizeof(addr), &addr);
  return nl.request(nlh, std::string("add address ") + kGatewayIp + " to " + kTapName);
}

// Creates the persistent tap (or attaches to it), owned by uid 0. spaced attaches to it for each
// VM and hands QEMU the descriptor (vmm::Vm), so no QEMU needs a right to attach; the owner is
// for QEMUs an older spaced started, which opened the tap by name as uid 0 without
// capabilities. IFF_VNET_HDR here is only the initial state: whoever attaches sets its own
// flags, and QEMU, handed a descriptor, probes vnet_hdr support from them.
Status createTap() {
  UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return sysError("open /dev/net/tun");
  ifreq ifr{};
  strncpy(ifr.ifr_name, kTapName, IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
  if (ioctl(fd.get(), TUNSETIFF, &ifr) != 0) return sysError(std::string("create tap ") + kTapName);
  if (ioctl(fd.get(), TUNSETOWNER, 0) != 0) return sysError(std::string("give tap ") + kTapName + " an owner");
  if (ioctl(fd.get(), TUNSETPERSIST, 1) != 0) return sysError(std::string("make tap persistent ") + kTapName);
  return okStatus();
}

Result<int> tapIndex() {
  unsigned index = if_nametoindex(kTapName);
  if (index == 0) return sysError(std::string("find ") + kTapName);
  return static_cast<int>(index);
}

// libnftables is not documented as thread-safe (its symbol tables and bignum setup are global),
// so all uses in this process take turns. Also guards canonical_ruleset.
std::mutex nft_mutex;
// `nft list ruleset` of a slot holding exactly rulesetText(), as this kernel and libnftables print
// it; learnt in the first create() of this process, while the new namespace is still reachable
// from its creating thread only, so nobody can have changed it (all slots hold the same text). Lets scrub skip
// reloading rules that nobody changed, which matters: a transaction that deletes objects makes the close of its netlink
// socket wait for an RCU grace period (about 10 ms), several times the rest of a scrub.
std::string canonical_ruleset;

// Runs `text` as one nft transaction (all of it or nothing); returns what it printed.
Result<std::string> runNftLocked(const std::string& text) {
  // The context (and its netlink socket) belongs to the calling thread's namespace.
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return makeError(ErrorCode::kInternal, "nft_ctx_new failed");
  nft_ctx_buffer_output(ctx);
  nft_ctx_buffer_error(ctx);
  int rc = nft_run_cmd_from_buffer(ctx, text.c_str());
  std::string out = nft_ctx_get_output_buffer(ctx);
  std::string err = nft_ctx_get_error_buffer(ctx);
  nft_ctx_free(ctx);
  if (rc != 0) return makeError(ErrorCode::kInternal, "nftables: " + err);
  return out;
}

Status loadRuleset() {
  std::lock_guard lock(nft_mutex);
  auto out = runNftLocked(SlotManager::rulesetText());
  if (!out.ok()) return out.error();
  if (canonical_ruleset.empty()) {
    auto listed = runNftLocked("list ruleset");
    if (listed.ok()) canonical_ruleset = *listed;
  }
  return okStatus();
}

// Puts the slot's rules back as create() left them, unless they already are.
Status restoreRuleset() {
  std::lock_guard lock(nft_mutex);
  if (!canonical_ruleset.empty()) {
    auto listed = runNftLocked("list ruleset");
    if (listed.ok() && *listed == canonical_ruleset) return okStatus();
  }
  // "flush ruleset" and the table in one buffer: one transaction, never a slot without rules.
  auto loaded = runNftLocked("flush ruleset\n" + SlotManager::rulesetText());
  if (!loaded.ok()) return loaded.error();
  return okStatus();
}

// The slot's tap as the guest expects it: persistent, owned, our MAC and MTU, the gateway's
// address, up. In the calling thread's namespace, which must not have one.
Status makeTap(Netlink& nl) {
  SPACE_TRY(createTap());
  auto index = tapIndex();
  if (!index.ok()) return index.error();
  uint8_t mac[6];
  if (sscanf(kTapMac, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1], &mac[2], &mac[3], &mac[4], &mac[5]) != 6) {
    return makeError(ErrorCode::kInternal, "bad kTapMac");
  }
  SPACE_TRY(setLink(nl, *index, std::string("configure ") + kTapName, mac, kMtu));
  return addAddress(nl, *index);
}

// Everything create() does inside the fresh namespace, in an order where a failure needs no undo:
// the namespace dies with the thread unless the final bind mount succeeded.
Status configureNamespace(const std::string& path) {
  if (unshare(CLONE_NEWNET) != 0) return sysError("unshare(CLONE_NEWNET)");
  // A new netns copies the host's IPv4 "all"/"default" settings (net.core.devconf_inherit_init_net
  // = 0), so forwarding is off only if we say so. IPv6 is off before any interface exists, so no
  // link-local address is ever configured. Strict reverse-path filtering drops guest packets with
  // a source the slot would not route back to the tap (spoofed addresses never reach a listener).
  SPACE_TRY(writeSysctl("net.ipv6.conf.all.disable_ipv6", "1"));
  SPACE_TRY(writeSysctl("net.ipv6.conf.default.disable_ipv6", "1"));
  SPACE_TRY(writeSysctl("net.ipv4.ip_forward", "0"));
  SPACE_TRY(writeSysctl("net.ipv4.conf.all.rp_filter", "1"));
  SPACE_TRY(writeSysctl("net.ipv4.conf.default.rp_filter", "1"));

  auto nl = Netlink::open(NETLINK_ROUTE);
  if (!nl.ok()) return nl.error();
  // lo is ifindex 1 in every namespace (LOOPBACK_IFINDEX).
  SPACE_TRY(setLink(*nl, 1, "set lo up", nullptr, 0));

  SPACE_TRY(makeTap(*nl));

  SPACE_TRY(loadRuleset());
  // Mid-stream TCP packets of a flow conntrack does not know (one scrubbed away when the slot
  // passed to another sandbox) stay invalid instead of being picked up as a new flow, which the
  // rules would then judge by direction. The knob exists once the ruleset loaded conntrack.
  SPACE_TRY(writeSysctl("net.netfilter.nf_conntrack_tcp_loose", "0"));

  // Last: from here on the namespace outlives this thread.
  if (mount("/proc/thread-self/ns/net", path.c_str(), "none", MS_BIND, nullptr) != 0) {
    return sysError("bind-mount namespace at " + path);
  }
  return okStatus();
}

// Deletes every conntrack entry of the calling thread's namespace: IPCTNL_MSG_CT_DELETE without a
// tuple is ctnetlink's flush (AF_UNSPEC: every family).
Status flushConntrack() {
  auto nl = Netlink::open(NETLINK_NETFILTER);
  if (!nl.ok()) return nl.error();
  nlmsghdr* nlh = nl->message((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE, 0);
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = AF_UNSPEC;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  return nl->request(nlh, "flush conntrack");
}

struct Neighbour {
  uint8_t family;
  std::vector<uint8_t> dst;
};

struct NeighbourDump {
  int ifindex;
  std::vector<Neighbour> found;
};

int collectNeighbour(const nlmsghdr* nlh, void* data) {
  auto* dump = static_cast<NeighbourDump*>(data);
  if (nlh->nlmsg_type != RTM_NEWNEIGH || mnl_nlmsg_get_payload_len(nlh) < sizeof(ndmsg)) return MNL_CB_OK;
  const auto* ndm = static_cast<const ndmsg*>(mnl_nlmsg_get_payload(nlh));
  if (ndm->ndm_ifindex != dump->ifindex) return MNL_CB_OK;
  const auto* tail = static_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
  for (auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(ndmsg)));
       mnl_attr_ok(attr, static_cast<int>(tail - reinterpret_cast<const char*>(attr))); attr = mnl_attr_next(attr)) {
    if (mnl_attr_get_type(attr) != NDA_DST) continue;
    const auto* p = static_cast<const uint8_t*>(mnl_attr_get_payload(attr));
    dump->found.push_back({ndm->ndm_family, std::vector<uint8_t>(p, p + mnl_attr_get_payload_len(attr))});
  }
  return MNL_CB_OK;
}

// Forgets every neighbour (the previous guest's MAC) learnt on the tap.
Status flushNeighbours() {
  auto index = tapIndex();
  if (!index.ok()) return index.error();
  auto nl = Netlink::open(NETLINK_ROUTE);
  if (!nl.ok()) return nl.error();
  NeighbourDump dump{*index, {}};
  nlmsghdr* nlh = nl->message(RTM_GETNEIGH, NLM_F_DUMP);
  auto* ndm = static_cast<ndmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
  ndm->ndm_family = AF_UNSPEC;
  SPACE_TRY(nl->request(nlh, "list neighbours", collectNeighbour, &dump));
  for (const Neighbour& n : dump.found) {
    nlh = nl->message(RTM_DELNEIGH, 0);
    ndm = static_cast<ndmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
    ndm->ndm_family = n.family;
    ndm->ndm_ifindex = *index;
    mnl_attr_put(nlh, NDA_DST, n.dst.size(), n.dst.data());
    Status st = nl->request(nlh, "delete neighbour");
    if (!st.ok() && nl->lastErrno() != ENOENT) return st;  // ENOENT: it expired meanwhile
  }
  return okStatus();
}

bool allDigits(const std::string& s) {
  return !s.empty() && s.size() <= 9 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

SlotManager::SlotManager(std::string prefix, std::string netns_dir)
    : prefix_(std::move(prefix)), netns_dir_(netns_dir.empty() ? kDefaultNetnsDir : std::move(netns_dir)) {}

Slot SlotManager::slotAt(int index) const {
  Slot s;
  s.index = index;
  s.name = prefix_ + "-" + std::to_string(index);
  s.netns_path = netns_dir_ + "/" + s.name;
  return s;
}

Result<Slot> SlotManager::create(int index) {
  if (index < 0) return makeError(ErrorCode::kInvalidArgument, "slot index " + std::to_string(index));
  // The bind mounts need no special propagation, so netns_dir need not be a mount point: a bind
  // mount of an nsfs file works on any mount and umount2 undoes it. Where /run is a shared mount
  // (systemd), mount and unmount propagate alike to peer and slave mount namespaces. A private
  // copy of the mount table made later by someone else (unshare -m; `ip netns exec` on a host
  // whose / is private, which is why iproute2 makes /run/netns a shared mount of its own) keeps
  // the namespaces it copied alive until it ends: a delay, never a leak past its life.
  std::error_code ec;
  std::filesystem::create_directories(netns_dir_, ec);
  if (ec) return makeError(ErrorCode::kInternal, "create " + netns_dir_ + ": " + ec.message());
  chmod(netns_dir_.c_str(), 0700);

  Slot slot = slotAt(index);
  // O_EXCL claims the name: two creates of one index cannot both proceed, and an existing slot
  // (mounted or a leftover) is never touched.
  UniqueFd claim(::open(slot.netns_path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0));
  if (!claim.valid()) {
    if (errno == EEXIST) return makeError(ErrorCode::kAlreadyExists, "slot " + slot.name + " exists");
    return sysError("create " + slot.netns_path);
  }
  claim.reset();
  Status st = onFreshThread([&] { return configureNamespace(slot.netns_path); });
  if (!st.ok()) {
    unlink(slot.netns_path.c_str());
    Error e = st.error();
    e.message = "create slot " + slot.name + ": " + e.message;
    return e;
  }
  return slot;
}

Status SlotManager::destroy(const Slot& slot) {
  // MNT_DETACH: a process that has the file open (about to setns) must not make this fail.
  // EINVAL: not mounted (a create that died between its claim and its mount).
  if (umount2(slot.netns_path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
    return sysError("unmount " + slot.netns_path);
  }
  if (unlink(slot.netns_path.c_str()) != 0 && errno != ENOENT) return sysError("remove " + slot.netns_path);
  return okStatus();
}

Status SlotManager::scrub(const Slot& slot) {
  Status st = runInNetns(slot.netns_path, []() -> Status {
    // Rules first, so no connection is admitted under the old ones after conntrack forgets.
    SPACE_TRY(restoreRuleset());
    SPACE_TRY(flushConntrack());
    // The QEMU that held the tap may have made it non-persistent (TUNSETPERSIST needs no
    // capability from the tap's owner), and it went with that QEMU (and its neighbours with it):
    // the slot gets its tap back as create() made it, not the bare one the next attach would make.
    if (!tapIndex().ok()) {
      auto nl = Netlink::open(NETLINK_ROUTE);
      if (!nl.ok()) return nl.error();
      return makeTap(*nl);
    }
    SPACE_TRY(flushNeighbours());
    // A slot made by an older daemon has a tap with no owner, which the next QEMU (jailed: no
    // capabilities) could not attach to: given one here, best effort. A tap someone holds now
    // is left as it is (EBUSY), and a QEMU that then cannot attach says so.
    (void)createTap();
    return okStatus();
  });
  if (!st.ok()) {
    Error e = st.error();
    e.message = "scrub slot " + slot.name + ": " + e.message;
    return e;
  }
  return okStatus();
}

std::vector<Slot> SlotManager::existing() const {
  std::vector<Slot> out;
  DIR* dir = opendir(netns_dir_.c_str());
  if (dir == nullptr) return out;
  const std::string lead = prefix_ + "-";
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name.size() <= lead.size() || name.compare(0, lead.size(), lead) != 0) continue;
    std::string digits = name.substr(lead.size());
    if (!allDigits(digits)) continue;
    Slot s = slotAt(std::stoi(digits));
    if (s.name != name) continue;  // "space-007": not a name create() makes
    out.push_back(std::move(s));
  }
  closedir(dir);
  std::sort(out.begin(), out.end(), [](const Slot& a, const Slot& b) { return a.index < b.index; });
  return out;
}

Result<std::string> runNft(const std::string& text) {
  std::lock_guard lock(nft_mutex);
  return runNftLocked(text);
}

Status runInNetns(const std::string& netns_path, const std::function<Status()>& fn) {
  return onFreshThread([&]() -> Status {
    UniqueFd fd(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) return makeError(ErrorCode::kNotFound, "no namespace at " + netns_path);
      return sysError("open " + netns_path);
    }
    if (setns(fd.get(), CLONE_NEWNET) != 0) return sysError("enter namespace " + netns_path);
    return fn();
  });
}

Result<TapBytes> tapBytesFromNetDev(const std::string& net_dev, const std::string& tap) {
  // Two header lines, then "<name>: rx_bytes rx_packets errs drop fifo frame compressed
  // multicast tx_bytes ..." per interface (the kernel's dev_seq_show). Names are the host's
  // (the slot's own tap and lo): nothing the guest writes reaches this text.
  std::istringstream lines(net_dev);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t name_at = line.find_first_not_of(' ');
    if (name_at >= colon || line.substr(name_at, colon - name_at) != tap) continue;
    std::istringstream fields(line.substr(colon + 1));
    uint64_t values[9] = {};
    for (auto& v : values) {
      std::string field;
      if (!(fields >> field) || field.size() > 20 || field.find_first_not_of("0123456789") != std::string::npos) {
        return makeError(ErrorCode::kInternal, "unreadable net/dev line for " + tap);
      }
      errno = 0;
      v = std::strtoull(field.c_str(), nullptr, 10);
      if (errno == ERANGE) return makeError(ErrorCode::kInternal, "unreadable net/dev line for " + tap);
    }
    return TapBytes{/*guest_sent=*/values[0], /*guest_received=*/values[8]};
  }
  return makeError(ErrorCode::kNotFound, "no interface " + tap + " in net/dev");
}

Result<TapBytes> readTapBytes(pid_t pid) {
  auto text = readSmallFile("/proc/" + std::to_string(pid) + "/net/dev", 64 * 1024);
  if (!text.ok()) return text.error();
  return tapBytesFromNetDev(text.value(), kTapName);
}

Result<TapBytes> readTapBytes(const Slot& slot) {
  TapBytes bytes;
  // thread-self, not self: setns moved this thread only.
  SPACE_TRY(runInNetns(slot.netns_path, [&]() -> Status {
    auto text = readSmallFile("/proc/thread-self/net/dev", 64 * 1024);
    if (!text.ok()) return text.error();
    auto read = tapBytesFromNetDev(text.value(), kTapName);
    if (!read.ok()) return read.error();
    bytes = read.value();
    return okStatus();
  }));
  return bytes;
}

}  // namespace space::net
