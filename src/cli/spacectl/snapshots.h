// Snapshot commands: snapshot create, ls and get (snapshot rm is cmdRemove over snapshot paths),
// and branch, which starts sandboxes from a snapshot. Same conventions as sandboxes.h.
#pragma once

#include <string>
#include <vector>

#include "apiclient/api_client.h"
#include "cli/spacectl/sandboxes.h"

namespace space::spacectl {

struct SnapshotOptions {
  std::string name;
  std::vector<std::string> metadata;
};

int cmdSnapshotCreate(const apiclient::Client& api, const std::string& sandbox_id, const SnapshotOptions& o,
                      bool as_json);

struct SnapshotListOptions {
  std::string sandbox_id;
  int limit = 0;
  bool all = false;
};

int cmdSnapshotList(const apiclient::Client& api, const SnapshotListOptions& o, bool as_json);

int cmdSnapshotGet(const apiclient::Client& api, const std::string& id, bool as_json);

struct BranchOptions {
  int count = 1;
  SandboxSettings settings;
};

int cmdBranch(const apiclient::Client& api, const std::string& snapshot_id, const BranchOptions& o, bool as_json);

}  // namespace space::spacectl
