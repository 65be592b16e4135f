// The gateway's DNS pins (src/gateway/dns_pins.h): which names a connection to an address may
// claim. The guest chooses the names, so the table's bounds (names, addresses per name) and the
// consistency of its reverse index after eviction and expiry are tested with hostile volumes.
// Time is passed in, so every test fixes its own clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gateway/dns_pins.h"

namespace space::gateway {
namespace {

using std::chrono::seconds;
using Names = std::vector<std::string>;

const DnsPins::Clock::time_point t0 = DnsPins::Clock::now();

std::string nameOf(size_t i) { return "n" + std::to_string(i) + ".example"; }

TEST(DnsPins, APinCreditsItsNameToItsAddressesUntilTheExpiryExclusive) {
  DnsPins pins;
  pins.pin("a.example", {1, 2}, t0 + seconds(10), t0);
  EXPECT_EQ(pins.namesFor(1, t0), Names{"a.example"});
  EXPECT_EQ(pins.namesFor(2, t0 + seconds(9)), Names{"a.example"});
  EXPECT_EQ(pins.namesFor(1, t0 + seconds(10) - std::chrono::nanoseconds(1)), Names{"a.example"});
  EXPECT_TRUE(pins.namesFor(1, t0 + seconds(10)).empty());
  EXPECT_TRUE(pins.namesFor(3, t0).empty());
}

TEST(DnsPins, NamesForAnAddressAreSortedAndEachListedOnce) {
  DnsPins pins;
  pins.pin("c.example", {7}, t0 + seconds(10), t0);
  pins.pin("a.example", {7, 7, 7}, t0 + seconds(10), t0);
  pins.pin("b.example", {7}, t0 + seconds(10), t0);
  pins.pin("a.example", {7}, t0 + seconds(20), t0);
  EXPECT_EQ(pins.namesFor(7, t0), (Names{"a.example", "b.example", "c.example"}));
  EXPECT_EQ(pins.names(), 3u);
}

TEST(DnsPins, ANewAnswerKeepsTheOlderAddressesUntilTheirOwnExpiry) {
  // Round-robin DNS: the guest may still connect with the answer it got a moment ago.
  DnsPins pins;
  pins.pin("rr.example", {1}, t0 + seconds(10), t0);
  pins.pin("rr.example", {2}, t0 + seconds(20), t0 + seconds(1));
  EXPECT_EQ(pins.namesFor(1, t0 + seconds(5)), Names{"rr.example"});
  EXPECT_EQ(pins.namesFor(2, t0 + seconds(5)), Names{"rr.example"});
  EXPECT_TRUE(pins.namesFor(1, t0 + seconds(15)).empty());
  EXPECT_EQ(pins.namesFor(2, t0 + seconds(15)), Names{"rr.example"});
}

TEST(DnsPins, ARepeatedAddressIsExtendedButNeverShortened) {
  DnsPins pins;
  pins.pin("a.example", {1}, t0 + seconds(30), t0);
  pins.pin("a.example", {1}, t0 + seconds(10), t0 + seconds(1));  // a shorter TTL now
  EXPECT_EQ(pins.namesFor(1, t0 + seconds(20)), Names{"a.example"});
  pins.pin("a.example", {1}, t0 + seconds(60), t0 + seconds(2));
  EXPECT_EQ(pins.namesFor(1, t0 + seconds(50)), Names{"a.example"});
  EXPECT_TRUE(pins.namesFor(1, t0 + seconds(60)).empty());
}

TEST(DnsPins, AnEmptyAnswerOrZeroLimitsPinNothing) {
  DnsPins pins;
  pins.pin("a.example", {}, t0 + seconds(10), t0);
  EXPECT_EQ(pins.names(), 0u);
  DnsPins no_names(0, 32);
  no_names.pin("a.example", {1}, t0 + seconds(10), t0);
  EXPECT_EQ(no_names.names(), 0u);
  EXPECT_TRUE(no_names.namesFor(1, t0).empty());
  DnsPins no_ips(4096, 0);
  no_ips.pin("a.example", {1}, t0 + seconds(10), t0);
  EXPECT_EQ(no_ips.names(), 0u);
}

TEST(DnsPins, AtMost4096NamesAndTheLeastRecentlyPinnedIsEvictedFirst) {
  DnsPins pins;  // the gateway's defaults
  for (size_t i = 0; i < 4096; ++i) pins.pin(nameOf(i), {static_cast<uint32_t>(1000 + i)}, t0 + seconds(60), t0);
  EXPECT_EQ(pins.names(), 4096u);
  pins.pin(nameOf(0), {1000}, t0 + seconds(60), t0);  // n0 is now the most recent
  pins.pin("new.example", {1}, t0 + seconds(60), t0);
  EXPECT_EQ(pins.names(), 4096u);
  EXPECT_EQ(pins.namesFor(1000, t0), Names{nameOf(0)});
  EXPECT_TRUE(pins.namesFor(1001, t0).empty()) << "n1 was the least recently pinned";
  EXPECT_EQ(pins.namesFor(1002, t0), Names{nameOf(2)});
  EXPECT_EQ(pins.namesFor(1, t0), Names{"new.example"});
}

TEST(DnsPins, EvictionRemovesEveryReverseEntryOfTheEvictedNames) {
  // 4096 names on one shared address, then 4096 others: none of the first may still be credited
  // (namesFor would also throw on an index entry whose name is gone).
  DnsPins pins;
  const uint32_t shared = 100000;  // outside the per-name addresses 0-4095
  for (size_t i = 0; i < 4096; ++i) pins.pin(nameOf(i), {shared, static_cast<uint32_t>(i)}, t0 + seconds(60), t0);
  EXPECT_EQ(pins.namesFor(shared, t0).size(), 4096u);
  for (size_t i = 4096; i < 8192; ++i) pins.pin(nameOf(i), {shared}, t0 + seconds(60), t0);
  EXPECT_EQ(pins.names(), 4096u);
  Names names = pins.namesFor(shared, t0);
  ASSERT_EQ(names.size(), 4096u);
  for (const auto& name : names) {
    EXPECT_GE(std::stoul(name.substr(1)), 4096u) << name;
  }
  for (uint32_t i = 0; i < 4096; ++i) EXPECT_TRUE(pins.namesFor(i, t0).empty()) << i;
}

TEST(DnsPins, AtMost32AddressesPerNameAndTheSoonestToExpireMakesRoom) {
  DnsPins pins;
  for (uint32_t i = 0; i < 32; ++i) pins.pin("a.example", {100 + i}, t0 + seconds(100 + i), t0);
  pins.pin("a.example", {500}, t0 + seconds(1000), t0);
  EXPECT_TRUE(pins.namesFor(100, t0).empty()) << "the address closest to its expiry goes";
  for (uint32_t i = 1; i < 32; ++i) EXPECT_EQ(pins.namesFor(100 + i, t0), Names{"a.example"}) << i;
  EXPECT_EQ(pins.namesFor(500, t0), Names{"a.example"});
}

TEST(DnsPins, OneHostileAnswerOf1000AddressesKeepsOnly32) {
  DnsPins pins;
  std::vector<uint32_t> ips;
  for (uint32_t i = 0; i < 1000; ++i) ips.push_back(i);
  pins.pin("many.example", ips, t0 + seconds(60), t0);
  size_t credited = 0;
  for (uint32_t ip : ips) credited += pins.namesFor(ip, t0).size();
  EXPECT_EQ(credited, 32u);
  // Equal expiries: the first ones of the answer made room for the later ones.
  EXPECT_EQ(pins.namesFor(999, t0), Names{"many.example"});
  EXPECT_TRUE(pins.namesFor(0, t0).empty());
}

TEST(DnsPins, ExpiredAddressesAreDroppedFromTheIndexWhenTheNameIsPinnedAgain) {
  DnsPins pins;
  std::vector<uint32_t> old_ips, new_ips;
  for (uint32_t i = 0; i < 32; ++i) {
    old_ips.push_back(100 + i);
    new_ips.push_back(200 + i);
  }
  pins.pin("a.example", old_ips, t0 + seconds(10), t0);
  pins.pin("a.example", new_ips, t0 + seconds(100), t0 + seconds(20));
  for (uint32_t i = 0; i < 32; ++i) {
    // Asked about a moment when the old pins were live: they are gone, not merely filtered out.
    EXPECT_TRUE(pins.namesFor(old_ips[i], t0).empty()) << old_ips[i];
    // And the expired ones did not crowd out any of the 32 live ones.
    EXPECT_EQ(pins.namesFor(new_ips[i], t0 + seconds(20)), Names{"a.example"}) << new_ips[i];
  }
}

TEST(DnsPins, AFullTableOf4096NamesBy32AddressesStaysBoundedUnderChurn) {
  // Round 0 fills the table (33 addresses offered per name, 32 kept); round 1 evicts it all.
  DnsPins pins;
  auto now = t0;
  for (size_t round = 0; round < 2; ++round) {
    for (size_t i = 0; i < 4096; ++i) {
      std::vector<uint32_t> ips;
      for (uint32_t k = 0; k < 33; ++k) ips.push_back(static_cast<uint32_t>((i * 37 + k + round * 7) % 5000));
      pins.pin(nameOf(i + round * 4096), ips, now + seconds(30), now);
    }
    now += seconds(10);
  }
  EXPECT_EQ(pins.names(), 4096u);
  size_t credited = 0;
  for (uint32_t ip = 0; ip < 5000; ++ip) {
    for (const auto& name : pins.namesFor(ip, t0)) {
      ++credited;
      ASSERT_GE(std::stoul(name.substr(1)), 4096u) << name << " was evicted";
    }
  }
  EXPECT_EQ(credited, 4096u * 32u);
}

// A plain model of the documented behaviour, to compare the indexed implementation with over
// random operations on small bounds (evictions and expiries happen constantly).
class ModelPins {
 public:
  ModelPins(size_t max_names, size_t max_ips) : max_names_(max_names), max_ips_(max_ips) {}

