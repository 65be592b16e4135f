#include "cli/spacectl/files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <utility>

#include "cli/spacectl/output.h"
#include "cli/spacectl/signals.h"
#include "common/bounded_json.h"

namespace space::spacectl {

using apiclient::kRequestTimeout;
using apiclient::Query;
using apiclient::sandboxPath;

namespace {

// An upload's answer is one small JSON document; a daemon that sends more gets it cut.
constexpr size_t kMaxAnswer = 64 * 1024;

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

}  // namespace

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

}  // namespace space::spacectl
