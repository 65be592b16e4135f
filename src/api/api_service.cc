#include "api/api_service.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <ctime>
#include <limits>

#include "agentproto/base64.h"
#include "api/json_input.h"
#include "api/json_output.h"
#include "api/pty_session.h"
#include "guest/guest_ops.h"
#include "http/stream_drain.h"

namespace space::api {

using nlohmann::json;
using std::chrono::milliseconds;

struct ApiService::Call {
  http::Request& req;
  http::Response& res;
  std::string tenant;
  std::string console_session;  // the token, when a console session's cookie authenticated it
  // The tenant's place for this request (null for open routes): a stream that outlives its
  // handler takes it along, so streams keep counting against --max-requests-per-tenant.
  TenantGate::Ticket* ticket = nullptr;
  const std::string& id() const { return req.pathParam("id"); }
};

namespace {

// An upper bound on the bytes `text` takes as a JSON string (quotes aside): control bytes are
// written as \u00XX, '"' and '\\' escaped, and a byte that is not valid UTF-8 is replaced by
// U+FFFD (3 bytes); counting every non-ASCII byte as 3 covers that.
size_t jsonEncodedBound(std::string_view text) {
  size_t n = 0;
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    n += c < 0x20 ? 6 : c == '"' || c == '\\' ? 2 : c >= 0x80 ? 3 : 1;
  }
  return n;
}

constexpr uint32_t kMaxCpus = 256;
constexpr int64_t kMaxMemoryMb = 1 << 20;
constexpr const char* kNdjson = "application/x-ndjson";

json sandboxJson(const store::SandboxRecord& r) {
  json out{{"id", r.id},
           {"state", r.state},
           {"template", r.template_name},
           {"cpus", r.cpus},
           {"memory_mb", r.memory_mb},
           {"created_at", rfc3339(r.created_at_ms)},
           {"expires_at", rfc3339(r.expires_at_ms)},
           {"metadata", r.metadata},
           {"timeout_s", r.timeout_s},
           {"idle_suspend_s", r.idle_suspend_s},
           {"on_timeout", r.on_timeout.empty() ? "delete" : r.on_timeout}};
  if (!r.state_reason.empty()) out["state_reason"] = r.state_reason;
  if (!r.source_snapshot.empty()) out["snapshot"] = r.source_snapshot;
  return out;
}

json snapshotJson(const store::SnapshotRecord& s) {
  return json{{"id", s.id},
              {"name", s.name},
              {"sandbox_id", s.sandbox_id},
              {"template", s.template_name},
              {"cpus", s.cpus},
              {"memory_mb", s.memory_mb},
              {"created_at", rfc3339(s.created_at_ms)},
              {"size_bytes", s.size_bytes},
              {"metadata", s.metadata}};
}

// The settings create and branch share: how long the sandbox lives and what it starts with.
Status readSandboxSettings(ObjectReader& in, sandbox::CreateRequest& request) {
  auto timeout = in.integer("timeout_s", 1, INT32_MAX);
  if (!timeout.ok()) return timeout.error();
  auto env = in.envMap("env", 256);
  if (!env.ok()) return env.error();
  auto metadata = in.stringMap("metadata", 64, 16 * 1024);
  if (!metadata.ok()) return metadata.error();
  auto idle = in.integer("idle_suspend_s", 0, INT32_MAX);
  if (!idle.ok()) return idle.error();
  auto on_timeout = in.string("on_timeout", 16);
  if (!on_timeout.ok()) return on_timeout.error();
  if (on_timeout.value() && *on_timeout.value() != "delete" && *on_timeout.value() != "suspend") {
    return makeError(ErrorCode::kInvalidArgument, "on_timeout: must be \"delete\" or \"suspend\"");
  }
  auto network = in.object("network");
  if (!network.ok()) return network.error();
  if (network.value()) {
    auto policy = net::parsePolicy(**network.value());
    if (!policy.ok()) return makeError(ErrorCode::kInvalidArgument, "network: " + policy.error().message);
    request.network = std::move(policy.value());
  }
  if (timeout.value()) request.timeout_s = *timeout.value();
  if (env.value()) request.env = *env.value();
  if (metadata.value()) request.metadata = *metadata.value();
  if (idle.value()) request.idle_suspend_s = *idle.value();
  if (on_timeout.value()) request.on_timeout = *on_timeout.value();
  return okStatus();
}

json entryJson(const guest::FileEntry& e) {
  json out = json::object();
  auto copy = [&](const std::optional<std::string>& from, const char* to) {
    if (from) out[to] = *from;
  };
  copy(e.name, "name");
  copy(e.path, "path");
  switch (e.type) {
    case guest::FileType::kFile: out["type"] = "file"; break;
    case guest::FileType::kDirectory: out["type"] = "dir"; break;
    case guest::FileType::kSymlink: out["type"] = "symlink"; break;
    case guest::FileType::kOther: out["type"] = "other"; break;
  }
  out["size"] = e.size;
  if (e.mode) out["mode"] = *e.mode;
  copy(e.permissions, "permissions");
  copy(e.owner, "owner");
  copy(e.group, "group");
  copy(e.modified_at, "modified_at");
  copy(e.symlink_target, "symlink_target");
  return out;
}

Result<std::string> requiredQuery(http::Request& req, const char* name) {
  auto v = req.query(name);
  if (!v) return makeError(ErrorCode::kInvalidArgument, std::string("query parameter ") + name + " is required");
  SPACE_TRY(checkPath(*v, name));
  return *v;
}

Result<std::optional<int64_t>> queryInt(http::Request& req, const char* name, int64_t min, int64_t max) {
  auto v = req.query(name);
  if (!v) return std::optional<int64_t>();
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0 || n < min || n > max) {
    return makeError(ErrorCode::kInvalidArgument, std::string("query parameter ") + name + ": must be an integer in " +
                                                      std::to_string(min) + ".." + std::to_string(max));
  }
  return std::optional<int64_t>(n);
}

// `limit` and `cursor`, as every list takes them.
Status readPaging(http::Request& req, size_t& limit, std::string& after_id) {
  auto given = queryInt(req, "limit", 1, 1000);
  if (!given.ok()) return given.error();
  if (given.value()) limit = static_cast<size_t>(*given.value());
  if (auto cursor = req.query("cursor")) after_id = *cursor;
  return okStatus();
}

// One page of a list: {"<key>": [...], "next_cursor": "..." or null}.
std::string pageJson(const char* key, json items, const std::string& next_cursor) {
  return dumpJson(json{{key, std::move(items)}, {"next_cursor", next_cursor.empty() ? json() : json(next_cursor)}});
}

Result<std::string> queryUser(http::Request& req) {
  auto user = req.query("user");
  if (!user) return std::string();
  if (user->empty() || user->size() > 64 || user->find('\0') != std::string::npos) {
    return makeError(ErrorCode::kInvalidArgument, "query parameter user: must be a user name of 1..64 bytes");
  }
  return *user;
}

Result<int> pidParam(http::Request& req) {
  const std::string& text = req.pathParam("pid");
  char* end = nullptr;
  long n = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || n < 1 || n > 4194304) {
    return makeError(ErrorCode::kInvalidArgument, "pid: must be a process id (1..4194304)");
  }
  return static_cast<int>(n);
}

// NDJSON line for one process event. Output stays the agent's base64 text (GuestOps checked
// it is canonical and bounded), so no chunk is decoded and encoded again on its way through.
std::string eventLine(const guest::ProcessEvent& ev) {
  using Kind = guest::ProcessEvent::Kind;
  switch (ev.kind) {
    case Kind::kStart: return dumpJson(json{{"type", "start"}, {"pid", ev.pid}}) + "\n";
    case Kind::kStdout: return dumpJson(json{{"type", "stdout"}, {"data", ev.data_base64}}) + "\n";
    case Kind::kStderr: return dumpJson(json{{"type", "stderr"}, {"data", ev.data_base64}}) + "\n";
    case Kind::kEnd: break;
  }
  return dumpJson(json{{"type", "exit"}, {"exit_code", ev.end.exit_code}, {"status", ev.end.status}}) + "\n";
}

}  // namespace

