#include "net/gateway_egress.h"

#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <span>

#include "net/slot.h"

namespace space::net {

Result<Ipv4Endpoint> parseResolver(std::string_view text) {
  Ipv4Endpoint endpoint;
  std::string_view host = text;
  if (const size_t colon = text.find(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    const std::string_view digits = text.substr(colon + 1);
    const bool decimal =
        !digits.empty() && digits.size() <= 5 && digits.find_first_not_of("0123456789") == std::string_view::npos;
    const unsigned long port = decimal ? std::stoul(std::string(digits)) : 0;
    if (port == 0 || port > 65535) {
      return makeError(ErrorCode::kInvalidArgument, "bad port in \"" + std::string(text) + "\"");
    }
    endpoint.port = static_cast<uint16_t>(port);
  }
  auto ip = parseIpv4(host);
  if (!ip) return makeError(ErrorCode::kInvalidArgument, "not an IPv4 address: \"" + std::string(host) + "\"");
  endpoint.address = *ip;
  return endpoint;
}

Result<Ipv4Endpoint> resolverOfResolvConf(std::string_view text) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    auto word = [&line]() {
      const size_t start = line.find_first_not_of(" \t");
      if (start == std::string_view::npos) return std::string_view();
      line.remove_prefix(start);
      const size_t stop = std::min(line.find_first_of(" \t"), line.size());
      std::string_view taken = line.substr(0, stop);
      line.remove_prefix(stop);
      return taken;
    };
    if (word() != "nameserver") continue;
    if (auto ip = parseIpv4(word())) return Ipv4Endpoint{*ip, 53};
  }
  return makeError(ErrorCode::kFailedPrecondition, "no IPv4 nameserver in /etc/resolv.conf");
}

std::string formatEndpoint(const Ipv4Endpoint& endpoint) {
  return formatIpv4(endpoint.address) + ":" + std::to_string(endpoint.port);
}

std::string gatewayEgressTableName(uint32_t first_uid) { return "space_gateways_" + std::to_string(first_uid); }

std::string gatewayEgressRuleset(const GatewayEgress& egress) {
  auto set = [](std::span<const Ipv4Range> ranges) {
    std::string text;
    for (const Ipv4Range& range : ranges) text += (text.empty() ? "" : ", ") + formatCidr(range);
    return "{ " + text + " }";
  };
  const std::string refuse = " counter jump refuse\n";
  const std::string table = "table inet " + egress.table;
  std::string text = table + " {}\ndelete " + table + "\n" + table +
                     " {\n"
                     // A refused connect fails at once (a reset: ECONNREFUSED), which the
                     // gateway's log then names, rather than waiting out a timeout; anything
                     // else's send fails (EPERM).
                     "  chain refuse {\n"
                     "    meta l4proto tcp reject with tcp reset\n"
                     "    drop\n"
                     "  }\n"
                     // Entered on a positive match only: a packet with no socket file to read a
                     // uid from (the kernel's own: ICMP errors, neighbour discovery, a closed
                     // socket's last segments) is nobody's to hold here.
                     "  chain output {\n"
                     "    type filter hook output priority filter; policy accept;\n"
                     "    meta skuid " +
                     std::to_string(egress.first_uid) + "-" + std::to_string(egress.last_uid) +
                     " jump gateway\n"
                     "  }\n"
                     "  chain gateway {\n"
                     // The reset a refusal sends carries the refused socket's uid and goes to
                     // its own (local) address: it must pass. A gateway's sockets can reset only
                     // their own connections (no raw sockets without CAP_NET_RAW).
                     "    tcp flags & rst == rst fib daddr type local accept\n"
                     // A socket bound to the loopback device (SO_BINDTODEVICE, IP_UNICAST_IF,
                     // unprivileged) sends an address that is not the host's through it, and the
                     // kernel then delivers it to the host's own listeners: refused before the
                     // resolver's exception, whose address may be anywhere (review helper-75).
                     "    oifname \"lo\" fib daddr type != local" +
                     refuse +
                     // IP options (record route; source routing, where a kernel lets an
                     // unprivileged socket set it, names the real destination past this check):
                     // a gateway sets none.
                     "    ip hdrlength != 5" + refuse +
                     // Gateways make IPv4 sockets only (their seccomp filter); anything else is a
                     // compromised one's.
                     "    meta nfproto != ipv4" + refuse;
  if (egress.resolver) {
    const std::string to = "    ip daddr " + formatIpv4(egress.resolver->address);
    const std::string port = std::to_string(egress.resolver->port);
    text += to + " udp dport " + port + " accept\n" + to + " tcp dport " + port + " accept\n";
  }
  // A gateway relays TCP; its only datagrams are questions to the resolver. No UDP services,
  // no ICMP (ping sockets, where the host's ping_group_range allows them).
  text += "    meta l4proto != tcp" + refuse;
  // What leaves through the loopback device now is for the host's own addresses.
  text += "    oifname \"lo\"" + refuse;
  // The namespace's own addresses (the host's, by default: its services listen there too, and
  // an openable range may hold one; they leave through lo as well, so the rule above refuses
  // them first), broadcast (the host's subnets' directed broadcasts), multicast: by address,
  // before any range is opened.
  text += "    fib daddr type != unicast" + refuse;
  text += "    ip daddr " + set(neverReachableRanges()) + refuse;
  for (const Ipv4Range& range : egress.openable) text += "    ip daddr " + formatCidr(range) + " accept\n";
  text += "    ip daddr " + set(forbiddenRanges()) + refuse;
  text += "  }\n}\n";
  return text;
}