  void pin(const std::string& name, const std::vector<uint32_t>& ips, DnsPins::Clock::time_point expiry,
           DnsPins::Clock::time_point now) {
    if (ips.empty()) return;
    auto it = std::find_if(order_.begin(), order_.end(), [&](const auto& e) { return e.first == name; });
    std::vector<std::pair<uint32_t, DnsPins::Clock::time_point>> pinned;
    if (it != order_.end()) {
      pinned = std::move(it->second);
      order_.erase(it);
    } else if (order_.size() >= max_names_) {
      order_.erase(order_.begin());
    }
    std::erase_if(pinned, [&](const auto& p) { return p.second <= now; });
    for (uint32_t ip : ips) {
      auto same = std::find_if(pinned.begin(), pinned.end(), [&](const auto& p) { return p.first == ip; });
      if (same != pinned.end()) {
        same->second = std::max(same->second, expiry);
        continue;
      }
      if (pinned.size() >= max_ips_) {
        pinned.erase(std::min_element(pinned.begin(), pinned.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; }));
      }
      pinned.emplace_back(ip, expiry);
    }
    order_.emplace_back(name, std::move(pinned));
  }

  Names namesFor(uint32_t ip, DnsPins::Clock::time_point now) const {
    Names out;
    for (const auto& [name, pinned] : order_) {
      if (std::any_of(pinned.begin(), pinned.end(), [&](const auto& p) { return p.first == ip && p.second > now; }))
        out.push_back(name);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  size_t max_names_, max_ips_;
  std::vector<std::pair<std::string, std::vector<std::pair<uint32_t, DnsPins::Clock::time_point>>>> order_;
};

TEST(DnsPins, MatchesASimpleModelOverRandomPinsEvictionsAndExpiries) {
  std::mt19937 rng(20240611);
  DnsPins pins(8, 4);
  ModelPins model(8, 4);
  auto now = t0;
  for (int step = 0; step < 4000; ++step) {
    now += std::chrono::milliseconds(rng() % 400);
    std::vector<uint32_t> ips(rng() % 7);
    for (auto& ip : ips) ip = rng() % 24;
    std::string name = nameOf(rng() % 20);
    auto expiry = now + std::chrono::milliseconds(rng() % 3000);
    pins.pin(name, ips, expiry, now);
    model.pin(name, ips, expiry, now);
    // Asked at, before and after `now`: stale index entries would show in the past.
    for (auto when : {now, now - seconds(5), now + seconds(1)}) {
      for (uint32_t ip = 0; ip < 24; ++ip) ASSERT_EQ(pins.namesFor(ip, when), model.namesFor(ip, when)) << step;
    }
  }
}

}  // namespace
}  // namespace space::gateway
