// Network commands: `spacectl net show|set|log|url` on one sandbox's egress policy, audit log
// and ports (docs/network.md). Same conventions as sandboxes.h.
#pragma once

#include <string>

#include "apiclient/api_client.h"
#include "cli/spacectl/sandboxes.h"

namespace space::spacectl {

int cmdNetworkShow(const apiclient::Client& api, const std::string& id, bool as_json);
int cmdNetworkSet(const apiclient::Client& api, const std::string& id, const NetworkPolicyOptions& o, bool as_json);
struct NetworkLogOptions {
  int limit = 0;        // 0: the daemon's default
  bool denied = false;  // denials only
  std::string kind;     // dns, tcp, gateway; empty: all
  bool follow = false;  // then print new entries as they come (--json: one JSON line each)
};
int cmdNetworkLog(const apiclient::Client& api, const std::string& id, const NetworkLogOptions& o, bool as_json);
// The path-form URL of `port` of a sandbox, then `X-Space-Access-Token: <token>`.
int cmdNetworkUrl(const apiclient::Client& api, const std::string& id, int port, bool as_json);

}  // namespace space::spacectl
