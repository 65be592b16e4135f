#include "e2b/control_plane.h"

#include <spdlog/spdlog.h>
#include <strings.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>

#include "api/api_service.h"
#include "api/ingress.h"
#include "api/json_input.h"
#include "api/json_output.h"
#include "http/url.h"
#include "net/policy.h"
#include "sandbox/lifecycle.h"

namespace space::e2b {

using api::dumpJson;
using api::rfc3339;
using nlohmann::json;

namespace {

constexpr uint32_t kMaxForkCount = 100;
constexpr size_t kMaxListScan = 10000;  // a tenant's live sandboxes, read for one list request

// A list's `limit` query parameter: 1..1000.
Result<size_t> pageLimit(const std::string& value) {
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < 1 || n > 1000) {
    return makeError(ErrorCode::kInvalidArgument, "limit: must be an integer in 1..1000");
  }
  return static_cast<size_t>(n);
}

}  // namespace

std::optional<int64_t> parseRfc3339Ms(const std::string& text) {
  struct tm t {};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &t);
  if (!rest) return std::nullopt;
  int64_t ms = 0;
  if (*rest == '.') {
    ++rest;
    int digits = 0;
    while (*rest >= '0' && *rest <= '9') {
      if (digits < 3) ms = ms * 10 + (*rest - '0');
      ++digits;
      ++rest;
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 3; ++digits) ms *= 10;
  }
  int64_t offset_s = 0;
  if (*rest == 'Z' || *rest == 'z') {
    ++rest;
  } else if (*rest == '+' || *rest == '-') {
    // Exactly [+-]HH:MM, checked byte by byte before stepping over it.
    auto digit = [](char ch) { return ch >= '0' && ch <= '9'; };
    if (!digit(rest[1]) || !digit(rest[2]) || rest[3] != ':' || !digit(rest[4]) || !digit(rest[5])) {
      return std::nullopt;
    }
    const int hh = (rest[1] - '0') * 10 + (rest[2] - '0');
    const int mm = (rest[4] - '0') * 10 + (rest[5] - '0');
    if (hh > 23 || mm > 59) return std::nullopt;
    offset_s = (hh * 3600 + mm * 60) * (*rest == '+' ? 1 : -1);
    rest += 6;
  } else {
    return std::nullopt;
  }
  if (*rest != '\0') return std::nullopt;
  return (static_cast<int64_t>(timegm(&t)) - offset_s) * 1000 + ms;
}

namespace {

Status sendE2bError(http::Response& res, int status, const std::string& message) {
  return res.send(status, "application/json", dumpJson(json{{"code", status}, {"message", message}}));
}

// E2B names one state "paused" for what SPACE keeps in two: vCPUs stopped, or saved to disk.
bool isE2bPaused(const std::string& state) {
  return state == sandbox::stateName(sandbox::SandboxState::kPaused) ||
         state == sandbox::stateName(sandbox::SandboxState::kSuspended);
}
bool isGone(const std::string& state) {
  return state == sandbox::stateName(sandbox::SandboxState::kDeleted) ||
         state == sandbox::stateName(sandbox::SandboxState::kFailed);
}

Error notFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "sandbox \"" + id + "\" not found", "not_found");
}

