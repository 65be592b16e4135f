#include "cli/spacectl/output.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <optional>

namespace space::spacectl {

namespace {

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

}  // namespace

std::string dumpJson(const json& value, int indent) {
  return value.dump(indent, ' ', false, json::error_handler_t::replace);
}

void printJson(const json& value) { std::cout << dumpJson(value, 2) << "\n" << std::flush; }

std::string describe(const Error& e) { return e.reason.empty() ? e.message : e.message + " (" + e.reason + ")"; }

int fail(const Error& e) {
  std::cerr << "spacectl: " << describe(e) << "\n";
  return kExitFailure;
}

int fail(const std::string& message) { return fail(makeError(ErrorCode::kInternal, message)); }

Error errnoError(const std::string& what) {
  int err = errno;
  return makeError(ErrorCode::kInternal, what + ": " + std::strerror(err), err == EPIPE ? kBrokenPipe : "");
}

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

std::string secondsText(const json& seconds) {
  if (!seconds.is_number_integer()) return "-";
  int64_t s = seconds.get<int64_t>();
  if (s > 0 && s % 86400 == 0) return std::to_string(s / 86400) + "d";
  if (s > 0 && s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s > 0 && s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

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

Progress::Progress(std::string what, bool as_json) : what_(std::move(what)) {
  const char* term = std::getenv("TERM");
  if (as_json || !::isatty(STDERR_FILENO) || (term != nullptr && std::string_view(term) == "dumb")) return;
  thread_ = std::thread([this] { run(); });
}

Progress::~Progress() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  (void)writeAll(STDERR_FILENO, "\r\x1b[K", "stderr");
}

void Progress::run() {
  const auto started = std::chrono::steady_clock::now();
  static constexpr char kFrames[] = {'|', '/', '-', '\\'};
  std::unique_lock lock(mu_);
  for (size_t frame = 0; !done_; ++frame) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char elapsed[32];
    std::snprintf(elapsed, sizeof elapsed, "%.1fs", seconds);
    // \x1b[K erases what a longer earlier line left to the right.
    (void)writeAll(STDERR_FILENO,
                   std::string("\r") + kFrames[frame % std::size(kFrames)] + " " + what_ + "... " + elapsed + "\x1b[K",
                   "stderr");
    cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; });
  }
}

}  // namespace space::spacectl
