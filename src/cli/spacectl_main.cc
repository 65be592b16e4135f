// spacectl: the command-line client of spaced's REST API (docs/openapi.json). One request per
// step, human tables by default and the API's own JSON with --json, so scripts get exactly what
// the API documents.
//
// Exit codes: 0 on success; exec and run: the remote command's exit code, or 128+N when signal N
// ended it (as a shell reports it); 1 for an API, connection or local I/O failure (the message
// on stderr); 2 for usage errors; 128+N when signal N interrupted spacectl itself (Ctrl-C: 130).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agentproto/base64.h"
#include "apiclient/api_client.h"
#include "common/bounded_json.h"

namespace {

using namespace space;
using apiclient::field;
using apiclient::kRequestTimeout;
using apiclient::Query;
using apiclient::sandboxPath;
using apiclient::snapshotPath;
using nlohmann::json;
using std::chrono::milliseconds;

// Creating a sandbox boots a VM, which without KVM (TCG) takes a while.
constexpr milliseconds kCreateTimeout = std::chrono::minutes(5);
// Saving a guest's memory and disk; the daemon itself gives up after 5 minutes.
constexpr milliseconds kSnapshotTimeout = std::chrono::minutes(6);
// A branch starts its children a few at a time (4), each as long as a create.
constexpr int kBranchParallel = 4;
// What the daemon may take beyond a command's own timeout before we stop waiting for it.
constexpr milliseconds kExecSlack = std::chrono::seconds(30);
constexpr int64_t kDaemonExecTimeoutS = 60;  // the daemon's default when a request names none
// An upload's answer is one small JSON document; a daemon that sends more gets it cut.
constexpr size_t kMaxAnswer = 64 * 1024;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// --- output ----------------------------------------------------------------------------------

// Command output and guest file names need not be UTF-8; the daemon already replaced such bytes.
std::string dumpJson(const json& value, int indent = -1) {
  return value.dump(indent, ' ', false, json::error_handler_t::replace);
}

void printJson(const json& value) { std::cout << dumpJson(value, 2) << "\n" << std::flush; }

std::string describe(const Error& e) { return e.reason.empty() ? e.message : e.message + " (" + e.reason + ")"; }

int fail(const Error& e) {
  std::cerr << "spacectl: " << describe(e) << "\n";
  return kExitFailure;
}

int fail(const std::string& message) { return fail(makeError(ErrorCode::kInternal, message)); }

// Marks a write to a pipe whose reader left (spacectl exec ... | head): an ending, not an error.
constexpr const char* kBrokenPipe = "broken_pipe";

Error errnoError(const std::string& what) {
  int err = errno;
  return makeError(ErrorCode::kInternal, what + ": " + std::strerror(err), err == EPIPE ? kBrokenPipe : "");
}

// Straight to the descriptor: exec output must show up as it arrives, not when a buffer fills.
Status writeAll(int fd, std::string_view data, const char* what) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoError(std::string("writing ") + what);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return okStatus();
}

Result<std::string> readAll(int fd, const char* what) {
  std::string out;
  char buf[64 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoError(std::string("reading ") + what);
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

std::string text(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return dumpJson(value);
}

std::optional<time_t> parseTime(const std::string& rfc3339) {
  struct tm t {};
  if (std::sscanf(rfc3339.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour, &t.tm_min,
                  &t.tm_sec) != 6) {
    return std::nullopt;
  }
  t.tm_year -= 1900;
  t.tm_mon -= 1;
  return timegm(&t);
}

// "3m ago", "in 2h": what a person wants from a table; --json keeps the timestamps.
std::string relativeTime(const json& value) {
  std::string raw = text(value);
  auto when = parseTime(raw);
  if (!when) return raw.empty() ? "-" : raw;
  long long delta = static_cast<long long>(*when) - static_cast<long long>(std::time(nullptr));
  long long span = delta < 0 ? -delta : delta;
  std::string amount = span < 60          ? std::to_string(span) + "s"
                       : span < 3600      ? std::to_string(span / 60) + "m"
                       : span < 2 * 86400 ? std::to_string(span / 3600) + "h"
                                          : std::to_string(span / 86400) + "d";
  return delta > 0 ? "in " + amount : amount + " ago";
}

std::string metadataText(const json& metadata, size_t max_chars) {
  std::string out;
  if (metadata.is_object()) {
    for (const auto& [key, value] : metadata.items()) out += (out.empty() ? "" : ",") + key + "=" + text(value);
  }
  if (out.size() > max_chars) out = out.substr(0, max_chars - 3) + "...";
  return out.empty() ? "-" : out;
}

std::string memoryText(const json& mb) { return mb.is_number() ? dumpJson(mb) + "MB" : "-"; }

// 1.5GiB, 300MiB, 12KiB, 80B.
std::string bytesText(const json& bytes) {
  if (!bytes.is_number_integer()) return "-";
  double n = static_cast<double>(bytes.get<int64_t>());
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (n >= 1024 && unit + 1 < std::size(units)) n /= 1024, ++unit;
  char out[32];
  std::snprintf(out, sizeof out, unit == 0 || n >= 10 ? "%.0f%s" : "%.1f%s", n, units[unit]);
  return out;
}

// A number of seconds in the largest unit that says it exactly: 300s, 90m, 6h, 7d.
std::string secondsText(const json& seconds) {
  if (!seconds.is_number_integer()) return "-";
  int64_t s = seconds.get<int64_t>();
  if (s > 0 && s % 86400 == 0) return std::to_string(s / 86400) + "d";
  if (s > 0 && s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s > 0 && s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

// Left-aligned columns; the last one is not padded, so long metadata does not pad every line.
void printTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 3, ' ');
    }
    std::cout << line << "\n";
  }
  std::cout << std::flush;
}

// --- signals ---------------------------------------------------------------------------------

// The HTTP client retries reads interrupted by a signal, so a handler that only sets a flag would
// go unnoticed until the daemon answers (a silent command: never). Instead SIGINT, SIGTERM and
// SIGHUP are blocked in every thread and taken by a thread of their own, which runs the current
// command's reaction: delete the sandbox of `run --rm`, signal the remote process, remove a
// partial download. Without one, spacectl exits as the signal would have made it.
std::mutex g_signal_mutex;
std::function<void(int)> g_on_signal;  // guarded by g_signal_mutex
std::atomic<int> g_interrupted{0};     // the last signal taken, 0 if none

void startSignalThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A reader that went away (spacectl exec ... | head) must not kill us before `run --rm` cleans up.
  signal(SIGPIPE, SIG_IGN);
  std::thread([set] {
    while (true) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      g_interrupted = sig;
      std::lock_guard lock(g_signal_mutex);
      if (!g_on_signal) _exit(128 + sig);
      g_on_signal(sig);
    }
  }).detach();
}

// The reaction to signals while this object lives; runs on the signal thread. Leaving the scope
// waits for a reaction in progress, so it never uses a frame that is gone.
class OnSignal {
 public:
  explicit OnSignal(std::function<void(int)> reaction) {
    std::lock_guard lock(g_signal_mutex);
    g_on_signal = std::move(reaction);
  }
  ~OnSignal() {
    std::lock_guard lock(g_signal_mutex);
    g_on_signal = nullptr;
  }
  OnSignal(const OnSignal&) = delete;
  OnSignal& operator=(const OnSignal&) = delete;
};

// Go's signal names (the agent reports "signal: killed"), indexed by Linux signal number.
// clang-format off
constexpr const char* kSignalNames[] = {
    "", "hangup", "interrupt", "quit", "illegal instruction",                                // 0-4
    "trace/breakpoint trap", "aborted", "bus error", "floating point exception", "killed",   // 5-9
    "user defined signal 1", "segmentation fault", "user defined signal 2", "broken pipe",   // 10-13
    "alarm clock", "terminated", "stack fault", "child exited", "continued",                 // 14-18
    "stopped (signal)", "stopped", "stopped (tty input)", "stopped (tty output)",             // 19-22
    "urgent I/O condition", "CPU time limit exceeded", "file size limit exceeded",           // 23-25
    "virtual timer expired", "profiling timer expired", "window changed", "I/O possible",    // 26-29
    "power failure", "bad system call"};                                                      // 30-31
// clang-format on

std::optional<int> signalFromStatus(std::string status) {
  constexpr std::string_view kPrefix = "signal: ";
  if (!status.starts_with(kPrefix)) return std::nullopt;
  status.erase(0, kPrefix.size());
  if (auto core = status.find(" (core dumped)"); core != std::string::npos) status.erase(core);
  for (int i = 1; i < static_cast<int>(std::size(kSignalNames)); ++i) {
    if (status == kSignalNames[i]) return i;
  }
  if (status.starts_with("signal ")) {
    int n = std::atoi(status.c_str() + 7);
    if (n > 0 && n < 128) return n;
  }
  return std::nullopt;
}

// The remote command's exit code as a shell would give it: 128+N for signal N (1 if the signal
// is not recognisable).
int exitCodeOf(const json& exit_code, const json& status) {
  int code = exit_code.is_number_integer() ? exit_code.get<int>() : -1;
  if (code >= 0) return code & 0xff;
  if (auto sig = signalFromStatus(text(status))) return 128 + *sig;
  return kExitFailure;
}

// --- sandboxes -------------------------------------------------------------------------------

// What create, run and branch share: how long the sandbox lives and what it starts with.
struct SandboxSettings {
  int64_t timeout_s = 0;
  int64_t idle_suspend_s = -1;  // -1: the daemon's default
  std::string on_timeout;
  std::vector<std::string> env;
  std::vector<std::string> metadata;
};

struct CreateOptions {
  std::string template_name;
  std::string snapshot;
  int cpus = 0;
  int64_t memory_mb = 0;
  SandboxSettings settings;
};

// CLI11 validator: a usage error (exit 2) rather than a request the daemon would refuse.
const CLI::Validator kKeyValue(
    [](std::string& item) {
      auto eq = item.find('=');
      return eq == std::string::npos || eq == 0 ? "expected KEY=VALUE, got \"" + item + "\"" : std::string();
    },
    "KEY=VALUE");

const CLI::Range kSeconds(int64_t(1), int64_t(INT32_MAX));
constexpr int64_t kMaxIdleSuspendS = 30 * 24 * 3600;

