// What gateways' upstream sockets may reach, held by the kernel as well as by each gateway's own
// policy checks. A gateway decides every connection and DNS answer itself (net::Policy), but a
// gateway compromised by its guest's bytes would decide nothing: it could connect to the
// host's loopback services or a cloud's metadata address, which its upstream namespace (the
// host's own, by default) reaches. So spaced loads one nftables table there whose output chain
// holds every socket of the gateways' uids to what some policy could open: TCP only (and the
// resolver the gateways ask, UDP and TCP at its port), never through the loopback device, to
// no address of the namespace itself, no broadcast or multicast, never the never-reachable
// ranges, forbidden ranges only where the node lets tenants open them, no IPv6. Other
// processes' packets, and packets with no socket behind them, pass untouched.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"
#include "net/policy.h"

namespace space::net {

struct Ipv4Endpoint {
  uint32_t address = 0;  // host byte order
  uint16_t port = 53;
};

// "IP" or "IP:PORT" (port 1-65535; 53 if absent), IPv4 only.
Result<Ipv4Endpoint> parseResolver(std::string_view text);
// The first IPv4 `nameserver` of resolv.conf's text (port 53).
Result<Ipv4Endpoint> resolverOfResolvConf(std::string_view text);
std::string formatEndpoint(const Ipv4Endpoint& endpoint);

struct GatewayEgress {
  // The table's name (nftables inet family; gatewayEgressTableName), replaced whole when loaded.
  std::string table;
  // Sockets of these uids are held; others pass untouched.
  uint32_t first_uid = 0;
  uint32_t last_uid = 0;
  // The gateways' resolver: reachable at its port (UDP and TCP) whatever its range.
  std::optional<Ipv4Endpoint> resolver;
  // Private ranges the node lets tenant allow rules open (NetworkOptions::openable_cidrs).
  std::vector<Ipv4Range> openable;
};

// The table for `egress`, as nftables text: loading it replaces the table of that name.
std::string gatewayEgressRuleset(const GatewayEgress& egress);
// Loads it in the namespace at `netns_path` (empty: the caller's own), in one transaction.
Status loadGatewayEgress(const GatewayEgress& egress, const std::string& netns_path);

struct GatewayEgressListing {
  // The table as loaded there now, without its counters' figures: what a check compares with
  // the listing taken after the load (another program may have removed the table, `nft flush
  // ruleset`, emptied its chains, or loaded its own over it).
  std::string rules;
  // Packets its refusals counted since the load. A gateway's own checks refuse all of it
  // before it dials, so on a healthy node this stays 0: more means a gateway tried what its
  // policy refuses (compromised, or a bug).
  uint64_t refused_packets = 0;
};
Result<GatewayEgressListing> listGatewayEgress(const GatewayEgress& egress, const std::string& netns_path);

// Says when nftables changed in a network namespace, as `nft monitor` hears it: a netlink socket
// of that namespace in the kernel's nftables group. Every change there wakes it (any program's
// table, this one's own loads), so a watcher checks its table then rather than trusting it was
// the table's change.
class NftablesChanges {
 public:
  // Made in the namespace at `netns_path` (empty: the caller's own). Needs CAP_NET_ADMIN.
  static Result<NftablesChanges> open(const std::string& netns_path);
  // Readable (poll) when changes came.
  int fd() const { return socket_.get(); }
  // Reads what came without waiting: kChanged if anything did, or if notices were lost (the
  // socket's queue overflowed: a change too, after which it listens on); kFailed if the socket
  // cannot be read (errno set).
  enum class Drained { kNothing, kChanged, kFailed };
  Drained drain();

 private:
  explicit NftablesChanges(UniqueFd socket) : socket_(std::move(socket)) {}
  UniqueFd socket_;
};

// The table for the uid range starting at `first_uid`: one per range, since every table holds
// the range's sockets (a second table would refuse what the first opens), so a daemon's load
// replaces what an earlier one with the same gateway uids left, whatever its data dir.
std::string gatewayEgressTableName(uint32_t first_uid);

}  // namespace space::net
