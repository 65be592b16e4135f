// The gateways' egress table's pure parts: the resolver it lets through, and the order of its
// rules (the kernel's verdicts on real sockets: GatewayEgressTest in gateway_test.cc).
#include <gtest/gtest.h>

#include "net/gateway_egress.h"

namespace space::net {
namespace {

TEST(GatewayEgress, AResolverIsAnIpv4AddressWithAnOptionalPort) {
  auto plain = parseResolver("192.0.2.53");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(formatEndpoint(plain.value()), "192.0.2.53:53");
  auto ported = parseResolver("127.0.0.1:5353");
  ASSERT_TRUE(ported.ok());
  EXPECT_EQ(formatEndpoint(ported.value()), "127.0.0.1:5353");
  for (const char* bad : {"", "resolver.example", "::1", "[::1]:53", "1.2.3.4:", "1.2.3.4:0", "1.2.3.4:65536",
                          "1.2.3.4:99999999999", "1.2.3.4:5a", "1.2.3.4:-1", "1.2.3:53", " 1.2.3.4"}) {
    EXPECT_FALSE(parseResolver(bad).ok()) << bad;
  }
}

TEST(GatewayEgress, TheHostsResolverIsItsFirstIpv4Nameserver) {
  auto found = resolverOfResolvConf(
      "# nameserver 10.9.9.9\nsearch example\nnameserver fe80::1\n\tnameserver\t10.96.0.10  # cluster\nnameserver "
      "1.1.1.1\n");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(formatEndpoint(found.value()), "10.96.0.10:53");
  EXPECT_FALSE(resolverOfResolvConf("").ok());
  EXPECT_FALSE(resolverOfResolvConf("nameserver ::1\nnameservers 10.0.0.1\n#nameserver 10.0.0.2").ok());
}

TEST(GatewayEgress, TheTableIsNamedForItsUidRange) {
  EXPECT_EQ(gatewayEgressTableName(1499999999), "space_gateways_1499999999");
}

// Order decides: only the gateways' uids enter its rules; the resolver passes after the rules
// that hold it too (a non-local address through loopback, IP options) and before those that
// would refuse it (not TCP, loopback, a local or never-reachable address); the node's openable
// ranges open after everything no range opens and before the forbidden ones.
TEST(GatewayEgress, ItsRulesComeInTheOrderThatMakesThemMean) {
  GatewayEgress egress;
  egress.table = "t";
  egress.first_uid = 1499999999;
  egress.last_uid = 1500065535;
  egress.resolver = Ipv4Endpoint{0x7f000035, 53};  // 127.0.0.53, systemd-resolved's
  egress.openable = {{0x0a000000, 24}};
  const std::string text = gatewayEgressRuleset(egress);
  auto at = [&text](const std::string& part) {
    const size_t found = text.find(part);
    EXPECT_NE(found, std::string::npos) << part << " in\n" << text;
    return found;
  };
  const size_t gateways = at("meta skuid 1499999999-1500065535 jump gateway");
  const size_t chain = at("chain gateway {");
  const size_t not_ours_on_lo = at("oifname \"lo\" fib daddr type != local counter jump refuse");
  const size_t options = at("ip hdrlength != 5 counter jump refuse");
  const size_t resolver = at("ip daddr 127.0.0.53 udp dport 53 accept");
  at("ip daddr 127.0.0.53 tcp dport 53 accept");
  const size_t tcp_only = at("meta l4proto != tcp counter jump refuse");
  const size_t loopback = at("oifname \"lo\" counter jump refuse");
  const size_t unicast = at("fib daddr type != unicast counter jump refuse");
  const size_t never = at("ip daddr { 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/4, 240.0.0.0/4 }");
  const size_t openable = at("ip daddr 10.0.0.0/24 accept");
  const size_t forbidden = at("10.0.0.0/8, 168.63.129.16/32, 100.64.0.0/10");
  EXPECT_LT(gateways, chain);
  EXPECT_LT(chain, not_ours_on_lo);
  EXPECT_LT(not_ours_on_lo, resolver);
  EXPECT_LT(options, resolver);
  for (size_t refusal : {tcp_only, loopback, unicast, never}) {
    EXPECT_LT(resolver, refusal);
    EXPECT_LT(refusal, openable);
  }
  EXPECT_LT(openable, forbidden);
  // No rule accepts what is not the gateways' (their chain is entered on a match only).
  EXPECT_EQ(text.find("skuid !="), std::string::npos) << text;
  // Loading it replaces a table of that name, in one transaction.
  EXPECT_EQ(text.rfind("table inet t {}\ndelete table inet t\ntable inet t {", 0), 0u) << text;
}

}  // namespace
}  // namespace space::net
