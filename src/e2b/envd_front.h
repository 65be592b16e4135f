// The envd front end: what E2B's SDK calls at E2B_SANDBOX_URL, for every sandbox at once. It
// finds the sandbox by the E2b-Sandbox-Id header (or a "<port>-<id>.<domain>" Host), checks the
// sandbox's access token (or, for /files, a URL signed with it), and routes the call to the
// sandbox's guest agent, which serves envd's own RPCs (process.Process/*, filesystem.Filesystem/*):
// unary Connect calls go through as JSON, server streams as Connect envelopes, file transfers
// as streamed bodies. Nothing is translated but the framing between HTTP/1.1 and the agent's
// HTTP/2; what only E2B has (/health, signed URLs, multipart uploads, keepalive frames, E2B's
// 502 for a sandbox that is not running) is done here. docs/e2b.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include "api/ingress.h"
#include "api/tenant_gate.h"
#include "api/tenant_places.h"
#include "e2b/watchers.h"
#include "http/message.h"
#include "sandbox/manager.h"
#include "secrets/vault.h"

namespace space::e2b {

// envd's port inside an E2B sandbox: what the SDK names in E2b-Sandbox-Port.
inline constexpr uint16_t kEnvdPort = 49983;

struct EnvdOptions {
  // SendInput carries stdin. Parsed with the API's body bounds (32 levels, 100,000 values).
  size_t max_unary_body = 2 << 20;
  size_t max_stream_request = 64 << 10;  // the one message of a server-streaming call
  // Frames waiting for a slow client, those being written included; over it the stream ends.
  size_t max_stream_backlog = 2 << 20;
  // Per tenant. Each E2B stream (a command, a PTY, a watch) holds a connection and its backlog
  // for its life (no thread: the response is detached), so streams get a larger share than
  // calls and transfers, which hold a thread and memory instead; neither lets one tenant fill
  // the listener.
  api::TenantGate::Limits tenant_streams{1024, 0, 0};
  api::TenantGate::Limits tenant_calls{64, 0, 0};
  // Shared buckets (see api::ApiLimits): calls and stream starts both spend the tenant's tokens.
  // Null: the calls have their own, at tenant_calls' rate, and streams none.
  std::shared_ptr<api::TenantRates> tenant_rates;
  std::chrono::milliseconds unary_timeout{30000};
  // Requests for other guest ports (E2b-Sandbox-Port: N): proxied as SPACE's ingress does, with
  // its timeouts, its token (e2b-traffic-access-token) and its cap: `max_connections` for the
  // node, a quarter of it per tenant, apart from the streams' share.
  api::IngressOptions ports;
  WatcherLimits watchers;
};

// Stream steps and stream callbacks hold a raw `this`: the front must outlive the HTTP server
// that serves it (whose stop waits for every stream step) and the sandboxes' agent clients
// (whose stream callbacks run on their I/O threads), as spaced's declaration order ensures.
class EnvdFront {
 public:
  EnvdFront(sandbox::SandboxManager& manager, secrets::SecretVault& vault, EnvdOptions options);
  EnvdFront(const EnvdFront&) = delete;
  EnvdFront& operator=(const EnvdFront&) = delete;

  void handle(http::Request& request, http::Response& response);

 private:
  struct Call;
  void unary(Call& c, const std::string& method);
  void stream(Call& c, const std::string& method);
  // CreateWatcher, GetWatcherEvents, RemoveWatcher: served here from a held WatchDir stream.
  void watcher(Call& c, const std::string& method);
  void download(Call& c);
  void upload(Call& c);
  // A request for another port of the guest (a preview, Jupyter on 49999): relayed as it came.
  void proxyPort(Call& c, uint16_t port);
  // A call that could not reach the guest: E2B's 502 when the sandbox is gone, else `error`.
  void agentError(Call& c, const sandbox::AgentLease& lease, const Error& error, bool connect_shape);
  // Which sandbox a signed /files URL is for, when the request does not say: the one whose
  // token signs it (tokens of live sandboxes are kept, so the scan costs a hash each).
  std::string sandboxForSignature(http::Request& req, const std::string& operation);

  sandbox::SandboxManager& manager_;
  secrets::SecretVault& vault_;
  EnvdOptions options_;
  api::TenantGate streams_;
  api::TenantGate calls_;
  api::TenantGate ports_;
  api::TenantGate signed_files_;       // requests by signed file URL: their own bucket (see handle)
  std::atomic<size_t> ports_open_{0};  // proxied connections of the whole node
  // Of those, the ones waiting for their guest's answer (each holds a server thread).
  api::TenantPlaces ports_waiting_{options_.ports.max_waiting};
  WatcherTable watchers_;
  std::mutex tokens_mu_;
  std::map<std::string, std::string> tokens_;  // guarded by tokens_mu_: live sandbox id -> token
};

}  // namespace space::e2b
