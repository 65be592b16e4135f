// ApiService: the /v1 REST API of spaced over a SandboxManager. It turns HTTP requests into
// manager calls and guest commands (guest::GuestOps, through the sandbox's agent lease) and
// their results into JSON (errors: {"error":{"code","message"}} with a status that fits the
// code). Every route except /healthz needs `Authorization: Bearer
// <key>`; the key's tenant scopes everything, and another tenant's sandbox is "not found".
// docs/api.md describes the API; docs/openapi.json is its contract (a test compares the
// routes below with it).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "api/auth.h"
#include "api/console.h"
#include "api/ingress.h"
#include "api/metrics.h"
#include "api/pty_session.h"
#include "api/tenant_gate.h"
#include "api/tenant_places.h"
#include "guest/guest_ops.h"
#include "http/message.h"
#include "http/router.h"
#include "sandbox/manager.h"
#include "secrets/vault.h"

namespace space::api {

struct ApiLimits {
  size_t max_json_body = 1 << 20;  // create, timeout, file operations
  // Exec bodies (they carry stdin) and non-streamed output are held in memory, several times
  // over while being encoded: kept moderate; larger data goes through files or streams.
  // Eight concurrent ones stay within tens of MB.
  size_t max_exec_body = 4 << 20;
  size_t max_exec_output = 4 << 20;     // as JSON: escapes count
  size_t max_stream_backlog = 8 << 20;  // streamed output waiting for a slow client
  size_t max_console_bytes = 1 << 20;
  // Requests one tenant may run at once (streams included): the server's connection limits
  // are per client address, and a tenant may use many.
  size_t max_requests_per_tenant = 64;
  // Requests one tenant may start per second, sustained, and at once (a token bucket); more get
  // 429 with Retry-After. 0: no rate limit (spaced sets 100/s and 500 unless told otherwise).
  double tenant_requests_per_s = 0;
  double tenant_request_burst = 0;
  // Buckets shared with the other front ends (one rate per tenant for the daemon); null: its own,
  // at the two values above.
  std::shared_ptr<TenantRates> tenant_rates;
  // Terminal sessions open at once (each a guest process, a socket pair and its queues, no
  // thread); a tenant may hold a quarter of them, more get 429 (the node's limit: 503).
  size_t max_terminals = 1024;
};

// The served OpenAPI document (docs/openapi.json, embedded at build time).
std::string_view openApiDocument();

// The request rate of a tenant that has its own (spaced tenant quota --requests-per-s,
// --request-burst), each value it lacks taken from `fallback`; for a TenantGate.
TenantGate::RateSource tenantRateSource(sandbox::SandboxManager& manager, TenantGate::Rate fallback);

class ApiService {
 public:
  // `operator_tenant` is the node's operator: the only tenant that reads node-wide figures
  // (/metrics, the free capacity named in a refused create). Without `secrets` the /v1/secrets
  // routes answer 503.
  ApiService(sandbox::SandboxManager& manager, KeyRing& keys, ApiLimits limits = {},
             std::string operator_tenant = "default", IngressOptions ingress = {},
             secrets::SecretVault* secrets = nullptr);
  ApiService(const ApiService&) = delete;
  ApiService& operator=(const ApiService&) = delete;

  // The web console (/ui/) and its session cookies, which then stand in for a key on every
  // route; without one, /ui is an unknown route and only keys authenticate. Set before serving.
  void setConsole(Console* console);
  // Ends every terminal session (their processes are killed): after the servers stopped, before
  // the console goes, since a session asks it whether its login is still valid.
  void endTerminals() { terminals_.reset(); }

  // The server's handler: authentication, then routing.
  void handle(http::Request& request, http::Response& response);
  // Every (method, pattern) the API serves, for the OpenAPI consistency test.
  static std::vector<std::pair<std::string, std::string>> routes();

 private:
  struct Call;  // one authenticated request
  using Method = void (ApiService::*)(Call&);
  struct Route {
    const char* method;
    const char* pattern;
    Method handler;
    bool open;  // served without a key
  };
  static const std::vector<Route>& routeTable();