json pairs(const std::vector<std::string>& items) {
  json out = json::object();
  for (const auto& item : items) {
    auto eq = item.find('=');
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

json settingsRequest(const SandboxSettings& o) {
  json request = json::object();
  if (o.timeout_s > 0) request["timeout_s"] = o.timeout_s;
  if (o.idle_suspend_s >= 0) request["idle_suspend_s"] = o.idle_suspend_s;
  if (!o.on_timeout.empty()) request["on_timeout"] = o.on_timeout;
  if (!o.env.empty()) request["env"] = pairs(o.env);
  if (!o.metadata.empty()) request["metadata"] = pairs(o.metadata);
  return request;
}

json createRequest(const CreateOptions& o) {
  json request = settingsRequest(o.settings);
  if (!o.template_name.empty()) request["template"] = o.template_name;
  if (!o.snapshot.empty()) request["snapshot"] = o.snapshot;
  if (o.cpus > 0) request["cpus"] = o.cpus;
  if (o.memory_mb > 0) request["memory_mb"] = o.memory_mb;
  return request;
}

std::vector<std::string> sandboxRow(const json& s) {
  return {text(field(s, "id")),
          text(field(s, "state")),
          text(field(s, "template")),
          text(field(s, "cpus")),
          memoryText(field(s, "memory_mb")),
          relativeTime(field(s, "created_at")),
          relativeTime(field(s, "expires_at")),
          metadataText(field(s, "metadata"), 60)};
}

// "5m, then suspend": the timeout it was created (or last set) with and what its expiry does.
std::string timeoutText(const json& s) {
  if (!field(s, "timeout_s").is_number_integer()) return "-";
  std::string then = text(field(s, "on_timeout"));
  return secondsText(field(s, "timeout_s")) + (then.empty() ? "" : ", then " + then);
}

std::string idleSuspendText(const json& seconds) {
  if (!seconds.is_number_integer()) return "-";
  return seconds.get<int64_t>() == 0 ? "never" : "after " + secondsText(seconds) + " idle";
}

void printSandbox(const json& s) {
  std::vector<std::vector<std::string>> rows = {
      {"ID:", text(field(s, "id"))},
      {"State:", text(field(s, "state"))},
      {"Template:", text(field(s, "template"))},
      {"CPUs:", text(field(s, "cpus"))},
      {"Memory:", memoryText(field(s, "memory_mb"))},
      {"Created:", text(field(s, "created_at")) + " (" + relativeTime(field(s, "created_at")) + ")"},
      {"Expires:", field(s, "expires_at").is_string() && !text(field(s, "expires_at")).empty()
                       ? text(field(s, "expires_at")) + " (" + relativeTime(field(s, "expires_at")) + ")"
                       : "-"},
      {"Timeout:", timeoutText(s)},
      {"Idle suspend:", idleSuspendText(field(s, "idle_suspend_s"))},
      {"Metadata:", metadataText(field(s, "metadata"), 4096)}};
  // Right after its template: what it was started from.
  if (field(s, "snapshot").is_string()) rows.insert(rows.begin() + 3, {"Snapshot:", text(field(s, "snapshot"))});
  if (field(s, "state_reason").is_string()) rows.push_back({"Reason:", text(field(s, "state_reason"))});
  printTable(rows);
}

int cmdCreate(const apiclient::Client& api, const CreateOptions& o, bool as_json) {
  auto created = api.call("POST", "/v1/sandboxes", createRequest(o), kCreateTimeout);
  if (!created.ok()) return fail(created.error());
  if (as_json) {
    printJson(*created);
  } else {
    std::cout << text(field(*created, "id")) << "\n";
  }
  return 0;
}

struct ListOptions {
  std::vector<std::string> states;
  std::vector<std::string> metadata;
  int limit = 0;
  bool all = false;
};

int cmdList(const apiclient::Client& api, const ListOptions& o, bool as_json) {
  json sandboxes = json::array();
  std::string cursor;
  do {
    Query query;
    if (!o.states.empty()) {
      std::string joined;
      for (const auto& s : o.states) joined += (joined.empty() ? "" : ",") + s;
      query.add("state", joined);
    }
    for (const auto& m : o.metadata) query.add("metadata", m);
    if (o.limit > 0) query.add("limit", std::to_string(o.limit));
    if (!cursor.empty()) query.add("cursor", cursor);
    auto page = api.call("GET", query.on("/v1/sandboxes"));
    if (!page.ok()) return fail(page.error());
    for (const auto& s : field(*page, "sandboxes")) sandboxes.push_back(s);
    cursor = field(*page, "next_cursor").is_string() ? field(*page, "next_cursor").get<std::string>() : "";
  } while (o.all && !cursor.empty());

  if (as_json) {
    printJson(json{{"sandboxes", sandboxes}, {"next_cursor", cursor.empty() ? json() : json(cursor)}});
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATE", "TEMPLATE", "CPUS", "MEMORY", "CREATED", "EXPIRES", "METADATA"}};
  for (const auto& s : sandboxes) rows.push_back(sandboxRow(s));
  printTable(rows);
  if (!cursor.empty()) std::cerr << "spacectl: more sandboxes follow; --all lists every page\n";
  return 0;
}

int cmdGet(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto sandbox = api.call("GET", sandboxPath(id));
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    printSandbox(*sandbox);
  }
  return 0;
}

// rm and snapshot rm: each id in turn, whatever happened to the ones before.
int cmdRemove(const apiclient::Client& api, const std::vector<std::string>& ids,
              std::string (*path)(const std::string&), bool as_json) {
  json deleted = json::array(), failed = json::array();
  for (const auto& id : ids) {
    auto done = api.call("DELETE", path(id));
    if (done.ok()) {
      deleted.push_back(id);
      if (!as_json) std::cout << id << "\n" << std::flush;
      continue;
    }
    failed.push_back({{"id", id}, {"error", {{"code", done.error().reason}, {"message", done.error().message}}}});
    fail(done.error());
  }
  if (as_json) printJson(json{{"deleted", deleted}, {"failed", failed}});
  return failed.empty() ? 0 : kExitFailure;
}

int cmdTimeout(const apiclient::Client& api, const std::string& id, int64_t seconds, bool as_json) {
  auto sandbox = api.call("POST", sandboxPath(id) + "/timeout", json{{"timeout_s", seconds}});
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    std::cout << id << " expires " << text(field(*sandbox, "expires_at")) << " ("
              << relativeTime(field(*sandbox, "expires_at")) << ")\n";
  }
  return 0;
}

// pause / resume: the sandbox's new state, or its JSON.
int cmdRunState(const apiclient::Client& api, const std::string& id, const char* action, bool as_json) {
  auto sandbox = api.call("POST", sandboxPath(id) + "/" + action, json::object());
  if (!sandbox.ok()) return fail(sandbox.error());
  if (as_json) {
    printJson(*sandbox);
  } else {
    std::cout << id << " " << text(field(*sandbox, "state")) << "\n";
  }
  return 0;
}

int cmdLogs(const apiclient::Client& api, const std::string& id, int64_t tail_bytes, bool as_json) {
  Query query;
  if (tail_bytes > 0) query.add("tail_bytes", std::to_string(tail_bytes));
  auto log = api.send("GET", query.on(sandboxPath(id) + "/logs"), {}, "", kRequestTimeout);
  if (!log.ok()) return fail(log.error());
  if (as_json) {
    printJson(json{{"id", id}, {"log", log->body}});
    return 0;
  }
  auto written = writeAll(STDOUT_FILENO, log->body, "the log to stdout");
  return written.ok() ? 0 : fail(written.error());
}

// --- snapshots -------------------------------------------------------------------------------

struct SnapshotOptions {
  std::string name;
  std::vector<std::string> metadata;
};

int cmdSnapshotCreate(const apiclient::Client& api, const std::string& sandbox_id, const SnapshotOptions& o,
                      bool as_json) {
  json request = json::object();
  if (!o.name.empty()) request["name"] = o.name;
  if (!o.metadata.empty()) request["metadata"] = pairs(o.metadata);
  auto snapshot = api.call("POST", sandboxPath(sandbox_id) + "/snapshots", request, kSnapshotTimeout);
  if (!snapshot.ok()) return fail(snapshot.error());
  if (as_json) {
    printJson(*snapshot);
  } else {
    std::cout << text(field(*snapshot, "id")) << "\n";
  }
  return 0;
}

struct SnapshotListOptions {
  std::string sandbox_id;
  int limit = 0;
  bool all = false;
};

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

struct BranchOptions {
  int count = 1;
  SandboxSettings settings;
};

int cmdBranch(const apiclient::Client& api, const std::string& snapshot_id, const BranchOptions& o, bool as_json) {
  json request = settingsRequest(o.settings);
  if (o.count != 1) request["count"] = o.count;
  // The daemon answers once every child runs (or, if one fails, once the others are deleted).
  OnSignal reaction([](int sig) {
    std::cerr << "\nspacectl: interrupted; sandboxes the branch started may be left behind (spacectl ls)\n";
    _exit(128 + sig);
  });
  auto branched = api.call("POST", snapshotPath(snapshot_id) + "/branch", request,
                           kCreateTimeout * ((o.count + kBranchParallel - 1) / kBranchParallel));
  if (!branched.ok()) return fail(branched.error());
  if (as_json) {
    printJson(*branched);
  } else {
    for (const auto& s : field(*branched, "sandboxes")) std::cout << text(field(s, "id")) << "\n";
  }
  return 0;
}

// --- processes -------------------------------------------------------------------------------

struct ExecOptions {
  std::string user;
  std::string cwd;
  std::vector<std::string> env;
  int64_t timeout_s = -1;  // -1: the daemon's default
  bool send_stdin = false;
  std::vector<std::string> command;
};

// Read before anything is created, so a failing stdin leaves nothing behind.
Result<json> execRequest(const ExecOptions& o) {
  json request = json::object();
  // One argument is a command line for the guest's shell (pipes, globs); several are an argv.
  if (o.command.size() == 1) {
    request["command"] = o.command[0];
  } else {
    request["argv"] = o.command;
  }
  if (!o.env.empty()) request["env"] = pairs(o.env);
  if (!o.cwd.empty()) request["cwd"] = o.cwd;
  if (!o.user.empty()) request["user"] = o.user;
  if (o.timeout_s >= 0) request["timeout_s"] = o.timeout_s;
  if (o.send_stdin) {
    auto data = readAll(STDIN_FILENO, "stdin");
    if (!data.ok()) return data.error();
    request["stdin"] = agentproto::base64Encode(data.value());
  }
  return request;
}

// How long to wait for the daemon's next word: the command may be silent for its whole timeout.
milliseconds execWait(const json& request) {
  const json& t = field(request, "timeout_s");
  int64_t seconds = t.is_number_integer() ? t.get<int64_t>() : kDaemonExecTimeoutS;
  if (seconds == 0) return milliseconds(0);  // no limit on the command: none on waiting either
  return std::chrono::seconds(seconds) + kExecSlack;
}

std::string processPath(const std::string& id, int pid) {
  return sandboxPath(id) + "/processes/" + std::to_string(pid);
}

// The remote process of a streamed exec, for the signal thread.
struct RemoteProcess {
  std::string sandbox_id;
  std::atomic<int> pid{0};
  int signals = 0;  // only the signal thread touches it
};

const char* signalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; }

