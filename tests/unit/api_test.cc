// Pure parts of the API layer: strict JSON input, API keys, metrics text, and the OpenAPI
// document against the route table.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "../support/raw_http.h"
#include "api/api_service.h"
#include "api/auth.h"
#include "api/json_input.h"
#include "api/metrics.h"
#include "api/tenant_gate.h"
#include "common/fs.h"
#include "http/server.h"
#include "store/state_store.h"

namespace space::api {
namespace {

using nlohmann::json;

TEST(JsonInput, RejectsMalformedAndNonObjects) {
  EXPECT_FALSE(parseJsonBody("{\"a\":").ok());
  EXPECT_FALSE(parseJsonBody("[1,2]").ok());
  EXPECT_FALSE(parseJsonBody("\"text\"").ok());
  auto empty = parseJsonBody("  \n");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->is_object());
}

// One POST declaring a body of `bytes` bytes of `fill`, sent while the answer is read.
std::string postFlood(uint16_t port, size_t bytes, char fill) {
  std::string head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(bytes) + "\r\n\r\n";
  return testsupport::flood(port, head, std::string(64 * 1024, fill), head.size() + bytes).answer;
}

// A body nested past the bounds is refused from its first bytes, not after being buffered:
// eight concurrent 16 MiB bodies of '[' cost the server almost nothing.
TEST(JsonInput, NestedBodiesAreRefusedWhileTheyArrive) {
  auto server = http::Server::start("127.0.0.1:0", [](http::Request& request, http::Response& response) {
    auto body = readJsonBody(request, 16 << 20);
    if (!body.ok()) {
      const std::string& reason = body.error().reason;
      (void)response.sendError(400, reason.empty() ? "invalid_argument" : reason, body.error().message);
      return;
    }
    (void)response.send(200, "application/json", body->dump());
  });
  ASSERT_TRUE(server.ok()) << server.error().message;
  uint16_t port = server.value()->port();
  testsupport::resetPeakResident();
  size_t before = testsupport::peakResidentBytes();
  std::vector<std::future<std::string>> answers;
  for (int i = 0; i < 8; ++i) {
    answers.push_back(std::async(std::launch::async, [port] { return postFlood(port, 16 << 20, '['); }));
  }
  for (auto& answer : answers) {
    std::string text = answer.get();
    EXPECT_NE(text.find("HTTP/1.1 400"), std::string::npos) << text.substr(0, 300);
    EXPECT_NE(text.find("nests deeper than 32 levels"), std::string::npos) << text.substr(0, 300);
  }
  EXPECT_LT(testsupport::peakGrowth(before), size_t{100} << 20);
  // Too large is still 413-worthy and named so; an ordinary body still parses.
  auto big = postFlood(port, 17 << 20, ' ');
  EXPECT_NE(big.find("payload_too_large"), std::string::npos) << big.substr(0, 300);
}

TEST(TenantGate, CountsEachTenantsRunningRequestsAlone) {
  TenantGate gate(2);
  auto a1 = gate.enter("a");
  auto a2 = gate.enter("a");
  EXPECT_TRUE(a1.admitted());
  EXPECT_TRUE(a2.admitted());
  EXPECT_FALSE(gate.enter("a").admitted());
  EXPECT_EQ(gate.inFlight("a"), 2u);
  EXPECT_TRUE(gate.enter("b").admitted());  // another tenant is not affected (and leaves at once)
  EXPECT_EQ(gate.inFlight("b"), 0u);
  {
    auto moved = std::move(a1);
    EXPECT_FALSE(a1.admitted());  // NOLINT: a moved-from ticket holds nothing
  }
  EXPECT_EQ(gate.inFlight("a"), 1u);
  EXPECT_TRUE(gate.enter("a").admitted());
}

// A tenant with a rate of its own gets that rate; the others the gate's; the source is asked at
// most once a second per tenant (it reads the state database).
TEST(TenantGate, ATenantsOwnRateAppliesToItAlone) {
  TenantGate gate(TenantGate::Limits{64, 0, 0});  // the node: no rate limit
  int asked = 0;
  gate.setRateSource([&](const std::string& tenant) -> std::optional<TenantGate::Rate> {
    ++asked;
    if (tenant == "slow") return TenantGate::Rate{1, 2};
    return std::nullopt;
  });
  EXPECT_TRUE(gate.enter("slow").admitted());
  EXPECT_TRUE(gate.enter("slow").admitted());
  auto refused = gate.enter("slow");
  EXPECT_FALSE(refused.admitted());
  EXPECT_EQ(refused.refusal(), TenantGate::Refusal::kRateLimited);
  EXPECT_GE(refused.retryAfterS(), 1);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(gate.enter("fast").admitted()) << i;
  EXPECT_EQ(gate.rateOf("slow").rate_per_s, 1);
  EXPECT_EQ(gate.rateOf("fast").rate_per_s, 0);
  EXPECT_EQ(asked, 2) << "asked for every request, not once a second";
}

// Gates that share buckets (SPACE's API, E2B's API, envd's calls and streams) spend one rate per
// tenant: spreading requests over the front ends does not multiply it.
TEST(TenantGate, GatesThatShareBucketsSpendOneRate) {
  auto rates = std::make_shared<TenantRates>(TenantRates::Rate{5, 5});
  TenantGate api(TenantGate::Limits{64, 0, 0});
  TenantGate e2b(TenantGate::Limits{64, 0, 0});
  TenantGate envd_streams(TenantGate::Limits{1024, 0, 0});
  for (auto* gate : {&api, &e2b, &envd_streams}) gate->shareRates(rates);
  int admitted = 0;
  for (int i = 0; i < 10; ++i) {
    for (auto* gate : {&api, &e2b, &envd_streams}) admitted += gate->enter("t").admitted();
  }
  EXPECT_EQ(admitted, 5) << "a burst of 5 let " << admitted << " requests in over three front ends";
  EXPECT_TRUE(api.enter("other").admitted()) << "one tenant's requests spent another's tokens";
}

// The rate's source may read the state database: a slow read for one tenant holds up no other
// tenant's requests, nor that tenant's own beyond its first (the last rate known serves), and a
// read that fails keeps the rate known rather than the node's (which may be higher).
TEST(TenantGate, ASlowOrFailingRateReadHoldsNobodyUpAndLetsNobodyGo) {
  TenantGate gate(TenantGate::Limits{64, 100, 100});  // the node's rate: 100/s
  std::atomic<bool> slow{false}, failing{false};
  gate.setRateSource([&](const std::string& tenant) -> Result<std::optional<TenantGate::Rate>> {
    if (tenant == "throttled" && failing) return makeError(ErrorCode::kUnavailable, "database is locked");
    if (tenant == "throttled" && slow) std::this_thread::sleep_for(std::chrono::seconds(2));
    if (tenant == "throttled") return std::optional<TenantGate::Rate>(TenantGate::Rate{1, 1});
    return std::optional<TenantGate::Rate>();
  });
  EXPECT_EQ(gate.rateOf("throttled").rate_per_s, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // its rate is to be asked again
  slow = true;
  std::thread asking([&] { (void)gate.rateOf("throttled"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the slow read is under way
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(gate.enter("fast").admitted());
  EXPECT_EQ(gate.rateOf("throttled").rate_per_s, 1) << "not the last rate known";
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(500))
      << "waited for another tenant's read";
  asking.join();
  slow = false;
  failing = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(gate.rateOf("throttled").rate_per_s, 1) << "a failed read let a throttled tenant go at the node's rate";
}

TEST(JsonInput, TypesRangesAndUnknownFields) {
  json body = json::parse(R"({"cpus": 2, "memory_mb": "512", "flag": true, "extra": 1})");
  ObjectReader in(body);
  auto cpus = in.integer("cpus", 1, 64);
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(cpus.value().value(), 2);
  auto memory = in.integer("memory_mb", 1, 1024);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.error().message, "memory_mb: must be an integer in 1..1024");
  auto flag = in.boolean("flag");
  ASSERT_TRUE(flag.ok());
  auto missing = in.string("template");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing.value().has_value());
  auto done = in.finish();
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.error().message, "unknown field \"extra\"");
}

TEST(JsonInput, IntegerBounds) {
  json body = json::parse(R"({"a": 0, "b": 18446744073709551615, "c": 1.5, "d": 65})");
  ObjectReader in(body);
  EXPECT_FALSE(in.integer("a", 1, 64).ok());
  EXPECT_FALSE(in.integer("b", 1, 64).ok());
  EXPECT_FALSE(in.integer("c", 1, 64).ok());
  EXPECT_FALSE(in.integer("d", 1, 64).ok());
}

TEST(JsonInput, StringMapsAndArrays) {
  json body = json::parse(R"({"env": {"A": "1", "B": 2}, "meta": {"k": "v"}, "argv": ["ls", "-l"], "bad": ["x", 1]})");
  ObjectReader in(body);
  auto env = in.stringMap("env", 10);
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.error().message, "env.B: must be a string");
  auto meta = in.stringMap("meta", 10);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta.value()->at("k"), "v");
  EXPECT_FALSE(in.stringMap("meta", 0).ok());  // over the entry limit
  auto argv = in.stringArray("argv", 10);
  ASSERT_TRUE(argv.ok());
  EXPECT_EQ(argv.value()->size(), 2u);
  EXPECT_FALSE(in.stringArray("bad", 10).ok());
  EXPECT_TRUE(in.finish().ok());
}

