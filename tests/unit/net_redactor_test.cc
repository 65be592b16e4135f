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

TEST(Redactor, MasksEveryOccurrenceWhereverTheReadsSplitIt) {
  const std::string secret = "ghp_SecretValue0123";
  const std::string header = "Bearer " + secret;
  const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 60\r\n\r\n{\"authorization\": \"" + header +
                             "\", \"again\": \"" + secret + "\"}";
  for (size_t step : {1, 2, 5, 19, 64, 4096}) {
    Redactor r({header, secret});
    std::string out = run(r, answer, step);
    EXPECT_EQ(out.size(), answer.size()) << step;
    EXPECT_EQ(out.find(secret), std::string::npos) << step << ": " << out;
    EXPECT_NE(out.find("\"authorization\": \"" + std::string(header.size(), '*') + "\""), std::string::npos) << out;
    EXPECT_EQ(r.masked(), 2u) << step;
    EXPECT_EQ(out.substr(0, 20), answer.substr(0, 20));
  }
}

TEST(Redactor, ShortValuesAndNoValuesPassEverythingAtOnce) {
  Redactor none({"short"});
  std::vector<uint8_t> out;
  const std::string text = "a short answer";
  none.feed(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), out);
  EXPECT_EQ(std::string(out.begin(), out.end()), text);
  EXPECT_FALSE(none.holding());
  // With a value, only the tail that could start one is held back.
  Redactor some({"0123456789"});
  out.clear();
  some.feed(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), out);
  EXPECT_EQ(out.size(), text.size() - 9);
  some.finish(out);
  EXPECT_EQ(std::string(out.begin(), out.end()), text);
}

}  // namespace
}  // namespace space::net
