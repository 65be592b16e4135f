// Masking the added secret in what the rule's host answers (a server that echoes headers).
#include <gtest/gtest.h>

#include <string>

#include "net/redactor.h"

namespace space::net {
namespace {

std::string run(Redactor& r, const std::string& text, size_t step) {
  std::vector<uint8_t> out;
  for (size_t at = 0; at < text.size(); at += step) {
    std::string piece = text.substr(at, step);
    r.feed(std::span(reinterpret_cast<const uint8_t*>(piece.data()), piece.size()), out);
  }
  r.finish(out);
  return std::string(out.begin(), out.end());
}

const std::string kSecret = "ghp_SecretValue0123";

TEST(Redactor, MasksEveryOccurrenceWhereverTheReadsSplitIt) {
  const std::string header = "Bearer " + kSecret;
  const std::string body = "{\"authorization\": \"" + header + "\", \"again\": \"" + kSecret + "\"}";
  const std::string answer = "HTTP/1.1 200 OK\r\nX-Echo: " + kSecret +
                             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t step : {1, 2, 5, 19, 64, 4096}) {
    Redactor r({header, kSecret}, false);
    std::string out = run(r, answer, step);
    EXPECT_EQ(out.size(), answer.size()) << step;
    EXPECT_EQ(out.find(kSecret), std::string::npos) << step << ": " << out;
    EXPECT_NE(out.find("\"authorization\": \"" + std::string(header.size(), '*') + "\""), std::string::npos) << out;
    EXPECT_EQ(r.masked(), 3u) << step;
    EXPECT_EQ(out.substr(0, 17), "HTTP/1.1 200 OK\r\n");
    EXPECT_TRUE(r.refused().empty());
  }
}

// A chunk boundary in the middle of the value (the guest can pad its request so that the echo
// lands there) does not hide it; the framing itself is left as it was.
TEST(Redactor, FindsAValueSplitByChunkFraming) {
  const std::string answer =
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "7\r\nghp_Sec\r\n5;x=1\r\nretVa\r\n7\r\nlue0123\r\n0\r\nX-T: " +
      kSecret + "\r\n\r\n";
  for (size_t step : {1, 3, 11, 4096}) {
    Redactor r({kSecret}, false);
    std::string out = run(r, answer, step);
    EXPECT_EQ(out.size(), answer.size()) << step;
    EXPECT_NE(out.find("7\r\n*******\r\n5;x=1\r\n*****\r\n7\r\n*******\r\n0\r\n"), std::string::npos) << out;
    EXPECT_EQ(out.find(kSecret), std::string::npos) << out;
    EXPECT_EQ(r.masked(), 2u) << step;
  }
}

TEST(Redactor, RefusesAnswersItCannotRead) {
  Redactor gz({kSecret}, false);
  run(gz, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", 4096);
  EXPECT_NE(gz.refused().find("encoded"), std::string::npos);
  Redactor bad_chunk({kSecret}, false);
  run(bad_chunk, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 4096);
  EXPECT_FALSE(bad_chunk.refused().empty());
  Redactor huge({kSecret}, false);
  run(huge, "HTTP/1.1 200 OK\r\nX: " + std::string(70000, 'a'), 4096);
  EXPECT_FALSE(huge.refused().empty());
  // A HEAD answer's head says chunked, and no body follows: the next bytes are not framing.
  Redactor head({kSecret}, true);
  std::string out = run(head, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 4096);
  EXPECT_TRUE(head.refused().empty()) << head.refused();
}

TEST(Redactor, ShortValuesAreNotMaskedAndTheHeadWaitsWhole) {
  Redactor none({"short"}, false);
  std::vector<uint8_t> out;
  const std::string text = "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\na short answer";
  none.feed(std::span(reinterpret_cast<const uint8_t*>(text.data()), 20), out);
  EXPECT_TRUE(out.empty()) << "the head is held until it is complete";
  none.feed(std::span(reinterpret_cast<const uint8_t*>(text.data()) + 20, text.size() - 20), out);
  EXPECT_EQ(std::string(out.begin(), out.end()), text);
}

}  // namespace
}  // namespace space::net
