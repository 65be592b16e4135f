// The nftables ruleset of every slot. Kept apart from slot.cc so the gateway's tests load the
// very text the product loads.
#include <string>

#include "net/addressing.h"
#include "net/slot.h"

namespace space::net {

std::string SlotManager::rulesetText() {
  const std::string tap = kTapName;
  const std::string gw = kGatewayIp;
  const std::string guest = kGuestIp;
  const std::string tcp = std::to_string(kGatewayTcpPort);
  const std::string dns = std::to_string(kGatewayDnsPort);
  // Only IPv4 from the tap is ever accepted, and only after a redirect to one of the gateway's
  // listeners (`ct status dnat`), so a packet the guest aims straight at the gateway's address
  // reaches nothing else. Nothing is forwarded: the slot has no route out, and the gateway's
  // upstream sockets live in another namespace. IPv6 of every form falls to the drop policies.
  //
  // Ingress (preview URLs) is the one exception, and it goes the other way: spaced connects
  // from the slot's side of the tap to a port of the guest. Only connections opened from the
  // slot pass (`ct direction` of a flow the slot started); the guest answers them but can
  // open nothing toward the slot that is not redirected to the gateway.
  return "table inet space_slot {\n"
         // Before conntrack confirms a flow (mangle priority): a flow over the cap is dropped
         // while it is still unconfirmed, so it never takes a place in the host's table.
         "  chain flows {\n"
         "    type filter hook prerouting priority mangle; policy accept;\n"
         "    iifname \"" +
         tap + "\" ct state new ct count over " + std::to_string(kMaxGuestFlows) +
         " drop\n"
         "  }\n"
         "  chain prerouting {\n"
         "    type nat hook prerouting priority dstnat; policy accept;\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 udp dport 53 redirect to :" + dns +
         "\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 tcp dport 53 redirect to :" + dns +
         "\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 meta l4proto tcp redirect to :" + tcp +
         "\n"
         "  }\n"
         "  chain input {\n"
         "    type filter hook input priority filter; policy drop;\n"
         "    iifname \"lo\" accept\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 ip daddr " + gw + " tcp dport { " + tcp + ", " + dns +
         " } ct status dnat accept\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 ip daddr " + gw + " udp dport " + dns +
         " ct status dnat accept\n"
         "    iifname \"" +
         tap + "\" meta nfproto ipv4 ip saddr " + guest + " ip daddr " + gw +
         " meta l4proto tcp ct direction reply accept\n"
         "  }\n"
         "  chain forward {\n"
         "    type filter hook forward priority filter; policy drop;\n"
         "  }\n"
         "  chain output {\n"
         "    type filter hook output priority filter; policy drop;\n"
         "    oifname \"lo\" accept\n"
         "    oifname \"" +
         tap + "\" meta nfproto ipv4 ip saddr " + gw +
         " ct status dnat accept\n"
         "    oifname \"" +
         tap + "\" meta nfproto ipv4 ip saddr " + gw + " ip daddr " + guest +
         " meta l4proto tcp ct direction original accept\n"
         "  }\n"
         "}\n";
}

}  // namespace space::net