const std::vector<ApiService::Route>& ApiService::routeTable() {
  static const std::vector<Route> kRoutes = {
      {"GET", "/healthz", &ApiService::healthz, true},
      {"GET", "/metrics", &ApiService::metrics, false},
      {"GET", "/v1/openapi.json", &ApiService::openapi, false},
      {"POST", "/v1/sandboxes", &ApiService::createSandbox, false},
      {"GET", "/v1/sandboxes", &ApiService::listSandboxes, false},
      {"GET", "/v1/sandboxes/{id}", &ApiService::getSandbox, false},
      {"DELETE", "/v1/sandboxes/{id}", &ApiService::deleteSandbox, false},
      {"POST", "/v1/sandboxes/{id}/timeout", &ApiService::setTimeout, false},
      {"POST", "/v1/sandboxes/{id}/pause", &ApiService::pauseSandbox, false},
      {"POST", "/v1/sandboxes/{id}/resume", &ApiService::resumeSandbox, false},
      {"POST", "/v1/sandboxes/{id}/suspend", &ApiService::suspendSandbox, false},
      {"POST", "/v1/sandboxes/{id}/exec", &ApiService::exec, false},
      {"GET", "/v1/sandboxes/{id}/processes", &ApiService::listProcesses, false},
      {"GET", "/v1/sandboxes/{id}/processes/{pid}/stream", &ApiService::attachProcess, false},
      {"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", &ApiService::signalProcess, false},
      {"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", &ApiService::processInput, false},
      {"GET", "/v1/sandboxes/{id}/pty", &ApiService::openPty, false},
      {"GET", "/v1/sandboxes/{id}/files", &ApiService::downloadFile, false},
      {"PUT", "/v1/sandboxes/{id}/files", &ApiService::uploadFile, false},
      {"DELETE", "/v1/sandboxes/{id}/files", &ApiService::removeFile, false},
      {"GET", "/v1/sandboxes/{id}/files/list", &ApiService::listFiles, false},
      {"POST", "/v1/sandboxes/{id}/files/mkdir", &ApiService::makeDirectory, false},
      {"POST", "/v1/sandboxes/{id}/files/move", &ApiService::moveFile, false},
      {"GET", "/v1/sandboxes/{id}/logs", &ApiService::consoleLog, false},
      {"GET", "/v1/sandboxes/{id}/metrics", &ApiService::sandboxMetrics, false},
      {"GET", "/v1/sandboxes/{id}/network", &ApiService::getNetwork, false},
      {"PUT", "/v1/sandboxes/{id}/network", &ApiService::setNetwork, false},
      {"GET", "/v1/sandboxes/{id}/network/log", &ApiService::networkLog, false},
      {"POST", "/v1/sandboxes/{id}/snapshots", &ApiService::createSnapshot, false},
      {"GET", "/v1/snapshots", &ApiService::listSnapshots, false},
      {"GET", "/v1/snapshots/{id}", &ApiService::getSnapshot, false},
      {"DELETE", "/v1/snapshots/{id}", &ApiService::deleteSnapshot, false},
      {"POST", "/v1/snapshots/{id}/branch", &ApiService::branchSnapshot, false},
      {"GET", "/v1/quota", &ApiService::getQuota, false},
      {"GET", "/v1/secrets", &ApiService::listSecrets, false},
      {"POST", "/v1/secrets", &ApiService::createSecret, false},
      {"GET", "/v1/secrets/{name}", &ApiService::getSecret, false},
      {"PUT", "/v1/secrets/{name}", &ApiService::putSecret, false},
      {"DELETE", "/v1/secrets/{name}", &ApiService::deleteSecret, false},
  };
  return kRoutes;
}

std::vector<std::pair<std::string, std::string>> ApiService::routes() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& r : routeTable()) out.emplace_back(r.method, r.pattern);
  // Ingress is matched before routing (any method, any rest of the path): these are the
  // methods the document describes.
  for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE"}) {
    out.emplace_back(method, "/v1/sandboxes/{id}/ports/{port}/{path}");
  }
  return out;
}

TenantGate::RateSource tenantRateSource(sandbox::SandboxManager& manager, TenantGate::Rate fallback) {
  return [&manager, fallback](const std::string& tenant) -> Result<std::optional<TenantGate::Rate>> {
    auto own = manager.ownQuota(tenant);
    if (!own.ok()) {
      // Not waived, not invented: the last rate known applies until it can be read.
      spdlog::warn("api: cannot read the request rate of tenant {}: {}", tenant, own.error().message);
      return own.error();
    }
    if (!own.value() || (!own.value()->requests_per_s && !own.value()->request_burst)) {
      return std::optional<TenantGate::Rate>();
    }
    const auto& q = *own.value();
    return std::optional<TenantGate::Rate>(
        TenantGate::Rate{q.requests_per_s ? static_cast<double>(*q.requests_per_s) : fallback.rate_per_s,
                         q.request_burst ? static_cast<double>(*q.request_burst) : fallback.burst});
  };
}

ApiService::ApiService(sandbox::SandboxManager& manager, KeyRing& keys, ApiLimits limits, std::string operator_tenant,
                       IngressOptions ingress, secrets::SecretVault* secrets)
    : manager_(manager),
      keys_(keys),
      limits_(limits),
      operator_tenant_(std::move(operator_tenant)),
      ingress_(std::move(ingress)),
      secrets_(secrets),
      tenant_gate_(TenantGate::Limits{limits.max_requests_per_tenant, limits.tenant_requests_per_s,
                                      limits.tenant_request_burst}) {
  if (limits.tenant_rates) {
    tenant_gate_.shareRates(limits.tenant_rates);
  } else {
    tenant_gate_.setRateSource(
        tenantRateSource(manager_, TenantGate::Rate{limits.tenant_requests_per_s, limits.tenant_request_burst}));
  }
  // The router only matches; handle() runs the route's method with the authenticated tenant.
  for (const auto& r : routeTable()) router_.add(r.method, r.pattern, http::Handler());
}

void ApiService::setConsole(Console* console) {
  console_ = console;
  // A login spends a request of its tenant's rate, like any other call.
  if (console_) {
    console_->setRateCheck([this](const std::string& tenant, int& retry_after_s) {
      auto ticket = tenant_gate_.enter(tenant);
      retry_after_s = ticket.admitted() ? 0 : ticket.retryAfterS();
      return ticket.admitted();
    });
  }
}

void ApiService::handle(http::Request& req, http::Response& res) {
  metrics_.countRequest();
  // Requests for a sandbox's ports go to its guest, whatever their method and path.
  std::optional<Result<IngressTarget>> ingress;
  if (auto host = req.header("host")) ingress = ingressFromHost(*host, ingress_.domain, req.target());
  if (!ingress) ingress = ingressFromPath(req.target());
  if (ingress) return serveIngress(req, res, *ingress);
  if (console_ && Console::isConsolePath(req.path())) return console_->handle(req, res);
  // Whatever a browser is sent here is data, never a page of this origin's (the console's).
  res.setHeader("X-Content-Type-Options", "nosniff");
  auto found = router_.match(req.method(), req.rawPath());
  const Route* route = nullptr;
  if (found.kind == http::Router::Match::Kind::kFound) {
    for (const auto& r : routeTable()) {
      if (found.pattern == r.pattern && req.method() == r.method) route = &r;
    }
  }
  Call call{req, res, ""};
  // Authentication comes before any answer about routes, so the API's shape is not probed
  // without a key.
  if (!route || !route->open) {
    auto header = req.header("authorization");
    auto key = header ? bearerToken(*header) : std::nullopt;
    auto tenant = key ? keys_.authenticate(*key) : std::nullopt;
    // A browser of the console: its session cookie, when it sends no key.
    if (auto by_cookie = !header && console_ ? console_->authenticate(req) : std::nullopt) {
      if (by_cookie->refusal) {
        metrics_.countError(by_cookie->refusal->code);
        res.closeConnection();
        (void)res.sendError(by_cookie->refusal->status, by_cookie->refusal->code, by_cookie->refusal->message);
        return;
      }
      tenant = by_cookie->tenant;
      call.console_session = by_cookie->token;
      // Answers to a browser's session are its alone: no cache keeps them.
      res.setHeader("Cache-Control", "no-store");
      res.setHeader("Vary", "Cookie");
    }
    if (!tenant) {
      metrics_.countError("unauthenticated");
      res.setHeader("WWW-Authenticate", "Bearer");
      (void)res.sendError(401, "unauthenticated",
                          header ? "the API key is not valid"
                                 : "missing Authorization: Bearer <api key> header (or a console session's cookie)");
      return;
    }
    call.tenant = *tenant;
  }
  // Only a tenant's requests, counted by its gate, keep a connection: open routes and refusals
  // (401 by the server, 429 here) close it, so nobody without a ticket can keep connection
  // threads busy with a stream of cheap requests read slowly.
  if (call.tenant.empty()) res.closeConnection();
  TenantGate::Ticket ticket;
  if (!call.tenant.empty()) {
    ticket = tenant_gate_.enter(call.tenant);
    if (!ticket.admitted()) {
      res.closeConnection();
      refuseForNow(
          res, 429, "too_many_requests",
          ticket.refusal() == TenantGate::Refusal::kRateLimited
              ? "this tenant is over its rate of " + fmt::format("{:g}", tenant_gate_.rateOf(call.tenant).rate_per_s) +
                    " requests per second; retry after " + std::to_string(std::max(1, ticket.retryAfterS())) + " s"
              : "this tenant already has " + std::to_string(tenant_gate_.maxInFlight()) +
                    " requests running; retry when one has finished",
          ticket.retryAfterS());
      return;
    }
    call.ticket = &ticket;
  }
  if (found.kind == http::Router::Match::Kind::kNotFound) {
    return fail(call, makeError(ErrorCode::kNotFound, "no route for " + req.method() + " " + req.path(), "no_route"));
  }
  if (found.kind == http::Router::Match::Kind::kMethodNotAllowed) {
    std::string allowed;
    for (const auto& m : found.allowed) allowed += (allowed.empty() ? "" : ", ") + m;
    res.setHeader("Allow", allowed);
    metrics_.countError("method_not_allowed");
    (void)res.sendError(405, "method_not_allowed",
                        "method " + req.method() + " is not allowed on " + req.path() + " (allowed: " + allowed + ")");
    return;
  }
  req.setPathParams(std::move(found.params));
  (this->*(route->handler))(call);
}

