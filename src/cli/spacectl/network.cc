#include "cli/spacectl/network.h"

#include <chrono>
#include <ctime>
#include <iostream>
#include <thread>

#include "cli/spacectl/output.h"

namespace space::spacectl {

using apiclient::field;
using apiclient::Query;
using apiclient::sandboxPath;

namespace {

std::string joined(const json& rules) {
  if (!rules.is_array() || rules.empty()) return "-";
  std::string out;
  for (const auto& r : rules) out += (out.empty() ? "" : ", ") + (r.is_string() ? r.get<std::string>() : r.dump());
  return out;
}

int printPolicy(const json& policy, bool as_json) {
  if (as_json) {
    printJson(policy);
  } else {
    std::cout << "egress: " << text(field(policy, "egress")) << "\n"
              << "allow:  " << joined(field(policy, "allow")) << "\n"
              << "deny:   " << joined(field(policy, "deny")) << "\n"
              << "ports:  "
              << (field(policy, "public_ports") == true ? "public (anyone with the URL)"
                                                        : "private (the API key or the sandbox's access token)")
              << "\n";
    // Templates only: the values stay with spaced.
    for (const auto& rule : field(policy, "credentials")) {
      for (const auto& [header, value_template] : field(rule, "headers").items()) {
        std::cout << "credential: " << text(field(rule, "host")) << " " << header << ": " << text(value_template)
                  << (field(rule, "plain_http") == true ? "  (also plain HTTP)" : "") << "\n";
      }
    }
    for (const auto& [env, secret] : field(policy, "placeholders").items()) {
      std::cout << "placeholder: $" << env << " stands for secret " << text(secret) << "\n";
    }
  }
  return 0;
}

std::string clock(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char out[32];
  std::strftime(out, sizeof out, "%H:%M:%S", &tm);
  return out;
}

}  // namespace

int cmdNetworkShow(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto policy = api.call("GET", sandboxPath(id) + "/network");
  if (!policy.ok()) return fail(policy.error());
  return printPolicy(*policy, as_json);
}

int cmdNetworkSet(const apiclient::Client& api, const std::string& id, const NetworkPolicyOptions& o, bool as_json) {
  if (!o.given()) {
    std::cerr << "spacectl: net set needs --egress, --allow, --deny or --credential (the whole policy is replaced)\n";
    return kExitUsage;
  }
  auto request = networkRequest(o);
  if (!request.ok()) return fail(request.error());
  auto policy = api.call("PUT", sandboxPath(id) + "/network", request.value());
  if (!policy.ok()) return fail(policy.error());
  return printPolicy(*policy, as_json);
}

int cmdNetworkUrl(const apiclient::Client& api, const std::string& id, int port, bool as_json) {
  auto sandbox = api.call("GET", sandboxPath(id));
  if (!sandbox.ok()) return fail(sandbox.error());
  const std::string url = api.endpoint().url + sandboxPath(id) + "/ports/" + std::to_string(port) + "/";
  const std::string token = text(field(*sandbox, "access_token"));
  if (as_json) {
    printJson(json{{"url", url}, {"access_token", token}});
  } else {
    std::cout << url << "\n";
    if (!token.empty()) std::cout << "X-Space-Access-Token: " << token << "\n";
  }
  return 0;
}

int cmdNetworkLog(const apiclient::Client& api, const std::string& id, const NetworkLogOptions& o, bool as_json) {
  auto print = [&](const json& e) {
    if (as_json) {
      std::cout << dumpJson(e) << "\n";
      return;
    }
    std::string what = text(field(e, "name"));
    for (const char* claim : {"sni", "host"}) {
      if (what.empty() && field(e, claim).is_string()) what = field(e, claim).get<std::string>();
    }
    std::string where = field(e, "destination").is_string()
                            ? text(field(e, "destination")) + ":" +
                                  std::to_string(field(e, "port").is_number() ? field(e, "port").get<int>() : 0)
                            : "";
    std::cout << clock(field(e, "time_ms").is_number() ? field(e, "time_ms").get<int64_t>() : 0) << "  "
              << (field(e, "allowed").is_boolean() && field(e, "allowed").get<bool>() ? "allow" : "DENY ") << "  "
              << text(field(e, "kind")) << "  " << (what.empty() ? "-" : what) << "  " << (where.empty() ? "-" : where)
              << "  " << text(field(e, "reason")) << "\n";
  };
  int64_t last_ms = -1;
  auto fetch = [&](int limit) -> Status {
    Query query;
    if (limit > 0) query.add("limit", std::to_string(limit));
    if (o.denied) query.add("allowed", "false");
    if (!o.kind.empty()) query.add("kind", o.kind);
    if (last_ms >= 0) query.add("after_ms", std::to_string(last_ms));
    auto log = api.call("GET", query.on(sandboxPath(id) + "/network/log"));
    if (!log.ok()) return log.error();
    if (as_json && !o.follow) {
      printJson(*log);
      return okStatus();
    }
    for (const auto& e : field(*log, "entries")) {
      print(e);
      if (field(e, "time_ms").is_number_integer()) last_ms = std::max(last_ms, field(e, "time_ms").get<int64_t>());
    }
    std::cout.flush();
    return okStatus();
  };
  if (auto first = fetch(o.limit); !first.ok()) return fail(first.error());
  // Following: the entries newer than the last one printed, once a second, until interrupted.
  // (Entries written in the same millisecond as the last one printed, after it was read, are
  // not shown: the log has no sequence numbers.)
  if (last_ms < 0)
    last_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count() -
              1;
  while (o.follow) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (auto more = fetch(10000); !more.ok()) return fail(more.error());
  }
  return 0;
}

}  // namespace space::spacectl
