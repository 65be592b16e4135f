#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "vmm/vm_users.h"

namespace space::vmm {
namespace {

TEST(VmUsers, EachVmGetsAUidOfItsOwnAndOneGoesBackOnlyWhenReleased) {
  auto users = VmUsers::create(1000000, 3);
  ASSERT_TRUE(users.ok()) << users.error().message;
  std::vector<VmUsers::Lease> held;
  std::set<uid_t> uids;
  for (int i = 0; i < 3; ++i) {
    auto lease = users.value()->acquire();
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->held());
    EXPECT_EQ(lease->gid(), 1000000u);
    EXPECT_TRUE(users.value()->contains(lease->uid()));
    uids.insert(lease->uid());
    held.push_back(std::move(lease.value()));
  }
  EXPECT_EQ(uids, (std::set<uid_t>{1000001, 1000002, 1000003}));  // never the group's own id
  auto none = users.value()->acquire();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, ErrorCode::kResourceExhausted);
  // Released ones come back last: the oldest released first.
  const uid_t first_back = held[1].uid(), second_back = held[0].uid();
  held[1] = VmUsers::Lease();
  held[0] = VmUsers::Lease();
  EXPECT_EQ(users.value()->held(), 1u);
  auto again = users.value()->acquire();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->uid(), first_back);
  auto next = users.value()->acquire();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->uid(), second_back);
  // A lease moved from is empty; the one moved to gives the uid back once.
  VmUsers::Lease moved = std::move(next.value());
  EXPECT_FALSE(next->held());
  moved = VmUsers::Lease();
  EXPECT_EQ(users.value()->held(), 2u);
}

TEST(VmUsers, AdoptedVmsClaimTheirUidsAndKeptOnesNeverComeBack) {
  auto users = VmUsers::create(2000000, 4);
  ASSERT_TRUE(users.ok());
  auto claimed = users.value()->claim(2000003);
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  EXPECT_FALSE(users.value()->claim(2000003).ok());  // held already
  EXPECT_FALSE(users.value()->claim(2000000).ok());  // the group's id, not a VM's
  EXPECT_FALSE(users.value()->claim(2000005).ok());  // outside
  EXPECT_FALSE(users.value()->claim(0).ok());
  std::set<uid_t> others;
  std::vector<VmUsers::Lease> held;
  for (int i = 0; i < 3; ++i) {
    auto lease = users.value()->acquire();
    ASSERT_TRUE(lease.ok());
    others.insert(lease->uid());
    held.push_back(std::move(lease.value()));
  }
  EXPECT_EQ(others, (std::set<uid_t>{2000001, 2000002, 2000004}));
  // A QEMU left running unwatched keeps its uid for as long as the range lives.
  held[0].keep();
  EXPECT_FALSE(held[0].held());
  held.clear();
  claimed.value() = VmUsers::Lease();
  EXPECT_EQ(users.value()->held(), 1u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(users.value()->acquire().ok());  // each released at once
}

TEST(VmUsers, ARangeThatCannotBeIsRefused) {
  EXPECT_FALSE(VmUsers::create(0, 10).ok());
  EXPECT_FALSE(VmUsers::create(100000, 0).ok());
  EXPECT_FALSE(VmUsers::create(2147483000u, 65535).ok());
  EXPECT_TRUE(VmUsers::create(1600000000, 65535).ok());
  // This host's accounts (root, nobody at 65534) are not in a range far above them...
  EXPECT_TRUE(VmUsers::create(1600000000, 65535).value()->checkNoAccount().ok());
  // ...and are found in one that holds them.
  auto with_root = VmUsers::create(1, 65535);
  ASSERT_TRUE(with_root.ok());
  auto refused = with_root.value()->checkNoAccount();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--vm-uid-base"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace space::vmm