TEST(JsonInput, NulBytesAndPaths) {
  json body = json{{"env", {{"A", std::string("x\0y", 3)}}}};
  ObjectReader in(body);
  EXPECT_FALSE(in.stringMap("env", 10).ok());
  EXPECT_FALSE(checkPath(std::string("/a\0b", 4), "path").ok());
  EXPECT_FALSE(checkPath(std::string(5000, 'a'), "path").ok());
  EXPECT_FALSE(checkPath("", "path").ok());
  EXPECT_TRUE(checkPath("../relative/is/the/guest's/business", "path").ok());
}

TEST(ApiKeys, GeneratedKeysAndBearerParsing) {
  std::string a = generateApiKey(), b = generateApiKey();
  // E2B's format, which E2B SDK 2.45 checks: ^e2b_[0-9a-f]+$.
  EXPECT_EQ(a.size(), 44u);
  EXPECT_EQ(a.substr(0, 4), "e2b_");
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 4), std::string::npos);
  EXPECT_NE(a, b);
  EXPECT_EQ(apiKeyDigest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(bearerToken("Bearer sk_123").value(), "sk_123");
  EXPECT_EQ(bearerToken("bearer   sk_123 ").value(), "sk_123");
  EXPECT_FALSE(bearerToken("Basic dXNlcjo=").has_value());
  EXPECT_FALSE(bearerToken("Bearer ").has_value());
  EXPECT_FALSE(bearerToken("Bearer " + std::string(300, 'k')).has_value());
}