Result<std::optional<std::vector<std::string>>> stringList(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::optional<std::vector<std::string>>();
  if (!it->is_array() || it->size() > net::kMaxRules) {
    return makeError(ErrorCode::kInvalidArgument, std::string("network.") + name + ": must be an array of at most " +
                                                      std::to_string(net::kMaxRules) + " strings");
  }
  std::vector<std::string> out;
  for (const auto& v : *it) {
    if (!v.is_string()) {
      return makeError(ErrorCode::kInvalidArgument, std::string("network.") + name + ": must hold strings");
    }
    out.push_back(v.get<std::string>());
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

// A header value that names at least one secret and holds nothing else in clear but, before
// it, an authorization scheme ("Bearer ", "token "): a key beside the placeholder would be
// kept in clear as surely as a literal.
bool onlySecretsAndAScheme(const std::string& value) {
  std::string rest;
  bool named = false;
  for (size_t at = 0; at < value.size();) {
    const size_t open = value.find("{{secret:", at);
    if (open == std::string::npos) {
      rest += value.substr(at);
      break;
    }
    if (open > at && named) return false;  // text between or after placeholders
    rest += value.substr(at, open - at);
    const size_t close = value.find("}}", open);
    if (close == std::string::npos) return false;
    named = true;
    at = close + 2;
  }
  if (!named) return false;
  if (rest.empty()) return true;
  if (!value.starts_with(rest)) return false;  // the scheme comes first, nothing follows the secret
  for (const char* scheme : {"Bearer ", "Basic ", "Token ", "Bot ", "Digest ", "ApiKey ", "Key "}) {
    if (strcasecmp(rest.c_str(), scheme) == 0) return true;
  }
  return false;
}

// network.rules: {"<host>": [{"transform": {"headers": {"Name": "value"}}}, ...]} becomes one
// SPACE credential rule per host, its headers those of every entry (later ones win). The
// gateway adds them to the sandbox's TLS requests to that host, outside the VM. A value may
// name one of the tenant's SPACE secrets as {{secret:NAME}}; E2B's IAM token placeholders have
// nothing behind them here and are refused.
Result<json> e2bCredentialRules(const json& rules) {
  auto invalid = [](const std::string& m) { return makeError(ErrorCode::kInvalidArgument, "network.rules" + m); };
  if (!rules.is_object()) return invalid(": must be an object of host: [rule]");
  if (rules.size() > net::kMaxCredentialRules) {
    return invalid(": at most " + std::to_string(net::kMaxCredentialRules) + " hosts");
  }
  json out = json::array();
  for (const auto& [host, entries] : rules.items()) {
    const std::string at = "[" + host.substr(0, 64) + "]";
    if (!entries.is_array() || entries.size() > net::kMaxCredentialHeaders) {
      return invalid(at + ": must be an array of at most " + std::to_string(net::kMaxCredentialHeaders) + " rules");
    }
    json headers = json::object();
    for (const auto& entry : entries) {
      if (!entry.is_object()) return invalid(at + ": each rule must be an object");
      for (const auto& [field, transform] : entry.items()) {
        if (field != "transform") return invalid(at + "." + field + ": unknown field");
        if (transform.is_null()) continue;
        if (!transform.is_object()) return invalid(at + ".transform: must be an object");
        for (const auto& [what, value] : transform.items()) {
          if (what != "headers") return invalid(at + ".transform." + what + ": not supported by SPACE (headers only)");
          if (!value.is_object()) return invalid(at + ".transform.headers: must be an object of name: value");
          for (const auto& [name, header] : value.items()) {
            if (!header.is_string()) return invalid(at + ".transform.headers." + name + ": must be a string");
            if (header.get_ref<const std::string&>().find("${e2b.identity.") != std::string::npos) {
              return invalid(at + ".transform.headers." + name + ": IAM tokens are not supported by SPACE");
            }
            // A literal value would be kept in clear in the sandbox's policy (its file, its
            // snapshots, the policy's log lines), where SPACE keeps secrets sealed in the vault.
            if (!onlySecretsAndAScheme(header.get_ref<const std::string&>())) {
              return invalid(at + ".transform.headers." + name +
                             ": name a SPACE secret as {{secret:NAME}} (create it with PUT /v1/secrets/NAME on "
                             "SPACE's API); literal values are not kept");
            }
            headers[name] = header;
          }
        }
      }
    }
    if (headers.empty()) continue;  // a rule without a transform changes nothing here
    out.push_back(json{{"host", host}, {"headers", std::move(headers)}});
  }
  return out;
}

}  // namespace

Result<json> e2bNetworkPolicy(json base, std::optional<bool> allow_internet_access, const json* network) {
  if (!base.is_object()) base = json::object();
  std::optional<std::vector<std::string>> allow_out, deny_out;
  if (network) {
    if (!network->is_object()) return makeError(ErrorCode::kInvalidArgument, "network: must be an object");
    for (const auto& [key, value] : network->items()) {
      if (value.is_null()) continue;
      if (key == "allowOut" || key == "denyOut" || key == "allowPublicTraffic") continue;
      if (key == "rules") {
        auto credentials = e2bCredentialRules(value);
        if (!credentials.ok()) return credentials.error();
        base["credentials"] = std::move(credentials.value());  // replaces what the sandbox had
        continue;
      }
      if (key == "egressProxy" || key == "maskRequestHost" || key == "httpsPorts") {
        return makeError(ErrorCode::kInvalidArgument, "network." + key + ": not supported by SPACE");
      }
      return makeError(ErrorCode::kInvalidArgument, "network." + key + ": unknown field");
    }
    auto a = stringList(*network, "allowOut");
    if (!a.ok()) return a.error();
    auto d = stringList(*network, "denyOut");
    if (!d.ok()) return d.error();
    allow_out = std::move(a.value());
    deny_out = std::move(d.value());
    if (auto it = network->find("allowPublicTraffic"); it != network->end() && !it->is_null()) {
      if (!it->is_boolean())
        return makeError(ErrorCode::kInvalidArgument, "network.allowPublicTraffic: must be a boolean");
      base["public_ports"] = it->get<bool>();
    }
  }
  if (!allow_internet_access && !allow_out && !deny_out) return base;
  std::vector<std::string> allow = allow_out.value_or(std::vector<std::string>{});
  std::vector<std::string> deny;
  bool deny_all = allow_internet_access.has_value() && !*allow_internet_access;
  for (const auto& rule : deny_out.value_or(std::vector<std::string>{})) {
    if (rule == "0.0.0.0/0") {
      deny_all = true;
    } else {
      deny.push_back(rule);
    }
  }
  if (deny_all) {
    // E2B: allowOut wins over a deny of everything; SPACE says that as mode "policy".
    base["egress"] = allow.empty() ? "deny" : "policy";
    base["allow"] = allow;
    base["deny"] = allow.empty() ? std::vector<std::string>{} : deny;
  } else {
    base["egress"] = "allow";
    base["allow"] = allow;
    base["deny"] = deny;
  }
  return base;
}

json e2bNetworkInfo(const net::Policy& policy) {
  json allow = json::array(), deny = json::array();
  for (const auto& r : policy.allow) allow.push_back(r.text);
  for (const auto& r : policy.deny) deny.push_back(r.text);
  const bool open = policy.mode == net::EgressMode::kAllow;
  if (!open) deny.insert(deny.begin(), "0.0.0.0/0");
  json network{{"allowOut", allow}, {"denyOut", deny}, {"allowPublicTraffic", policy.public_ports}};
  return json{{"allowInternetAccess", open}, {"network", network}};
}

struct ControlPlane::Call {
  http::Request& req;
  http::Response& res;
  std::string tenant;
  const std::string& id() const { return req.pathParam("id"); }
};

ControlPlane::ControlPlane(sandbox::SandboxManager& manager, api::KeyRing& keys, secrets::SecretVault& vault,
                           ControlPlaneOptions options)
    : manager_(manager), keys_(keys), vault_(vault), options_(options), gate_(options.tenant_gate) {
  // A tenant's own request rate applies here as on SPACE's API.
  if (options.tenant_rates) {
    gate_.shareRates(options.tenant_rates);
  } else {
    gate_.setRateSource(api::tenantRateSource(manager_, {options.tenant_gate.rate_per_s, options.tenant_gate.burst}));
  }
  auto connect = [](ControlPlane& self, Call& c) { self.connectSandbox(c, false); };
  routes_ = {
      {"POST", "/sandboxes", [](ControlPlane& s, Call& c) { s.createSandbox(c); }},
      {"POST", "/v2/sandboxes", [](ControlPlane& s, Call& c) { s.createSandbox(c); }},
      {"GET", "/sandboxes", [](ControlPlane& s, Call& c) { s.listSandboxes(c); }},
      {"GET", "/v2/sandboxes", [](ControlPlane& s, Call& c) { s.listSandboxes(c); }},
      {"GET", "/sandboxes/{id}", [](ControlPlane& s, Call& c) { s.getSandbox(c); }},
      {"DELETE", "/sandboxes/{id}", [](ControlPlane& s, Call& c) { s.killSandbox(c); }},
      {"POST", "/sandboxes/{id}/timeout", [](ControlPlane& s, Call& c) { s.setTimeout(c); }},
      {"POST", "/sandboxes/{id}/pause", [](ControlPlane& s, Call& c) { s.pauseSandbox(c); }},
      {"POST", "/sandboxes/{id}/connect", connect},
      {"POST", "/v2/sandboxes/{id}/connect", connect},
      {"POST", "/sandboxes/{id}/resume", [](ControlPlane& s, Call& c) { s.connectSandbox(c, true); }},
      {"GET", "/sandboxes/{id}/metrics", [](ControlPlane& s, Call& c) { s.metrics(c); }},
      {"PUT", "/sandboxes/{id}/network", [](ControlPlane& s, Call& c) { s.updateNetwork(c); }},
      {"POST", "/sandboxes/{id}/snapshots", [](ControlPlane& s, Call& c) { s.createSnapshot(c); }},
      {"GET", "/snapshots", [](ControlPlane& s, Call& c) { s.listSnapshots(c); }},
      {"DELETE", "/templates/{id}", [](ControlPlane& s, Call& c) { s.deleteSnapshot(c); }},
      {"POST", "/sandboxes/{id}/fork", [](ControlPlane& s, Call& c) { s.forkSandbox(c); }},
  };
  // The router only matches; routes_ holds what runs.
  for (const auto& r : routes_) router_.add(r.method, r.pattern, [](http::Request&, http::Response&) {});
}

void ControlPlane::handle(http::Request& req, http::Response& res) {
  // E2B's SDK sends X-API-KEY; a SPACE client's Bearer key works too.
  std::optional<std::string> key = req.header("x-api-key");
  if (!key) {
    if (auto header = req.header("authorization")) key = api::bearerToken(*header);
  }
  auto tenant = key ? keys_.authenticate(*key) : std::nullopt;
  if (!tenant) {
    res.closeConnection();
    (void)sendE2bError(res, 401, key ? "the API key is not valid" : "missing X-API-KEY header");
    return;
  }
  auto ticket = gate_.enter(*tenant);
  if (!ticket.admitted()) {
    res.closeConnection();
    res.setHeader("Retry-After", std::to_string(std::max(1, ticket.retryAfterS())));
    (void)sendE2bError(
        res, 429,
        ticket.refusal() == api::TenantGate::Refusal::kRateLimited
            ? "rate limit reached; retry after " + std::to_string(std::max(1, ticket.retryAfterS())) + " s"
            : "too many requests running for this API key; retry when one has finished");
    return;
  }
  auto found = router_.match(req.method(), req.rawPath());
  if (found.kind != http::Router::Match::Kind::kFound) {
    if (found.kind == http::Router::Match::Kind::kMethodNotAllowed) {
      (void)sendE2bError(res, 405, "method " + req.method() + " is not allowed on " + req.path());
    } else {
      (void)sendE2bError(res, 404, "no route for " + req.method() + " " + req.path());
    }
    return;
  }
  req.setPathParams(std::move(found.params));
  Call call{req, res, *tenant};
  for (const auto& r : routes_) {
    if (r.pattern == found.pattern && r.method == req.method()) return r.run(*this, call);
  }
}

void ControlPlane::fail(Call& c, const Error& error) {
  if (c.res.started()) return;
  if (error.code != ErrorCode::kNotFound && error.code != ErrorCode::kInvalidArgument) {
    spdlog::info("e2b: {} {}: {}", c.req.method(), c.req.path(), error.message);
  }
  const int status = api::httpStatus(error);
  std::string message = error.message;
  if (error.reason == "insufficient_capacity") message = "this node has not enough free capacity now; retry later";
  if (status == 429) c.res.setHeader("Retry-After", "1");
  (void)sendE2bError(c.res, status, message);
}

json ControlPlane::sandboxJson(const store::SandboxRecord& r) const {
  // The ports of a SPACE sandbox are private unless it was made with public traffic: the
  // traffic token (E2B's header e2b-traffic-access-token) opens them, and only them.
  json traffic =
      options_.traffic_token_key.empty() ? json(nullptr) : json(api::accessToken(options_.traffic_token_key, r.id));
  return json{
      {"sandboxID", r.id},           {"templateID", r.source_snapshot.empty() ? r.template_name : r.source_snapshot},
      {"alias", r.template_name},    {"clientID", kClientId},
      {"envdVersion", kEnvdVersion}, {"envdAccessToken", vault_.envdAccessToken(r.id)},
      {"domain", nullptr},           {"trafficAccessToken", traffic}};
}

json ControlPlane::detailJson(const store::SandboxRecord& r, bool with_token) const {
  json out = sandboxJson(r);
  if (!with_token) {
    out.erase("envdAccessToken");
    out.erase("domain");
    out.erase("trafficAccessToken");
  }
  out["startedAt"] = rfc3339(r.created_at_ms);
  out["endAt"] = rfc3339(r.expires_at_ms);
  out["state"] = isE2bPaused(r.state) ? "paused" : "running";
  out["cpuCount"] = r.cpus;
  out["memoryMB"] = r.memory_mb;
  out["diskSizeMB"] = options_.disk_size_mb;
  out["metadata"] = r.metadata.is_object() ? r.metadata : json::object();
  out["lifecycle"] = json{{"onTimeout", r.on_timeout == "suspend" ? "pause" : "kill"}, {"autoResume", r.auto_resume}};
  return out;
}

void ControlPlane::createSandbox(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  sandbox::CreateRequest request;
  request.tenant = c.tenant;
  auto tpl = in.string("templateID", 128);
  auto metadata = in.stringMap("metadata", 64, 16 * 1024);
  auto env = in.envMap("envVars", 256);
  auto timeout = in.integer("timeout", 1, INT32_MAX);
  auto internet = in.boolean("allow_internet_access");
  auto network = in.object("network");
  auto secure = in.boolean("secure");  // envd access tokens are always on
  auto auto_pause = in.boolean("autoPause");
  auto auto_pause_memory = in.boolean("autoPauseMemory");
  auto auto_resume = in.object("autoResume");
  for (const char* unsupported : {"volumeMounts", "mcp", "iam"}) {
    if (body->contains(unsupported) && !(*body)[unsupported].is_null()) {
      return fail(c, makeError(ErrorCode::kInvalidArgument, std::string(unsupported) + ": not supported by SPACE"));
    }
  }
  for (const Status& s :
       {tpl.ok() ? okStatus() : Status(tpl.error()), metadata.ok() ? okStatus() : Status(metadata.error()),
        env.ok() ? okStatus() : Status(env.error()), timeout.ok() ? okStatus() : Status(timeout.error()),
        internet.ok() ? okStatus() : Status(internet.error()), network.ok() ? okStatus() : Status(network.error()),
        secure.ok() ? okStatus() : Status(secure.error()), auto_pause.ok() ? okStatus() : Status(auto_pause.error()),
        auto_pause_memory.ok() ? okStatus() : Status(auto_pause_memory.error()),
        auto_resume.ok() ? okStatus() : Status(auto_resume.error()), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  if (auto_resume.value()) {
    const json& ar = **auto_resume.value();
    auto enabled = ar.find("enabled");
    if (ar.size() > 1 || (enabled != ar.end() && !enabled->is_boolean() && !enabled->is_null()) ||
        (ar.size() == 1 && enabled == ar.end())) {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "autoResume: must be {\"enabled\": true|false}"));
    }
    // Traffic to the sandbox (envd calls, its ports) resumes it when it is paused.
    request.auto_resume = enabled != ar.end() && enabled->is_boolean() && enabled->get<bool>();
  }
  const std::string template_id = tpl.value().value_or("base");
  // A snapshot id of this tenant's names a saved point, anything else a template.
  if (auto snap = manager_.getSnapshot(c.tenant, template_id); snap.ok()) {
    request.snapshot_id = template_id;
  } else {
    request.template_name = template_id;
  }
  if (metadata.value()) request.metadata = *metadata.value();
  if (env.value()) request.env = *env.value();
  if (timeout.value()) request.timeout_s = *timeout.value();
  if (auto_pause.value().value_or(false)) request.on_timeout = "suspend";
  if (internet.value() || network.value()) {
    auto policy_json = e2bNetworkPolicy(json::object(), internet.value(), network.value() ? *network.value() : nullptr);
    if (!policy_json.ok()) return fail(c, policy_json.error());
    auto policy = net::parsePolicy(policy_json.value());
    if (!policy.ok()) return fail(c, makeError(ErrorCode::kInvalidArgument, "network: " + policy.error().message));
    if (auto known = checkSecretsExist(c.tenant, policy.value()); !known.ok()) return fail(c, known.error());
    request.network = std::move(policy.value());
  }
  auto rec = manager_.create(request);
  if (!rec.ok()) return fail(c, rec.error());
  (void)c.res.send(201, "application/json", dumpJson(sandboxJson(rec.value())));
}

void ControlPlane::listSandboxes(Call& c) {
  std::vector<std::string> states;
  std::map<std::string, std::string> metadata;
  std::string template_filter;
  std::optional<int64_t> started_after;
  bool ascending = false;
  size_t limit = 100;
  std::string next_token;
  for (const auto& [key, value] : c.req.queryParams()) {
    if (key == "state") {
      size_t start = 0;
      while (start <= value.size()) {
        size_t comma = value.find(',', start);
        std::string name = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (name == "running") {
          states.push_back("running");
        } else if (name == "paused") {
          states.push_back("paused");
          states.push_back("suspended");
        } else {
          return fail(c, makeError(ErrorCode::kInvalidArgument, "state: \"" + name + "\" is not running or paused"));
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (key == "metadata") {
      // k=v pairs joined by '&', each part URL-encoded once more (the SDK's URLSearchParams).
      auto pairs = http::parseQuery(value);
      if (!pairs.ok()) return fail(c, makeError(ErrorCode::kInvalidArgument, "metadata: " + pairs.error().message));
      for (const auto& [k, v] : pairs.value()) {
        if (k.empty()) return fail(c, makeError(ErrorCode::kInvalidArgument, "metadata: must be key=value pairs"));
        metadata[k] = v;
      }
    } else if (key == "template") {
      template_filter = value;
    } else if (key == "startedAfter") {
      started_after = parseRfc3339Ms(value);
      if (!started_after) return fail(c, makeError(ErrorCode::kInvalidArgument, "startedAfter: not an RFC 3339 time"));
    } else if (key == "order") {
      if (value != "asc" && value != "desc") {
        return fail(c, makeError(ErrorCode::kInvalidArgument, "order: must be asc or desc"));
      }
      ascending = value == "asc";
    } else if (key == "limit") {
      auto n = pageLimit(value);
      if (!n.ok()) return fail(c, n.error());
      limit = n.value();
    } else if (key == "nextToken") {
      next_token = value;
    } else {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "unknown query parameter \"" + key + "\""));
    }
  }
  if (states.empty()) states = {"running", "paused", "suspended"};
  // Every matching sandbox of the tenant (its live ones are few: quotas bound them), sorted by
  // start time as E2B orders them; the page token is the last item's (time, id).
  store::ListFilter filter;
  filter.tenant = c.tenant;
  filter.states = states;
  filter.metadata = metadata;
  filter.limit = 1000;
  std::vector<store::SandboxRecord> all;
  while (true) {
    auto page = manager_.list(filter);
    if (!page.ok()) return fail(c, page.error());
    for (auto& rec : page->items) {
      if (!template_filter.empty() && rec.template_name != template_filter && rec.source_snapshot != template_filter) {
        continue;
      }
      if (started_after && rec.created_at_ms <= *started_after) continue;
      all.push_back(std::move(rec));
    }
    if (page->next_cursor.empty() || all.size() > kMaxListScan) break;
    filter.after_id = page->next_cursor;
  }
  auto before = [ascending](const store::SandboxRecord& a, const store::SandboxRecord& b) {
    if (a.created_at_ms != b.created_at_ms)
      return ascending ? a.created_at_ms < b.created_at_ms : a.created_at_ms > b.created_at_ms;
    return ascending ? a.id < b.id : a.id > b.id;
  };
  std::sort(all.begin(), all.end(), before);
  size_t first = 0;
  if (!next_token.empty()) {
    auto sep = next_token.find('_');
    char* end = nullptr;
    long long ms = std::strtoll(next_token.substr(0, sep).c_str(), &end, 10);
    if (sep == std::string::npos || *end != '\0') {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "nextToken: not a token this API gave"));
    }
    store::SandboxRecord mark;
    mark.created_at_ms = ms;
    mark.id = next_token.substr(sep + 1);
    first = static_cast<size_t>(std::upper_bound(all.begin(), all.end(), mark, before) - all.begin());
  }
  json items = json::array();
  size_t i = first;
  for (; i < all.size() && items.size() < limit; ++i) items.push_back(detailJson(all[i], false));
  if (i < all.size()) {
    c.res.setHeader("X-Next-Token", std::to_string(all[i - 1].created_at_ms) + "_" + all[i - 1].id);
  }
  (void)c.res.send(200, "application/json", dumpJson(items));
}

