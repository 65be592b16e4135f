#include "cli/spacectl/secrets.h"

#include <fcntl.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include <iostream>

#include "cli/spacectl/output.h"
#include "common/unix_socket.h"

namespace space::spacectl {

using apiclient::field;
using apiclient::secretPath;

namespace {

// Reads the value: a file, a pipe, or a terminal with echo off (restored on every path out).
Result<std::string> readValue(const std::string& name, const std::string& from_file) {
  if (!from_file.empty() && from_file != "-") {
    int fd = ::open(from_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errnoError("opening " + from_file);
    UniqueFd owned(fd);
    return readAll(fd, from_file.c_str());
  }
  if (!isatty(STDIN_FILENO)) return readAll(STDIN_FILENO, "stdin");
  termios saved{};
  bool echo_off = tcgetattr(STDIN_FILENO, &saved) == 0;
  if (echo_off) {
    termios quiet = saved;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    echo_off = tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet) == 0;
  }
  std::cerr << "value for secret " << name << " (not echoed; Enter ends it): " << std::flush;
  std::string line;
  std::getline(std::cin, line);
  if (echo_off) tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved);
  std::cerr << "\n";
  return line;
}

}  // namespace

int cmdSecretSet(const apiclient::Client& api, const std::string& name, const std::string& from_file, bool as_json) {
  auto value = readValue(name, from_file);
  if (!value.ok()) return fail(value.error());
  std::string& v = value.value();
  // `echo token > file` and here-strings end in a newline that is no part of the secret.
  if (!v.empty() && v.back() == '\n') v.pop_back();
  if (!v.empty() && v.back() == '\r') v.pop_back();
  if (v.empty()) return fail("the value is empty (nothing on stdin, or an empty file)");
  json body{{"value", v}};
  explicit_bzero(v.data(), v.size());
  auto stored = api.call("PUT", secretPath(name), body);
  if (!stored.ok()) return fail(stored.error());
  if (as_json) {
    printJson(*stored);
  } else {
    int64_t version = field(*stored, "version").is_number_integer() ? field(*stored, "version").get<int64_t>() : 0;
    std::cout << (version == 1 ? "created " : "rotated ") << name << " (version " << version << ")\n";
  }
  return 0;
}

int cmdSecretList(const apiclient::Client& api, bool as_json) {
  auto listed = api.call("GET", "/v1/secrets");
  if (!listed.ok()) return fail(listed.error());
  if (as_json) {
    printJson(*listed);
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "VERSION", "CREATED", "UPDATED"}};
  for (const auto& s : field(*listed, "secrets")) {
    rows.push_back({text(field(s, "name")), text(field(s, "version")), relativeTime(field(s, "created_at")),
                    relativeTime(field(s, "updated_at"))});
  }
  printTable(rows);
  return 0;
}

}  // namespace space::spacectl
