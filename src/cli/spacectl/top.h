// spacectl top: what sandboxes cost the host, refreshed as the daemon samples it (every 5 s):
// CPU, memory and disk per running sandbox (GET /v1/sandboxes/{id}/metrics). Same conventions
// as sandboxes.h; --json prints one document per refresh, one a line.
#pragma once

#include <string>
#include <vector>

#include "apiclient/api_client.h"

namespace space::spacectl {

struct TopOptions {
  std::vector<std::string> ids;  // none: every running sandbox of the tenant
  bool once = false;             // one refresh, then exit (for scripts)
  int interval_s = 5;
};

int cmdTop(const apiclient::Client& api, const TopOptions& o, bool as_json);

}  // namespace space::spacectl
