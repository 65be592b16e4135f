// E2B's control-plane REST API (what the `e2b` SDK calls at E2B_API_URL: /sandboxes,
// /v2/sandboxes, /snapshots, /templates) over the sandbox manager. It maps E2B's shapes onto
// SPACE's: an E2B-style API key (X-API-KEY) names a tenant, E2B "paused" is SPACE's suspended
// (or paused), fork is snapshot + branch, `allow_internet_access` and network.allowOut/denyOut
// become the sandbox's egress policy. Errors are E2B's {"code": <status>, "message"} bodies,
// since the SDK reads the code from the body, not the status line. A field SPACE cannot honour
// yet is a 400 naming it, never a silent success. docs/e2b.md lists the mapping.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/auth.h"
#include "api/tenant_gate.h"
#include "http/message.h"
#include "http/router.h"
#include "net/policy.h"
#include "sandbox/manager.h"
#include "secrets/vault.h"

namespace space::e2b {

// What the front end reports as envd's version: the SDK turns features on by it, and every one
// it gates is served (docs/e2b.md).
inline constexpr const char* kEnvdVersion = "0.6.13";
// E2B's deprecated clientID, required by its schema: E2B's own constant.
inline constexpr const char* kClientId = "6532622b";

struct ControlPlaneOptions {
  size_t max_json_body = 1 << 20;
  api::TenantGate::Limits tenant_gate;
  std::shared_ptr<api::TenantRates> tenant_rates;  // shared buckets (see api::ApiLimits); null: its own
  uint64_t disk_size_mb = 0;                       // what a sandbox's disk holds, as reported (diskSizeMB)
  // The ingress token key (api::accessToken): a sandbox's trafficAccessToken opens its ports
  // only. Empty (no network): trafficAccessToken is null.
  std::string traffic_token_key;
};

class ControlPlane {
 public:
  ControlPlane(sandbox::SandboxManager& manager, api::KeyRing& keys, secrets::SecretVault& vault,
               ControlPlaneOptions options);
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  void handle(http::Request& request, http::Response& response);

 private:
  struct Call;
  void createSandbox(Call& c);
  void listSandboxes(Call& c);
  void getSandbox(Call& c);
  void killSandbox(Call& c);
  void setTimeout(Call& c);
  // Every secret the policy's credential rules name exists for the tenant (400 otherwise).
  Status checkSecretsExist(const std::string& tenant, const net::Policy& policy);
  void pauseSandbox(Call& c);
  void connectSandbox(Call& c, bool legacy_resume);
  void metrics(Call& c);
  void updateNetwork(Call& c);
  void createSnapshot(Call& c);
  void listSnapshots(Call& c);
  void deleteSnapshot(Call& c);
  void forkSandbox(Call& c);

  void fail(Call& c, const Error& error);
  // E2B's Sandbox object (create, connect, fork).
  nlohmann::json sandboxJson(const store::SandboxRecord& record) const;
  // Its SandboxDetail / ListedSandbox: the Sandbox's identity plus state, sizes and times.
  nlohmann::json detailJson(const store::SandboxRecord& record, bool with_token) const;

  struct Route {
    std::string method;
    std::string pattern;
    void (*run)(ControlPlane&, Call&);
  };
  std::vector<Route> routes_;
  sandbox::SandboxManager& manager_;
  api::KeyRing& keys_;
  secrets::SecretVault& vault_;
  ControlPlaneOptions options_;
  api::TenantGate gate_;
  http::Router router_;
};

// An RFC 3339 time ("2026-12-02T08:00:00Z", fractions and a [+-]HH:MM offset allowed) as ms
// since the epoch; nullopt when malformed (E2B's startedAfter).
std::optional<int64_t> parseRfc3339Ms(const std::string& text);

// E2B's network fields as a SPACE egress policy (JSON for net::parsePolicy), built on `base`
// (the sandbox's current policy, or {} at create). `allow_internet_access` false, or a deny of
// 0.0.0.0/0, makes the listed allowOut the only way out; otherwise denyOut is denied. Errors
// name the field (including the E2B features SPACE does not have yet).
Result<nlohmann::json> e2bNetworkPolicy(nlohmann::json base, std::optional<bool> allow_internet_access,
                                        const nlohmann::json* network);

// The other way, for getInfo: the E2B `network` object ({allowOut, denyOut, allowPublicTraffic})
// and `allowInternetAccess` that describe a SPACE policy.
nlohmann::json e2bNetworkInfo(const net::Policy& policy);

}  // namespace space::e2b
