#include "sandbox/lifecycle.h"

#include <gtest/gtest.h>

#include "sandbox/manager.h"

namespace space::sandbox {
namespace {

using S = SandboxState;
constexpr S kAll[] = {S::kCreating, S::kRunning, S::kPaused, S::kSuspended, S::kDeleted, S::kFailed};

TEST(Lifecycle, NamesRoundTrip) {
  for (S s : kAll) {
    auto parsed = parseState(stateName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed.value(), s);
  }
  auto bad = parseState("runing");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("runing"), std::string::npos);
}

TEST(Lifecycle, TransitionTable) {
  // Exactly the documented edges are legal.
  std::set<std::pair<S, S>> legal = {
      {S::kCreating, S::kRunning}, {S::kCreating, S::kFailed},   {S::kCreating, S::kDeleted},
      {S::kRunning, S::kPaused},   {S::kRunning, S::kSuspended}, {S::kRunning, S::kFailed},
      {S::kRunning, S::kDeleted},  {S::kPaused, S::kRunning},    {S::kPaused, S::kSuspended},
      {S::kPaused, S::kFailed},    {S::kPaused, S::kDeleted},    {S::kSuspended, S::kRunning},
      {S::kSuspended, S::kFailed}, {S::kSuspended, S::kDeleted}, {S::kFailed, S::kDeleted},
  };
  for (S from : kAll) {
    for (S to : kAll) {
      EXPECT_EQ(transitionAllowed(from, to), legal.count({from, to}) == 1)
          << stateName(from) << " -> " << stateName(to);
    }
  }
}

TEST(Lifecycle, RefusalNamesTheCurrentState) {
  auto refused = checkTransition(S::kDeleted, S::kPaused, "pause");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(refused.error().message, "sandbox is deleted; cannot pause");
  auto needs = requireState(S::kPaused, S::kRunning, "exec");
  ASSERT_FALSE(needs.ok());
  EXPECT_EQ(needs.error().message, "sandbox is paused; cannot exec (needs running)");
  EXPECT_TRUE(requireState(S::kRunning, S::kRunning, "exec").ok());
}

TEST(Lifecycle, ResourceHoldingStates) {
  EXPECT_TRUE(holdsResources(S::kCreating));
  EXPECT_TRUE(holdsResources(S::kRunning));
  EXPECT_TRUE(holdsResources(S::kPaused));
  EXPECT_FALSE(holdsResources(S::kSuspended));
  EXPECT_FALSE(holdsResources(S::kDeleted));
  EXPECT_FALSE(holdsResources(S::kFailed));
}

TEST(SandboxIds, AreWellFormedAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string id = newSandboxId();
    ASSERT_EQ(id.size(), 23u);
    ASSERT_EQ(id.substr(0, 3), "sb_");
    for (char c : id.substr(3)) ASSERT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace space::sandbox
