// The one network every guest sees. Each sandbox's slot (its own network namespace) holds the
// same addresses and MACs, so clones of one snapshot need no renumbering: a resumed or branched
// sandbox may land in any slot.
#pragma once

#include <cstdint>

namespace space::net {

// 169.254.0.0/30: the guest (.2) and the gateway end of its tap (.1). Link-local, so no guest
// software mistakes it for a routable network.
inline constexpr const char* kGuestIp = "169.254.0.2";
inline constexpr const char* kGatewayIp = "169.254.0.1";
inline constexpr int kPrefixLength = 30;
inline constexpr const char* kGuestMac = "02:53:50:00:00:02";
inline constexpr const char* kTapMac = "02:53:50:00:00:01";
inline constexpr const char* kTapName = "tap0";
// The guest MTU; the tap's is the same.
inline constexpr int kMtu = 1500;

// The gateway's listeners inside the slot, on kGatewayIp. nftables redirects every guest TCP
// connection to kGatewayTcpPort and every DNS query (UDP and TCP 53) to kGatewayDnsPort.
inline constexpr uint16_t kGatewayTcpPort = 15001;
inline constexpr uint16_t kGatewayDnsPort = 15053;
// Conntrack entries a guest's own traffic may hold at once (every flow it starts: TCP, DNS and
// what is dropped later). The host's table is shared by every slot (nf_conntrack_max, 262144 on
// a 24 GiB host), so one guest must not fill it; a busy guest's TCP connections in TIME_WAIT
// (2 minutes each) fit many times over. Past it the guest's new flows are dropped.
inline constexpr int kMaxGuestFlows = 4096;

}  // namespace space::net
