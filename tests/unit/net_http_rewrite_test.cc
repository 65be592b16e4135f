// The plain-HTTP head rewrite for credential rules: the rule's headers replace the guest's, the
// connection headers go, the body is left where it was.
#include <gtest/gtest.h>

#include <string>

#include "net/http_rewrite.h"

namespace space::net {
namespace {

Result<RewrittenHead> rewrite(const std::string& text, const std::vector<std::pair<std::string, std::string>>& set) {
  return rewriteRequestHead(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()), set);
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

TEST(HttpRewrite, SetsTheRulesHeadersAndClosesAfterTheRequest) {
  const std::string body = "{\"x\":1}";
  const std::string text =
      "POST /repos/a/b/issues?q=1 HTTP/1.1\r\nHost: api.github.com\r\nauthorization: Bearer guest-guess\r\n"
      "Connection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nContent-Length: 7\r\nX-Other: kept\r\n\r\n" +
      body;
  auto r = rewrite(text, {{"Authorization", "Bearer ghp_real"}, {"X-Org", "acme"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->consumed, text.size() - body.size());
  EXPECT_EQ(r->method, "POST");
  EXPECT_EQ(r->target, "/repos/a/b/issues?q=1");
  const std::string& head = r->head;
  EXPECT_TRUE(head.starts_with("POST /repos/a/b/issues?q=1 HTTP/1.1\r\n")) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  EXPECT_EQ(count(head, "Bearer ghp_real"), 1u) << head;
  EXPECT_EQ(head.find("guest-guess"), std::string::npos) << head;
  EXPECT_EQ(count(head, "X-Org: acme\r\n"), 1u) << head;
  EXPECT_EQ(head.find("Keep-Alive"), std::string::npos) << head;
  EXPECT_EQ(head.find("keep-alive"), std::string::npos) << head;
  EXPECT_EQ(count(head, "Connection: close\r\n"), 1u) << head;
  EXPECT_EQ(count(head, "Host: api.github.com\r\n"), 1u) << head;
  EXPECT_EQ(count(head, "Content-Length: 7\r\n"), 1u) << head;
  EXPECT_EQ(count(head, "X-Other: kept\r\n"), 1u) << head;
}

// What sniff() accepted, the rewrite accepts: a large upload's head is still a head, and a value
// Beast cannot hold is an error, never an exception out of the gateway's loop.
TEST(HttpRewrite, TakesLargeUploadsAndRefusesHugeValues) {
  const std::string upload = "POST /up HTTP/1.1\r\nHost: h.example\r\nContent-Length: 2000000000\r\n\r\nfirst bytes";
  auto r = rewrite(upload, {{"Authorization", "Bearer x"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->consumed, upload.size() - std::string("first bytes").size());
  auto huge = rewrite("GET / HTTP/1.1\r\nHost: h.example\r\n\r\n", {{"Authorization", std::string(70000, 'v')}});
  EXPECT_FALSE(huge.ok());
}

TEST(HttpRewrite, RefusesWhatIsNotACompleteHead) {
  for (const std::string& text : {std::string("GET / HTTP/1.1\r\nHost: x\r\n"), std::string("not http at all\r\n\r\n"),
                                  std::string("GET / HTTP/1.1\r\nBad Header\r\n\r\n"), std::string()}) {
    EXPECT_FALSE(rewrite(text, {{"A", "b"}}).ok()) << text;
  }
}

// A request whose end two servers could find at two places is never sent with a credential:
// what follows it on the connection could be read as another request (request smuggling).
TEST(HttpRewrite, RefusesAmbiguousFraming) {
  const std::string head = "POST /x HTTP/1.1\r\nHost: api.test\r\n";
  for (const std::string fields : {
           "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n",
           "Transfer-Encoding: chunked, x\r\n",
           "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
           "Content-Length: 5\r\nContent-Length: 5\r\n",
           "Content-Length: 5, 5\r\n",
           "Content-Length: +5\r\n",
       }) {
    auto r = rewrite(head + fields + "\r\n", {{"Authorization", "Bearer x"}});
    EXPECT_FALSE(r.ok()) << fields;
  }
  EXPECT_FALSE(rewrite("POST /x HTTP/1.0\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n", {}).ok());
  // The usual framings pass.
  EXPECT_TRUE(rewrite(head + "Transfer-Encoding: Chunked\r\n\r\n", {}).ok());
  EXPECT_TRUE(rewrite(head + "Content-Length: 12\r\n\r\n", {}).ok());
  EXPECT_TRUE(rewrite("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n", {}).ok());
}

}  // namespace
}  // namespace space::net
