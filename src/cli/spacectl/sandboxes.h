// Sandbox commands: create, ls, get, rm, timeout, pause/suspend/resume and logs; and what create,
// run and branch share to describe a new sandbox. Each command returns spacectl's exit code and
// prints the API's JSON instead of text when as_json is set.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apiclient/api_client.h"

namespace space::spacectl {

using json = nlohmann::json;

// Creating a sandbox boots a VM, which without KVM (TCG) takes a while.
inline constexpr std::chrono::milliseconds kCreateTimeout = std::chrono::minutes(5);

// What create, run and branch share: how long the sandbox lives and what it starts with.
// An egress policy from flags (docs/network.md); nothing set: the daemon's default.
struct NetworkPolicyOptions {
  std::string egress;  // allow, deny, policy
  std::vector<std::string> allow;
  std::vector<std::string> deny;
  bool public_ports = false;
  // "HOST=Header: value template" (repeatable; several for one host make one rule).
  std::vector<std::string> credentials;
  bool credentials_plain_http = false;    // every rule above also over plain HTTP
  std::vector<std::string> placeholders;  // "ENV_NAME=secret name" (repeatable)
  bool given() const {
    return !egress.empty() || !allow.empty() || !deny.empty() || public_ports || !credentials.empty() ||
           !placeholders.empty();
  }
};
// {"egress", "allow", "deny", "public_ports", "credentials"}; with allow or credential rules
// and no mode, "policy" (only what they name). kInvalidArgument for a malformed --credential.
Result<json> networkRequest(const NetworkPolicyOptions& o);

struct SandboxSettings {
  int64_t timeout_s = 0;
  int64_t idle_suspend_s = -1;  // -1: the daemon's default
  std::string on_timeout;
  std::vector<std::string> env;
  std::vector<std::string> metadata;
  NetworkPolicyOptions network;
};

struct CreateOptions {
  std::string template_name;
  std::string snapshot;
  int cpus = 0;
  int64_t memory_mb = 0;
  SandboxSettings settings;
};

// KEY=VALUE arguments (the command line checked their shape) as a JSON object.
json pairs(const std::vector<std::string>& items);

// The request fields of the settings given; the daemon's defaults for the others.
// kInvalidArgument for options the command line could not check (a malformed --credential).
Result<json> settingsRequest(const SandboxSettings& o);
Result<json> createRequest(const CreateOptions& o);

int cmdCreate(const apiclient::Client& api, const CreateOptions& o, bool as_json);

struct ListOptions {
  std::vector<std::string> states;
  std::vector<std::string> metadata;
  int limit = 0;
  bool all = false;
};

int cmdList(const apiclient::Client& api, const ListOptions& o, bool as_json);

int cmdGet(const apiclient::Client& api, const std::string& id, bool as_json);

// rm and snapshot rm: each id in turn, whatever happened to the ones before.
int cmdRemove(const apiclient::Client& api, const std::vector<std::string>& ids,
              std::string (*path)(const std::string&), bool as_json);

int cmdTimeout(const apiclient::Client& api, const std::string& id, int64_t seconds, bool as_json);

// pause / suspend / resume: the sandbox's new state, or its JSON.
int cmdRunState(const apiclient::Client& api, const std::string& id, const char* action, bool as_json);

int cmdLogs(const apiclient::Client& api, const std::string& id, int64_t tail_bytes, bool as_json);

}  // namespace space::spacectl
