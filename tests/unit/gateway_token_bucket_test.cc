// The gateway's token bucket (src/gateway/token_bucket.h): DNS questions a second and bytes
// relayed a second. Time points are passed in; each test starts its clock after constructing
// the bucket (which starts full), so refills are exact. Rates and durations are chosen so the
// arithmetic is exact in binary floating point.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "gateway/token_bucket.h"

namespace space::gateway {
namespace {

using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = TokenBucket::Clock;

TEST(TokenBucket, StartsFullWithTheBurstAndNoMore) {
  TokenBucket bucket(8, 4);
  auto t0 = Clock::now();
  EXPECT_TRUE(bucket.tryTake(4, t0));
  EXPECT_FALSE(bucket.tryTake(1, t0));
}

TEST(TokenBucket, RefillsAtTheRate) {
  TokenBucket bucket(8, 4);
  auto t0 = Clock::now();
  ASSERT_TRUE(bucket.tryTake(4, t0));
  EXPECT_FALSE(bucket.tryTake(1, t0 + microseconds(62500)));  // half a token
  EXPECT_TRUE(bucket.tryTake(1, t0 + milliseconds(125)));     // a whole one, taken
  EXPECT_FALSE(bucket.tryTake(1, t0 + milliseconds(125)));
  EXPECT_TRUE(bucket.tryTake(2, t0 + milliseconds(375)));  // 2 more a quarter second later
  EXPECT_FALSE(bucket.tryTake(0.5, t0 + milliseconds(375)));
}

TEST(TokenBucket, AFailedTryTakeTakesNothing) {
  TokenBucket bucket(1, 4);
  auto t0 = Clock::now();
  EXPECT_FALSE(bucket.tryTake(5, t0));
  EXPECT_TRUE(bucket.tryTake(4, t0));
}

TEST(TokenBucket, NeverSavesMoreThanTheBurstHoweverLongItWaits) {
  TokenBucket bucket(1000, 10);
  auto t0 = Clock::now();
  ASSERT_TRUE(bucket.tryTake(10, t0));
  EXPECT_FALSE(bucket.tryTake(11, t0 + hours(24)));
  EXPECT_TRUE(bucket.tryTake(10, t0 + hours(24)));
  EXPECT_FALSE(bucket.tryTake(1, t0 + hours(24)));
}

TEST(TokenBucket, TakeGoesIntoDebtAndSaysHowLongToWait) {
  TokenBucket bucket(8, 8);
  auto t0 = Clock::now();
  EXPECT_EQ(bucket.take(8, t0), Clock::duration::zero());
  EXPECT_EQ(bucket.take(4, t0), milliseconds(500));
  EXPECT_EQ(bucket.take(4, t0), milliseconds(1000));         // the debt adds up
  EXPECT_FALSE(bucket.tryTake(1, t0 + milliseconds(1000)));  // the debt is paid at 1 s, not before
  EXPECT_TRUE(bucket.tryTake(1, t0 + milliseconds(1125)));
}

TEST(TokenBucket, ARateOfZeroNeverRefillsAndNeverAsksToWait) {
  TokenBucket bucket(0, 2);
  auto t0 = Clock::now();
  EXPECT_TRUE(bucket.tryTake(2, t0));
  EXPECT_FALSE(bucket.tryTake(1, t0 + hours(1000)));
  EXPECT_EQ(bucket.take(100, t0 + hours(1000)), Clock::duration::zero());
}

TEST(TokenBucket, AHugeElapsedTimeOrRateRefillsToTheBurstWithoutOverflow) {
  TokenBucket slow(1, 5);
  auto t0 = Clock::now();
  ASSERT_TRUE(slow.tryTake(5, t0));
  // 200 years: near the end of what a steady_clock time point can hold.
  auto far = t0 + hours(24 * 365 * 200);
  EXPECT_TRUE(slow.tryTake(5, far));
  EXPECT_FALSE(slow.tryTake(1, far));

  // elapsed x rate overflows to +inf: still only the burst.
  TokenBucket fast(std::numeric_limits<double>::max(), 5);
  auto t1 = Clock::now();  // after the bucket's own start: no time point before it
  ASSERT_TRUE(fast.tryTake(5, t1));
  EXPECT_TRUE(fast.tryTake(5, t1 + hours(1)));
  EXPECT_FALSE(fast.tryTake(5.5, t1 + hours(1)));
  EXPECT_EQ(fast.take(5, t1 + hours(2)), Clock::duration::zero());

  // An infinite rate with no time elapsed (inf x 0 = NaN) must not poison the count either.
  TokenBucket unlimited(std::numeric_limits<double>::infinity(), 5);
  auto t2 = Clock::now();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(unlimited.tryTake(5, t2));
    EXPECT_FALSE(unlimited.tryTake(6, t2));
  }
}

TEST(TokenBucket, ATimePointInThePastNeverMintsTokens) {
  TokenBucket bucket(8, 8);
  auto t0 = Clock::now();
  ASSERT_TRUE(bucket.tryTake(8, t0 + seconds(10)));
  EXPECT_FALSE(bucket.tryTake(1, t0));                // stale: no credit for going back
  EXPECT_FALSE(bucket.tryTake(1, t0 + seconds(10)));  // and none for coming forward again
  EXPECT_TRUE(bucket.tryTake(1, t0 + seconds(10) + milliseconds(125)));
  EXPECT_FALSE(bucket.tryTake(1, t0 + seconds(10) + milliseconds(125)));
}

TEST(TokenBucket, AnUnpayableDebtAsksForALongWaitNeverANegativeOne) {
  // The wait is computed in floating point seconds and converted to integer nanoseconds: a debt
  // of 1e12 s does not fit (about 292 years do), and an overflowed conversion came out negative
  // (on x86), which the relay reads as "no need to wait".
  TokenBucket bucket(1, 1);
  auto t0 = Clock::now();
  auto wait = bucket.take(1e12, t0);
  EXPECT_GT(wait, hours(24));
  auto tiny_rate = TokenBucket(1e-300, 1).take(1e6, t0);
  EXPECT_GT(tiny_rate, hours(24));
}

}  // namespace
}  // namespace space::gateway
