#include "cli/spacectl/snapshots.h"

#include <unistd.h>

#include <chrono>
#include <iostream>

#include "cli/spacectl/output.h"
#include "cli/spacectl/signals.h"

namespace space::spacectl {

using apiclient::field;
using apiclient::Query;
using apiclient::sandboxPath;
using apiclient::snapshotPath;
using std::chrono::milliseconds;

namespace {

// Saving a guest's memory and disk; the daemon itself gives up after 5 minutes.
constexpr milliseconds kSnapshotTimeout = std::chrono::minutes(6);
// A branch starts its children a few at a time (4), each as long as a create.
constexpr int kBranchParallel = 4;

}  // namespace

int cmdSnapshotCreate(const apiclient::Client& api, const std::string& sandbox_id, const SnapshotOptions& o,
                      bool as_json) {
  json request = json::object();
  if (!o.name.empty()) request["name"] = o.name;
  if (!o.metadata.empty()) request["metadata"] = pairs(o.metadata);
  Result<json> snapshot = [&] {
    Progress progress("taking a snapshot of " + sandbox_id, as_json);
    return api.call("POST", sandboxPath(sandbox_id) + "/snapshots", request, kSnapshotTimeout);
  }();
  if (!snapshot.ok()) return fail(snapshot.error());
  if (as_json) {
    printJson(*snapshot);
  } else {
    std::cout << text(field(*snapshot, "id")) << "\n";
  }
  return 0;
}

int cmdSnapshotList(const apiclient::Client& api, const SnapshotListOptions& o, bool as_json) {
  json snapshots = json::array();
  std::string cursor;
  do {
    Query query;
    if (!o.sandbox_id.empty()) query.add("sandbox_id", o.sandbox_id);
    if (o.limit > 0) query.add("limit", std::to_string(o.limit));
    if (!cursor.empty()) query.add("cursor", cursor);
    auto page = api.call("GET", query.on("/v1/snapshots"));
    if (!page.ok()) return fail(page.error());
    for (const auto& s : field(*page, "snapshots")) snapshots.push_back(s);
    cursor = field(*page, "next_cursor").is_string() ? field(*page, "next_cursor").get<std::string>() : "";
  } while (o.all && !cursor.empty());

  if (as_json) {
    printJson(json{{"snapshots", snapshots}, {"next_cursor", cursor.empty() ? json() : json(cursor)}});
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "SANDBOX", "TEMPLATE", "CPUS", "MEMORY", "SIZE", "CREATED", "METADATA"}};
  for (const auto& s : snapshots) {
    std::string name = text(field(s, "name"));
    rows.push_back({text(field(s, "id")), name.empty() ? "-" : name, text(field(s, "sandbox_id")),
                    text(field(s, "template")), text(field(s, "cpus")), memoryText(field(s, "memory_mb")),
                    bytesText(field(s, "size_bytes")), relativeTime(field(s, "created_at")),
                    metadataText(field(s, "metadata"), 60)});
  }
  printTable(rows);
  if (!cursor.empty()) std::cerr << "spacectl: more snapshots follow; --all lists every page\n";
  return 0;
}

int cmdSnapshotGet(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto snapshot = api.call("GET", snapshotPath(id));
  if (!snapshot.ok()) return fail(snapshot.error());
  if (as_json) {
    printJson(*snapshot);
    return 0;
  }
  const json& s = *snapshot;
  std::string name = text(field(s, "name"));
  printTable({{"ID:", text(field(s, "id"))},
              {"Name:", name.empty() ? "-" : name},
              {"Sandbox:", text(field(s, "sandbox_id"))},
              {"Template:", text(field(s, "template"))},
              {"CPUs:", text(field(s, "cpus"))},
              {"Memory:", memoryText(field(s, "memory_mb"))},
              {"Size:", bytesText(field(s, "size_bytes")) + " (" + text(field(s, "size_bytes")) + " bytes)"},
              {"Created:", text(field(s, "created_at")) + " (" + relativeTime(field(s, "created_at")) + ")"},
              {"Metadata:", metadataText(field(s, "metadata"), 4096)}});
  return 0;
}

int cmdBranch(const apiclient::Client& api, const std::string& snapshot_id, const BranchOptions& o, bool as_json) {
  auto settings = settingsRequest(o.settings);
  if (!settings.ok()) return fail(settings.error());
  json request = std::move(settings.value());
  if (o.count != 1) request["count"] = o.count;
  // The daemon answers once every child runs (or, if one fails, once the others are deleted).
  OnSignal reaction([](int sig) {
    std::cerr << "\nspacectl: interrupted; sandboxes the branch started may be left behind (spacectl ls)\n";
    _exit(128 + sig);
  });
  Result<json> branched = [&] {
    Progress progress(
        "branching " + snapshot_id + " into " + std::to_string(o.count) + (o.count == 1 ? " sandbox" : " sandboxes"),
        as_json);
    return api.call("POST", snapshotPath(snapshot_id) + "/branch", request,
                    kCreateTimeout * ((o.count + kBranchParallel - 1) / kBranchParallel));
  }();
  if (!branched.ok()) return fail(branched.error());
  if (as_json) {
    printJson(*branched);
  } else {
    for (const auto& s : field(*branched, "sandboxes")) std::cout << text(field(s, "id")) << "\n";
  }
  return 0;
}

}  // namespace space::spacectl
