// Network commands: `spacectl net show|set|log|url` on one sandbox's egress policy, audit log
// and ports (docs/network.md). Same conventions as sandboxes.h.
#pragma once

#include <string>

#include "apiclient/api_client.h"
#include "cli/spacectl/sandboxes.h"

namespace space::spacectl {

int cmdNetworkShow(const apiclient::Client& api, const std::string& id, bool as_json);
int cmdNetworkSet(const apiclient::Client& api, const std::string& id, const NetworkPolicyOptions& o, bool as_json);
int cmdNetworkLog(const apiclient::Client& api, const std::string& id, int limit, bool as_json);
// The path-form URL of `port` of a sandbox, then `X-Space-Access-Token: <token>`.
int cmdNetworkUrl(const apiclient::Client& api, const std::string& id, int port, bool as_json);

}  // namespace space::spacectl
