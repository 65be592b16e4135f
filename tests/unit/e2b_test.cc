// The E2B front ends' pure pieces: Connect framing, Basic users, file URL signatures, and the
// mapping of E2B's network fields onto SPACE's egress policy. The SDK itself drives the whole
// path against a real spaced in tests/e2b.
#include <gtest/gtest.h>

#include "e2b/connect.h"
#include "e2b/control_plane.h"
#include "e2b/envd_auth.h"
#include "net/policy.h"

namespace space::e2b {
namespace {

using nlohmann::json;

TEST(E2bConnect, EnvelopesRoundTripAndMalformedOnesAreRefused) {
  const std::string frame = envelope(kEnvelopeData, R"({"a":1})");
  ASSERT_EQ(frame.size(), 12u);
  EXPECT_EQ(frame[0], 0);
  EXPECT_EQ(frame.substr(1, 4), std::string("\0\0\0\x07", 4));
  EXPECT_EQ(unwrapRequestEnvelope(frame, 1024).value(), R"({"a":1})");
  EXPECT_FALSE(unwrapRequestEnvelope(frame.substr(0, 11), 1024).ok());  // truncated
  EXPECT_FALSE(unwrapRequestEnvelope(frame + "x", 1024).ok());          // bytes after it
  EXPECT_FALSE(unwrapRequestEnvelope("\x01" + frame.substr(1), 1024).ok());
  EXPECT_FALSE(unwrapRequestEnvelope(frame, 6).ok());  // over the limit
  EXPECT_FALSE(unwrapRequestEnvelope("", 1024).ok());
  // A length of 4 GiB in the header is refused by its value, not read.
  EXPECT_FALSE(unwrapRequestEnvelope(std::string("\0\xff\xff\xff\xff", 5), 1 << 20).ok());
}

TEST(E2bConnect, EndStreamCarriesTheErrorInConnectsShape) {
  EXPECT_EQ(endStream(std::nullopt), std::string("\x02\0\0\0\x02{}", 7));
  const std::string end = endStream(makeError(ErrorCode::kNotFound, "process 7 not found"));
  EXPECT_EQ(end[0], 2);
  auto body = json::parse(end.substr(5));
  EXPECT_EQ(body["error"]["code"], "not_found");
  EXPECT_EQ(body["error"]["message"], "process 7 not found");
  EXPECT_EQ(connectHttpStatus(ErrorCode::kNotFound), 404);
  EXPECT_EQ(connectHttpStatus(ErrorCode::kAlreadyExists), 409);
}

TEST(E2bConnect, BasicAuthNamesTheUser) {
  EXPECT_EQ(basicAuthUser("Basic cm9vdDo=").value().value(), "root");  // base64("root:")
  EXPECT_EQ(basicAuthUser("basic dXNlcjo=").value().value(), "user");
  EXPECT_FALSE(basicAuthUser("Bearer abc").value().has_value());
  EXPECT_FALSE(basicAuthUser("Basic !!!").ok());
  EXPECT_FALSE(basicAuthUser("Basic Og==").ok());  // ":" names nobody
}

TEST(E2bAuth, FileSignaturesMatchE2bsFormula) {
  // Reference values: "v1_" + unpadded base64 of SHA-256 of the raw string, computed apart.
  EXPECT_EQ(fileSignature("/home/user/a.txt", "read", "user", "tok", 1700000000),
            "v1_rjyaqcqTmWCotSjgdIM5sPngpduJ8ZZz/orD09SpFng");
  EXPECT_EQ(fileSignature("a.txt", "write", "", "tok", std::nullopt), "v1_/GA+OwObMH6etEE0CJuj8oBdczYFCpvdP4xFwJ/WIH8");
  EXPECT_TRUE(sameSecret("abc", "abc"));
  EXPECT_FALSE(sameSecret("abc", "abd"));
  EXPECT_FALSE(sameSecret("abc", "abcd"));
}

TEST(E2bNetwork, InternetAccessAndAllowDenyListsBecomeAnEgressPolicy) {
  auto policy = [](std::optional<bool> internet, const json& network) {
    auto j = e2bNetworkPolicy(json::object(), internet, network.is_null() ? nullptr : &network);
    EXPECT_TRUE(j.ok()) << (j.ok() ? "" : j.error().message);
    auto p = net::parsePolicy(j.ok() ? j.value() : json::object());
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
    return p.ok() ? p.value() : net::Policy{};
  };
  EXPECT_EQ(policy(false, nullptr).mode, net::EgressMode::kDeny);
  EXPECT_EQ(policy(true, nullptr).mode, net::EgressMode::kAllow);
  auto only = policy(std::nullopt, json{{"denyOut", {"0.0.0.0/0"}}, {"allowOut", {"example.com", "10.0.0.0/8"}}});
  EXPECT_EQ(only.mode, net::EgressMode::kPolicy);
  ASSERT_EQ(only.allow.size(), 2u);
  EXPECT_EQ(only.allow[0].text, "example.com");
  auto denied = policy(std::nullopt, json{{"denyOut", {"evil.example"}}});
  EXPECT_EQ(denied.mode, net::EgressMode::kAllow);
  ASSERT_EQ(denied.deny.size(), 1u);
  EXPECT_TRUE(policy(std::nullopt, json{{"allowPublicTraffic", true}}).public_ports);
  // Nothing said: the node's default stays (an empty object).
  EXPECT_EQ(e2bNetworkPolicy(json::object(), std::nullopt, nullptr).value(), json::object());
}

TEST(E2bNetwork, APolicyIsDescribedInE2bsTerms) {
  net::Policy policy;
  policy.mode = net::EgressMode::kPolicy;
  policy.allow.push_back(net::parseRule("example.com").value());
  policy.deny.push_back(net::parseRule("evil.example").value());
  auto info = e2bNetworkInfo(policy);
  EXPECT_EQ(info["allowInternetAccess"], false);
  EXPECT_EQ(info["network"]["allowOut"], json({"example.com"}));
  EXPECT_EQ(info["network"]["denyOut"], json({"0.0.0.0/0", "evil.example"}));
  // And back: the same policy.
  auto again = net::parsePolicy(e2bNetworkPolicy(json::object(), std::nullopt, &info["network"]).value()).value();
  EXPECT_EQ(again.mode, net::EgressMode::kPolicy);
  EXPECT_EQ(net::toJson(again), net::toJson(policy));
  EXPECT_EQ(e2bNetworkInfo(net::Policy{})["allowInternetAccess"], true);
}

TEST(E2bNetwork, FieldsSpaceCannotHonourAreRefusedByName) {
  for (const char* field : {"egressProxy", "maskRequestHost", "httpsPorts", "somethingNew"}) {
    json network{{field, json::object()}};
    auto j = e2bNetworkPolicy(json::object(), std::nullopt, &network);
    ASSERT_FALSE(j.ok()) << field;
    EXPECT_NE(j.error().message.find(field), std::string::npos) << j.error().message;
  }
  json bad{{"allowOut", "example.com"}};
  EXPECT_FALSE(e2bNetworkPolicy(json::object(), std::nullopt, &bad).ok());
}

TEST(E2bNetwork, HeaderTransformsBecomeCredentialRules) {
  json network = json::parse(R"({"rules": {
      "api.example.com": [{"transform": {"headers": {"A": "Bearer {{secret:a}}", "B": "{{secret:gh}}"}}}, {"transform": {"headers": {"A": "{{secret:b}}"}}}],
      "*.example.org": [{}],
      "other.example": [{"transform": null}]}})");
  auto j = e2bNetworkPolicy(json::object(), std::nullopt, &network);
  ASSERT_TRUE(j.ok()) << j.error().message;
  auto policy = net::parsePolicy(j.value());
  ASSERT_TRUE(policy.ok()) << policy.error().message;
  ASSERT_EQ(policy->credentials.size(), 1u);  // rules without a transform add nothing
  EXPECT_EQ(policy->credentials[0].host.text, "api.example.com");
  EXPECT_EQ(policy->credentials[0].headers,
            (std::vector<std::pair<std::string, std::string>>{{"A", "{{secret:b}}"}, {"B", "{{secret:gh}}"}}));
  EXPECT_FALSE(policy->credentials[0].plain_http);  // TLS only, as SPACE's rules default to
  // What the gateway cannot do is refused, naming the place.
  for (const char* bad : {R"({"h": {"transform": {}}})", R"({"h": [{"transform": {"body": "x"}}]})",
                          R"({"h": [{"match": {}}]})", R"({"h": [{"transform": {"headers": {"A": 1}}}]})",
                          R"({"h": [{"transform": {"headers": {"A": "${e2b.identity.tokens.x}"}}}]})", R"([])",
                          R"({"h": [{"transform": {"headers": {"A": "a literal value"}}}]})",
                          R"({"h": [{"transform": {"headers": {"A": "sk-live-KEY {{secret:a}}"}}}]})",
                          R"({"h": [{"transform": {"headers": {"A": "{{secret:a}} KEY"}}}]})",
                          R"({"h": [{"transform": {"headers": {"A": "{{secret:a}}KEY{{secret:b}}"}}}]})"}) {
    json n{{"rules", json::parse(bad)}};
    auto r = e2bNetworkPolicy(json::object(), std::nullopt, &n);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("network.rules"), std::string::npos) << r.error().message;
  }
  // An address is no credential host: parsePolicy says so.
  json by_address{{"rules", {{"10.0.0.1", {{{"transform", {{"headers", {{"A", "{{secret:a}}"}}}}}}}}}}};
  EXPECT_FALSE(net::parsePolicy(e2bNetworkPolicy(json::object(), std::nullopt, &by_address).value()).ok());
}

TEST(E2bControlPlane, StartedAfterTimesAreParsedStrictly) {
  EXPECT_EQ(parseRfc3339Ms("1970-01-01T00:00:01Z").value(), 1000);
  EXPECT_EQ(parseRfc3339Ms("1970-01-01T00:00:01.5Z").value(), 1500);
  EXPECT_EQ(parseRfc3339Ms("1970-01-01T01:00:00+01:00").value(), 0);
  EXPECT_EQ(parseRfc3339Ms("1970-01-01T00:00:00-00:30").value(), 1800 * 1000);
  // A short offset once made the parser step past the string's end (found under ASan).
  for (const char* bad : {"2024-01-01T00:00:00+1:2", "2024-01-01T00:00:00+01", "2024-01-01T00:00:00+24:00",
                          "2024-01-01T00:00:00", "2024-01-01T00:00:00Zjunk", "2024-01-01T00:00:00.Z", "yesterday"}) {
    EXPECT_FALSE(parseRfc3339Ms(bad)) << bad;
  }
}

}  // namespace
}  // namespace space::e2b
