// The tap counters behind a sandbox's network figures, parsed from /proc/<pid>/net/dev.
#include <gtest/gtest.h>

#include "net/slot.h"

namespace space::net {
namespace {

// As the kernel prints it (dev_seq_show): two header lines, then one line per interface.
constexpr const char* kNetDev =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
    "carrier compressed\n"
    "    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       "
    "0          0\n"
    "  tap0: 1048576     800    0    0    0     0          0         0     4096      30    0    1    0     0       "
    "0          0\n"
    "tap0x: 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9\n";

TEST(TapBytes, TheHostsReceiveIsWhatTheGuestSent) {
  auto bytes = tapBytesFromNetDev(kNetDev, "tap0");
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  EXPECT_EQ(bytes->guest_sent, 1048576u);
  EXPECT_EQ(bytes->guest_received, 4096u);
}

TEST(TapBytes, OnlyTheExactNameCounts) {
  EXPECT_EQ(tapBytesFromNetDev(kNetDev, "tap").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(tapBytesFromNetDev("", "tap0").error().code, ErrorCode::kNotFound);
  auto other = tapBytesFromNetDev(kNetDev, "tap0x");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->guest_received, 9u);
}

TEST(TapBytes, MalformedLinesAreErrorsNotNumbers) {
  for (const char* text : {"tap0: 1 2 3\n", "tap0: -1 0 0 0 0 0 0 0 5 0\n", "tap0: 1 2 3 4 5 6 7 8 0x10 0\n",
                           "tap0: 99999999999999999999999 0 0 0 0 0 0 0 1 0\n"}) {
    auto bytes = tapBytesFromNetDev(text, "tap0");
    EXPECT_FALSE(bytes.ok()) << text;
    if (!bytes.ok()) {
      EXPECT_EQ(bytes.error().code, ErrorCode::kInternal) << text;
    }
  }
}

}  // namespace
}  // namespace space::net
