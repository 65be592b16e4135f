// Where a credentialed request ends: the gateway forwards up to there and nothing after.
#include <gtest/gtest.h>

#include <string>

#include "net/request_end.h"

namespace space::net {
namespace {

std::span<const uint8_t> bytesOf(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// Feeds `text` in pieces of `step` bytes; returns how many were taken.
size_t feed(RequestEnd& end, const std::string& text, size_t step) {
  size_t taken = 0;
  for (size_t at = 0; at < text.size(); at += step) taken += end.take(bytesOf(text.substr(at, step)));
  return taken;
}

const std::string kGet = "GET /a HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n";
const std::string kPipelined = "GET /b HTTP/1.1\r\nHost: api.test\r\n\r\n";

TEST(RequestEnd, ABodilessRequestEndsWithItsHead) {
  for (size_t step : {1, 3, 7, 1000}) {
    RequestEnd end;
    EXPECT_EQ(feed(end, kGet + kPipelined, step), kGet.size()) << step;
    EXPECT_TRUE(end.ended());
    EXPECT_FALSE(end.failed());
  }
}

TEST(RequestEnd, ContentLengthAndChunkedBodiesEndWhereTheirFramingSays) {
  const std::string sized =
      "POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 20000\r\n\r\n" + std::string(20000, 'x');
  const std::string chunked =
      "POST /a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n2710\r\n" +
      std::string(10000, 'y') + "\r\n0\r\nX-Trailer: t\r\n\r\n";
  for (const std::string& request : {sized, chunked}) {
    for (size_t step : {1, 5, 4096, 100000}) {
      RequestEnd end;
      EXPECT_EQ(feed(end, request + kPipelined, step), request.size()) << step;
      EXPECT_TRUE(end.ended());
    }
  }
  // Not ended yet: everything so far belongs to it.
  RequestEnd open;
  EXPECT_EQ(open.take(bytesOf(sized.substr(0, 100))), 100u);
  EXPECT_FALSE(open.ended());
}

TEST(RequestEnd, BrokenFramingOrAnEndlessChunkLineStopsIt) {
  RequestEnd bad;
  EXPECT_EQ(feed(bad, "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 1000), 0u);
  EXPECT_TRUE(bad.failed());
  RequestEnd endless;
  feed(endless, "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;" + std::string(40000, 'e'), 512);
  EXPECT_TRUE(endless.failed());
  EXPECT_EQ(endless.take(bytesOf("more")), 0u);
}

}  // namespace
}  // namespace space::net
