// Slots: one network namespace per sandbox, holding the VM's tap, the gateway's guest-side
// listeners and the nftables rules that send every guest packet to them or drop it. Built with
// netlink (libmnl) and libnftables, never by spawning `ip` or `nft`.
//
// A slot's namespace is bind-mounted at <netns_dir>/<prefix>-<index>, so a restarted spaced
// finds (and reclaims) the ones a previous run left.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::net {

struct Slot {
  int index = -1;
  std::string name;        // "<prefix>-<index>"
  std::string netns_path;  // the bind mount; setns(2) on it enters the slot
};

class SlotManager {
 public:
  // `prefix` names this node's slots (e.g. "space"); `netns_dir` holds the bind mounts
  // (default /run/space/netns, created 0700).
  SlotManager(std::string prefix, std::string netns_dir);

  // A fresh namespace: lo up; tap kTapName (persistent, IFF_TAP|IFF_NO_PI|IFF_VNET_HDR) with
  // kTapMac, kGatewayIp/kPrefixLength, MTU kMtu, up; IPv6 disabled; no forwarding; the
  // nftables table of rulesetText() loaded. Fails (leaving nothing behind) if the slot exists.
  Result<Slot> create(int index);
  // Removes the namespace (and with it tap, rules, sockets) and its bind mount. Idempotent.
  Status destroy(const Slot& slot);
  // Makes a used slot as new: flushes conntrack state and neighbour entries, reloads the
  // rules. Cheaper than destroy + create.
  Status scrub(const Slot& slot);
  // Every slot of this prefix that exists on the host (bind mounts in netns_dir).
  std::vector<Slot> existing() const;
  Slot slotAt(int index) const;

  // The nftables ruleset loaded in every slot (one table, inet family): guest TCP redirected
  // to kGatewayTcpPort, guest UDP/TCP 53 to kGatewayDnsPort; everything else from the tap
  // dropped (IPv6, other UDP, ICMP, other protocols, the slot's other addresses); nothing
  // forwarded; the gateway's outbound traffic from inside the slot dropped as well.
  static std::string rulesetText();

 private:
  std::string prefix_;
  std::string netns_dir_;
};

// Runs `fn` on a short-lived thread that has entered the namespace at `netns_path` (setns
// changes only the calling thread), and returns its result.
Status runInNetns(const std::string& netns_path, const std::function<Status()>& fn);

// Runs `text` as one nftables transaction (all of it or nothing) in the calling thread's
// namespace; what it printed. Every use of libnftables in this process takes turns here.
Result<std::string> runNft(const std::string& text);

// A slot's tap byte counters, as the guest sees them: what the host's tap receives is what the
// guest sent. They count from the tap's creation, and slots are reused (scrubbed), so a
// sandbox's own figures are these minus what they were when it took the slot.
struct TapBytes {
  uint64_t guest_sent = 0;
  uint64_t guest_received = 0;
};
// Parses /proc/<pid>/net/dev's text for interface `tap`.
Result<TapBytes> tapBytesFromNetDev(const std::string& net_dev, const std::string& tap);
// Read through a process in the slot (the sandbox's QEMU): no thread, no setns.
Result<TapBytes> readTapBytes(pid_t pid);
// Read from inside the slot.
Result<TapBytes> readTapBytes(const Slot& slot);

}  // namespace space::net