Result<GatewayEgressListing> listGatewayEgress(const GatewayEgress& egress, const std::string& netns_path) {
  std::string listing;
  auto list = [&]() -> Status {
    auto listed = runNft("list table inet " + egress.table);
    if (!listed.ok()) return listed.error();
    listing = std::move(listed.value());
    return okStatus();
  };
  SPACE_TRY(netns_path.empty() ? list() : runInNetns(netns_path, list));
  // "counter packets N bytes M": every counter is a refusal's; the rules are the rest.
  static constexpr std::string_view kCounter = "counter packets ";
  GatewayEgressListing out;
  size_t from = 0;
  for (size_t at = listing.find(kCounter); at != std::string::npos; at = listing.find(kCounter, from)) {
    out.rules.append(listing, from, at - from);
    out.rules += "counter";
    const size_t packets = at + kCounter.size();
    const size_t bytes = listing.find(" bytes ", packets);
    const std::string digits = listing.substr(packets, bytes == std::string::npos ? 0 : bytes - packets);
    if (digits.empty() || digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos) {
      return makeError(ErrorCode::kInternal, "unreadable counter in: " + listing);
    }
    out.refused_packets += std::stoull(digits);
    from = listing.find_first_not_of("0123456789", bytes + 7);
    if (from == std::string::npos) from = listing.size();
  }
  out.rules.append(listing, from, std::string::npos);
  return out;
}

Status loadGatewayEgress(const GatewayEgress& egress, const std::string& netns_path) {
  const std::string text = gatewayEgressRuleset(egress);
  auto load = [&text]() -> Status {
    auto done = runNft(text);
    if (!done.ok()) return done.error();
    return okStatus();
  };
  return netns_path.empty() ? load() : runInNetns(netns_path, load);
}

Result<NftablesChanges> NftablesChanges::open(const std::string& netns_path) {
  UniqueFd made;
  auto make = [&]() -> Status {
    // Three system calls, and the messages are dropped unread: nothing of libmnl (which slot.cc
    // uses to build and parse messages) would be used here.
    made = UniqueFd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_NETFILTER));
    if (!made.valid())
      return makeError(ErrorCode::kInternal, std::string("netfilter netlink socket: ") + strerror(errno));
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    if (::bind(made.get(), reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) {
      return makeError(ErrorCode::kInternal, std::string("bind netfilter netlink socket: ") + strerror(errno));
    }
    // Room for a large ruleset's notices at once (a firewall's reload); past it they are lost,
    // which counts as a change all the same.
    const int room = 4 << 20;
    (void)::setsockopt(made.get(), SOL_SOCKET, SO_RCVBUFFORCE, &room, sizeof room);
    const int group = NFNLGRP_NFTABLES;
    if (::setsockopt(made.get(), SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof group) != 0) {
      return makeError(ErrorCode::kInternal, std::string("join the nftables group: ") + strerror(errno));
    }
    return okStatus();
  };
  SPACE_TRY(netns_path.empty() ? make() : runInNetns(netns_path, make));
  return NftablesChanges(std::move(made));
}

NftablesChanges::Drained NftablesChanges::drain() {
  // Only that something came matters, not what: each message is read and dropped.
  Drained drained = Drained::kNothing;
  char buffer[8192];
  while (true) {
    const ssize_t n = ::recv(socket_.get(), buffer, sizeof buffer, 0);
    if (n >= 0) {  // an empty message (netlink sends none) is a message too, not the end of a stream
      drained = Drained::kChanged;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == ENOBUFS) {
      drained = Drained::kChanged;  // notices lost (reading the error cleared it): something changed
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return drained;  // nothing more for now
    } else {
      return Drained::kFailed;
    }
  }
}

}  // namespace space::net