void ControlPlane::getSandbox(Call& c) {
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  json detail = detailJson(rec.value(), true);
  // A node without networking has no policy to show.
  if (auto policy = manager_.networkPolicy(c.tenant, c.id()); policy.ok())
    detail.update(e2bNetworkInfo(policy.value()));
  (void)c.res.send(200, "application/json", dumpJson(detail));
}

void ControlPlane::killSandbox(Call& c) {
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  if (auto removed = manager_.remove(c.tenant, c.id()); !removed.ok()) return fail(c, removed.error());
  (void)c.res.send(204, "", "");
}

void ControlPlane::setTimeout(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  auto timeout = in.integer("timeout", 0, INT32_MAX);
  if (!timeout.ok()) return fail(c, timeout.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  if (!timeout.value()) return fail(c, makeError(ErrorCode::kInvalidArgument, "timeout: required"));
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  // E2B's timeout may be 0 ("end now"); SPACE's smallest is a second.
  auto set = manager_.setTimeout(c.tenant, c.id(), std::max<int64_t>(1, *timeout.value()));
  if (!set.ok()) return fail(c, set.error());
  (void)c.res.send(204, "", "");
}

Status ControlPlane::checkSecretsExist(const std::string& tenant, const net::Policy& policy) {
  for (const std::string& name : net::credentialSecretNames(policy)) {
    auto found = vault_.info(tenant, name);
    if (found.ok()) continue;
    if (found.error().code == ErrorCode::kNotFound) {
      return makeError(
          ErrorCode::kInvalidArgument,
          "network.rules: no secret named " + name + " (create it first: PUT /v1/secrets/" + name + " on SPACE's API)");
    }
    return found.error();
  }
  return okStatus();
}

void ControlPlane::pauseSandbox(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  // memory:false would drop the running state; SPACE always keeps it (a superset of E2B's).
  auto memory = in.boolean("memory");
  if (!memory.ok()) return fail(c, memory.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  if (isE2bPaused(rec->state)) {
    (void)sendE2bError(c.res, 409, "sandbox \"" + c.id() + "\" is already paused");
    return;
  }
  auto suspended = manager_.suspend(c.tenant, c.id());
  if (!suspended.ok()) return fail(c, suspended.error());
  (void)c.res.send(204, "", "");
}

void ControlPlane::connectSandbox(Call& c, bool legacy_resume) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  auto timeout = in.integer("timeout", 0, INT32_MAX);
  auto memory = in.boolean("memory");
  auto auto_pause = in.boolean("autoPause");  // the legacy /resume's field
  for (const Status& s :
       {timeout.ok() ? okStatus() : Status(timeout.error()), memory.ok() ? okStatus() : Status(memory.error()),
        auto_pause.ok() ? okStatus() : Status(auto_pause.error()), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  int status = 200;
  if (isE2bPaused(rec->state)) {
    auto resumed = manager_.resume(c.tenant, c.id());
    if (!resumed.ok()) return fail(c, resumed.error());
    rec = std::move(resumed);
    status = 201;
  } else if (legacy_resume) {
    (void)sendE2bError(c.res, 409, "sandbox \"" + c.id() + "\" is already running");
    return;
  }
  if (timeout.value() && *timeout.value() > 0) {
    // Connecting extends a sandbox's life, never shortens it.
    const int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (status == 201 || now_ms + *timeout.value() * 1000 > rec->expires_at_ms) {
      auto set = manager_.setTimeout(c.tenant, c.id(), *timeout.value());
      if (!set.ok()) return fail(c, set.error());
      rec = std::move(set);
    }
  }
  (void)c.res.send(status, "application/json", dumpJson(sandboxJson(rec.value())));
}

void ControlPlane::metrics(Call& c) {
  // start and end: unix seconds, both optional (the whole series, the last hour's, by default).
  int64_t bounds[2] = {0, INT64_MAX / 1000 - 1};
  const char* names[2] = {"start", "end"};
  for (int i = 0; i < 2; ++i) {
    auto text = c.req.query(names[i]);
    if (!text) continue;
    int64_t value = -1;
    auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
    if (ec != std::errc() || end != text->data() + text->size() || value < 0 || value > INT64_MAX / 1000 - 1)
      return fail(c, makeError(ErrorCode::kInvalidArgument, std::string(names[i]) + ": not a unix time"));
    bounds[i] = value;
  }
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  // The end second is included whole; bounds[1] is at most INT64_MAX / 1000 - 1 here, so no overflow.
  auto samples = manager_.metrics(c.tenant, c.id(), bounds[0] * 1000, bounds[1] * 1000 + 999);
  if (!samples.ok()) return fail(c, samples.error());
  // E2B's figures are the guest's own (envd's): the guest's where its agent answered lately
  // (sandbox/metrics.h), else what the host measures, and no memCache then.
  json out = json::array();
  for (const auto& m : samples.value()) {
    json sample{{"timestamp", rfc3339(m.timestamp_ms)},
                {"timestampUnix", m.timestamp_ms / 1000},
                {"cpuCount", m.cpu_count},
                {"cpuUsedPct", std::round(m.cpu_used_pct * 100) / 100},
                {"memUsed", m.guest ? m.guest->mem_used : m.mem_used_bytes},
                {"memTotal", m.mem_total_bytes},
                {"diskUsed", m.guest ? m.guest->disk_used : m.disk_used_bytes},
                {"diskTotal", m.guest ? m.guest->disk_total : static_cast<uint64_t>(options_.disk_size_mb) << 20}};
    if (m.guest) sample["memCache"] = m.guest->mem_cache;
    out.push_back(std::move(sample));
  }
  (void)c.res.send(200, "application/json", dumpJson(out));
}

void ControlPlane::updateNetwork(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  if (!body->is_object()) return fail(c, makeError(ErrorCode::kInvalidArgument, "the body must be a JSON object"));
  json network = *body;
  std::optional<bool> internet;
  if (auto it = network.find("allow_internet_access"); it != network.end()) {
    if (!it->is_null() && !it->is_boolean()) {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "allow_internet_access: must be a boolean"));
    }
    if (it->is_boolean()) internet = it->get<bool>();
    network.erase(it);
  }
  auto current = manager_.networkPolicy(c.tenant, c.id());
  if (!current.ok()) return fail(c, current.error());
  // E2B's update replaces the egress rules whole: what it leaves out is cleared (open internet).
  auto policy_json = e2bNetworkPolicy(net::toJson(current.value()), internet.value_or(true), &network);
  if (!policy_json.ok()) return fail(c, policy_json.error());
  auto policy = net::parsePolicy(policy_json.value());
  if (!policy.ok()) return fail(c, makeError(ErrorCode::kInvalidArgument, "network: " + policy.error().message));
  if (auto known = checkSecretsExist(c.tenant, policy.value()); !known.ok()) return fail(c, known.error());
  if (auto set = manager_.setNetworkPolicy(c.tenant, c.id(), policy.value()); !set.ok()) return fail(c, set.error());
  (void)c.res.send(204, "", "");
}

void ControlPlane::createSnapshot(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  auto name = in.string("name", 128);
  if (!name.ok()) return fail(c, name.error());
  if (auto done = in.finish(); !done.ok()) return fail(c, done.error());
  sandbox::SnapshotRequest request;
  request.tenant = c.tenant;
  request.sandbox_id = c.id();
  request.name = name.value().value_or("");
  auto snap = manager_.snapshot(request);
  if (!snap.ok()) return fail(c, snap.error());
  json names = json::array();
  if (!snap->name.empty()) names.push_back(snap->name);
  (void)c.res.send(201, "application/json", dumpJson(json{{"snapshotID", snap->id}, {"names", names}}));
}

void ControlPlane::listSnapshots(Call& c) {
  store::SnapshotFilter filter;
  filter.tenant = c.tenant;
  std::string name_filter;
  for (const auto& [key, value] : c.req.queryParams()) {
    if (key == "sandboxID") {
      filter.sandbox_id = value;
    } else if (key == "name") {
      name_filter = value;
    } else if (key == "limit") {
      auto n = pageLimit(value);
      if (!n.ok()) return fail(c, n.error());
      filter.limit = n.value();
    } else if (key == "nextToken") {
      filter.after_id = value;
    } else {
      return fail(c, makeError(ErrorCode::kInvalidArgument, "unknown query parameter \"" + key + "\""));
    }
  }
  auto page = manager_.listSnapshots(filter);
  if (!page.ok()) return fail(c, page.error());
  json items = json::array();
  for (const auto& s : page->items) {
    if (!name_filter.empty() && s.name != name_filter) continue;
    json names = json::array();
    if (!s.name.empty()) names.push_back(s.name);
    items.push_back(json{{"snapshotID", s.id}, {"names", names}});
  }
  if (!page->next_cursor.empty()) c.res.setHeader("X-Next-Token", page->next_cursor);
  (void)c.res.send(200, "application/json", dumpJson(items));
}

void ControlPlane::deleteSnapshot(Call& c) {
  if (auto removed = manager_.deleteSnapshot(c.tenant, c.id()); !removed.ok()) return fail(c, removed.error());
  (void)c.res.send(204, "", "");
}

void ControlPlane::forkSandbox(Call& c) {
  auto body = api::readJsonBody(c.req, options_.max_json_body);
  if (!body.ok()) return fail(c, body.error());
  api::ObjectReader in(body.value());
  auto timeout = in.integer("timeout", 1, INT32_MAX);
  auto count = in.integer("count", 1, kMaxForkCount);
  for (const Status& s : {timeout.ok() ? okStatus() : Status(timeout.error()),
                          count.ok() ? okStatus() : Status(count.error()), in.finish()}) {
    if (!s.ok()) return fail(c, s.error());
  }
  auto rec = manager_.get(c.tenant, c.id());
  if (!rec.ok()) return fail(c, rec.error());
  if (isGone(rec->state)) return fail(c, notFound(c.id()));
  // A fork is a branch of a snapshot taken for it; the children keep its disk layer after the
  // snapshot itself is deleted again.
  sandbox::SnapshotRequest snap_request;
  snap_request.tenant = c.tenant;
  snap_request.sandbox_id = c.id();
  snap_request.name = "fork of " + c.id();
  auto snap = manager_.snapshot(snap_request);
  if (!snap.ok()) return fail(c, snap.error());
  sandbox::CreateRequest request;
  request.tenant = c.tenant;
  request.snapshot_id = snap->id;
  if (timeout.value()) request.timeout_s = *timeout.value();
  // Children live as their parent was made to: what its timeout does, whether traffic resumes it.
  request.on_timeout = rec->on_timeout;
  request.auto_resume = rec->auto_resume;
  auto children = manager_.branch(request, static_cast<uint32_t>(count.value().value_or(1)));
  if (auto removed = manager_.deleteSnapshot(c.tenant, snap->id); !removed.ok()) {
    spdlog::warn("e2b: fork of {}: cannot delete its snapshot {}: {}", c.id(), snap->id, removed.error().message);
  }
  if (!children.ok()) return fail(c, children.error());
  json out = json::array();
  for (const auto& child : children.value()) out.push_back(json{{"sandbox", sandboxJson(child)}});
  (void)c.res.send(201, "application/json", dumpJson(out));
}

}  // namespace space::e2b