// Ctrl-C during exec: the first is passed on to the remote command (which may want to clean up),
// the second detaches and leaves it running.
void forwardSignal(const apiclient::Client& api, RemoteProcess& process, int sig) {
  int pid = process.pid;
  if (pid == 0) {
    std::cerr << "\nspacectl: interrupted; if the command started, spacectl ps " << process.sandbox_id << " shows it\n";
    _exit(128 + sig);
  }
  if (++process.signals > 1) {
    std::cerr << "\nspacectl: detached; process " << pid << " may still be running in " << process.sandbox_id << "\n";
    _exit(128 + sig);
  }
  auto sent = api.call("POST", processPath(process.sandbox_id, pid) + "/signal", json{{"signal", signalName(sig)}});
  if (!sent.ok()) {
    std::cerr << "\nspacectl: could not pass " << signalName(sig) << " on: " << describe(sent.error()) << "\n";
    _exit(128 + sig);
  }
  std::cerr << "\nspacectl: sent " << signalName(sig) << " to process " << pid << " in " << process.sandbox_id
            << " (again to detach)\n";
}

// Runs the command with its output streamed to ours as it arrives (NDJSON lines); returns the
// exit code spacectl should end with.
int streamExec(const apiclient::Client& api, json request, RemoteProcess& process) {
  request["stream"] = true;
  json exit_code, exit_status;
  bool exited = false;
  std::optional<Error> stream_error;
  auto onEvent = [&](const json& event) -> Status {
    std::string type = text(field(event, "type"));
    if (type == "start") {
      process.pid = field(event, "pid").is_number_integer() ? field(event, "pid").get<int>() : 0;
    } else if (type == "stdout" || type == "stderr") {
      auto data = agentproto::base64Decode(text(field(event, "data")));
      if (!data) return makeError(ErrorCode::kInternal, "spaced sent output that is not base64");
      return type == "stdout" ? writeAll(STDOUT_FILENO, *data, "stdout") : writeAll(STDERR_FILENO, *data, "stderr");
    } else if (type == "exit") {
      exited = true;
      exit_code = field(event, "exit_code");
      exit_status = field(event, "status");
    } else if (type == "error") {
      const json& e = field(event, "error");
      stream_error = makeError(ErrorCode::kInternal, text(field(e, "message")), text(field(e, "code")));
    }
    return okStatus();  // other types: a newer daemon's additions
  };
  auto done = api.streamLines("POST", sandboxPath(process.sandbox_id) + "/exec", request, onEvent, execWait(request));
  if (!done.ok()) return done.error().reason == kBrokenPipe ? 128 + SIGPIPE : fail(done.error());
  if (stream_error) return fail(*stream_error);
  if (!exited) return fail("the output stream ended before the command's exit status arrived");
  return exitCodeOf(exit_code, exit_status);
}

// The non-streamed exec: one JSON document with all the output, for scripts.
int jsonExec(const apiclient::Client& api, const std::string& id, const json& request) {
  auto result = api.call("POST", sandboxPath(id) + "/exec", request, execWait(request));
  if (!result.ok()) return fail(result.error());
  printJson(*result);
  return exitCodeOf(field(*result, "exit_code"), field(*result, "status"));
}

int cmdExec(const apiclient::Client& api, const std::string& id, const ExecOptions& o, bool as_json) {
  auto request = execRequest(o);
  if (!request.ok()) return fail(request.error());
  RemoteProcess process;
  process.sandbox_id = id;
  OnSignal reaction([&](int sig) { forwardSignal(api, process, sig); });
  return as_json ? jsonExec(api, id, *request) : streamExec(api, *request, process);
}

// Deletes the sandbox of `run --rm` once, from whichever thread gets there first: the main one
// when the command is over, or the signal thread on Ctrl-C.
class SandboxCleanup {
 public:
  explicit SandboxCleanup(const apiclient::Client& api) : api_(api) {}