void ApiService::serveIngress(http::Request& req, http::Response& res, const Result<IngressTarget>& found) {
  if (!found.ok()) {
    metrics_.countError("invalid_argument");
    res.closeConnection();
    (void)res.sendError(400, "invalid_argument", found.error().message);
    return;
  }
  const IngressTarget& target = found.value();
  const std::string& id = target.sandbox_id;
  // Who may: the owner's key, the sandbox's token, or anyone for public ports. Proxied requests
  // hold no tenant ticket: a preview's WebSocket may stay open for hours, and the server's
  // per-client connection limits bound them.
  // Every Authorization field is looked at (a client may send several): any tenant's key among
  // them is spaced's secret and never reaches the guest; the owner's opens the ports.
  std::vector<std::string> key_tenants;
  for (const auto& [name, value] : req.headers()) {
    if (name.size() != 13 || !std::equal(name.begin(), name.end(), "authorization", [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        })) {
      continue;
    }
    if (auto key = bearerToken(value)) {
      if (auto t = keys_.authenticate(*key)) key_tenants.push_back(*t);
    }
  }
  const std::string key_tenant = key_tenants.empty() ? "" : key_tenants.front();
  std::string tenant;
  bool by_key = false;
  bool owner_key = false;
  if (auto owner = manager_.ownerOf(id); owner.ok()) {
    auto token = req.header(kAccessTokenHeader);
    if (std::find(key_tenants.begin(), key_tenants.end(), owner.value()) != key_tenants.end()) {
      owner_key = true;
      tenant = owner.value();
      by_key = true;
    } else if (token && !ingress_.token_key.empty() && accessTokenMatches(ingress_.token_key, id, *token)) {
      tenant = owner.value();
    } else if (auto policy = manager_.networkPolicy(owner.value(), id); policy.ok() && policy->public_ports) {
      tenant = owner.value();
    }
  }
  // Any tenant's key is spaced's secret, never the guest's (a key sent to a public port too).
  if (!key_tenants.empty()) by_key = true;
  if (tenant.empty()) {
    res.closeConnection();
    if (!key_tenant.empty()) {
      metrics_.countError("not_found");
      (void)res.sendError(404, "not_found", "no sandbox " + id);
      return;
    }
    metrics_.countError("unauthenticated");
    res.setHeader("WWW-Authenticate", "Bearer");
    (void)res.sendError(401, "unauthenticated",
                        std::string("the ports of a sandbox need its tenant's API key (Authorization: Bearer) or its "
                                    "access token (") +
                            kAccessTokenHeader + "), unless it was made with public ports");
    return;
  }
  if (!target.prefix.empty()) {
    if (auto refused = refusedOnApiOrigin(req)) {
      res.closeConnection();
      metrics_.countError("permission_denied");
      (void)res.sendError(403, "permission_denied", *refused);
      return;
    }
  }
  if (target.needs_slash) {
    res.setHeader("Location", target.prefix + target.target);
    (void)res.send(308, "text/plain", "");
    return;
  }
  Call call{req, res, tenant};
  // The node's ingress is bounded apart from each sandbox's, and each tenant may hold a quarter
  // of it, so a few sandboxes whose guests accept and never answer cannot take every other
  // tenant's previews down. Connections whose guest has not answered hold a server thread each,
  // and the API must keep some for itself: they have a smaller bound of their own. The count
  // lasts as long as the connection: the relay on the server's event loop holds it.
  TenantPlaces::Refusal refusal;
  std::shared_ptr<void> place = ingress_open_.enter(tenant, refusal);
  std::shared_ptr<void> waiting;
  TenantPlaces* full = place ? nullptr : &ingress_open_;
  if (place) {
    waiting = ingress_waiting_.enter(tenant, refusal);
    if (!waiting) full = &ingress_waiting_;
  }
  if (full != nullptr) {
    const bool of_waiting = full == &ingress_waiting_;
    const std::string what =
        of_waiting ? " proxied connections waiting for their guests' answers" : " proxied connections";
    refuseForNow(res, 503, "ingress_busy",
                 refusal.over_node ? "this node has " + std::to_string(full->nodeCap()) + what + " already; retry later"
                                   // No count: the caller may be a visitor of the owner's public ports.
                                   : "this tenant's sandboxes hold their share of this node's" + what +
                                         (of_waiting ? "; retry when one has answered" : "; retry when one has ended"));
    return;
  }
  // Only the owner's key wakes a suspended sandbox: a token holder or an anonymous visitor of
  // public ports must not make the node restore and save it again and again.
  auto connection = manager_.connectPort(tenant, id, target.port, Clock::now() + std::chrono::seconds(5), owner_key);
  if (!connection.ok()) return fail(call, connection.error());
  // The guest's socket and the place go with the relay's end.
  auto held = std::make_shared<std::pair<std::shared_ptr<void>, sandbox::PortConnection>>(
      std::move(place), std::move(connection).value());
  const int guest = held->second.connection.fd();
  proxyToGuest(req, res, guest, std::move(held), std::move(waiting), target, by_key, ingress_);
}

json ApiService::sandboxView(const store::SandboxRecord& record) const {
  json view = sandboxJson(record);
  if (manager_.config().network && !ingress_.token_key.empty()) {
    view["access_token"] = accessToken(ingress_.token_key, record.id);
  }
  return view;
}

void ApiService::refuseForNow(http::Response& res, int status, const std::string& code, const std::string& message,
                              int retry_after_s) {
  metrics_.countError(code);
  res.setHeader("Retry-After", std::to_string(std::max(1, retry_after_s)));
  (void)res.sendError(status, code, message);
}

void ApiService::fail(Call& c, const Error& error_in) {
  Error error = error_in;
  // The node's free capacity follows from what every tenant runs: only the operator hears it.
  if (error.reason == "insufficient_capacity" && c.tenant != operator_tenant_) {
    error.message = "this node has not enough free vCPUs or memory for this request now; retry later or ask for less";
  }
  std::string code = error.reason.empty() ? errorCodeName(error.code) : error.reason;
  metrics_.countError(code);
  if (c.res.started()) {
    spdlog::warn("api: {} {}: error after the response started: {}", c.req.method(), c.req.path(), error.message);
    return;  // the server closes the connection: the client sees a cut stream
  }
  json body = http::errorBody(code, error.message);
  // A request refused for the sandbox's state says what that state is.
  if (error.reason == "invalid_state" && !c.id().empty()) {
    if (auto rec = manager_.get(c.tenant, c.id()); rec.ok()) body["error"]["state"] = rec->state;
  }
  (void)c.res.send(httpStatus(error), "application/json", dumpJson(body));
}

Result<json> ApiService::readJson(Call& c, size_t max_bytes) { return readJsonBody(c.req, max_bytes); }

// --- open and node-wide ----------------------------------------------------------------------

void ApiService::healthz(Call& c) { (void)c.res.sendJson(200, json{{"status", "ok"}}); }

void ApiService::openapi(Call& c) {
  auto doc = openApiDocument();
  (void)c.res.send(200, "application/json", doc);
}

void ApiService::metrics(Call& c) {
  // Node-wide figures describe every tenant's sandboxes together.
  if (c.tenant != operator_tenant_) {
    metrics_.countError("permission_denied");
    (void)c.res.sendError(403, "permission_denied",
                          "node metrics need the operator's key (tenant \"" + operator_tenant_ + "\")");
    return;
  }
  auto stats = manager_.stats();
  std::map<std::string, Metrics::Gauge> gauges;
  auto& by_state = gauges["space_sandboxes"];
  by_state.help = "Sandboxes on this node by state (deleted: within the retention period).";
  for (const char* s : {"creating", "running", "paused", "suspended", "failed", "deleted"}) {
    auto it = stats.by_state.find(s);
    by_state.values[std::string("state=\"") + s + "\""] = it == stats.by_state.end() ? 0 : it->second;
  }
  gauges["space_node_vcpus_reserved"] = {"vCPUs reserved by sandboxes on this node.", {{"", stats.reserved_vcpus}}};
  gauges["space_node_vcpus_limit"] = {"vCPUs this node may reserve.", {{"", stats.max_total_vcpus}}};
  gauges["space_node_memory_reserved_mb"] = {"Memory (MB) reserved by sandboxes on this node.",
                                             {{"", static_cast<double>(stats.reserved_memory_mb)}}};
  gauges["space_node_memory_limit_mb"] = {"Memory (MB) this node may reserve.",
                                          {{"", static_cast<double>(stats.max_total_memory_mb)}}};
  gauges["space_warm_pool_ready"] = {"Running, warmed-up guests waiting in the pool to become sandboxes.",
                                     {{"", static_cast<double>(stats.warm_pool_ready)}}};
  gauges["space_warm_pool_target"] = {"Size the warm pool is kept at (0: no pool).",
                                      {{"", static_cast<double>(stats.warm_pool_target)}}};
  gauges["space_warm_pool_vcpus"] = {
      "vCPUs of this node's limit held by the warm pool's guests (given back to sandboxes that need them).",
      {{"", static_cast<double>(stats.warm_pool_vcpus)}}};
  gauges["space_warm_pool_memory_mb"] = {
      "Memory (MB) of this node's limit held by the warm pool's guests (given back to sandboxes that need it).",
      {{"", static_cast<double>(stats.warm_pool_memory_mb)}}};
  gauges["space_snapshot_helpers_memory_mb"] = {
      "Memory (MB) of this node's limit held by the helper VMs making snapshots' memory files now.",
      {{"", static_cast<double>(stats.snapshot_helpers_memory_mb)}}};
  gauges["space_qemu_build_stale"] = {
      "1 when SPACE's QEMU build comes from an older source than the installed qemu-system-x86 (a security "
      "update): run make images and restart spaced.",
      {{"", stats.qemu_build_stale ? 1.0 : 0.0}}};
  gauges["space_gateway_resolver_stale"] = {
      "1 while the host's resolver (resolv.conf) is not the one the gateways ask: until a new one has stayed "
      "10 s, within 5 minutes of the last follow, or while the gateways' egress table cannot be loaded with it.",
      {{"", stats.gateway_resolver_stale ? 1.0 : 0.0}}};
  auto& egress_refused = gauges["space_gateway_egress_refused_packets_total"];
  egress_refused = {
      "Packets the kernel's table of gateways' egress refused: a gateway sent what its own policy "
      "refuses (compromised by its guest, or a defect). 0 on a healthy node.",
      {{"", static_cast<double>(stats.gateway_egress_refused_packets)}}};
  egress_refused.type = "counter";
  // Per sandbox, the newest host-side sample (sandbox/metrics.h) of each running one.
  auto& cpu = gauges["space_sandbox_cpu_used_percent"];
  cpu.help = "CPU a running sandbox's vCPUs used together, percent of them (sampled every 5 s).";
  auto& mem = gauges["space_sandbox_memory_used_bytes"];
  mem.help = "Host memory a running sandbox's VM holds resident (its QEMU).";
  auto& mem_total = gauges["space_sandbox_memory_bytes"];
  mem_total.help = "A running sandbox's RAM size.";
  auto& disk = gauges["space_sandbox_disk_used_bytes"];
  disk.help = "Host disk blocks a running sandbox's disk overlay holds.";
  auto& guest_mem = gauges["space_sandbox_guest_memory_used_bytes"];
  guest_mem.help =
      "Memory in use in a running sandbox as its guest reports it (MemTotal - MemAvailable; the guest's claim).";
  auto& guest_disk = gauges["space_sandbox_guest_disk_used_bytes"];
  guest_disk.help = "Space in use on a running sandbox's root filesystem as its guest reports it (the guest's claim).";
  auto& net_sent = gauges["space_sandbox_network_sent_bytes_total"];
  net_sent.help = "Bytes a running sandbox's guest sent through its NIC since its network was made or resumed.";
  net_sent.type = "counter";
  auto& net_received = gauges["space_sandbox_network_received_bytes_total"];
  net_received.help = "Bytes a running sandbox's guest received through its NIC since its network was made or resumed.";
  net_received.type = "counter";
  for (const auto& usage : manager_.latestMetrics()) {
    const std::string labels = "tenant=\"" + labelValue(usage.tenant) + "\",sandbox=\"" + labelValue(usage.id) + "\"";
    cpu.values[labels] = usage.sample.cpu_used_pct;
    mem.values[labels] = static_cast<double>(usage.sample.mem_used_bytes);
    mem_total.values[labels] = static_cast<double>(usage.sample.mem_total_bytes);
    disk.values[labels] = static_cast<double>(usage.sample.disk_used_bytes);
    if (const auto& guest = usage.sample.guest) {
      guest_mem.values[labels] = static_cast<double>(guest->mem_used);
      guest_disk.values[labels] = static_cast<double>(guest->disk_used);
    }
    if (usage.sample.has_nic) {
      net_sent.values[labels] = static_cast<double>(usage.sample.net_sent_bytes);
      net_received.values[labels] = static_cast<double>(usage.sample.net_received_bytes);
    }
  }
  (void)c.res.send(200, "text/plain; version=0.0.4", metrics_.render(gauges));
}

