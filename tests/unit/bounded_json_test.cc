// parseJsonBounded: the one gate for JSON from outside the process (guest agent, QEMU, API
// clients). A document that would overflow the stack when copied or dumped must be refused.
#include "common/bounded_json.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace space {
namespace {

std::string nestedArrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(BoundedJson, RefusesTheStackOverflowDocument) {
  // 200,000 levels, ~400 KB: nlohmann parses it, then recursion in copy/dump overflows the stack.
  auto r = parseJsonBounded(nestedArrays(200000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("deeper than 64 levels"), std::string::npos) << r.error().message;
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}');
  auto deep_objects = parseJsonBounded(objects);
  ASSERT_FALSE(deep_objects.ok());
  EXPECT_NE(deep_objects.error().message.find("deeper than"), std::string::npos);
}

TEST(BoundedJson, DepthLimitIsExact) {
  auto at = parseJsonBounded(nestedArrays(64));
  ASSERT_TRUE(at.ok()) << at.error().message;
  nlohmann::json copy = at.value();  // copy and dump are what the bound protects
  EXPECT_EQ(copy.dump(), nestedArrays(64));
  EXPECT_FALSE(parseJsonBounded(nestedArrays(65)).ok());
  EXPECT_TRUE(parseJsonBounded(nestedArrays(3), JsonLimits{.max_depth = 3}).ok());
  EXPECT_FALSE(parseJsonBounded(nestedArrays(4), JsonLimits{.max_depth = 3}).ok());
  // Mixed objects and arrays count alike; brackets inside strings do not count.
  EXPECT_FALSE(parseJsonBounded(R"({"a":[{"b":[1]}]})", JsonLimits{.max_depth = 3}).ok());
  auto strings = parseJsonBounded(R"({"a":"[[[[[[[[{{{{{{"})", JsonLimits{.max_depth = 1});
  ASSERT_TRUE(strings.ok());
  EXPECT_EQ(strings.value()["a"], "[[[[[[[[{{{{{{");
}

TEST(BoundedJson, ValueLimitBoundsWideDocuments) {
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += (i ? ",[]" : "[]");
  wide += "]";
  auto refused = parseJsonBounded(wide, JsonLimits{.max_values = 500});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("more than 500 values"), std::string::npos) << refused.error().message;
  // 2001 nodes: the outer array, 1000 inner ones... and the bound counts containers as values
  // (1 + commas + opening brackets: an upper bound of the nodes the parser builds).
  EXPECT_FALSE(parseJsonBounded(wide, JsonLimits{.max_values = 2000}).ok());
  auto fits = parseJsonBounded(wide, JsonLimits{.max_values = 2001});
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(fits.value().size(), 1000u);
}

// Members nested deep cost one comma each but many nodes: the bound counts the nodes.
TEST(BoundedJson, ValueLimitCountsNestedContainers) {
  std::string member = std::string(62, '[') + std::string(62, ']');
  // 1 + 2 x 62 = 125 nodes; counted 1 + 1 comma + 125 opening brackets = 127 (an upper bound).
  // Commas alone would have said 2.
  std::string text = "[" + member + "," + member + "]";
  EXPECT_FALSE(parseJsonBounded(text, JsonLimits{.max_values = 126}).ok());
  EXPECT_TRUE(parseJsonBounded(text, JsonLimits{.max_values = 127}).ok());
}

// The bound costs linear time: wide documents of many small objects (the shape that made
// nlohmann's callback parser quadratic) and megabytes of brackets are decided in well under a
// second even under the sanitizers.
TEST(BoundedJson, LinearTimeOnWideAndDeepDocuments) {
  std::string wide = "{";
  for (int i = 0; i < 100000; ++i) wide += (i ? ",\"" : "\"") + std::to_string(i) + "\":{}";
  wide += "}";
  auto start = std::chrono::steady_clock::now();
  auto parsed = parseJsonBounded(wide);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed.value().size(), 100000u);
  auto refused = parseJsonBounded(std::string(16 << 20, '['));
  EXPECT_FALSE(refused.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(BoundedJson, OrdinaryDocumentsAndErrors) {
  auto ok = parseJsonBounded(R"({"entries":[{"name":"a","size":1},{"name":"b","size":2}],"n":null})");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok.value()["entries"][1]["name"], "b");
  EXPECT_TRUE(ok.value()["n"].is_null());
  EXPECT_TRUE(parseJsonBounded("42").ok());
  auto bad = parseJsonBounded("{\"a\":");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "not valid JSON");
  EXPECT_FALSE(parseJsonBounded("").ok());
  EXPECT_FALSE(parseJsonBounded("[1] trailing").ok());
}

// A body reader feeds the scanner as bytes arrive; its verdict must not depend on where the
// pieces split, in particular not inside a string or between a backslash and what it escapes.
TEST(BoundedJson, ScannerFedInPiecesAgreesWithTheWholeText) {
  JsonLimits limits{.max_depth = 3, .max_values = 5};
  const std::string cases[] = {
      R"(["a\"[[[[", "\"", [1]])",  // brackets and an escaped quote inside strings: depth 2
      R"([[["x"]]])",               // depth 3: at the limit
      R"([[[["x"]]]])",             // depth 4: over
      R"([1,2,3,"a,b,c"])",         // 5 values (the array and 4); the commas in the string do not count
      R"([1,2,3,4,5])",             // 6 values: over
  };
  for (const std::string& text : cases) {
    JsonBoundsScanner whole(limits);
    bool whole_ok = whole.feed(text).ok();
    for (size_t split = 0; split <= text.size(); ++split) {
      for (size_t split2 = split; split2 <= text.size(); ++split2) {
        JsonBoundsScanner pieces(limits);
        bool ok = pieces.feed(text.substr(0, split)).ok();
        ok = pieces.feed(text.substr(split, split2 - split)).ok() && ok;
        ok = pieces.feed(text.substr(split2)).ok() && ok;
        ASSERT_EQ(ok, whole_ok) << text << " split at " << split << "," << split2;
      }
    }
  }
  EXPECT_TRUE(JsonBoundsScanner(limits).feed(cases[0]).ok());
  EXPECT_TRUE(JsonBoundsScanner(limits).feed(cases[1]).ok());
  EXPECT_FALSE(JsonBoundsScanner(limits).feed(cases[2]).ok());
  EXPECT_TRUE(JsonBoundsScanner(limits).feed(cases[3]).ok());
  EXPECT_FALSE(JsonBoundsScanner(limits).feed(cases[4]).ok());

  // Once a bound is crossed, every later piece is refused too.
  JsonBoundsScanner sticky(limits);
  EXPECT_FALSE(sticky.feed("[[[[").ok());
  EXPECT_FALSE(sticky.feed("]]]]").ok());
}

}  // namespace
}  // namespace space
