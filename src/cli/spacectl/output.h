// How spacectl speaks: its exit codes, errors on stderr, the API's JSON for --json, and the
// tables and units people read. Every command prints through these, so they all look alike.
#pragma once

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/result.h"

namespace space::spacectl {

using json = nlohmann::json;

// Besides these, exec and run end with the remote command's code, and a signal N that stops
// spacectl itself with 128+N (see spacectl_main.cc).
inline constexpr int kExitFailure = 1;  // an API, connection or local I/O failure
inline constexpr int kExitUsage = 2;

// Command output and guest file names need not be UTF-8; the daemon already replaced such bytes.
std::string dumpJson(const json& value, int indent = -1);

// The API's JSON as --json prints it: indented, one document.
void printJson(const json& value);

// The message, and the API's error code when there is one: "no such sandbox (not_found)".
std::string describe(const Error& e);

// Says it on stderr; returns kExitFailure for `return fail(...)`.
int fail(const Error& e);
int fail(const std::string& message);

// Marks a write to a pipe whose reader left (spacectl exec ... | head): an ending, not an error.
inline constexpr const char* kBrokenPipe = "broken_pipe";

// errno's message after `what`; EPIPE gets the reason kBrokenPipe.
Error errnoError(const std::string& what);

// Straight to the descriptor: exec output must show up as it arrives, not when a buffer fills.
Status writeAll(int fd, std::string_view data, const char* what);

Result<std::string> readAll(int fd, const char* what);

// A value as a table cell: strings as they are, null as nothing, anything else as JSON.
std::string text(const json& value);

// "3m ago", "in 2h": what a person wants from a table; --json keeps the timestamps.
std::string relativeTime(const json& value);

// "k=v,k2=v2", cut to max_chars; "-" for none.
std::string metadataText(const json& metadata, size_t max_chars);

std::string memoryText(const json& mb);

// 1.5GiB, 300MiB, 12KiB, 80B.
std::string bytesText(const json& bytes);

// A number of seconds in the largest unit that says it exactly: 300s, 90m, 6h, 7d.
std::string secondsText(const json& seconds);

// Left-aligned columns; the last one is not padded, so long metadata does not pad every line.
void printTable(const std::vector<std::vector<std::string>>& rows);

// A line on stderr while a long request runs ("| creating a sandbox (2 vCPUs, 512 MB)... 2.4s"),
// redrawn every 100 ms and erased when it ends, so the answer prints on a clean line. The API
// answers these requests only when done, so elapsed time is what there is to show. Only on a
// terminal and without --json: pipes, logs and scripts never see it.
class Progress {
 public:
  Progress(std::string what, bool as_json);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

 private:
  void run();
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace space::spacectl
