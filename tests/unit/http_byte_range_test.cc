#include <gtest/gtest.h>

#include "http/byte_range.h"

namespace space::http {
namespace {

using Kind = ByteRange::Kind;

TEST(ByteRangeTest, TheThreeFormsOfOneRange) {
  auto r = parseByteRange("bytes=0-9", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(r.last, 9u);
  EXPECT_EQ(r.length(), 10u);
  r = parseByteRange("bytes=90-", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 90u);
  EXPECT_EQ(r.last, 99u);
  r = parseByteRange("bytes=-5", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 95u);
  EXPECT_EQ(r.last, 99u);
  r = parseByteRange(" Bytes=3-4 ", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 3u);
  EXPECT_EQ(r.length(), 2u);
}

TEST(ByteRangeTest, BoundsAreClampedOrUnsatisfiable) {
  auto r = parseByteRange("bytes=50-1000", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.last, 99u);
  r = parseByteRange("bytes=-1000", 100);
  ASSERT_EQ(r.kind, Kind::kPartial);
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(parseByteRange("bytes=100-", 100).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(parseByteRange("bytes=-0", 100).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(parseByteRange("bytes=0-", 0).kind, Kind::kUnsatisfiable);
  EXPECT_EQ(parseByteRange("bytes=-3", 0).kind, Kind::kUnsatisfiable);
}

TEST(ByteRangeTest, WhatDoesNotParseIsIgnored) {
  for (const char* h : {"", "bytes=", "items=0-1", "bytes=5-2", "bytes=a-b", "bytes=0-1,3-4", "bytes=1", "bytes=--1",
                        "bytes=0-99999999999999999999", "bytes=1e3-"}) {
    EXPECT_EQ(parseByteRange(h, 100).kind, Kind::kWhole) << h;
  }
}

}  // namespace
}  // namespace space::http
