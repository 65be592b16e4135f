#include "cli/spacectl/top.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cli/spacectl/output.h"

namespace space::spacectl {

namespace {

using apiclient::field;
using apiclient::Query;

// Every running sandbox of the tenant, all pages.
Result<std::vector<std::string>> runningSandboxes(const apiclient::Client& api) {
  std::vector<std::string> ids;
  std::string cursor;
  // The daemon is trusted for its shape only: a cursor that never ends must not either.
  for (int pages = 0; pages < 1000; ++pages) {
    Query query;
    query.add("state", "running").add("limit", "1000");
    if (!cursor.empty()) query.add("cursor", cursor);
    auto page = api.call("GET", query.on("/v1/sandboxes"));
    if (!page.ok()) return page.error();
    for (const auto& s : field(*page, "sandboxes")) {
      if (field(s, "id").is_string()) ids.push_back(field(s, "id").get<std::string>());
    }
    std::string next = field(*page, "next_cursor").is_string() ? field(*page, "next_cursor").get<std::string>() : "";
    if (next.empty() || next == cursor) break;
    cursor = std::move(next);
  }
  return ids;
}

std::string percentText(const json& value) {
  if (!value.is_number()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", value.get<double>());
  return buf;
}

}  // namespace

int cmdTop(const apiclient::Client& api, const TopOptions& o, bool as_json) {
  const bool screen = !as_json && !o.once && ::isatty(STDOUT_FILENO);
  while (true) {
    std::vector<std::string> ids = o.ids;
    if (ids.empty()) {
      auto running = runningSandboxes(api);
      if (!running.ok()) return fail(running.error());
      ids = std::move(running).value();
    }
    // The newest sample: the last of the last half minute (a sample comes every 5 s).
    const auto now_s =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    json report = json::array();
    for (const auto& id : ids) {
      auto series =
          api.call("GET", Query().add("start", std::to_string(now_s - 30)).on(apiclient::sandboxPath(id) + "/metrics"));
      if (!series.ok()) {
        // One named on the command line must exist; one listed may have gone meanwhile.
        if (!o.ids.empty() || series.error().reason != "sandbox_not_found") return fail(series.error());
        continue;
      }
      const json& samples = field(*series, "metrics");
      report.push_back(json{{"id", id}, {"metrics", samples.is_array() && !samples.empty() ? samples.back() : json()}});
    }
    if (as_json) {
      std::cout << dumpJson(json{{"sandboxes", report}}) << std::endl;
    } else {
      if (screen) std::cout << "\x1b[H\x1b[2J";
      std::vector<std::vector<std::string>> rows = {{"ID", "CPU", "VCPUS", "HOST MEM", "GUEST MEM", "MEMORY",
                                                     "HOST DISK", "GUEST DISK", "NET OUT/IN", "SAMPLED"}};
      for (const auto& entry : report) {
        const json& m = entry["metrics"];
        if (m.is_null()) {
          rows.push_back({text(entry["id"]), "-", "-", "-", "-", "-", "-", "-", "-", "not yet"});
          continue;
        }
        rows.push_back(
            {text(entry["id"]), percentText(field(m, "cpu_used_pct")), text(field(m, "cpu_count")),
             bytesText(field(m, "mem_used_bytes")), bytesText(field(m, "guest_mem_used_bytes")),
             bytesText(field(m, "mem_total_bytes")), bytesText(field(m, "disk_used_bytes")),
             bytesText(field(m, "guest_disk_used_bytes")) + "/" + bytesText(field(m, "guest_disk_total_bytes")),
             bytesText(field(m, "net_sent_bytes")) + "/" + bytesText(field(m, "net_received_bytes")),
             relativeTime(field(m, "timestamp"))});
      }
      printTable(rows);
      if (screen) std::cout << "\nevery " << o.interval_s << "s; Ctrl-C quits" << std::flush;
    }
    if (o.once) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(o.interval_s));
  }
}

}  // namespace space::spacectl