  void adopt(const std::string& id) {
    std::lock_guard lock(m_);
    id_ = id;
  }
  bool known() {
    std::lock_guard lock(m_);
    return !id_.empty();
  }
  // False if the sandbox may have been left behind (said on stderr).
  bool run() {
    std::lock_guard lock(m_);
    if (id_.empty() || attempted_) return ok_;
    attempted_ = true;
    auto done = api_.call("DELETE", sandboxPath(id_));
    ok_ = done.ok() || done.error().code == ErrorCode::kNotFound;
    if (!ok_) std::cerr << "spacectl: could not delete sandbox " << id_ << ": " << describe(done.error()) << "\n";
    if (!ok_) std::cerr << "spacectl: delete it with: spacectl rm " << id_ << "\n";
    return ok_;
  }
  std::string id() {
    std::lock_guard lock(m_);
    return id_;
  }

 private:
  const apiclient::Client& api_;
  std::mutex m_;
  std::string id_;
  bool attempted_ = false;
  bool ok_ = true;
};

int cmdRun(const apiclient::Client& api, const CreateOptions& create, const ExecOptions& exec, bool remove,
           bool as_json) {
  auto request = execRequest(exec);
  if (!request.ok()) return fail(request.error());
  SandboxCleanup cleanup(api);
  RemoteProcess process;  // its sandbox_id is set before cleanup knows the id, and read after
  int signals = 0;
  OnSignal reaction([&](int sig) {
    if (!cleanup.known()) {
      if (remove && ++signals < 3) {
        std::cerr << "\nspacectl: interrupted; the sandbox is deleted as soon as it exists (Ctrl-C "
                  << (signals == 1 ? "twice more" : "once more") << " to leave it)\n";
        return;  // the main thread checks g_interrupted once the create returns
      }
      std::cerr << "\nspacectl: interrupted; the sandbox being created may be left behind (spacectl ls)\n";
      _exit(128 + sig);
    }
    if (!remove) return forwardSignal(api, process, sig);
    // Deleting the sandbox ends the command; waiting for its stream to say so gains nothing.
    std::cerr << "\nspacectl: interrupted; deleting sandbox " << cleanup.id() << "\n";
    cleanup.run();
    _exit(128 + sig);
  });

  auto created = api.call("POST", "/v1/sandboxes", createRequest(create), kCreateTimeout);
  if (!created.ok()) return g_interrupted ? 128 + g_interrupted : fail(created.error());
  const std::string id = text(field(*created, "id"));
  process.sandbox_id = id;
  cleanup.adopt(id);
  if (!remove) std::cerr << id << "\n";
  int rc = g_interrupted ? 128 + g_interrupted
                         : (as_json ? jsonExec(api, id, *request) : streamExec(api, *request, process));
  if (remove && !cleanup.run() && rc == 0) rc = kExitFailure;
  return rc;
}

int cmdProcesses(const apiclient::Client& api, const std::string& id, bool as_json) {
  auto list = api.call("GET", sandboxPath(id) + "/processes");
  if (!list.ok()) return fail(list.error());
  if (as_json) {
    printJson(*list);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"PID", "CWD", "TAG", "COMMAND"}};
  for (const auto& p : field(*list, "processes")) {
    std::string command = text(field(p, "cmd"));
    for (const auto& arg : field(p, "args")) command += " " + text(arg);
    std::string cwd = text(field(p, "cwd")), tag = text(field(p, "tag"));
    rows.push_back({text(field(p, "pid")), cwd.empty() ? "-" : cwd, tag.empty() ? "-" : tag, command});
  }
  printTable(rows);
  return 0;
}

int cmdKill(const apiclient::Client& api, const std::string& id, int pid, std::string signal, bool as_json) {
  static const std::map<std::string, std::string> kNumbers = {{"1", "SIGHUP"},   {"2", "SIGINT"},   {"3", "SIGQUIT"},
                                                              {"9", "SIGKILL"},  {"10", "SIGUSR1"}, {"12", "SIGUSR2"},
                                                              {"15", "SIGTERM"}, {"18", "SIGCONT"}, {"19", "SIGSTOP"}};
  for (char& c : signal) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (auto it = kNumbers.find(signal); it != kNumbers.end()) signal = it->second;
  if (!signal.starts_with("SIG")) signal = "SIG" + signal;
  auto sent = api.call("POST", processPath(id, pid) + "/signal", json{{"signal", signal}});
  if (!sent.ok()) return fail(sent.error());
  if (as_json) printJson(json{{"id", id}, {"pid", pid}, {"signal", signal}});
  return 0;
}

// --- files -----------------------------------------------------------------------------------

struct RemotePath {
  std::string id;
  std::string path;
};

// "sb_x:/path"; "./a:b" and "/tmp/a:b" are local files (a '/' before the colon).
std::optional<RemotePath> parseRemote(const std::string& arg) {
  auto colon = arg.find(':');
  if (colon == std::string::npos || colon == 0 || arg.find('/') < colon) return std::nullopt;
  return RemotePath{arg.substr(0, colon), arg.substr(colon + 1)};
}

std::string baseName(const std::string& path) {
  auto name = std::filesystem::path(path).filename().string();
  return name.empty() ? std::filesystem::path(path).parent_path().filename().string() : name;
}

std::string filesTarget(const RemotePath& remote, const std::string& user) {
  Query query;
  query.add("path", remote.path);
  if (!user.empty()) query.add("user", user);
  return query.on(sandboxPath(remote.id) + "/files");
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ > STDERR_FILENO) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

int upload(const apiclient::Client& api, const std::string& local, RemotePath remote, const std::string& user,
           bool as_json) {
  const bool from_stdin = local == "-";
  Fd file(from_stdin ? STDIN_FILENO : ::open(local.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) return fail(errnoError(local));
  struct stat st {};
  if (fstat(file.get(), &st) != 0) return fail(errnoError(local));
  if (S_ISDIR(st.st_mode)) return fail(local + " is a directory; cp copies one file");
  if (remote.path.ends_with('/') && !from_stdin) remote.path += baseName(local);
  // A regular file goes out with its length; a pipe chunked. Reading stops at the length taken
  // here, so a file that grows meanwhile is copied as it was.
  std::optional<uint64_t> length;
  if (S_ISREG(st.st_mode)) {
    off_t at = lseek(file.get(), 0, SEEK_CUR);
    length = static_cast<uint64_t>(st.st_size - std::max<off_t>(at, 0));
  }
  uint64_t left = length.value_or(UINT64_MAX);
  std::optional<Error> read_error;
  auto source = [&](char* buf, size_t max) -> Result<size_t> {
    size_t want = static_cast<size_t>(std::min<uint64_t>(max, left));
    if (want == 0) return size_t(0);
    while (true) {
      ssize_t n = ::read(file.get(), buf, want);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        read_error = errnoError("reading " + local);
        return *read_error;
      }
      left -= static_cast<uint64_t>(n);
      return static_cast<size_t>(n);
    }
  };
  std::string answer;
  auto done = api.stream(
      "PUT", filesTarget(remote, user), "application/octet-stream", {}, http::RequestBody::fromSource(source, length),
      [&](std::string_view chunk) {
        answer.append(chunk.substr(0, kMaxAnswer - std::min(kMaxAnswer, answer.size())));
        return okStatus();
      },
      kRequestTimeout);
  if (read_error) return fail(*read_error);
  if (!done.ok()) return fail(done.error());
  if (as_json) {
    auto entry = parseJsonBounded(answer);
    printJson(entry.ok() ? *entry : json::object());
  }
  return 0;
}