// --- sandboxes -------------------------------------------------------------------------------

void ApiService::createSandbox(Call& c) {
  auto started = Clock::now();
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  sandbox::CreateRequest request;
  request.tenant = c.tenant;
  auto tpl = in.string("template", 128);
  auto snapshot = in.string("snapshot", 128);
  auto cpus = in.integer("cpus", 1, kMaxCpus);
  auto memory = in.integer("memory_mb", 1, kMaxMemoryMb);
  for (const Status& s :
       {tpl.ok() ? okStatus() : Status(tpl.error()), snapshot.ok() ? okStatus() : Status(snapshot.error()),
        cpus.ok() ? okStatus() : Status(cpus.error()), memory.ok() ? okStatus() : Status(memory.error()),
        readSandboxSettings(in, request), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  if (auto known = checkCredentialSecrets(c.tenant, request.network); !known.ok()) return fail(c, known.error());
  if (tpl.value() && snapshot.value()) {
    return fail(c, makeError(ErrorCode::kInvalidArgument,
                             "template and snapshot: give one (a snapshot already names its template)"));
  }
  if (tpl.value()) request.template_name = *tpl.value();
  if (snapshot.value()) request.snapshot_id = *snapshot.value();
  if (cpus.value()) request.cpus = static_cast<uint32_t>(*cpus.value());
  if (memory.value()) request.memory_mb = static_cast<uint64_t>(*memory.value());
  auto rec = manager_.create(request);
  if (!rec.ok()) return fail(c, rec.error());
  metrics_.create_seconds.observe(std::chrono::duration<double>(Clock::now() - started).count());
  (void)c.res.send(201, "application/json", dumpJson(sandboxView(rec.value())));
}

void ApiService::listSandboxes(Call& c) {
  store::ListFilter filter;
  filter.tenant = c.tenant;
  for (const auto& [key, value] : c.req.queryParams()) {
    if (key == "state") {
      size_t start = 0;
      while (start <= value.size()) {
        size_t comma = value.find(',', start);
        std::string name = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        auto state = sandbox::parseState(name);
        if (!state.ok()) return fail(c, makeError(ErrorCode::kInvalidArgument, "state: " + state.error().message));
        filter.states.push_back(name);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (key == "metadata") {
      auto eq = value.find('=');
      if (eq == std::string::npos || eq == 0) {
        return fail(c, makeError(ErrorCode::kInvalidArgument, "metadata: must be key=value"));
      }
      if (!filter.metadata.emplace(value.substr(0, eq), value.substr(eq + 1)).second) {
        return fail(
            c, makeError(ErrorCode::kInvalidArgument, "metadata: key \"" + value.substr(0, eq) + "\" given twice"));
      }
    } else if (key != "limit" && key != "cursor") {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "unknown query parameter \"" + key + "\""));
    }
  }
  if (auto paging = readPaging(c.req, filter.limit, filter.after_id); !paging.ok()) return fail(c, paging.error());
  auto page = manager_.list(filter);
  if (!page.ok()) return fail(c, page.error());
  json items = json::array();
  for (const auto& rec : page->items) items.push_back(sandboxView(rec));
  (void)c.res.send(200, "application/json", pageJson("sandboxes", std::move(items), page->next_cursor));
}

void ApiService::getSandbox(Call& c) {
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(200, "application/json", dumpJson(sandboxView(rec.value())));
}

void ApiService::deleteSandbox(Call& c) {
  auto removed = manager_.remove(c.tenant, c.id());
  if (!removed.ok()) return fail(c, removed.error());
  (void)c.res.send(204, "", "");
}

void ApiService::setTimeout(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto timeout = in.integer("timeout_s", 1, INT32_MAX);
  if (!timeout.ok()) return fail(c, timeout.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  if (!timeout.value()) return fail(c, makeError(ErrorCode::kInvalidArgument, "timeout_s: required"));
  auto rec = manager_.setTimeout(c.tenant, c.id(), *timeout.value());
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(200, "application/json", dumpJson(sandboxView(rec.value())));
}

void ApiService::pauseSandbox(Call& c) {
  auto body = readJson(c, limits_.max_json_body);  // no fields yet; refuses unknown ones
  if (!body.ok()) return fail(c, body.error());
  if (auto done = ObjectReader(body.value()).finish(); !done.ok()) return fail(c, done.error());
  auto rec = manager_.pause(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(200, "application/json", dumpJson(sandboxView(rec.value())));
}

void ApiService::resumeSandbox(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  if (auto done = ObjectReader(body.value()).finish(); !done.ok()) return fail(c, done.error());
  auto rec = manager_.resume(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(200, "application/json", dumpJson(sandboxView(rec.value())));
}

void ApiService::suspendSandbox(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  if (auto done = ObjectReader(body.value()).finish(); !done.ok()) return fail(c, done.error());
  auto rec = manager_.suspend(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(200, "application/json", dumpJson(sandboxView(rec.value())));
}

// --- snapshots -------------------------------------------------------------------------------

void ApiService::createSnapshot(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto name = in.string("name", 128);
  auto metadata = in.stringMap("metadata", 64, 16 * 1024);
  for (const Status& s : {name.ok() ? okStatus() : Status(name.error()),
                          metadata.ok() ? okStatus() : Status(metadata.error()), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  sandbox::SnapshotRequest request;
  request.tenant = c.tenant;
  request.sandbox_id = c.id();
  if (name.value()) {
    for (unsigned char ch : *name.value()) {
      if (ch < 0x20 || ch == 0x7f) {
        return fail(c, makeError(ErrorCode::kInvalidArgument, "name: must not contain control characters"));
      }
    }
    request.name = *name.value();
  }
  if (metadata.value()) {
    for (const auto& [k, v] : *metadata.value()) request.metadata[k] = v;
  }
  auto snap = manager_.snapshot(request);
  if (!snap.ok()) return fail(c, snap.error());
  (void)c.res.send(201, "application/json", dumpJson(snapshotJson(snap.value())));
}

void ApiService::listSnapshots(Call& c) {
  store::SnapshotFilter filter;
  filter.tenant = c.tenant;
  for (const auto& [key, value] : c.req.queryParams()) {
    if (key == "sandbox_id") {
      filter.sandbox_id = value;
    } else if (key != "limit" && key != "cursor") {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "unknown query parameter \"" + key + "\""));
    }
  }
  if (auto paging = readPaging(c.req, filter.limit, filter.after_id); !paging.ok()) return fail(c, paging.error());
  auto page = manager_.listSnapshots(filter);
  if (!page.ok()) return fail(c, page.error());
  json items = json::array();
  for (const auto& snap : page->items) items.push_back(snapshotJson(snap));
  (void)c.res.send(200, "application/json", pageJson("snapshots", std::move(items), page->next_cursor));
}

void ApiService::getSnapshot(Call& c) {
  auto snap = manager_.getSnapshot(c.tenant, c.id());
  if (!snap.ok()) return fail(c, snap.error());
  (void)c.res.send(200, "application/json", dumpJson(snapshotJson(snap.value())));
}

void ApiService::deleteSnapshot(Call& c) {
  auto removed = manager_.deleteSnapshot(c.tenant, c.id());
  if (!removed.ok()) return fail(c, removed.error());
  (void)c.res.send(204, "", "");
}

void ApiService::branchSnapshot(Call& c) {
  auto started = Clock::now();
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  sandbox::CreateRequest request;
  request.tenant = c.tenant;
  request.snapshot_id = c.id();
  auto count = in.integer("count", 1, manager_.config().max_branch);
  for (const Status& s :
       {count.ok() ? okStatus() : Status(count.error()), readSandboxSettings(in, request), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  if (auto known = checkCredentialSecrets(c.tenant, request.network); !known.ok()) return fail(c, known.error());
  auto children = manager_.branch(request, count.value() ? static_cast<uint32_t>(*count.value()) : 1);
  if (!children.ok()) return fail(c, children.error());
  json items = json::array();
  for (const auto& rec : children.value()) items.push_back(sandboxView(rec));
  metrics_.create_seconds.observe(std::chrono::duration<double>(Clock::now() - started).count());
  (void)c.res.send(201, "application/json", dumpJson(json{{"sandboxes", items}}));
}

// --- secrets ---------------------------------------------------------------------------------
// A secret's value comes in and never goes out: no answer, log line or error message holds it.

namespace {

// A request body holds one value (16 KiB at most, escaped up to six-fold) and a name.
constexpr size_t kMaxSecretBody = 128 * 1024;

json secretView(const secrets::SecretInfo& s) {
  return json{{"name", s.name},
              {"version", s.version},
              {"created_at", rfc3339(s.created_at_ms)},
              {"updated_at", rfc3339(s.updated_at_ms)}};
}

}  // namespace

Status ApiService::checkCredentialSecrets(const std::string& tenant, const std::optional<net::Policy>& policy) {
  if (!policy) return okStatus();
  const std::vector<std::string> names = net::credentialSecretNames(*policy);
  if (names.empty()) return okStatus();
  auto v = vault();
  if (!v.ok()) return makeError(ErrorCode::kInvalidArgument, "network.credentials: " + v.error().message);
  for (const std::string& name : names) {
    auto found = v.value()->info(tenant, name);
    if (found.ok()) continue;
    if (found.error().code == ErrorCode::kNotFound) {
      return makeError(ErrorCode::kInvalidArgument, "network.credentials: no secret named " + name +
                                                        " (create it first: PUT /v1/secrets/" + name + ")");
    }
    return found.error();
  }
  return okStatus();
}

Result<secrets::SecretVault*> ApiService::vault() {
  if (secrets_ == nullptr) return makeError(ErrorCode::kUnavailable, "this node keeps no secrets");
  return secrets_;
}

Result<std::pair<std::string, std::string>> ApiService::readSecret(Call& c, bool with_name) {
  auto body = readJson(c, kMaxSecretBody);
  if (!body.ok()) return body.error();
  ObjectReader in(body.value());
  std::optional<std::string> name;
  if (with_name) {
    auto given = in.string("name", secrets::kMaxNameBytes + 1);
    if (!given.ok()) return given.error();
    if (!given.value()) return makeError(ErrorCode::kInvalidArgument, "name: required");
    name = *given.value();
  }
  auto value = in.string("value", secrets::kMaxValueBytes + 1);
  if (!value.ok()) return value.error();
  if (!value.value()) return makeError(ErrorCode::kInvalidArgument, "value: required");
  SPACE_TRY(in.finish());
  return std::pair(name.value_or(c.req.pathParam("name")), std::move(*value.value()));
}

void ApiService::getQuota(Call& c) {
  auto report = manager_.quotaReport(c.tenant);
  if (!report.ok()) return fail(c, report.error());
  const auto& r = report.value();
  const auto& q = r.limits;
  const TenantGate::Rate rate = tenant_gate_.rateOf(c.tenant);
  // Whole rates (all of a tenant's own, most of the node's) as integers.
  auto number = [](double v) { return v == std::floor(v) && v < 9e15 ? json(static_cast<int64_t>(v)) : json(v); };
  // 0: no limit of that kind. Only the caller's own figures: nothing about other tenants.
  (void)c.res.sendJson(
      200, json{{"tenant", c.tenant},
                {"own", r.own},
                {"limits",
                 {{"max_sandboxes", q.max_sandboxes},
                  {"max_vcpus", q.max_vcpus},
                  {"max_memory_mb", q.max_memory_mb},
                  {"max_snapshots", q.max_snapshots},
                  {"max_snapshot_mb", q.max_snapshot_bytes >> 20},
                  {"max_suspended", q.max_suspended},
                  {"max_suspended_mb", q.max_suspended_bytes >> 20},
                  {"requests_per_s", number(rate.rate_per_s)},
                  {"request_burst",
                   number(rate.rate_per_s > 0 ? std::max(rate.burst, std::max(rate.rate_per_s, 1.0)) : 0.0)}}},
                {"usage",
                 {{"sandboxes", r.sandboxes},
                  {"vcpus", r.vcpus},
                  {"memory_mb", r.memory_mb},
                  {"snapshots", r.snapshots},
                  {"snapshot_bytes", r.snapshot_bytes},
                  {"suspended", r.suspended},
                  {"suspended_bytes", r.suspended_bytes}}}});
}

void ApiService::listSecrets(Call& c) {
  auto v = vault();
  if (!v.ok()) return fail(c, v.error());
  auto listed = v.value()->list(c.tenant);
  if (!listed.ok()) return fail(c, listed.error());
  json items = json::array();
  for (const auto& s : listed.value()) items.push_back(secretView(s));
  (void)c.res.sendJson(200, json{{"secrets", items}});
}

void ApiService::createSecret(Call& c) {
  auto v = vault();
  if (!v.ok()) return fail(c, v.error());
  auto given = readSecret(c, /*with_name=*/true);
  if (!given.ok()) return fail(c, given.error());
  const auto& [name, value] = given.value();
  // POST creates only: an existing name is a conflict, so a typo cannot overwrite a secret.
  auto stored = v.value()->create(c.tenant, name, value);
  if (!stored.ok() && stored.error().code == ErrorCode::kAlreadyExists) {
    return fail(c, makeError(ErrorCode::kAlreadyExists,
                             "a secret named " + name + " exists; PUT /v1/secrets/" + name + " replaces its value"));
  }
  if (!stored.ok()) return fail(c, stored.error());
  spdlog::info("api: tenant {} {} secret {} (version {})", c.tenant, stored->created ? "created" : "rotated", name,
               stored->version);
  manager_.secretChanged(c.tenant, name);
  (void)c.res.sendJson(stored->created ? 201 : 200, secretView(stored.value()));
}

void ApiService::getSecret(Call& c) {
  auto v = vault();
  if (!v.ok()) return fail(c, v.error());
  auto found = v.value()->info(c.tenant, c.req.pathParam("name"));
  if (!found.ok()) return fail(c, found.error());
  (void)c.res.sendJson(200, secretView(found.value()));
}

void ApiService::putSecret(Call& c) {
  auto v = vault();
  if (!v.ok()) return fail(c, v.error());
  auto given = readSecret(c, /*with_name=*/false);
  if (!given.ok()) return fail(c, given.error());
  auto stored = v.value()->put(c.tenant, given->first, given->second);
  if (!stored.ok()) return fail(c, stored.error());
  spdlog::info("api: tenant {} {} secret {} (version {})", c.tenant, stored->created ? "created" : "rotated",
               given->first, stored->version);
  manager_.secretChanged(c.tenant, given->first);
  (void)c.res.sendJson(stored->created ? 201 : 200, secretView(stored.value()));
}

void ApiService::deleteSecret(Call& c) {
  auto v = vault();
  if (!v.ok()) return fail(c, v.error());
  const std::string& name = c.req.pathParam("name");
  if (auto removed = v.value()->remove(c.tenant, name); !removed.ok()) return fail(c, removed.error());
  spdlog::info("api: tenant {} deleted secret {}", c.tenant, name);
  manager_.secretChanged(c.tenant, name);
  (void)c.res.send(204, "", "");
}

// --- agent access ----------------------------------------------------------------------------

Result<sandbox::AgentLease> ApiService::lease(Call& c, std::string_view operation) {
  // X-Space-No-Resume: a caller that only looks (the console's polls) finds a suspended
  // sandbox suspended instead of waking it up.
  const bool may_resume = !c.req.header("x-space-no-resume");
  auto lease = manager_.agent(c.tenant, c.id(), operation, may_resume);
  // Said on the response: the call found the sandbox suspended and resumed it first.
  if (lease.ok() && lease->resumed) c.res.setHeader("X-Space-Resumed", "true");
  return lease;
}

void ApiService::exec(Call& c) {
  auto started = Clock::now();
  auto body = readJson(c, limits_.max_exec_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto command = in.string("command", 128 * 1024);
  auto argv = in.stringArray("argv", 4096, 128 * 1024);
  auto env = in.envMap("env", 256);
  auto cwd = in.string("cwd", 4096);
  auto user = in.string("user", 64);
  auto stdin_b64 = in.string("stdin", limits_.max_exec_body);
  auto timeout = in.integer("timeout_s", 0, 24 * 3600);
  auto stream = in.boolean("stream");
  auto stdin_open = in.boolean("stdin_open");
  if (!stdin_open.ok()) return fail(c, stdin_open.error());
  for (const Status& s :
       {command.ok() ? okStatus() : Status(command.error()), argv.ok() ? okStatus() : Status(argv.error()),
        env.ok() ? okStatus() : Status(env.error()), cwd.ok() ? okStatus() : Status(cwd.error()),
        user.ok() ? okStatus() : Status(user.error()), stdin_b64.ok() ? okStatus() : Status(stdin_b64.error()),
        timeout.ok() ? okStatus() : Status(timeout.error()), stream.ok() ? okStatus() : Status(stream.error()),
        in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  guest::ProcessSpec spec;
  if (command.value().has_value() == argv.value().has_value()) {
    return fail(c, makeError(ErrorCode::kInvalidArgument, "exactly one of command, argv is required"));
  }
  if (command.value()) {
    if (command.value()->empty()) return fail(c, makeError(ErrorCode::kInvalidArgument, "command: must not be empty"));
    if (command.value()->find('\0') != std::string::npos) {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "command: contains a NUL byte"));
    }
    spec.command = *command.value();
  } else {
    if (argv.value()->empty() || argv.value()->front().empty()) {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "argv: must name a program"));
    }
    spec.argv = *argv.value();
  }
  if (env.value()) spec.env = *env.value();
  if (cwd.value()) {
    if (auto ok = checkPath(*cwd.value(), "cwd"); !ok.ok()) return fail(c, ok.error());
    spec.cwd = *cwd.value();
  }
  if (user.value()) spec.user = *user.value();
  if (stdin_b64.value()) {
    auto data = agentproto::base64Decode(*stdin_b64.value());
    if (!data) return fail(c, makeError(ErrorCode::kInvalidArgument, "stdin: not valid base64"));
    spec.stdin_data = std::move(*data);
  }
  // What the request held is in `spec` now; a streamed exec may run for a day, so the body, its
  // DOM and the base64 copy go at once.
  stdin_b64 = std::optional<std::string>();
  body.value() = json();
  spec.timeout = std::chrono::seconds(timeout.value() ? *timeout.value() : 60);
  bool streamed = stream.value().value_or(false);
  if (auto accept = c.req.header("accept"); accept && accept->find(kNdjson) != std::string::npos) streamed = true;
  // stdin_open: stdin stays open for .../processes/{pid}/stdin; only useful while streaming.
  const bool keep_stdin = stdin_open.value().value_or(false);
  if (keep_stdin && !streamed) {
    return fail(c, makeError(ErrorCode::kInvalidArgument, "stdin_open: needs a streamed exec (\"stream\": true)"));
  }
  spec.close_stdin = !keep_stdin;

  auto agent = lease(c, "exec");
  if (!agent.ok()) return fail(c, agent.error());
  guest::GuestOps ops(agent->agent);
  if (streamed) {
    auto process = ops.start(std::move(spec), guest::StreamLimits{limits_.max_stream_backlog});
    if (!process.ok()) return fail(c, process.error());
    return streamProcess(c, std::move(agent.value()), std::move(process.value()), started);
  }
  auto result = ops.run(std::move(spec), limits_.max_exec_output, [&c] { return c.res.clientGone(); });
  if (!result.ok()) {
    if (result.error().code == ErrorCode::kCanceled && c.res.clientGone()) return;  // nobody to answer
    return fail(c, manager_.agentFailed(agent.value(), result.error()));
  }
  metrics_.exec_seconds.observe(std::chrono::duration<double>(Clock::now() - started).count());
  // The limit holds for the answer as sent: JSON writes a control byte as 6 bytes and an invalid
  // UTF-8 byte as 3, so 16 MiB of raw output could become a ~100 MiB body.
  size_t encoded = jsonEncodedBound(result->stdout_data) + jsonEncodedBound(result->stderr_data);
  if (encoded > limits_.max_exec_output) {
    return fail(c, makeError(ErrorCode::kResourceExhausted,
                             "the output (" + std::to_string(encoded) + " bytes as JSON) is over the limit of " +
                                 std::to_string(limits_.max_exec_output) +
                                 " bytes; stream it (\"stream\": true) or write it to a file",
                             "output_too_large"));
  }
  json out{{"pid", result->pid},
           {"exit_code", result->exit_code},
           {"status", result->status},
           {"stdout", std::move(result->stdout_data)},
           {"stderr", std::move(result->stderr_data)},
           {"duration_ms", std::chrono::duration_cast<milliseconds>(Clock::now() - started).count()}};
  (void)c.res.send(200, "application/json", dumpJson(out));
}

// A process's output once its handler returned. The agent client's I/O thread says when events
// came (ProcessStream::onReady); a server thread drains them into the response (StreamDrain), because next()
// also feeds a started process its stdin and an error's meaning depends on the sandbox's state
// (both may block); the event loop writes. Owned by the response's close callback alone, so it
// goes when the stream closes; it cancels its process without waiting wherever that is.
struct ApiService::ProcessPump {
  ApiService& service;
  sandbox::AgentLease lease;
  std::unique_ptr<guest::ProcessStream> process;
  std::shared_ptr<http::ResponseStream> out;
  std::optional<Clock::time_point> exec_started;
  TenantGate::Ticket place;  // the request's place among its tenant's, held for the stream's life
  bool finished = false;     // the response was ended (or its client left); touched by one drain at a time

  ProcessPump(ApiService& s, sandbox::AgentLease l, std::unique_ptr<guest::ProcessStream> p,
              std::shared_ptr<http::ResponseStream> o, std::optional<Clock::time_point> started)
      : service(s), lease(std::move(l)), process(std::move(p)), out(std::move(o)), exec_started(started) {}
  ProcessPump(const ProcessPump&) = delete;
  ProcessPump& operator=(const ProcessPump&) = delete;
  ~ProcessPump() { process->cancel(); }

  // Writes one batch; true once the stream is over.
  bool handle(guest::ProcessStream::Batch batch) {
    using State = guest::ProcessStream::State;
    if (finished) return true;
    // A client slower than the backlog bound loses the stream, not the node's memory: what it
    // has not taken counts, here as in the process stream, checked before each line.
    bool too_slow = batch.state == State::kOverflow;
    for (const auto& event : batch.events) {
      std::string line = eventLine(event);
      if (out->pending() + line.size() > service.limits_.max_stream_backlog) {
        too_slow = true;
        break;
      }
      if (!out->write(std::move(line))) {
        // The client left: the process keeps running in the guest and can be re-attached.
        finished = true;
        process->cancel();
        return true;
      }
    }
    if (too_slow) {
      process->cancel();
      (void)out->write(
          dumpJson(json{{"type", "error"},
                        {"error",
                         {{"code", "client_too_slow"},
                          {"message", "output backlog over " + std::to_string(service.limits_.max_stream_backlog) +
                                          " bytes; the process keeps running, re-attach to it"}}}}) +
          "\n");
      out->end();
      finished = true;
      return true;
    }
    if (batch.state != State::kEnded) return false;
    if (batch.error) {
      Error e = service.manager_.agentFailed(lease, *batch.error);
      std::string code = e.reason.empty() ? errorCodeName(e.code) : e.reason;
      service.metrics_.countError(code);
      (void)out->write(dumpJson(json{{"type", "error"}, {"error", {{"code", code}, {"message", e.message}}}}) + "\n");
    }
    out->end();
    finished = true;
    return true;
  }
};

void ApiService::streamProcess(Call& c, sandbox::AgentLease lease, std::unique_ptr<guest::ProcessStream> process,
                               std::optional<Clock::time_point> exec_started) {
  using State = guest::ProcessStream::State;
  // Until the first event, this thread waits (waking each second to notice a client gone).
  guest::ProcessStream::Batch first;
  while (true) {
    first = process->next(milliseconds(1000));
    if (!first.events.empty() || first.state != State::kOpen) break;
    if (c.res.clientGone()) return;  // the process keeps running in the guest
  }
  // An error before any event (unknown pid, bad cwd) is a plain error response.
  if (first.events.empty() && first.state == State::kEnded && first.error) {
    return fail(c, manager_.agentFailed(lease, *first.error));
  }
  auto detached = c.res.detach(200, kNdjson);
  if (!detached.ok()) {
    if (!c.res.started()) fail(c, detached.error());
    return;
  }
  // Its drains share the step threads as its tenant's, whatever address the tenant calls from.
  detached.value()->shareStepsWith("tenant " + c.tenant);
  auto pump = std::make_shared<ProcessPump>(*this, std::move(lease), std::move(process), std::move(detached.value()),
                                            exec_started);
  if (c.ticket) pump->place = std::move(*c.ticket);
  // However the response ends, the process stops streaming to it (and keeps running).
  pump->out->onClose([pump](bool) {
    pump->process->cancel();
    // Every streamed exec counts, however it ended (its end, a client gone, too slow).
    if (pump->exec_started) {
      pump->service.metrics_.exec_seconds.observe(
          std::chrono::duration<double>(Clock::now() - *pump->exec_started).count());
    }
  });
  if (pump->handle(std::move(first))) return;
  // What the I/O thread holds (the drain) owns no pump, so the last reference to the pump, and
  // to the sandbox's agent client, never goes on that thread.
  auto drain = http::StreamDrain::make(pump->out, [weak = std::weak_ptr<ProcessPump>(pump)] {
    auto p = weak.lock();
    return !p || p->handle(p->process->next(std::chrono::milliseconds(0)));
  });
  pump->process->onReady([drain] { drain->kick(); });
  drain->kick();  // for what came before onReady was set
}

void ApiService::openPty(Call& c) {
  if (!isWebSocketUpgrade(c.req)) {
    return fail(c, makeError(ErrorCode::kInvalidArgument,
                             "this is a WebSocket endpoint: send GET with Upgrade: websocket (spacectl shell does)"));
  }
  auto cols = queryInt(c.req, "cols", 1, 65535);
  if (!cols.ok()) return fail(c, cols.error());
  auto rows = queryInt(c.req, "rows", 1, 65535);
  if (!rows.ok()) return fail(c, rows.error());
  auto user = queryUser(c.req);
  if (!user.ok()) return fail(c, user.error());
  guest::ProcessSpec spec;
  spec.pty = guest::PtySize{static_cast<int>(cols.value().value_or(80)), static_cast<int>(rows.value().value_or(24))};
  spec.user = user.value();
  if (auto cwd = c.req.query("cwd")) {
    if (auto ok = checkPath(*cwd, "cwd"); !ok.ok()) return fail(c, ok.error());
    spec.cwd = *cwd;
  }
  // The client's terminal type, so full-screen programs draw for it.
  std::string term = c.req.query("term").value_or("xterm-256color");
  if (term.empty() || term.size() > 64 ||
      term.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-_") !=
          std::string::npos) {
    return fail(
        c, makeError(ErrorCode::kInvalidArgument, "query parameter term: must be a terminal type like xterm-256color"));
  }
  spec.env["TERM"] = term;
  auto command = c.req.query("command");
  auto [first_arg, last_arg] = c.req.queryParams().equal_range("arg");
  for (auto it = first_arg; it != last_arg; ++it) spec.argv.push_back(it->second);
  if (command && !spec.argv.empty()) {
    return fail(c, makeError(ErrorCode::kInvalidArgument, "give a command or args (arg=...), not both"));
  }
  if (spec.argv.size() > 4096) return fail(c, makeError(ErrorCode::kInvalidArgument, "arg: at most 4096"));
  if (command) {
    spec.command = *command;
  } else if (spec.argv.empty()) {
    spec.argv = {"/bin/bash", "-l"};  // an interactive login shell
  }
  // The session's life is the client's: the process is killed when it leaves. Until its pid is
  // known, the tag finds it.
  spec.timeout = milliseconds(0);
  static std::atomic<uint64_t> sessions{0};
  spec.tag = "space-pty-" + std::to_string(::getpid()) + "-" + std::to_string(++sessions);
  const std::string tag = spec.tag;
  if (auto ok = guest::checkProcessSpec(spec); !ok.ok()) return fail(c, ok.error());

  // Terminals hold no thread, so a tenant could otherwise open them by the thousand.
  auto busy = [&c, this](int status, const std::string& message) {
    refuseForNow(c.res, status, "terminals_busy", message);
  };
  TenantPlaces::Refusal refusal;
  std::shared_ptr<void> place = terminal_places_.enter(c.tenant, refusal);
  if (!place || terminals_ == nullptr) {
    return busy(
        refusal.over_node ? 503 : 429,
        refusal.over_node
            ? "this node has " + std::to_string(terminal_places_.nodeCap()) + " terminals open already; retry later"
            : "this tenant " + terminal_places_.shareText(refusal, " terminals") + "; close one first");
  }
  auto agent = lease(c, "open a terminal");
  if (!agent.ok()) return fail(c, agent.error());
  guest::GuestOps ops(agent->agent);
  ops.setControlTimeout(std::chrono::seconds(5));
  // A terminal needs little backlog: a reader that falls 1 MiB behind is too slow for one.
  auto process = ops.start(std::move(spec), guest::StreamLimits{std::min<size_t>(limits_.max_stream_backlog, 1 << 20)});
  if (!process.ok()) return fail(c, process.error());
  // Until the process runs, failures (no such user or directory) are plain HTTP errors. The
  // agent announces a process before its output, so anything else first is a broken guest.
  int pid = 0;
  std::vector<guest::ProcessEvent> pending;
  for (auto deadline = Clock::now() + std::chrono::seconds(30); pid == 0;) {
    auto batch = process.value()->next(milliseconds(500));
    for (auto& event : batch.events) {
      if (pid != 0) {
        pending.push_back(std::move(event));  // one batch, bounded by the stream's backlog
      } else if (event.kind == guest::ProcessEvent::Kind::kStart) {
        pid = event.pid;
      } else {
        process.value()->stop();
        (void)ops.sendSignalTagged(tag, guest::Signal::kKill);
        return fail(c,
                    manager_.agentFailed(agent.value(), makeError(ErrorCode::kUnavailable,
                                                                  "the guest sent output before the process started")));
      }
    }
    if (pid != 0) break;
    if (batch.state != guest::ProcessStream::State::kOpen) {
      Error e = batch.error ? *batch.error : makeError(ErrorCode::kUnavailable, "the process ended before it started");
      (void)ops.sendSignalTagged(tag, guest::Signal::kKill);
      return fail(c, manager_.agentFailed(agent.value(), e));
    }
    if (Clock::now() > deadline || c.res.clientGone()) {
      process.value()->stop();
      (void)ops.sendSignalTagged(tag, guest::Signal::kKill);
      return fail(c, makeError(ErrorCode::kUnavailable, "the guest did not start the terminal's process in 30 s"));
    }
  }
  spdlog::info("pty: sandbox {} ({}): terminal process {} started", c.id(), c.tenant, pid);
  // A terminal lasts as long as what let it in: a removed key or an ended console session ends
  // it too (checked every few seconds).
  PtyProcess session{ops, std::move(process).value(), pid, std::move(pending), nullptr, {}, {}};
  if (!c.console_session.empty()) {
    session.authorized = [this, token = c.console_session, tenant = c.tenant] {
      return console_ && console_->stillValid(token, tenant);
    };
  } else if (auto header = c.req.header("authorization"); header && bearerToken(*header)) {
    session.authorized = [this, key = *bearerToken(*header), tenant = c.tenant] {
      return keys_.authenticate(key) == tenant;
    };
  }
  session.keep =
      std::make_shared<std::pair<sandbox::AgentLease, std::shared_ptr<void>>>(std::move(agent).value(), place);
  session.ended = [id = std::string(c.id()), pid](const PtySessionEnd& end) {
    spdlog::info("pty: sandbox {}: terminal process {} ended: {}{}", id, pid, end.outcome,
                 end.outcome == "exited" ? " (exit code " + std::to_string(end.exit_code) + ")" : "");
  };
  // The server relays the client's connection to the session's socket on its event loop; the
  // session runs on the terminals' loop: no thread waits for the client from here on.
  auto plan = terminals_->open(c.req.target(), c.req.headers(), std::move(session));
  if (!plan.ok()) return fail(c, plan.error());
  // The relay holds the place as well, until it ends: a client that keeps its connection after
  // its session ended (a close handshake it never finishes) counts among its tenant's quarter.
  plan->keep = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(std::move(plan->keep),
                                                                                         std::move(place));
  if (auto relayed = c.res.relay(101, std::move(plan).value()); !relayed.ok()) {
    busy(503, relayed.error().message);  // the plan went with the refusal, and the session with its socket
  }
}

void ApiService::listProcesses(Call& c) {
  auto agent = lease(c, "list processes");
  if (!agent.ok()) return fail(c, agent.error());
  auto result = guest::GuestOps(agent->agent).listProcesses();
  if (!result.ok()) return fail(c, manager_.agentFailed(agent.value(), result.error()));
  json out = json::array();
  for (auto& p : result.value()) {
    json entry{{"pid", p.pid}, {"cmd", std::move(p.cmd)}, {"args", std::move(p.args)}, {"cwd", std::move(p.cwd)}};
    if (p.tag) entry["tag"] = std::move(*p.tag);
    out.push_back(std::move(entry));
  }
  (void)c.res.send(200, "application/json", dumpJson(json{{"processes", out}}));
}

void ApiService::attachProcess(Call& c) {
  auto pid = pidParam(c.req);
  if (!pid.ok()) return fail(c, pid.error());
  auto agent = lease(c, "attach to a process");
  if (!agent.ok()) return fail(c, agent.error());
  auto process = guest::GuestOps(agent->agent).connect(pid.value(), guest::StreamLimits{limits_.max_stream_backlog});
  streamProcess(c, std::move(agent.value()), std::move(process), std::nullopt);
}

void ApiService::signalProcess(Call& c) {
  auto pid = pidParam(c.req);
  if (!pid.ok()) return fail(c, pid.error());
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto signal = in.string("signal", 32);
  if (!signal.ok()) return fail(c, signal.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  auto parsed = guest::parseSignal(signal.value().value_or("SIGTERM"));
  if (!parsed) {
    return fail(
        c, makeError(ErrorCode::kInvalidArgument,
                     "signal: one of SIGKILL, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT"));
  }
  auto agent = lease(c, "signal a process");
  if (!agent.ok()) return fail(c, agent.error());
  auto sent = guest::GuestOps(agent->agent).sendSignal(pid.value(), *parsed);
  if (!sent.ok()) return fail(c, manager_.agentFailed(agent.value(), sent.error()));
  (void)c.res.send(204, "", "");
}

void ApiService::processInput(Call& c) {
  auto pid = pidParam(c.req);
  if (!pid.ok()) return fail(c, pid.error());
  auto body = readJson(c, limits_.max_exec_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto data = in.string("data", limits_.max_exec_body);
  auto eof = in.boolean("eof");
  if (!data.ok()) return fail(c, data.error());
  if (!eof.ok()) return fail(c, eof.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  std::optional<std::string> bytes;
  if (data.value()) {
    bytes = agentproto::base64Decode(*data.value());
    if (!bytes) return fail(c, makeError(ErrorCode::kInvalidArgument, "data: not valid base64"));
  }
  auto agent = lease(c, "send input");
  if (!agent.ok()) return fail(c, agent.error());
  guest::GuestOps ops(agent->agent);
  if (bytes) {
    auto sent = ops.sendInput(pid.value(), *bytes);
    if (!sent.ok()) return fail(c, manager_.agentFailed(agent.value(), sent.error()));
  }
  if (eof.value().value_or(false)) {
    auto closed = ops.closeStdin(pid.value());
    if (!closed.ok()) return fail(c, manager_.agentFailed(agent.value(), closed.error()));
  }
  (void)c.res.send(204, "", "");
}

// --- files -----------------------------------------------------------------------------------

void ApiService::downloadFile(Call& c) {
  auto path = requiredQuery(c.req, "path");
  if (!path.ok()) return fail(c, path.error());
  auto user = queryUser(c.req);
  if (!user.ok()) return fail(c, user.error());
  auto agent = lease(c, "read files");
  if (!agent.ok()) return fail(c, agent.error());
  bool client_gone = false;
  // The response starts with the first chunk, so an error before it (no such file, a
  // directory) is still a proper error response. The sink runs on this thread (never the
  // agent client's I/O thread), so a client that reads slowly slows only its own download.
  auto done = guest::GuestOps(agent->agent)
                  .download(
                      path.value(),
                      [&](std::string_view chunk) -> Status {
                        if (!c.res.started()) {
                          c.res.setHeader("X-Content-Type-Options", "nosniff");
                          if (!c.res.begin(200, "application/octet-stream").ok()) client_gone = true;
                        }
                        if (client_gone || !c.res.write(chunk).ok()) {
                          client_gone = true;
                          return makeError(ErrorCode::kCanceled, "the client went away");
                        }
                        return okStatus();
                      },
                      user.value());
  if (!done.ok()) {
    if (client_gone) return;
    return fail(c, manager_.agentFailed(agent.value(), done.error()));
  }
  if (!c.res.started()) {
    (void)c.res.send(200, "application/octet-stream", "");
    return;
  }
  (void)c.res.end();
}

void ApiService::uploadFile(Call& c) {
  auto path = requiredQuery(c.req, "path");
  if (!path.ok()) return fail(c, path.error());
  auto user = queryUser(c.req);
  if (!user.ok()) return fail(c, user.error());
  auto agent = lease(c, "write files");
  if (!agent.ok()) return fail(c, agent.error());
  std::optional<Error> body_error;
  // The source runs on this thread (never the agent client's I/O thread), so a client that
  // trickles its body holds up only its own upload; each read waits at most the server's
  // read timeout.
  auto result = guest::GuestOps(agent->agent)
                    .upload(
                        path.value(),
                        [&](char* out, size_t max) -> Result<size_t> {
                          auto n = c.req.readSome(out, max);
                          if (!n.ok()) body_error = n.error();
                          return n;
                        },
                        user.value());
  if (!result.ok()) {
    if (body_error) return fail(c, makeError(ErrorCode::kInvalidArgument, "request body: " + body_error->message));
    return fail(c, manager_.agentFailed(agent.value(), result.error()));
  }
  (void)c.res.send(200, "application/json", dumpJson(entryJson(result.value())));
}

void ApiService::removeFile(Call& c) {
  auto path = requiredQuery(c.req, "path");
  if (!path.ok()) return fail(c, path.error());
  auto user = queryUser(c.req);
  if (!user.ok()) return fail(c, user.error());
  auto agent = lease(c, "remove files");
  if (!agent.ok()) return fail(c, agent.error());
  auto removed = guest::GuestOps(agent->agent).remove(path.value(), user.value());
  if (!removed.ok()) return fail(c, manager_.agentFailed(agent.value(), removed.error()));
  (void)c.res.send(204, "", "");
}

void ApiService::listFiles(Call& c) {
  auto path = requiredQuery(c.req, "path");
  if (!path.ok()) return fail(c, path.error());
  auto user = queryUser(c.req);
  if (!user.ok()) return fail(c, user.error());
  auto depth = queryInt(c.req, "depth", 1, 64);
  if (!depth.ok()) return fail(c, depth.error());
  auto agent = lease(c, "list files");
  if (!agent.ok()) return fail(c, agent.error());
  auto result =
      guest::GuestOps(agent->agent).listDir(path.value(), static_cast<int>(depth.value().value_or(1)), user.value());
  if (!result.ok()) return fail(c, manager_.agentFailed(agent.value(), result.error()));
  json entries = json::array();
  for (const auto& e : result.value()) entries.push_back(entryJson(e));
  (void)c.res.send(200, "application/json", dumpJson(json{{"entries", entries}}));
}

void ApiService::makeDirectory(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto path = in.string("path", 4096);
  auto user = in.string("user", 64);
  if (!path.ok()) return fail(c, path.error());
  if (!user.ok()) return fail(c, user.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  if (auto ok = checkPath(path.value().value_or(""), "path"); !ok.ok()) return fail(c, ok.error());
  auto agent = lease(c, "make directories");
  if (!agent.ok()) return fail(c, agent.error());
  auto result = guest::GuestOps(agent->agent).makeDir(*path.value(), user.value().value_or(""));
  if (!result.ok()) return fail(c, manager_.agentFailed(agent.value(), result.error()));
  (void)c.res.send(201, "application/json", dumpJson(entryJson(result.value())));
}

void ApiService::moveFile(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  ObjectReader in(body.value());
  auto source = in.string("source", 4096);
  auto destination = in.string("destination", 4096);
  auto user = in.string("user", 64);
  for (const Status& s :
       {source.ok() ? okStatus() : Status(source.error()), destination.ok() ? okStatus() : Status(destination.error()),
        user.ok() ? okStatus() : Status(user.error()), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  if (auto ok = checkPath(source.value().value_or(""), "source"); !ok.ok()) return fail(c, ok.error());
  if (auto ok = checkPath(destination.value().value_or(""), "destination"); !ok.ok()) return fail(c, ok.error());
  auto agent = lease(c, "move files");
  if (!agent.ok()) return fail(c, agent.error());
  auto result = guest::GuestOps(agent->agent).move(*source.value(), *destination.value(), user.value().value_or(""));
  if (!result.ok()) return fail(c, manager_.agentFailed(agent.value(), result.error()));
  (void)c.res.send(200, "application/json", dumpJson(entryJson(result.value())));
}

void ApiService::sandboxMetrics(Call& c) {
  // start and end: unix seconds, both optional (by default the whole series: the last hour's).
  constexpr int64_t kMaxUnixS = INT64_MAX / 1000 - 1;
  auto start = queryInt(c.req, "start", 0, kMaxUnixS);
  if (!start.ok()) return fail(c, start.error());
  auto end = queryInt(c.req, "end", 0, kMaxUnixS);
  if (!end.ok()) return fail(c, end.error());
  // The end second is included whole.
  auto samples = manager_.metrics(c.tenant, c.id(), start.value().value_or(0) * 1000,
                                  end.value().value_or(kMaxUnixS) * 1000 + 999);
  if (!samples.ok()) return fail(c, samples.error());
  json out = json::array();
  for (const auto& m : samples.value()) {
    json sample{{"timestamp", rfc3339(m.timestamp_ms)},
                {"timestamp_unix", m.timestamp_ms / 1000},
                {"cpu_count", m.cpu_count},
                {"cpu_used_pct", std::round(m.cpu_used_pct * 100) / 100},
                {"mem_used_bytes", m.mem_used_bytes},
                {"mem_total_bytes", m.mem_total_bytes},
                {"disk_used_bytes", m.disk_used_bytes},
                {"net_sent_bytes", m.net_sent_bytes},
                {"net_received_bytes", m.net_received_bytes}};
    // What the guest says of itself, when its agent answered lately (sandbox/metrics.h).
    if (m.guest) {
      sample["guest_mem_used_bytes"] = m.guest->mem_used;
      sample["guest_mem_cache_bytes"] = m.guest->mem_cache;
      sample["guest_disk_used_bytes"] = m.guest->disk_used;
      sample["guest_disk_total_bytes"] = m.guest->disk_total;
    }
    out.push_back(std::move(sample));
  }
  (void)c.res.send(200, "application/json", dumpJson(json{{"metrics", std::move(out)}}));
}

void ApiService::consoleLog(Call& c) {
  auto tail = queryInt(c.req, "tail_bytes", 1, static_cast<int64_t>(limits_.max_console_bytes));
  if (!tail.ok()) return fail(c, tail.error());
  auto text = manager_.consoleLog(c.tenant, c.id(), static_cast<size_t>(tail.value().value_or(64 * 1024)));
  if (!text.ok()) return fail(c, text.error());
  (void)c.res.send(200, "text/plain; charset=utf-8", text.value());
}

void ApiService::getNetwork(Call& c) {
  auto policy = manager_.networkPolicy(c.tenant, c.id());
  if (!policy.ok()) return fail(c, policy.error());
  (void)c.res.send(200, "application/json", dumpJson(net::toJson(policy.value())));
}

void ApiService::setNetwork(Call& c) {
  auto body = readJson(c, limits_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  auto policy = net::parsePolicy(body.value());
  if (!policy.ok()) return fail(c, makeError(ErrorCode::kInvalidArgument, "network: " + policy.error().message));
  if (auto known = checkCredentialSecrets(c.tenant, policy.value()); !known.ok()) return fail(c, known.error());
  if (auto set = manager_.setNetworkPolicy(c.tenant, c.id(), policy.value()); !set.ok()) return fail(c, set.error());
  (void)c.res.send(200, "application/json", dumpJson(net::toJson(policy.value())));
}

void ApiService::networkLog(Call& c) {
  sandbox::NetworkLogFilter filter;
  auto limit = queryInt(c.req, "limit", 1, 10000);
  if (!limit.ok()) return fail(c, limit.error());
  filter.limit = static_cast<size_t>(limit.value().value_or(1000));
  for (auto [name, bound] : {std::pair{"after_ms", &filter.after_ms}, std::pair{"before_ms", &filter.before_ms}}) {
    auto ms = queryInt(c.req, name, 0, std::numeric_limits<int64_t>::max());
    if (!ms.ok()) return fail(c, ms.error());
    if (ms.value()) *bound = *ms.value();
  }
  if (auto allowed = c.req.query("allowed")) {
    if (*allowed != "true" && *allowed != "false") {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "allowed: must be true or false"));
    }
    filter.allowed = *allowed == "true";
  }
  if (auto kind = c.req.query("kind")) {
    if (*kind != "dns" && *kind != "tcp" && *kind != "gateway") {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "kind: must be dns, tcp or gateway"));
    }
    filter.kind = *kind;
  }
  auto entries = manager_.networkLog(c.tenant, c.id(), filter);
  if (!entries.ok()) return fail(c, entries.error());
  json items = json::array();
  for (auto& e : entries.value()) items.push_back(std::move(e));
  (void)c.res.send(200, "application/json", dumpJson(json{{"entries", std::move(items)}}));
}

}  // namespace space::api
