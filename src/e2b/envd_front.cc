#include "e2b/envd_front.h"

#include <spdlog/spdlog.h>
#include <strings.h>

#include <algorithm>
#include <mutex>

#include "api/api_service.h"
#include "api/json_input.h"
#include "api/json_output.h"
#include "common/bounded_json.h"
#include "e2b/connect.h"
#include "e2b/envd_auth.h"
#include "guest/guest_ops.h"
#include "http/byte_range.h"
#include "http/gunzip.h"
#include "http/multipart.h"
#include "sandbox/lifecycle.h"

namespace space::e2b {

using api::dumpJson;
using nlohmann::json;

namespace {

constexpr const char* kUnauthorized =
    "unauthorized access, please provide a valid access token or method signing if supported";

// The RPCs the SDK calls; anything else is Connect's unimplemented, never forwarded.
bool isUnaryMethod(const std::string& m) {
  return m == "/process.Process/List" || m == "/process.Process/SendInput" || m == "/process.Process/CloseStdin" ||
         m == "/process.Process/SendSignal" || m == "/process.Process/Update" || m == "/filesystem.Filesystem/Stat" ||
         m == "/filesystem.Filesystem/ListDir" || m == "/filesystem.Filesystem/MakeDir" ||
         m == "/filesystem.Filesystem/Move" || m == "/filesystem.Filesystem/Remove";
}
bool isWatcherMethod(const std::string& m) {
  return m == "/filesystem.Filesystem/CreateWatcher" || m == "/filesystem.Filesystem/GetWatcherEvents" ||
         m == "/filesystem.Filesystem/RemoveWatcher";
}
bool isStreamMethod(const std::string& m) {
  return m == "/process.Process/Start" || m == "/process.Process/Connect" || m == "/filesystem.Filesystem/WatchDir";
}

Status sendJsonError(http::Response& res, int status, const std::string& message) {
  return res.send(status, "application/json", dumpJson(json{{"code", status}, {"message", message}}));
}

// E2B's answer for a sandbox that is not running: the SDK reads 502 as "not running any more".
Status sendNotRunning(http::Response& res, const std::string& id) {
  return res.send(502, "application/json",
                  dumpJson(json{{"sandboxId", id}, {"message", "The sandbox was not found"}, {"code", 502}}));
}

// A suspended sandbox that a request may wake (the manager resumes it when the call takes its
// agent or a port): one made with autoResume, or one SPACE suspended for idleness, which an E2B
// user never asked for. One the user paused stays paused, as E2B's do.
bool resumesOnDemand(const store::SandboxRecord& rec) {
  return rec.state == sandbox::stateName(sandbox::SandboxState::kSuspended) &&
         (rec.auto_resume || sandbox::suspendedForIdleness(rec));
}

bool contentTypeIs(const std::optional<std::string>& header, std::string_view want) {
  if (!header) return false;
  std::string_view v = *header;
  v = v.substr(0, v.find(';'));
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (v.size() != want.size()) return false;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(v[i])) != want[i]) return false;
  }
  return true;
}

std::optional<int64_t> parseInt(const std::string& s, int64_t min, int64_t max) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  int64_t v = std::stoll(s);
  if (v < min || v > max) return std::nullopt;
  return v;
}

