#include <gtest/gtest.h>

#include "http/router.h"
#include "http/url.h"

namespace space::http {
namespace {

Handler named(std::string* called, std::string name) {
  return [called, name](Request&, Response&) { *called = name; };
}

TEST(Router, MatchesLiteralsAndParameters) {
  Router router;
  std::string called;
  router.add("GET", "/v1/sandboxes", named(&called, "list"));
  router.add("GET", "/v1/sandboxes/{id}/files/list", named(&called, "files"));

  auto list = router.match("GET", "/v1/sandboxes");
  ASSERT_EQ(list.kind, Router::Match::Kind::kFound);
  EXPECT_EQ(list.pattern, "/v1/sandboxes");
  EXPECT_TRUE(list.params.empty());

  auto files = router.match("GET", "/v1/sandboxes/sb-1/files/list");
  ASSERT_EQ(files.kind, Router::Match::Kind::kFound);
  EXPECT_EQ(files.pattern, "/v1/sandboxes/{id}/files/list");
  EXPECT_EQ(files.params.at("id"), "sb-1");

  EXPECT_EQ(router.match("GET", "/v1/sandboxes/").kind, Router::Match::Kind::kNotFound);
  EXPECT_EQ(router.match("GET", "/v1/sandboxes/sb-1/files").kind, Router::Match::Kind::kNotFound);
  EXPECT_EQ(router.match("GET", "/v2/sandboxes").kind, Router::Match::Kind::kNotFound);
}

TEST(Router, ParametersAreDecodedSegmentsWithoutSlashes) {
  Router router;
  std::string called;
  router.add("GET", "/files/{name}", named(&called, "file"));

  auto spaced = router.match("GET", "/files/my%20file+1");
  ASSERT_EQ(spaced.kind, Router::Match::Kind::kFound);
  EXPECT_EQ(spaced.params.at("name"), "my file+1");  // '+' is only a space in queries

  EXPECT_EQ(router.match("GET", "/files/a%2Fb").kind, Router::Match::Kind::kNotFound);
  EXPECT_EQ(router.match("GET", "/files/a/b").kind, Router::Match::Kind::kNotFound);
  EXPECT_EQ(router.match("GET", "/files/").kind, Router::Match::Kind::kNotFound);
  EXPECT_EQ(router.match("GET", "/files/%zz").kind, Router::Match::Kind::kNotFound);
}

TEST(Router, LiteralSegmentWinsOverParameter) {
  Router router;
  std::string called;
  router.add("GET", "/v1/sandboxes/{id}", named(&called, "one"));
  router.add("GET", "/v1/sandboxes/search", named(&called, "search"));

  EXPECT_EQ(router.match("GET", "/v1/sandboxes/search").pattern, "/v1/sandboxes/search");
  EXPECT_EQ(router.match("GET", "/v1/sandboxes/other").pattern, "/v1/sandboxes/{id}");
}

TEST(Router, OtherMethodOfTheSamePathIsMethodNotAllowed) {
  Router router;
  std::string called;
  router.add("POST", "/v1/sandboxes", named(&called, "create"));
  router.add("GET", "/v1/sandboxes", named(&called, "list"));
  router.add("DELETE", "/v1/sandboxes/{id}", named(&called, "delete"));

  auto match = router.match("PUT", "/v1/sandboxes");
  ASSERT_EQ(match.kind, Router::Match::Kind::kMethodNotAllowed);
  EXPECT_EQ(match.allowed, (std::vector<std::string>{"GET", "POST"}));

  // A less specific pattern with the method still serves the request.
  router.add("GET", "/v1/sandboxes/{id}", named(&called, "get"));
  router.add("POST", "/v1/sandboxes/search", named(&called, "search"));
  EXPECT_EQ(router.match("GET", "/v1/sandboxes/search").pattern, "/v1/sandboxes/{id}");
}

TEST(Router, ListsEveryRouteInOrder) {
  Router router;
  std::string called;
  router.add("POST", "/v1/sandboxes", named(&called, "a"));
  router.add("GET", "/v1/sandboxes/{id}", named(&called, "b"));
  router.add("DELETE", "/v1/sandboxes/{id}", named(&called, "c"));
  using Route = std::pair<std::string, std::string>;
  EXPECT_EQ(
      router.routes(),
      (std::vector<Route>{{"POST", "/v1/sandboxes"}, {"GET", "/v1/sandboxes/{id}"}, {"DELETE", "/v1/sandboxes/{id}"}}));
}

TEST(RouterDeathTest, RejectsDuplicatesAndMalformedPatterns) {
  Router router;
  router.add("GET", "/a/{x}", [](Request&, Response&) {});
  EXPECT_DEATH(router.add("GET", "/a/{x}", [](Request&, Response&) {}), "added twice");
  EXPECT_DEATH(router.add("GET", "no-slash", [](Request&, Response&) {}), "start with");
  EXPECT_DEATH(router.add("GET", "/a/{x}/{x}", [](Request&, Response&) {}), "used twice");
  EXPECT_DEATH(router.add("GET", "/a/x{y}", [](Request&, Response&) {}), "misplaced");
}

TEST(Url, EncodeDecodeRoundTrip) {
  std::string text = "a b/c?d=e&f+g%h~._-\xc3\xa9";
  std::string encoded = urlEncode(text);
  EXPECT_EQ(encoded, "a%20b%2Fc%3Fd%3De%26f%2Bg%25h~._-%C3%A9");
  EXPECT_EQ(urlDecode(encoded, true).value(), text);
  EXPECT_EQ(urlDecode(encoded, false).value(), text);
}

TEST(Url, PlusIsASpaceOnlyInQueries) {
  EXPECT_EQ(urlDecode("a+b", true).value(), "a b");
  EXPECT_EQ(urlDecode("a+b", false).value(), "a+b");
}

TEST(Url, MalformedEscapesAreErrors) {
  for (const char* bad : {"%", "%4", "%zz", "a%g1", "abc%"}) {
    auto decoded = urlDecode(bad, true);
    ASSERT_FALSE(decoded.ok()) << bad;
    EXPECT_EQ(decoded.error().code, ErrorCode::kInvalidArgument);
  }
}

TEST(Url, ParsesQueries) {
  auto query = parseQuery("name=a%20b&x=1+2&&x=3&flag");
  ASSERT_TRUE(query.ok());
  std::multimap<std::string, std::string> want{{"name", "a b"}, {"x", "1 2"}, {"x", "3"}, {"flag", ""}};
  EXPECT_EQ(query.value(), want);
  EXPECT_FALSE(parseQuery("a=%").ok());
}

}  // namespace
}  // namespace space::http
