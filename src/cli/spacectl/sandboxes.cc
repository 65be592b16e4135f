#include "cli/spacectl/sandboxes.h"

#include <unistd.h>

#include <iostream>

#include "cli/spacectl/output.h"

namespace space::spacectl {

using apiclient::field;
using apiclient::kRequestTimeout;
using apiclient::Query;
using apiclient::sandboxPath;

namespace {

std::vector<std::string> sandboxRow(const json& s) {
  return {text(field(s, "id")),
          text(field(s, "state")),
          text(field(s, "template")),
          text(field(s, "cpus")),
          memoryText(field(s, "memory_mb")),
          relativeTime(field(s, "created_at")),
          relativeTime(field(s, "expires_at")),
          metadataText(field(s, "metadata"), 60)};
}

// "5m, then suspend": the timeout it was created (or last set) with and what its expiry does.
std::string timeoutText(const json& s) {
  if (!field(s, "timeout_s").is_number_integer()) return "-";
  std::string then = text(field(s, "on_timeout"));
  return secondsText(field(s, "timeout_s")) + (then.empty() ? "" : ", then " + then);
}

std::string idleSuspendText(const json& seconds) {
  if (!seconds.is_number_integer()) return "-";
  return seconds.get<int64_t>() == 0 ? "never" : "after " + secondsText(seconds) + " idle";
}

void printSandbox(const json& s) {
  std::vector<std::vector<std::string>> rows = {
      {"ID:", text(field(s, "id"))},
      {"State:", text(field(s, "state"))},
      {"Template:", text(field(s, "template"))},
      {"CPUs:", text(field(s, "cpus"))},
      {"Memory:", memoryText(field(s, "memory_mb"))},
      {"Created:", text(field(s, "created_at")) + " (" + relativeTime(field(s, "created_at")) + ")"},
      {"Expires:", field(s, "expires_at").is_string() && !text(field(s, "expires_at")).empty()
                       ? text(field(s, "expires_at")) + " (" + relativeTime(field(s, "expires_at")) + ")"
                       : "-"},
      {"Timeout:", timeoutText(s)},
      {"Idle suspend:", idleSuspendText(field(s, "idle_suspend_s"))},
      {"Metadata:", metadataText(field(s, "metadata"), 4096)}};
  // Right after its template: what it was started from.
  if (field(s, "snapshot").is_string()) rows.insert(rows.begin() + 3, {"Snapshot:", text(field(s, "snapshot"))});
  if (field(s, "state_reason").is_string()) rows.push_back({"Reason:", text(field(s, "state_reason"))});
  printTable(rows);
}

}  // namespace

json pairs(const std::vector<std::string>& items) {
  json out = json::object();
  for (const auto& item : items) {
    auto eq = item.find('=');
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

Result<json> networkRequest(const NetworkPolicyOptions& o) {
  json policy = json::object();
  policy["egress"] = !o.egress.empty() ? o.egress : (o.allow.empty() && o.credentials.empty() ? "allow" : "policy");
  policy["allow"] = o.allow;
  policy["deny"] = o.deny;
  policy["public_ports"] = o.public_ports;
  json rules = json::array();
  for (const std::string& text : o.credentials) {
    const size_t equals = text.find('=');
    const size_t colon = equals == std::string::npos ? std::string::npos : text.find(':', equals);
    if (equals == 0 || colon == std::string::npos || colon == equals + 1) {
      return makeError(ErrorCode::kInvalidArgument, "--credential " + text +
                                                        ": expected HOST=Header: value, e.g. "
                                                        "'api.example.com=Authorization: Bearer {{secret:NAME}}'");
    }
    const std::string host = text.substr(0, equals);
    const std::string header = text.substr(equals + 1, colon - equals - 1);
    std::string value = text.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.erase(0, 1);
    json* rule = nullptr;
    for (auto& r : rules) {
      if (r["host"] == host) rule = &r;
    }
    if (rule == nullptr) {
      rules.push_back({{"host", host}, {"headers", json::object()}, {"plain_http", o.credentials_plain_http}});
      rule = &rules.back();
    }
    (*rule)["headers"][header] = value;
  }
  if (!rules.empty()) policy["credentials"] = rules;
  if (!o.placeholders.empty()) policy["placeholders"] = pairs(o.placeholders);
  return policy;
}

Result<json> settingsRequest(const SandboxSettings& o) {
  json request = json::object();
  if (o.timeout_s > 0) request["timeout_s"] = o.timeout_s;
  if (o.idle_suspend_s >= 0) request["idle_suspend_s"] = o.idle_suspend_s;
  if (!o.on_timeout.empty()) request["on_timeout"] = o.on_timeout;
  if (!o.env.empty()) request["env"] = pairs(o.env);
  if (!o.metadata.empty()) request["metadata"] = pairs(o.metadata);
  if (o.network.given()) {
    auto network = networkRequest(o.network);
    if (!network.ok()) return network.error();
    request["network"] = network.value();
  }
  return request;
}

Result<json> createRequest(const CreateOptions& o) {
  auto settings = settingsRequest(o.settings);
  if (!settings.ok()) return settings.error();
  json request = std::move(settings.value());
  if (!o.template_name.empty()) request["template"] = o.template_name;
  if (!o.snapshot.empty()) request["snapshot"] = o.snapshot;
  if (o.cpus > 0) request["cpus"] = o.cpus;
  if (o.memory_mb > 0) request["memory_mb"] = o.memory_mb;
  return request;
}

int cmdCreate(const apiclient::Client& api, const CreateOptions& o, bool as_json) {
  auto request = createRequest(o);
  if (!request.ok()) return fail(request.error());
  Result<json> created = [&] {
    Progress progress(o.snapshot.empty() ? "creating a sandbox" : "creating a sandbox from " + o.snapshot, as_json);
    return api.call("POST", "/v1/sandboxes", request.value(), kCreateTimeout);
  }();
  if (!created.ok()) return fail(created.error());
  if (as_json) {
    printJson(*created);
  } else {
    std::cout << text(field(*created, "id")) << "\n";
  }
  return 0;
}

int cmdList(const apiclient::Client& api, const ListOptions& o, bool as_json) {
  json sandboxes = json::array();
  std::string cursor;
  do {
    Query query;
    if (!o.states.empty()) {
      std::string joined;
      for (const auto& s : o.states) joined += (joined.empty() ? "" : ",") + s;
      query.add("state", joined);
    }
    for (const auto& m : o.metadata) query.add("metadata", m);
    if (o.limit > 0) query.add("limit", std::to_string(o.limit));
    if (!cursor.empty()) query.add("cursor", cursor);
    auto page = api.call("GET", query.on("/v1/sandboxes"));
    if (!page.ok()) return fail(page.error());
    for (const auto& s : field(*page, "sandboxes")) sandboxes.push_back(s);
    cursor = field(*page, "next_cursor").is_string() ? field(*page, "next_cursor").get<std::string>() : "";
  } while (o.all && !cursor.empty());

  if (as_json) {
    printJson(json{{"sandboxes", sandboxes}, {"next_cursor", cursor.empty() ? json() : json(cursor)}});
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATE", "TEMPLATE", "CPUS", "MEMORY", "CREATED", "EXPIRES", "METADATA"}};
  for (const auto& s : sandboxes) rows.push_back(sandboxRow(s));
  printTable(rows);
  if (!cursor.empty()) std::cerr << "spacectl: more sandboxes follow; --all lists every page\n";
  return 0;
}

int cmdGet(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto sandbox = api.call("GET", sandboxPath(id));
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    printSandbox(*sandbox);
  }
  return 0;
}

int cmdRemove(const apiclient::Client& api, const std::vector<std::string>& ids,
              std::string (*path)(const std::string&), bool as_json) {
  json deleted = json::array(), failed = json::array();
  for (const auto& id : ids) {
    auto done = api.call("DELETE", path(id));
    if (done.ok()) {
      deleted.push_back(id);
      if (!as_json) std::cout << id << "\n" << std::flush;
      continue;
    }
    failed.push_back({{"id", id}, {"error", {{"code", done.error().reason}, {"message", done.error().message}}}});
    fail(done.error());
  }
  if (as_json) printJson(json{{"deleted", deleted}, {"failed", failed}});
  return failed.empty() ? 0 : kExitFailure;
}

int cmdTimeout(const apiclient::Client& api, const std::string& id, int64_t seconds, bool as_json) {
  auto sandbox = api.call("POST", sandboxPath(id) + "/timeout", json{{"timeout_s", seconds}});
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    std::cout << id << " expires " << text(field(*sandbox, "expires_at")) << " ("
              << relativeTime(field(*sandbox, "expires_at")) << ")\n";
  }
  return 0;
}

int cmdRunState(const apiclient::Client& api, const std::string& id, const char* action, bool as_json) {
  const std::string doing = std::string_view(action) == "pause"     ? "pausing "
                            : std::string_view(action) == "suspend" ? "suspending "
                                                                    : "resuming ";
  Result<json> sandbox = [&] {
    Progress progress(doing + id, as_json);
    return api.call("POST", sandboxPath(id) + "/" + action, json::object());
  }();
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    std::cout << id << " " << text(field(*sandbox, "state")) << "\n";
  }
  return 0;
}

int cmdLogs(const apiclient::Client& api, const std::string& id, int64_t tail_bytes, bool as_json) {
  Query query;
  if (tail_bytes > 0) query.add("tail_bytes", std::to_string(tail_bytes));
  auto log = api.send("GET", query.on(sandboxPath(id) + "/logs"), {}, "", kRequestTimeout);
  if (!log.ok()) return fail(log.error());
  if (as_json) {
    printJson(json{{"id", id}, {"log", log->body}});
    return 0;
  }
  auto written = writeAll(STDOUT_FILENO, log->body, "the log to stdout");
  return written.ok() ? 0 : fail(written.error());
}

}  // namespace space::spacectl
