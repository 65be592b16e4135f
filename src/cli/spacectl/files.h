// cp: one file into or out of a sandbox, streamed both ways, `-` for stdin or stdout. A download
// replaces its destination only once complete.
#pragma once

#include <string>

#include "apiclient/api_client.h"

namespace space::spacectl {

// Exactly one of from and to is ID:/path (else a usage error, kExitUsage).
int cmdCopy(const apiclient::Client& api, const std::string& from, const std::string& to, const std::string& user,
            bool as_json);

}  // namespace space::spacectl
