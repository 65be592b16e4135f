#include "api/tenant_places.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace space::api {
namespace {

TEST(TenantPlaces, CapsTheNodeAndEachTenantAtAQuarterAndGivesPlacesBack) {
  std::vector<std::shared_ptr<void>> held;
  std::shared_ptr<void> outliving;
  {
    TenantPlaces counter(8);  // a tenant: 2
    bool over_node = true;
    for (int i = 0; i < 2; ++i) held.push_back(counter.enter("a", over_node));
    EXPECT_TRUE(held[0] && held[1]);
    EXPECT_FALSE(counter.enter("a", over_node)) << "the tenant's quarter";
    EXPECT_FALSE(over_node);
    for (const char* tenant : {"b", "b", "c", "c", "d", "d"}) held.push_back(counter.enter(tenant, over_node));
    EXPECT_TRUE(std::all_of(held.begin(), held.end(), [](const auto& p) { return p != nullptr; }));
    EXPECT_FALSE(counter.enter("e", over_node)) << "the node's cap";
    EXPECT_TRUE(over_node);
    held[0].reset();
    outliving = counter.enter("e", over_node);
    EXPECT_TRUE(outliving) << "a place given back serves another tenant";
    EXPECT_FALSE(counter.enter("a", over_node));
    held[1].reset();
    held[2].reset();
    EXPECT_TRUE(counter.enter("a", over_node)) << "the tenant's own places came back";
  }
  outliving.reset();  // after the counter: the place holds what it counts in
}

}  // namespace
}  // namespace space::api