// Into a temporary file next to the destination, renamed over it only when complete: a failed
// or interrupted copy leaves the old file (or none), never half of the new one.
int download(const apiclient::Client& api, const RemotePath& remote, std::string local, const std::string& user,
             bool as_json) {
  uint64_t bytes = 0;
  auto target = filesTarget(remote, user);
  if (local == "-") {
    auto done = api.stream(
        "GET", target, "", {}, {},
        [&](std::string_view chunk) {
          bytes += chunk.size();
          return writeAll(STDOUT_FILENO, chunk, "stdout");
        },
        kRequestTimeout);
    if (!done.ok()) return done.error().reason == kBrokenPipe ? 128 + SIGPIPE : fail(done.error());
    return 0;
  }
  std::error_code ec;
  if (local.ends_with('/') || std::filesystem::is_directory(local, ec)) {
    local = (std::filesystem::path(local) / baseName(remote.path)).string();
  }
  auto dest = std::filesystem::path(local);
  std::string tmpl = (dest.parent_path().empty() ? std::filesystem::path(".") : dest.parent_path()) /
                     ("." + dest.filename().string() + ".spacectl-XXXXXX");
  Fd file(::mkstemp(tmpl.data()));
  if (file.get() < 0) return fail(errnoError("creating a temporary file for " + local));
  const std::string tmp = tmpl;
  // mkstemp makes 0600; the copy gets what the existing file had, or what a new file would get.
  struct stat st {};
  mode_t mode;
  if (::stat(local.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    mode = st.st_mode & 07777;
  } else {
    mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  (void)::fchmod(file.get(), mode);
  OnSignal reaction([&](int sig) {
    ::unlink(tmp.c_str());
    _exit(128 + sig);
  });
  auto done = api.stream(
      "GET", target, "", {}, {},
      [&](std::string_view chunk) {
        bytes += chunk.size();
        return writeAll(file.get(), chunk, tmp.c_str());
      },
      kRequestTimeout);
  Status finished = done;
  if (finished.ok() && ::fsync(file.get()) != 0) finished = errnoError("fsync " + tmp);
  if (finished.ok() && ::close(file.release()) != 0) finished = errnoError("closing " + tmp);
  if (finished.ok() && ::rename(tmp.c_str(), local.c_str()) != 0) finished = errnoError("renaming it to " + local);
  if (!finished.ok()) {
    ::unlink(tmp.c_str());
    return fail(finished.error());
  }
  // The rename itself lasts only once the directory is on disk too.
  Fd dir(::open(dest.parent_path().empty() ? "." : dest.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) (void)::fsync(dir.get());
  if (as_json) printJson(json{{"source", remote.id + ":" + remote.path}, {"path", local}, {"bytes", bytes}});
  return 0;
}

int cmdCopy(const apiclient::Client& api, const std::string& from, const std::string& to, const std::string& user,
            bool as_json) {
  auto remote_from = parseRemote(from), remote_to = parseRemote(to);
  if (remote_from.has_value() == remote_to.has_value()) {
    std::cerr << "spacectl: cp copies between a sandbox and this machine: exactly one of SRC and DST must be "
                 "ID:/path\n";
    return kExitUsage;
  }
  const RemotePath& remote = remote_from ? *remote_from : *remote_to;
  if (remote.path.empty()) {
    std::cerr << "spacectl: " << (remote_from ? from : to) << ": give the path in the sandbox after the ':'\n";
    return kExitUsage;
  }
  return remote_to ? upload(api, from, *remote_to, user, as_json) : download(api, *remote_from, to, user, as_json);
}

// --- command line ----------------------------------------------------------------------------

constexpr const char* kDescription =
    "spacectl: run commands in SPACE sandboxes (microVMs) through the spaced daemon's REST API.\n"
    "\n"
    "Examples:\n"
    "  spacectl run --rm -- uname -a                  one-off sandbox: create, run, delete\n"
    "  id=$(spacectl create --cpus 2 --memory 1024 --metadata owner=me)\n"
    "  spacectl exec $id -- 'cd /tmp && ls -la | head'   one argument: a shell command line\n"
    "  spacectl exec $id -- python3 -c 'print(1)'     several arguments: an argv, no shell\n"
    "  echo hello | spacectl exec --stdin $id -- cat\n"
    "  spacectl cp ./data.csv $id:/tmp/data.csv       upload; cp $id:/tmp/out.txt . downloads\n"
    "  spacectl ls --metadata owner=me --all\n"
    "  spacectl ls --json | jq -r '.sandboxes[].id'   --json: the API's JSON, for scripts\n"
    "  spacectl timeout $id 3600                      keep it for another hour\n"
    "  spacectl pause $id; spacectl resume $id        stop its vCPUs for a while, keep everything\n"
    "  snap=$(spacectl snapshot create $id --name warm)   save it as it is now (it keeps running)\n"
    "  spacectl branch $snap -n 4                     four sandboxes that start from that point\n"
    "  spacectl create --idle-suspend 600 --on-timeout suspend\n"
    "  spacectl rm $id\n"
    "\n"
    "The daemon: --api, env SPACE_API, else the url spaced wrote to <data-dir>/spaced.json, else\n"
    "http://127.0.0.1:8080. The key: --api-key, env SPACE_API_KEY, else <data-dir>/api-key.\n"
    "\n"
    "Exit codes: 0 ok; exec/run: the remote command's (128+N if signal N killed it);\n"
    "1 API or connection error; 2 usage error; 130 interrupted (Ctrl-C).\n";

// What every new sandbox may be given: create, run and branch.
void addSettingsOptions(CLI::App* sub, SandboxSettings& o) {
  sub->add_option("--timeout", o.timeout_s,
                  "seconds until its timeout deletes it (or suspends it: --on-timeout; daemon default 300); "
                  "extend with `spacectl timeout`")
      ->check(kSeconds);
  sub->add_option("--idle-suspend", o.idle_suspend_s,
                  "suspend it after this many seconds without API, exec or file activity (0: never; daemon "
                  "default 21600 = 6 h); spacectl resume, exec or a file call resumes it")
      ->check(CLI::Range(int64_t(0), kMaxIdleSuspendS));
  sub->add_option("--on-timeout", o.on_timeout,
                  "what its timeout does: delete (default), or suspend: kept suspended (7 days by default), "
                  "its timeout starting again when resumed")
      ->check(CLI::IsMember({"delete", "suspend"}));
  sub->add_option("--env", o.env, "environment variable for every command in the sandbox (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  sub->add_option("--metadata", o.metadata, "label to find it by, e.g. owner=me (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
}

void addCreateOptions(CLI::App* sub, CreateOptions& o) {
  auto* tpl = sub->add_option("--template", o.template_name, "sandbox template (daemon default: base)");
  sub->add_option("--snapshot", o.snapshot,
                  "start from this snapshot (snap_..., see spacectl snapshot) instead of a template: its disk, "
                  "memory and processes as they were, with the snapshot's template, CPUs and memory")
      ->excludes(tpl);
  sub->add_option("--cpus", o.cpus, "vCPUs (daemon default; with --snapshot: the snapshot's, or equal to it)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--memory", o.memory_mb,
                  "memory in MB (daemon default; with --snapshot: the snapshot's, or equal to it)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  addSettingsOptions(sub, o.settings);
}

void addExecOptions(CLI::App* sub, ExecOptions& o) {
  sub->add_option("--user", o.user, "user to run as (default: the sandbox's)");
  sub->add_option("--cwd", o.cwd, "working directory in the sandbox");
  sub->add_flag("--stdin", o.send_stdin, "send this terminal's stdin (read to its end first) to the command");
  sub->add_option("command", o.command, "after --: one argument is a shell command line (bash -l -c), several an argv")
      ->required();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, "spacectl"};
  app.require_subcommand(1);
  app.fallthrough();  // global options also after the subcommand: spacectl ls --api URL
  apiclient::EndpointFlags global;
  app.add_option("--api", global.api,
                 "daemon URL, e.g. http://127.0.0.1:8080 (env SPACE_API; default: <data-dir>/spaced.json)");
  app.add_option("--api-key", global.api_key, "API key (env SPACE_API_KEY; default: <data-dir>/api-key)");
  app.add_option("--data-dir", global.data_dir,
                 "spaced's data directory (env SPACE_DATA_DIR; default: /var/lib/space)");

  bool as_json = false;
  app.add_flag("--json", as_json, "print the API's JSON (one document) instead of text; also after the subcommand");
  std::vector<std::pair<CLI::App*, std::function<int(const apiclient::Client&)>>> commands;
  auto nested = [&](CLI::App* parent, const char* name, const char* help,
                    std::function<int(const apiclient::Client&)> run) {
    auto* sub = parent->add_subcommand(name, help);
    sub->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
    commands.emplace_back(sub, std::move(run));
    return sub;
  };
  auto command = [&](const char* name, const char* help, std::function<int(const apiclient::Client&)> run) {
    return nested(&app, name, help, std::move(run));
  };
  std::string id, user, from, to, signal = "SIGTERM";
  std::vector<std::string> ids;
  int pid = 0;
  int64_t seconds = 0, tail_bytes = 0;
  bool remove = false;
  CreateOptions create;
  ListOptions list;
  ExecOptions exec;
  SnapshotOptions snapshot;
  SnapshotListOptions snapshot_list;
  BranchOptions branch;

  auto* c_create = command("create", "create a sandbox and print its id",
                           [&](const apiclient::Client& api) { return cmdCreate(api, create, as_json); });
  addCreateOptions(c_create, create);

  auto* c_ls =
      command("ls", "list sandboxes", [&](const apiclient::Client& api) { return cmdList(api, list, as_json); });
  c_ls->add_option(
          "--state", list.states,
          "only these states (comma-separated or repeated): creating, running, paused, suspended, failed, deleted")
      ->delimiter(',')
      ->allow_extra_args(false);
  c_ls->add_option("--metadata", list.metadata, "only sandboxes with this label (repeatable: all must match)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_ls->add_option("--limit", list.limit, "sandboxes per page (1..1000)")->check(CLI::Range(1, 1000));
  c_ls->add_flag("--all", list.all, "follow next_cursor through every page");

  auto* c_get =
      command("get", "show one sandbox", [&](const apiclient::Client& api) { return cmdGet(api, id, as_json); });
  c_get->add_option("id", id, "sandbox id")->required();

  auto* c_rm = command("rm", "delete sandboxes (exit 1 if any could not be deleted)",
                       [&](const apiclient::Client& api) { return cmdRemove(api, ids, sandboxPath, as_json); });
  c_rm->add_option("ids", ids, "sandbox ids")->required();

  auto* c_exec = command("exec", "run a command in a sandbox, its output streamed as it runs",
                         [&](const apiclient::Client& api) { return cmdExec(api, id, exec, as_json); });
  c_exec->add_option("id", id, "sandbox id")->required();
  c_exec->add_option("--env", exec.env, "environment variable for the command (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_exec->add_option("--timeout", exec.timeout_s, "seconds the command may run (daemon default 60; 0: no limit)")
      ->check(CLI::Range(int64_t(0), int64_t(24 * 3600)));
  addExecOptions(c_exec, exec);
  c_exec->footer("Example: spacectl exec sb_x --cwd /tmp -- ls -la\nCtrl-C passes SIGINT on; a second one detaches.");

  auto* c_run = command("run", "create a sandbox and run a command in it (--rm: delete it afterwards)",
                        [&](const apiclient::Client& api) { return cmdRun(api, create, exec, remove, as_json); });
  c_run->add_flag("--rm", remove, "delete the sandbox when the command ends, fails or is interrupted");
  addCreateOptions(c_run, create);
  c_run
      ->add_option("--exec-timeout", exec.timeout_s,
                   "seconds the command may run (default: no limit but the sandbox's own --timeout)")
      ->check(CLI::Range(int64_t(0), int64_t(24 * 3600)));
  addExecOptions(c_run, exec);
  c_run->footer("Example: spacectl run --rm --cpus 2 -- 'nproc && free -m'\nWithout --rm the id goes to stderr.");

  auto* c_cp = command("cp", "copy a file into or out of a sandbox (ID:/path on one side; - for stdin/stdout)",
                       [&](const apiclient::Client& api) { return cmdCopy(api, from, to, user, as_json); });
  c_cp->add_option("src", from, "source: a local file, -, or ID:/path")->required();
  c_cp->add_option("dst", to, "destination: a local file or directory, -, or ID:/path (ending in / keeps the name)")
      ->required();
  c_cp->add_option("--user", user, "owner of the file in the sandbox (default: the sandbox's user)");
  c_cp->footer("Examples: spacectl cp app.tar.gz sb_x:/tmp/\n          spacectl cp sb_x:/var/log/app.log - | less");

  auto* c_logs = command("logs", "print a sandbox's console (kernel and boot) log",
                         [&](const apiclient::Client& api) { return cmdLogs(api, id, tail_bytes, as_json); });
  c_logs->add_option("id", id, "sandbox id")->required();
  c_logs->add_option("--tail-bytes", tail_bytes, "only the last N bytes (daemon default 64 KiB)")
      ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));

  auto* c_timeout =
      command("timeout", "set a sandbox's timeout to SECONDS from now (it then is deleted, or suspended: --on-timeout)",
              [&](const apiclient::Client& api) { return cmdTimeout(api, id, seconds, as_json); });
  c_timeout->add_option("id", id, "sandbox id")->required();
  c_timeout->add_option("seconds", seconds, "seconds from now")->required()->check(kSeconds);

  auto* c_snapshot = app.add_subcommand(
      "snapshot", "save a sandbox as it is now (disk, memory, processes), list and delete the snapshots");
  c_snapshot->add_flag("--json", as_json, "print the API's JSON (one document) instead of text");
  c_snapshot->require_subcommand(1);
  c_snapshot->footer(
      "A snapshot starts new sandboxes: spacectl branch SNAP_ID (several at once) or spacectl create --snapshot.\n"
      "They share its disk copy-on-write, so each sees its own writes only.");

  auto* c_snap_create =
      nested(c_snapshot, "create", "snapshot a running or paused sandbox (it stays so) and print the snapshot's id",
             [&](const apiclient::Client& api) { return cmdSnapshotCreate(api, id, snapshot, as_json); });
  c_snap_create->add_option("id", id, "sandbox id")->required();
  c_snap_create->add_option("--name", snapshot.name, "a name to recognise it by (at most 128 characters)");
  c_snap_create->add_option("--metadata", snapshot.metadata, "label, e.g. stage=warm (repeatable)")
      ->check(kKeyValue)
      ->allow_extra_args(false);
  c_snap_create->footer("Example: snap=$(spacectl snapshot create sb_x --name deps-installed)");

  auto* c_snap_ls = nested(c_snapshot, "ls", "list snapshots, oldest first",
                           [&](const apiclient::Client& api) { return cmdSnapshotList(api, snapshot_list, as_json); });
  c_snap_ls->add_option("--sandbox", snapshot_list.sandbox_id, "only the snapshots of this sandbox");
  c_snap_ls->add_option("--limit", snapshot_list.limit, "snapshots per page (1..1000, daemon default 100)")
      ->check(CLI::Range(1, 1000));
  c_snap_ls->add_flag("--all", snapshot_list.all, "follow next_cursor through every page");

  auto* c_snap_get = nested(c_snapshot, "get", "show one snapshot",
                            [&](const apiclient::Client& api) { return cmdSnapshotGet(api, id, as_json); });
  c_snap_get->add_option("id", id, "snapshot id (snap_...)")->required();

  auto* c_snap_rm = nested(c_snapshot, "rm",
                           "delete snapshots; sandboxes started from them keep working (exit 1 if any could not be "
                           "deleted)",
                           [&](const apiclient::Client& api) { return cmdRemove(api, ids, snapshotPath, as_json); });
  c_snap_rm->add_option("ids", ids, "snapshot ids")->required();

  auto* c_branch = command("branch", "start sandboxes from a snapshot, all or none, and print their ids (one per line)",
                           [&](const apiclient::Client& api) { return cmdBranch(api, id, branch, as_json); });
  c_branch->add_option("id", id, "snapshot id (snap_...)")->required();
  c_branch->add_option("-n,--count", branch.count, "how many sandboxes (at most 64, or spaced's --max-branch)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  addSettingsOptions(c_branch, branch.settings);
  c_branch->footer(
      "Each sandbox continues from the snapshot with its own copy-on-write disk (a write in one is invisible\n"
      "to the others), hostname, clock and fresh randomness; CPUs and memory are the snapshot's.\n"
      "If one fails to start, the others are deleted and the error is reported.\n"
      "Example: spacectl branch snap_x -n 8 --timeout 600 --metadata run=7");

  auto* c_pause = command("pause", "pause a sandbox: its vCPUs stop, memory stays (resume with spacectl resume)",
                          [&](const apiclient::Client& api) { return cmdRunState(api, id, "pause", as_json); });
  c_pause->add_option("id", id, "sandbox id")->required();
  auto* c_suspend = command("suspend", "suspend a sandbox: its memory and state go to disk, its VM exits",
                            [&](const apiclient::Client& api) { return cmdRunState(api, id, "suspend", as_json); });
  c_suspend->add_option("id", id, "sandbox id")->required();
  auto* c_resume =
      command("resume", "resume a paused or suspended sandbox (one its timeout suspended gets the timeout again)",
              [&](const apiclient::Client& api) { return cmdRunState(api, id, "resume", as_json); });
  c_resume->add_option("id", id, "sandbox id")->required();

  auto* c_ps = command("ps", "list the processes running in a sandbox",
                       [&](const apiclient::Client& api) { return cmdProcesses(api, id, as_json); });
  c_ps->add_option("id", id, "sandbox id")->required();

  auto* c_kill = command("kill", "send a signal to a process in a sandbox",
                         [&](const apiclient::Client& api) { return cmdKill(api, id, pid, signal, as_json); });
  c_kill->add_option("id", id, "sandbox id")->required();
  c_kill->add_option("pid", pid, "process id (see spacectl ps)")->required()->check(CLI::Range(1, 4194304));
  c_kill
      ->add_option("--signal,-s", signal,
                   "SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP, SIGCONT")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  auto endpoint = apiclient::resolveEndpoint(global);
  if (!endpoint.ok()) return fail(endpoint.error());
  auto api = apiclient::Client::create(std::move(endpoint.value()));
  if (!api.ok()) {
    std::cerr << "spacectl: " << api.error().message << "\n";
    return kExitUsage;
  }
  startSignalThread();
  for (const auto& [sub, run] : commands) {
    if (sub->parsed()) return run(*api);
  }
  return kExitUsage;
}