TEST(ApiKeys, KeyRingMapsKeysToTenantsAndReloads) {
  auto dir = TempDir::create(testing::TempDir(), "keys-");
  ASSERT_TRUE(dir.ok());
  auto db = store::StateStore::open(dir->path() + "/state.db");
  ASSERT_TRUE(db.ok()) << db.error().message;
  const std::string alice = generateApiKey(), bob = generateApiKey();
  ASSERT_TRUE(db.value()->addApiKey({"alice", apiKeyDigest(alice), "", 0}).ok());
  KeyRing ring(*db.value());
  ASSERT_TRUE(ring.load().ok());
  EXPECT_EQ(ring.authenticate(alice).value_or(""), "alice");
  EXPECT_FALSE(ring.authenticate(bob).has_value());
  EXPECT_FALSE(ring.authenticate(alice.substr(0, 42)).has_value());
  // A key added later (spaced tenant add) is found without a restart, after the reload pause.
  ASSERT_TRUE(db.value()->addApiKey({"bob", apiKeyDigest(bob), "", 0}).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(ring.authenticate(bob).value_or(""), "bob");
}

// A label value cannot end its quotes or its line: a tenant named `a",x="y` stays one value.
TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(labelValue("plain-tenant_1"), "plain-tenant_1");
  EXPECT_EQ(labelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(Metrics, PrometheusText) {
  Metrics m;
  m.create_seconds.observe(0.02);
  m.create_seconds.observe(3);
  m.countError("not_found");
  m.countRequest();
  std::string text = m.render({{"space_sandboxes", {"help", {{"state=\"running\"", 2}}}}});
  EXPECT_NE(text.find("# TYPE space_sandboxes gauge\nspace_sandboxes{state=\"running\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("space_sandbox_create_seconds_bucket{le=\"0.025000000000000001\"} 1\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("space_sandbox_create_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("space_sandbox_create_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("space_api_errors_total{code=\"not_found\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("space_api_requests_total 1\n"), std::string::npos);
}

// The OpenAPI document served at /v1/openapi.json describes exactly the routes served.
TEST(OpenApi, DocumentMatchesRoutes) {
  json doc = json::parse(openApiDocument(), nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << "docs/openapi.json is not valid JSON";
  ASSERT_EQ(doc.value("openapi", "").substr(0, 2), "3.");
  std::set<std::pair<std::string, std::string>> documented, served;
  for (const auto& [path, item] : doc["paths"].items()) {
    for (const auto& [method, op] : item.items()) {
      if (method == "parameters" || method == "summary" || method == "description") continue;
      std::string upper = method;
      for (auto& ch : upper) ch = static_cast<char>(toupper(ch));
      documented.insert({upper, path});
    }
  }
  for (const auto& route : ApiService::routes()) served.insert(route);
  for (const auto& r : served) EXPECT_TRUE(documented.count(r)) << "not documented: " << r.first << " " << r.second;
  for (const auto& r : documented)
    EXPECT_TRUE(served.count(r)) << "documented, not served: " << r.first << " " << r.second;
}

}  // namespace
}  // namespace space::api