  void healthz(Call& c);
  void metrics(Call& c);
  void openapi(Call& c);
  void createSandbox(Call& c);
  void listSandboxes(Call& c);
  void getSandbox(Call& c);
  void deleteSandbox(Call& c);
  void setTimeout(Call& c);
  void pauseSandbox(Call& c);
  void resumeSandbox(Call& c);
  void suspendSandbox(Call& c);
  void exec(Call& c);
  void listProcesses(Call& c);
  void openPty(Call& c);
  void sandboxMetrics(Call& c);
  void attachProcess(Call& c);
  void signalProcess(Call& c);
  void processInput(Call& c);
  void downloadFile(Call& c);
  void uploadFile(Call& c);
  void removeFile(Call& c);
  void listFiles(Call& c);
  void makeDirectory(Call& c);
  void moveFile(Call& c);
  void consoleLog(Call& c);
  void getNetwork(Call& c);
  void setNetwork(Call& c);
  void networkLog(Call& c);
  void createSnapshot(Call& c);
  void listSnapshots(Call& c);
  void getSnapshot(Call& c);
  void deleteSnapshot(Call& c);
  void branchSnapshot(Call& c);
  void getQuota(Call& c);
  void listSecrets(Call& c);
  void createSecret(Call& c);
  void getSecret(Call& c);
  void putSecret(Call& c);
  void deleteSecret(Call& c);
  // Every secret the policy's credential rules name exists for the tenant (else a 400 naming it).
  Status checkCredentialSecrets(const std::string& tenant, const std::optional<net::Policy>& policy);
  // The vault, or an error for a node without one.
  Result<secrets::SecretVault*> vault();
  // Reads {"name"?, "value"} (name only where `with_name`) from a secrets request body.
  Result<std::pair<std::string, std::string>> readSecret(Call& c, bool with_name);

  // Ingress: a request for a port of a sandbox (api/ingress.h), with its own access rules.
  void serveIngress(http::Request& req, http::Response& res, const Result<IngressTarget>& found);
  // The sandbox JSON its owner gets (with its access token on a node with networking).
  nlohmann::json sandboxView(const store::SandboxRecord& record) const;

  void fail(Call& c, const Error& error);
  // A refusal the client should retry (429: its tenant's share; 503: the node's): counted by
  // `code`, and said with Retry-After (at least 1 s).
  void refuseForNow(http::Response& res, int status, const std::string& code, const std::string& message,
                    int retry_after_s = 1);
  Result<nlohmann::json> readJson(Call& c, size_t max_bytes);
  Result<sandbox::AgentLease> lease(Call& c, std::string_view operation);
  // Writes a process's events as NDJSON until it ends, overflows or the client goes away. The
  // handler waits for the first event only (an error before it is a plain error response); the
  // rest goes out on a detached stream (ProcessPump). `exec_started`: a streamed exec, whose
  // duration is observed when it ends.
  void streamProcess(Call& c, sandbox::AgentLease lease, std::unique_ptr<guest::ProcessStream> process,
                     std::optional<Clock::time_point> exec_started);
  struct ProcessPump;

  sandbox::SandboxManager& manager_;
  KeyRing& keys_;
  ApiLimits limits_;
  std::string operator_tenant_;
  IngressOptions ingress_;
  secrets::SecretVault* secrets_;
  Console* console_ = nullptr;
  TenantPlaces ingress_open_{ingress_.max_connections};  // proxied connections
  TenantPlaces ingress_waiting_{ingress_.max_waiting};   // of those, waiting for their guest's answer
  TenantGate tenant_gate_;
  Metrics metrics_;
  http::Router router_;
  TenantPlaces terminal_places_{limits_.max_terminals};  // open terminal sessions
  // Last: its sessions ask keys_ and console_ whether they may go on, until it is gone.
  std::unique_ptr<PtySessions> terminals_ = std::make_unique<PtySessions>();
};

}  // namespace space::api
