#include "gateway/policy_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unix_socket.h"

namespace space::gateway {

namespace {

int64_t mtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

Result<std::pair<net::Policy, PolicyFile::Version>> PolicyFile::read(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return makeError(ErrorCode::kInvalidArgument, "cannot open " + path + ": " + strerror(errno));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return makeError(ErrorCode::kInternal, "cannot stat " + path + ": " + strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return makeError(ErrorCode::kInvalidArgument, path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxPolicyFileBytes) {
    return makeError(ErrorCode::kInvalidArgument,
                     path + " is larger than " + std::to_string(kMaxPolicyFileBytes) + " bytes");
  }
  // The version is the opened file's, so a rename between stat and read cannot pair one
  // file's identity with another's content.
  Version version{st.st_dev, st.st_ino, mtimeNs(st), static_cast<int64_t>(st.st_size)};
  std::string text;
  char chunk[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return makeError(ErrorCode::kInternal, "cannot read " + path + ": " + strerror(errno));
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
    if (text.size() > kMaxPolicyFileBytes) {
      return makeError(ErrorCode::kInvalidArgument, path + " grew past " + std::to_string(kMaxPolicyFileBytes));
    }
  }
  nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded()) return makeError(ErrorCode::kInvalidArgument, path + " is not valid JSON");
  auto policy = net::parsePolicy(json);
  if (!policy.ok()) return makeError(ErrorCode::kInvalidArgument, path + ": " + policy.error().message);
  return std::make_pair(std::move(policy.value()), version);
}

Result<PolicyFile> PolicyFile::load(const std::string& path) {
  auto loaded = read(path);
  if (!loaded.ok()) return loaded.error();
  PolicyFile file;
  file.path_ = path;
  file.policy_ = std::make_shared<const net::Policy>(std::move(loaded->first));
  file.loaded_ = loaded->second;
  return file;
}

PolicyFile::Refresh PolicyFile::refresh() {
  Refresh out;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    // Between spaced's rename and nothing: keep enforcing what we have.
    Version gone{};
    if (failed_ != gone) {
      failed_ = gone;
      out.failure = "cannot stat " + path_ + ": " + strerror(errno);
    }
    return out;
  }
  Version now{st.st_dev, st.st_ino, mtimeNs(st), static_cast<int64_t>(st.st_size)};
  if (now == loaded_) {
    // The loaded version is back: a later failure, even of a version seen before, is news.
    failed_.reset();
    return out;
  }
  if (failed_ && now == *failed_) return out;
  auto loaded = read(path_);
  if (!loaded.ok()) {
    failed_ = now;
    out.failure = loaded.error().message;
    return out;
  }
  policy_ = std::make_shared<const net::Policy>(std::move(loaded->first));
  loaded_ = loaded->second;
  failed_.reset();
  out.reloaded = true;
  return out;
}

}  // namespace space::gateway
