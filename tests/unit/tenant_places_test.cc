#include "api/tenant_places.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace space::api {
namespace {

TEST(TenantPlaces, CapsTheNodeAndEachTenantAtAQuarterAndGivesPlacesBack) {
  std::vector<std::shared_ptr<void>> held;
  std::shared_ptr<void> outliving;
  {
    TenantPlaces counter(8);  // a tenant: 2
    TenantPlaces::Refusal refusal;
    for (int i = 0; i < 2; ++i) held.push_back(counter.enter("a", refusal));
    EXPECT_TRUE(held[0] && held[1]);
    EXPECT_FALSE(counter.enter("a", refusal)) << "the tenant's quarter";
    EXPECT_FALSE(refusal.over_node);
    EXPECT_EQ(refusal.tenant_holds, 2u);
    EXPECT_FALSE(refusal.busy_node);
    EXPECT_EQ(counter.shareText(refusal, " terminals"), "holds 2 terminals, its most: a quarter of the node's 8");
    TenantPlaces tiny(2);  // a tenant: 1, though a quarter of 2 rounds to none
    auto only = tiny.enter("a", refusal);
    EXPECT_TRUE(only);
    EXPECT_FALSE(tiny.enter("a", refusal));
    EXPECT_EQ(tiny.shareText(refusal, " terminals"), "holds 1 terminals, its most: 1 of the node's 2");
    // b and c take their quarters (each less than half of what is free), d one of the last two.
    for (const char* tenant : {"b", "b", "c", "c", "d"}) held.push_back(counter.enter(tenant, refusal));
    EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](const auto& p) { return p != nullptr; }));
    EXPECT_FALSE(counter.enter("d", refusal)) << "d would hold half of the one place left";
    EXPECT_FALSE(refusal.over_node);
    EXPECT_EQ(refusal.tenant_holds, 1u);
    EXPECT_TRUE(refusal.busy_node);
    // Its own count, not the node's: how many are free would tell it what the others hold.
    EXPECT_EQ(counter.shareText(refusal, " terminals"), "holds 1 terminals, its share while the node is this busy");
    held.push_back(counter.enter("e", refusal));
    EXPECT_TRUE(held.back()) << "a tenant holding none takes the last place";
    EXPECT_FALSE(counter.enter("f", refusal)) << "the node's cap";
    EXPECT_TRUE(refusal.over_node);
    held[0].reset();
    outliving = counter.enter("f", refusal);
    EXPECT_TRUE(outliving) << "a place given back serves another tenant";
    EXPECT_FALSE(counter.enter("a", refusal));
    held[1].reset();
    held[2].reset();
    held[3].reset();
    EXPECT_TRUE(counter.enter("a", refusal)) << "the tenant's own places came back";
  }
  outliving.reset();  // after the counter: the place holds what it counts in
}

// Tenants that each take all they can, one after another, as colluding tenants would: every
// next one still finds places, and it takes 17 of them, not four, to fill a node of 1024.
TEST(TenantPlaces, ABusyNodeKeepsPlacesForTheNextTenant) {
  TenantPlaces counter(1024);
  std::vector<std::shared_ptr<void>> held;
  std::vector<size_t> taken;
  TenantPlaces::Refusal refusal;
  for (int tenant = 0; tenant < 40 && held.size() < 1024; ++tenant) {
    size_t n = 0;
    while (auto place = counter.enter("t" + std::to_string(tenant), refusal)) {
      held.push_back(std::move(place));
      ++n;
    }
    EXPECT_FALSE(refusal.over_node && held.size() < 1024) << tenant;
    taken.push_back(n);
  }
  ASSERT_EQ(held.size(), 1024u);
  EXPECT_EQ(taken.size(), 17u);
  EXPECT_EQ(taken[0], 256u) << "an idle node's quarter";
  EXPECT_EQ(taken[1], 256u);
  EXPECT_EQ(taken[2], 171u) << "less than half of the 512 places then free";
  EXPECT_TRUE(std::all_of(taken.begin(), taken.end(), [](size_t n) { return n >= 1; }));
  EXPECT_FALSE(counter.enter("late", refusal));
  EXPECT_TRUE(refusal.over_node);
}

}  // namespace
}  // namespace space::api
