#include "cli/spacectl/quota.h"

#include <iostream>
#include <string>
#include <vector>

#include "cli/spacectl/output.h"

namespace space::spacectl {

using apiclient::field;

int cmdQuota(const apiclient::Client& api, bool as_json) {
  auto quota = api.call("GET", "/v1/quota");
  if (!quota.ok()) return fail(quota.error());
  if (as_json) {
    printJson(*quota);
    return 0;
  }
  const json& limits = field(*quota, "limits");
  const json& usage = field(*quota, "usage");
  auto limit = [&](const char* key) {
    const json& v = field(limits, key);
    return v.is_number() && v.get<double>() == 0 ? std::string("none") : text(v);
  };
  auto mib = [](const json& bytes) {
    return bytes.is_number_integer() ? std::to_string((bytes.get<int64_t>() + (1 << 20) - 1) >> 20) : text(bytes);
  };
  std::vector<std::vector<std::string>> rows = {
      {"WHAT", "USED", "LIMIT"},
      {"sandboxes (running or paused)", text(field(usage, "sandboxes")), limit("max_sandboxes")},
      {"vCPUs", text(field(usage, "vcpus")), limit("max_vcpus")},
      {"memory (MB)", text(field(usage, "memory_mb")), limit("max_memory_mb")},
      {"snapshots", text(field(usage, "snapshots")), limit("max_snapshots")},
      {"snapshot disk (MB)", mib(field(usage, "snapshot_bytes")), limit("max_snapshot_mb")},
      {"suspended sandboxes", text(field(usage, "suspended")), limit("max_suspended")},
      {"suspended disk (MB)", mib(field(usage, "suspended_bytes")), limit("max_suspended_mb")},
      {"API requests per second", "", limit("requests_per_s")},
      {"API requests at once (burst)", "", limit("request_burst")},
  };
  printTable(rows);
  const bool own = field(*quota, "own").is_boolean() && field(*quota, "own").get<bool>();
  std::cout << "tenant " << text(field(*quota, "tenant"))
            << (own ? ": limits set for this tenant by the operator" : ": the node's default limits") << "\n";
  return 0;
}

}  // namespace space::spacectl