int fileErrorStatus(const Error& e) {
  switch (e.code) {
    case ErrorCode::kNotFound: return 404;
    case ErrorCode::kInvalidArgument: return 400;
    case ErrorCode::kPermissionDenied: return 403;
    case ErrorCode::kResourceExhausted: return 507;
    case ErrorCode::kAlreadyExists: return 409;
    case ErrorCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

// What a stream's agent callbacks hand to the thread writing the HTTP response.
// A unary Connect call's request: a JSON object within `max_bytes`, bounded while it arrives
// (depth, values) as the REST API's bodies are. Errors are the call's answer.
Result<json> readUnaryRequest(http::Request& req, size_t max_bytes) {
  if (!contentTypeIs(req.header("content-type"), "application/json")) {
    return makeError(ErrorCode::kInvalidArgument, "unary calls take Content-Type: application/json");
  }
  auto message = api::readJsonBody(req, max_bytes);
  if (!message.ok()) return makeError(ErrorCode::kInvalidArgument, "request body: " + message.error().message);
  if (!message->is_object()) return makeError(ErrorCode::kInvalidArgument, "the request is not a JSON object");
  return message;
}

}  // namespace

struct EnvdFront::Call {
  http::Request& req;
  http::Response& res;
  std::string id;
  std::string tenant;
  std::string user;         // "" = the sandbox's default user
  bool may_resume = false;  // a suspended sandbox is woken for this request (resumesOnDemand)
  // The tenant's place for this request: a stream that outlives its handler takes it along.
  api::TenantGate::Ticket* ticket = nullptr;
};

EnvdFront::EnvdFront(sandbox::SandboxManager& manager, secrets::SecretVault& vault, EnvdOptions options)
    : manager_(manager),
      vault_(vault),
      options_(options),
      streams_(options.tenant_streams),
      calls_(options.tenant_calls),
      ports_(api::TenantGate::Limits{std::max<size_t>(1, options.ports.max_connections / 4), 0, 0}),
      signed_files_(options.tenant_calls),
      watchers_(options.watchers) {
  signed_files_.setRateSource(
      api::tenantRateSource(manager_, {options.tenant_calls.rate_per_s, options.tenant_calls.burst}));
  if (options.tenant_rates) {
    calls_.shareRates(options.tenant_rates);
    streams_.shareRates(options.tenant_rates);
  } else {
    calls_.setRateSource(
        api::tenantRateSource(manager_, {options.tenant_calls.rate_per_s, options.tenant_calls.burst}));
  }
}

std::string EnvdFront::sandboxForSignature(http::Request& req, const std::string& operation) {
  auto signature = req.query("signature");
  if (!signature) return "";
  std::optional<int64_t> expiration;
  if (auto exp = req.query("signature_expiration")) expiration = parseInt(*exp, 0, INT64_MAX / 2);
  const std::string path = req.query("path").value_or("");
  const std::string user = req.query("username").value_or("");
  std::map<std::string, std::string> live;
  {
    std::lock_guard lock(tokens_mu_);
    for (const auto& [id, tenant] : manager_.liveSandboxes()) {
      auto it = tokens_.find(id);
      live.emplace(id, it != tokens_.end() ? it->second : vault_.envdAccessToken(id));
    }
    tokens_ = live;  // ended sandboxes' tokens go
  }
  std::string found;
  for (const auto& [id, token] : live) {
    // Every candidate is hashed, so the time says nothing about which one matched.
    if (sameSecret(fileSignature(path, operation, user, token, expiration), *signature)) found = id;
  }
  return found;
}

void EnvdFront::handle(http::Request& req, http::Response& res) {
  const bool files = req.path() == "/files";
  const std::string file_op = req.method() == "GET" ? "read" : "write";
  // Which sandbox, which port: E2B's headers, else a "<port>-<id>.<domain>" host.
  std::string id = req.header("e2b-sandbox-id").value_or("");
  uint16_t port = kEnvdPort;
  if (auto p = req.header("e2b-sandbox-port")) {
    auto parsed = parseInt(*p, 1, 65535);
    if (!parsed) {
      res.closeConnection();
      (void)sendJsonError(res, 400, "E2b-Sandbox-Port: not a port number");
      return;
    }
    port = static_cast<uint16_t>(*parsed);
  }
  if (id.empty()) {
    std::string host = req.header("host").value_or("");
    auto dash = host.find('-');
    auto dot = host.find('.');
    if (dash != std::string::npos && dot != std::string::npos && dash < dot) {
      if (auto parsed = parseInt(host.substr(0, dash), 1, 65535)) {
        port = static_cast<uint16_t>(*parsed);
        id = host.substr(dash + 1, dot - dash - 1);
      }
    }
  }
  if (id.empty() && files) id = sandboxForSignature(req, file_op);
  if (id.empty()) {
    res.closeConnection();
    (void)sendJsonError(res, 400, "which sandbox? send the E2b-Sandbox-Id header");
    return;
  }
  auto tenant = manager_.ownerOf(id);
  if (!tenant.ok()) {
    res.closeConnection();
    (void)sendNotRunning(res, id);
    return;
  }
  // The token, before anything that says more about the sandbox than "not running".
  const std::string token = vault_.envdAccessToken(id);
  auto presented = req.header("x-access-token");
  const bool health = req.path() == "/health" && port == kEnvdPort;
  bool authorized = presented && sameSecret(*presented, token);
  // Whether the sandbox's own credentials (its envd token, or a URL signed with it) came: only
  // they wake a sandbox SPACE suspended for idleness; a traffic token or public ports wake one
  // whose owner asked for that (autoResume), as E2B's traffic does.
  bool owner_credentials = authorized;
  bool signed_url = false;  // authorized by a signed file URL (handed out, to browsers perhaps)
  if (presented && !authorized) {
    res.closeConnection();
    (void)sendJsonError(res, 401, kUnauthorized);
    return;
  }
  // Another port may also be reached with E2B's traffic token, which opens ports and nothing
  // else (SPACE's ingress token for the sandbox).
  if (!authorized && port != kEnvdPort) {
    if (auto traffic = req.header("e2b-traffic-access-token")) {
      if (options_.ports.token_key.empty() || !api::accessTokenMatches(options_.ports.token_key, id, *traffic)) {
        res.closeConnection();
        (void)sendJsonError(res, 401, kUnauthorized);
        return;
      }
      authorized = true;
    }
  }
  if (!authorized && port != kEnvdPort) {
    // A sandbox made with public traffic serves its ports to anyone, as E2B's do.
    auto policy = manager_.networkPolicy(tenant.value(), id);
    authorized = policy.ok() && policy->public_ports;
  }
  if (!authorized && files && port == kEnvdPort) {
    auto signature = req.query("signature");
    std::optional<int64_t> expiration;
    if (auto exp = req.query("signature_expiration")) {
      expiration = parseInt(*exp, 0, INT64_MAX / 2);
      if (!expiration) {
        res.closeConnection();
        (void)sendJsonError(res, 400, "signature_expiration: not a unix time");
        return;
      }
    }
    if (signature && sameSecret(fileSignature(req.query("path").value_or(""), file_op,
                                              req.query("username").value_or(""), token, expiration),
                                *signature)) {
      const int64_t now_s =
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
      if (expiration && *expiration < now_s) {
        res.closeConnection();
        (void)sendJsonError(res, 401, "signature is already expired");
        return;
      }
      authorized = true;
      owner_credentials = true;
      signed_url = true;
    }
  }
  if (!authorized && !health) {
    res.closeConnection();
    (void)sendJsonError(res, 401, kUnauthorized);
    return;
  }
  if (!authorized) res.closeConnection();  // an unauthenticated /health keeps no connection
  auto rec = manager_.get(tenant.value(), id);
  const bool may_resume =
      rec.ok() && (owner_credentials ? resumesOnDemand(*rec) : rec->auto_resume && resumesOnDemand(*rec));
  if (!rec.ok() || (rec->state != sandbox::stateName(sandbox::SandboxState::kRunning) && !may_resume)) {
    (void)sendNotRunning(res, id);
    return;
  }
  if (health) {
    (void)res.send(204, "", "");
    return;
  }
  // Each kind of request has its own share per tenant: a sandbox's visitors (ports, perhaps
  // anonymous) cannot use up its owner's streams, nor streams the calls.
  const bool is_port = port != kEnvdPort;
  const bool is_stream = !is_port && !files && isStreamMethod(req.path());
  // Signed file URLs are handed out (to browsers, perhaps without an expiry): whoever holds one
  // spends a bucket of their own, never the tenant's, so they cannot lock its API out.
  api::TenantGate& gate = is_port ? ports_ : signed_url ? signed_files_ : is_stream ? streams_ : calls_;
  auto ticket = gate.enter(tenant.value());
  if (!ticket.admitted()) {
    // A refusal keeps no connection (and its server thread) for the next request to reuse.
    res.closeConnection();
    const int retry_s = std::max(1, ticket.retryAfterS());
    res.setHeader("Retry-After", std::to_string(retry_s));
    (void)sendJsonError(res, 429,
                        ticket.refusal() == api::TenantGate::Refusal::kRateLimited
                            ? "this tenant is over its rate of " +
                                  fmt::format("{:g}", gate.rateOf(tenant.value()).rate_per_s) +
                                  " requests per second; retry after " + std::to_string(retry_s) + " s"
                            : "this tenant already has " + std::to_string(gate.maxInFlight()) +
                                  (is_port     ? " connections to its sandboxes' ports"
                                   : is_stream ? " envd streams"
                                               : " envd calls") +
                                  " open; retry when one has finished");
    return;
  }
  Call call{req, res, id, tenant.value(), "", may_resume, &ticket};
  if (port != kEnvdPort) return proxyPort(call, port);
  if (files) {
    auto user = req.query("username");
    // ':' separates the signed fields: a name holding one could make one signature mean another.
    if (user && (user->size() > 64 || std::any_of(user->begin(), user->end(), [](char ch) {
                   return ch == ':' || static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
                 }))) {
      (void)sendJsonError(res, 400, "username: must be a user name of at most 64 bytes, without ':'");
      return;
    }
    call.user = user.value_or("");
    if (req.method() == "GET") return download(call);
    if (req.method() == "POST") return upload(call);
    (void)sendJsonError(res, 405, "/files takes GET or POST");
    return;
  }
  if (req.method() != "POST" ||
      (!isUnaryMethod(req.path()) && !isStreamMethod(req.path()) && !isWatcherMethod(req.path()))) {
    (void)res.send(
        404, "application/json",
        dumpJson(connectError(makeError(ErrorCode::kUnimplemented,
                                        req.method() + " " + req.path() + " is not an envd call SPACE serves"))));
    return;
  }
  if (auto auth = req.header("authorization")) {
    auto user = basicAuthUser(*auth);
    if (!user.ok()) {
      (void)res.send(400, "application/json", dumpJson(connectError(user.error())));
      return;
    }
    call.user = user.value().value_or("");
  }
  if (isStreamMethod(req.path())) return stream(call, req.path());
  if (isWatcherMethod(req.path())) return watcher(call, req.path());
  return unary(call, req.path());
}

void EnvdFront::agentError(Call& c, const sandbox::AgentLease& lease, const Error& error, bool connect_shape) {
  Error e = manager_.agentFailed(lease, error);
  if (e.code == ErrorCode::kUnavailable) {
    auto rec = manager_.get(c.tenant, c.id);
    if (!rec.ok() || rec->state != sandbox::stateName(sandbox::SandboxState::kRunning)) {
      (void)sendNotRunning(c.res, c.id);
      return;
    }
  }
  if (connect_shape) {
    (void)c.res.send(connectHttpStatus(e.code), "application/json", dumpJson(connectError(e)));
  } else {
    (void)sendJsonError(c.res, fileErrorStatus(e), e.message);
  }
}

void EnvdFront::unary(Call& c, const std::string& method) {
  auto connect_error = [&](const Error& e) {
    (void)c.res.send(connectHttpStatus(e.code), "application/json", dumpJson(connectError(e)));
  };
  auto message = readUnaryRequest(c.req, options_.max_unary_body);
  if (!message.ok()) return connect_error(message.error());
  auto lease = manager_.agent(c.tenant, c.id, "run envd calls");
  if (!lease.ok()) return connect_error(lease.error());
  agentproto::CallOptions options;
  options.timeout = options_.unary_timeout;
  options.user = c.user;
  auto answer = lease->agent->call(method, message.value(), options);
  if (!answer.ok()) return agentError(c, lease.value(), answer.error(), true);
  (void)c.res.send(200, "application/json", dumpJson(answer.value()));
}

void EnvdFront::watcher(Call& c, const std::string& method) {
  auto connect_error = [&](const Error& e) {
    (void)c.res.send(connectHttpStatus(e.code), "application/json", dumpJson(connectError(e)));
  };
  auto message = readUnaryRequest(c.req, options_.max_stream_request);
  if (!message.ok()) return connect_error(message.error());
  if (method == "/filesystem.Filesystem/CreateWatcher") {
    auto lease = manager_.agent(c.tenant, c.id, "watch files");
    if (!lease.ok()) return connect_error(lease.error());
    agentproto::CallOptions options;
    options.timeout = std::chrono::milliseconds(0);  // until removed
    options.user = c.user;
    auto id = watchers_.create(c.tenant, c.id, *lease->agent, message.value(), options, options_.unary_timeout);
    if (!id.ok()) return agentError(c, lease.value(), id.error(), true);
    (void)c.res.send(200, "application/json", dumpJson(json{{"watcherId", id.value()}}));
    return;
  }
  // envd's JSON names it watcherId; its parser takes the proto name too.
  std::string id;
  for (const char* key : {"watcherId", "watcher_id"}) {
    if (auto it = message->find(key); it != message->end() && it->is_string()) id = it->get<std::string>();
  }
  if (id.empty()) return connect_error(makeError(ErrorCode::kInvalidArgument, "watcherId: required"));
  if (method == "/filesystem.Filesystem/GetWatcherEvents") {
    auto events = watchers_.events(c.tenant, c.id, id);
    if (!events.ok()) return connect_error(events.error());
    (void)c.res.send(200, "application/json", "{\"events\":" + events.value() + "}");
    return;
  }
  if (auto removed = watchers_.remove(c.tenant, c.id, id); !removed.ok()) return connect_error(removed.error());
  (void)c.res.send(200, "application/json", "{}");
}

void EnvdFront::stream(Call& c, const std::string& method) {
  // Errors of a stream go out as HTTP 200 with an EndStream envelope: the SDK keeps their code.
  auto end_with = [&](const std::optional<Error>& e) {
    if (!c.res.started() && !c.res.begin(200, "application/connect+json").ok()) return;
    if (c.res.write(endStream(e)).ok()) (void)c.res.end();
  };
  if (!contentTypeIs(c.req.header("content-type"), "application/connect+json")) {
    (void)c.res.send(415, "application/json",
                     dumpJson(connectError(makeError(ErrorCode::kInvalidArgument,
                                                     "streaming calls take Content-Type: application/connect+json"))));
    return;
  }
  agentproto::CallOptions options;
  options.user = c.user;
  // The client's deadline: for Start, envd makes it the process's lifetime; absent, none.
  options.timeout = std::chrono::milliseconds(0);
  if (auto deadline = c.req.header("connect-timeout-ms")) {
    auto ms = parseInt(*deadline, 0, int64_t{1} << 40);
    if (!ms) return end_with(makeError(ErrorCode::kInvalidArgument, "Connect-Timeout-Ms: not a number of ms"));
    options.timeout = std::chrono::milliseconds(*ms);
    options.local_grace = std::chrono::seconds(5);
  }
  std::chrono::seconds keepalive(90);  // envd's default when the client names none
  if (auto interval = c.req.header("keepalive-ping-interval")) {
    auto s = parseInt(*interval, 1, 3600);
    if (s) keepalive = std::chrono::seconds(*s);
  }
  const std::string keepalive_frame =
      envelope(kEnvelopeData,
               method == "/filesystem.Filesystem/WatchDir" ? R"({"keepalive":{}})" : R"({"event":{"keepalive":{}}})");

  auto lease = manager_.agent(c.tenant, c.id, "run envd calls");
  if (!lease.ok()) return end_with(lease.error());
  json message;
  {
    // The request is needed only to start the call: it is not kept for the stream's life.
    auto body = c.req.readBody(options_.max_stream_request + 5);
    if (!body.ok()) return end_with(makeError(ErrorCode::kInvalidArgument, "request body: " + body.error().message));
    auto payload = unwrapRequestEnvelope(body.value(), options_.max_stream_request);
    if (!payload.ok()) return end_with(payload.error());
    auto parsed = parseJsonBounded(payload.value(), JsonLimits{.max_depth = 32, .max_values = 10000});
    if (!parsed.ok() || !parsed->is_object()) {
      return end_with(makeError(ErrorCode::kInvalidArgument, "the request is not a JSON object"));
    }
    message = std::move(parsed.value());
  }
  // The stream runs on without this thread: the server's event loop writes what the agent
  // client's I/O thread relays, so a command, terminal or watch that lasts a day holds no thread.
  auto detached = c.res.detach(200, "application/connect+json");
  if (!detached.ok()) {
    if (!c.res.started()) {
      c.res.setHeader("Retry-After", "1");
      (void)c.res.send(connectHttpStatus(detached.error().code), "application/json",
                       dumpJson(connectError(detached.error())));
    }
    return;
  }
  std::shared_ptr<http::ResponseStream> out = std::move(detached.value());
  out->keepAlive(keepalive, keepalive_frame);
  // Every tenant may call from one address (loopback, a proxy): steps are shared per tenant.
  out->shareStepsWith("tenant " + c.tenant);
  auto held = std::make_shared<sandbox::AgentLease>(std::move(lease.value()));
  // The stream keeps its place among the tenant's streams until it closes.
  auto place = std::make_shared<api::TenantGate::Ticket>(std::move(*c.ticket));
  const size_t max_backlog = options_.max_stream_backlog;
  // Callbacks run on the agent client's I/O thread and never block: writes only queue. The
  // guest's messages are relayed as it framed them: never parsed or re-encoded here (the client
  // is the sandbox's own tenant, and the framing and sizes are checked by the decoder).
  auto handle = held->agent->streamRaw(
      method, message, options,
      [out, max_backlog, over = false](std::string_view payload) mutable {
        // Once over (the guest stream is canceled when the response closes), what still comes
        // is dropped unread: a flooding guest costs no copies meanwhile.
        if (over) return;
        // What waits for the client, queued or being written, is bounded: a client slower than
        // the process loses the stream, not the node's memory. end() refuses later writes.
        if (out->pending() + payload.size() + 5 > max_backlog) {
          over = true;
          if (out->write(endStream(
                  makeError(ErrorCode::kResourceExhausted,
                            "more than " + std::to_string(max_backlog) +
                                " bytes of output waited for this client (or one message was larger); the stream "
                                "ended, the process goes on (connect to it again)")))) {
            out->end();
          }
          return;
        }
        if (!out->write(envelope(kEnvelopeData, payload))) over = true;
      },
      // Owns nothing of the sandbox's (no lease): a callback may be destroyed on the I/O thread,
      // which must never drop the last reference to its own client.
      // Holds the tenant's place weakly: the callback may outlive this front (and its gate).
      [this, out, tenant = c.tenant, id = c.id, weak_place = std::weak_ptr(place)](const Status& end) {
        if (end.ok()) {
          if (out->write(endStream(std::nullopt))) out->end();
          return;
        }
        // Which error the client hears depends on the sandbox's state: a step that may block.
        Error error = end.error();
        // The step keeps the stream's place among the tenant's streams until it returns (while
        // the stream is open, its onClose holds the place, so it is there to take).
        bool ran = out->runBlocking([this, out, tenant, id, error, place = weak_place.lock()] {
          (void)place;
          Error e = manager_.agentFailed(sandbox::AgentLease{id, nullptr, false, nullptr}, error);
          if (e.code == ErrorCode::kUnavailable) {
            auto rec = manager_.get(tenant, id);
            // The sandbox is gone: the connection is cut, so the SDK asks /health and says so.
            if (!rec.ok() || rec->state != sandbox::stateName(sandbox::SandboxState::kRunning)) return out->abort();
          }
          if (out->write(endStream(e))) out->end();
        });
        if (!ran) out->abort();  // the client left, or the server is stopping
      });
  // However the stream ends (its end, a client gone, a slow client, the server stopping), the
  // guest stops streaming to it; the sandbox counts as active (the lease) until then.
  out->onClose([handle, held, place](bool) {
    (void)held;  // released with this callback, on the event loop
    (void)place;
    if (!handle->done()) handle->cancel();
  });
}

void EnvdFront::proxyPort(Call& c, uint16_t port) {
  // The node's share of proxied connections, apart from every tenant's, for as long as the
  // connection lasts (the relay on the server's event loop holds it).
  struct Place {
    explicit Place(std::atomic<size_t>& o) : open(o), now(++o) {}
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;
    ~Place() { --open; }
    std::atomic<size_t>& open;
    const size_t now;  // with this one
  };
  auto place = std::make_shared<Place>(ports_open_);
  if (place->now > options_.ports.max_connections) {
    c.res.setHeader("Retry-After", "1");
    (void)sendJsonError(c.res, 503,
                        "this node proxies " + std::to_string(options_.ports.max_connections) +
                            " connections to sandbox ports already; retry later");
    return;
  }
  api::TenantPlaces::Refusal refusal;
  std::shared_ptr<void> waiting = ports_waiting_.enter(c.tenant, refusal);
  if (!waiting) {
    c.res.setHeader("Retry-After", "1");
    (void)sendJsonError(c.res, refusal.over_node ? 503 : 429,
                        refusal.over_node
                            ? "this node has " + std::to_string(ports_waiting_.nodeCap()) +
                                  " proxied connections waiting for their guests' answers; retry later"
                            : "this tenant's sandboxes hold their share of this node's "
                              "proxied connections waiting for their guests' answers; retry when one has answered");
    return;
  }
  // The guest's own server gets the request as the client sent it (its Authorization too, which
  // may be the app's own), less the access token, which opens the sandbox's envd.
  api::IngressTarget target;
  target.sandbox_id = c.id;
  target.port = port;
  target.target = c.req.target();
  target.strip_headers = {"x-access-token", "e2b-traffic-access-token", "x-api-key"};
  auto connection = manager_.connectPort(c.tenant, c.id, port, Clock::now() + std::chrono::seconds(5), c.may_resume);
  if (!connection.ok()) {
    const Error& e = connection.error();
    int status = 502;  // nothing listens there, the guest went away
    if (e.code == ErrorCode::kResourceExhausted) {
      status = 503;  // the sandbox's own cap of guest connections
      c.res.setHeader("Retry-After", "1");
    } else if (e.code == ErrorCode::kFailedPrecondition) {
      status = 409;  // no network, no NIC, not running
    }
    (void)sendJsonError(c.res, status, "port " + std::to_string(port) + ": " + e.message);
    return;
  }
  // The node's place, the tenant's (its gate's ticket) and the guest's socket go with the relay's
  // end, not with this handler.
  struct Held {
    std::shared_ptr<Place> place;
    api::TenantGate::Ticket ticket;
    sandbox::PortConnection connection;
  };
  auto held = std::make_shared<Held>(Held{std::move(place), std::move(*c.ticket), std::move(connection).value()});
  const int guest = held->connection.connection.fd();
  api::proxyToGuest(c.req, c.res, guest, std::move(held), std::move(waiting), target, false, options_.ports);
}

void EnvdFront::download(Call& c) {
  auto path = c.req.query("path");
  if (!path || path->empty()) {
    (void)sendJsonError(c.res, 400, "path: required");
    return;
  }
  auto lease = manager_.agent(c.tenant, c.id, "read files");
  if (!lease.ok()) {
    (void)sendJsonError(c.res, fileErrorStatus(lease.error()), lease.error().message);
    return;
  }
  guest::GuestOps ops(lease->agent);
  // Range, as envd's http.ServeContent serves it: one range, against the size the file has now.
  // (If it changes before the bytes are read, the guest refuses an offset past the end, and a
  // body that comes up short is cut off rather than ended as if complete.)
  int status = 200;
  std::optional<std::pair<uint64_t, uint64_t>> range;
  std::string content_range;  // set on the answer only once the bytes come (an error has none)
  if (auto header = c.req.header("range")) {
    auto entry = ops.stat(*path, c.user);
    if (!entry.ok()) return agentError(c, lease.value(), entry.error(), false);
    // Not a file (a directory): the download below gives the error envd gives.
    auto wanted =
        entry->type == guest::FileType::kDirectory ? http::ByteRange{} : http::parseByteRange(*header, entry->size);
    if (wanted.kind == http::ByteRange::Kind::kUnsatisfiable) {
      c.res.setHeader("Content-Range", "bytes */" + std::to_string(entry->size));
      (void)sendJsonError(c.res, 416, "Range: not satisfiable for a file of " + std::to_string(entry->size) + " bytes");
      return;
    }
    if (wanted.kind == http::ByteRange::Kind::kPartial) {
      status = 206;
      range.emplace(wanted.first, wanted.length());
      content_range = "bytes " + std::to_string(wanted.first) + "-" + std::to_string(wanted.last) + "/" +
                      std::to_string(entry->size);
    }
  }
  auto setSuccessHeaders = [&] {
    c.res.setHeader("Accept-Ranges", "bytes");
    if (!content_range.empty()) c.res.setHeader("Content-Range", content_range);
  };
  bool client_gone = false;
  uint64_t sent = 0;
  auto done = ops.download(
      *path,
      [&](std::string_view chunk) -> Status {
        // Never more than was asked for, whatever the guest sends.
        if (range && sent + chunk.size() > range->second) {
          return makeError(ErrorCode::kUnavailable, "the guest sent more than the range asked for");
        }
        if (!c.res.started()) {
          setSuccessHeaders();
          if (!c.res.begin(status, "application/octet-stream").ok()) client_gone = true;
        }
        if (client_gone || !c.res.write(chunk).ok()) {
          client_gone = true;
          return makeError(ErrorCode::kCanceled, "the client went away");
        }
        sent += chunk.size();
        return okStatus();
      },
      c.user, range);
  if (!done.ok()) {
    if (client_gone || c.res.started()) return;
    return agentError(c, lease.value(), done.error(), false);
  }
  if (range && sent != range->second) return;  // short: the file shrank; never end it as whole
  if (!c.res.started()) {
    setSuccessHeaders();
    (void)c.res.send(status, "application/octet-stream", "");
    return;
  }
  (void)c.res.end();
}

void EnvdFront::upload(Call& c) {
  // X-Metadata-<key>: the key lower-cased, the first of repeated ones (envd's rules; the guest
  // checks sizes and characters and refuses with a 400).
  std::map<std::string, std::string> metadata;
  for (const auto& [name, value] : c.req.headers()) {
    if (name.size() > 11 && strncasecmp(name.c_str(), "x-metadata-", 11) == 0) {
      std::string key = name.substr(11);
      for (char& ch : key) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      metadata.emplace(std::move(key), value);
    }
  }
  // The SDK's gzip uploads: the body is decompressed as it is read (GunzipReader).
  bool gzipped = false;
  if (auto encoding = c.req.header("content-encoding"); encoding && *encoding != "identity") {
    if (strcasecmp(encoding->c_str(), "gzip") != 0) {
      (void)sendJsonError(c.res, 400, "Content-Encoding " + *encoding + ": only gzip is taken for uploads");
      return;
    }
    gzipped = true;
  }
  const auto query_path = c.req.query("path");
  auto lease = manager_.agent(c.tenant, c.id, "write files");
  if (!lease.ok()) {
    (void)sendJsonError(c.res, fileErrorStatus(lease.error()), lease.error().message);
    return;
  }
  guest::GuestOps ops(lease->agent);
  json written = json::array();
  std::optional<Error> body_error;
  // The guest names the absolute path it wrote; taken only within PATH_MAX, so a hostile guest
  // cannot make a tiny upload's answer huge (else the path as the client gave it).
  auto entryOf = [&metadata](const guest::FileEntry& e, const std::string& requested) {
    std::string path = e.path && !e.path->empty() && e.path->size() <= 4096 ? *e.path : requested;
    json entry{{"path", path}, {"name", path.substr(path.find_last_of('/') + 1)}, {"type", "file"}};
    // As envd answers: the metadata the upload set, and no field at all when it set none.
    if (!metadata.empty()) entry["metadata"] = metadata;
    return entry;
  };
  const std::string content_type = c.req.header("content-type").value_or("");
  auto boundary = http::multipartBoundary(content_type);
  if (!boundary && strncasecmp(content_type.c_str(), "multipart/", 10) == 0) {
    (void)sendJsonError(c.res, 400, "Content-Type: a multipart/form-data upload needs a valid boundary");
    return;
  }
  if (boundary) {
    if (gzipped) {
      (void)sendJsonError(c.res, 400, "Content-Encoding gzip is taken for raw (octet-stream) uploads only");
      return;
    }
    http::MultipartReader reader(*boundary, [&](char* out, size_t max) -> Result<size_t> {
      auto n = c.req.readSome(out, max);
      if (!n.ok()) body_error = n.error();
      return n;
    });
    while (true) {
      auto part = reader.next();
      if (!part.ok()) {
        (void)sendJsonError(c.res, 400, part.error().message);
        return;
      }
      if (!part.value()) break;
      if (part.value()->name != "file") continue;
      std::string path = query_path.value_or(part.value()->filename.value_or(""));
      if (path.empty()) {
        (void)sendJsonError(c.res, 400, "path: give ?path= or a filename in the part");
        return;
      }
      std::optional<Error> part_error;
      auto entry = ops.upload(
          path,
          [&](char* out, size_t max) -> Result<size_t> {
            auto n = reader.readSome(out, max);
            if (!n.ok()) part_error = n.error();
            return n;
          },
          c.user, metadata);
      if (part_error) {
        (void)sendJsonError(c.res, 400, part_error->message);
        return;
      }
      if (!entry.ok()) return agentError(c, lease.value(), entry.error(), false);
      written.push_back(entryOf(entry.value(), path));
    }
  } else {
    if (!query_path || query_path->empty()) {
      (void)sendJsonError(c.res, 400, "path: required");
      return;
    }
    std::optional<http::GunzipReader> gunzip;
    if (gzipped) gunzip.emplace([&](char* out, size_t max) { return c.req.readSome(out, max); });
    auto entry = ops.upload(
        *query_path,
        [&](char* out, size_t max) -> Result<size_t> {
          auto n = gunzip ? gunzip->readSome(out, max) : c.req.readSome(out, max);
          if (!n.ok()) body_error = n.error();
          return n;
        },
        c.user, metadata);
    if (body_error) {
      (void)sendJsonError(c.res, 400, "request body: " + body_error->message);
      return;
    }
    if (!entry.ok()) return agentError(c, lease.value(), entry.error(), false);
    written.push_back(entryOf(entry.value(), *query_path));
  }
  if (written.empty()) {
    (void)sendJsonError(c.res, 400, "no part named \"file\" in the upload");
    return;
  }
  (void)c.res.send(200, "application/json", dumpJson(written));
}

}  // namespace space::e2b
