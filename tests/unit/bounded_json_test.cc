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
  auto fits = parseJsonBounded(wide, JsonLimits{.max_values = 1001});
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(fits.value().size(), 1000u);
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

}  // namespace
}  // namespace space
