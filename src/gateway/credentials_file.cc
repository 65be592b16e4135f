#include "gateway/credentials_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/unix_socket.h"

namespace space::gateway {

CredentialsFile::~CredentialsFile() { clear(); }

void CredentialsFile::clear() {
  for (auto& [name, value] : secrets_) explicit_bzero(value.data(), value.size());
  secrets_.clear();
  explicit_bzero(ca_key_pem_.data(), ca_key_pem_.size());
  ca_key_pem_.clear();
  ca_cert_pem_.clear();
  placeholders_.clear();
  ++generation_;
}

const std::string* CredentialsFile::secret(std::string_view name) const {
  auto it = secrets_.find(name);
  return it == secrets_.end() ? nullptr : &it->second;
}

std::optional<std::string> CredentialsFile::refresh() {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    // No file: spaced has given this sandbox no secrets (or took them away).
    if (errno == ENOENT) {
      clear();
      loaded_.reset();
      stat_errno_ = 0;
      return std::nullopt;
    }
    // Said once, not at every request, until the file can be seen again.
    if (stat_errno_ == errno) return std::nullopt;
    stat_errno_ = errno;
    return "cannot stat " + path_ + ": " + strerror(errno);
  }
  stat_errno_ = 0;
  Version now{st.st_dev, st.st_ino, st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec,
              static_cast<int64_t>(st.st_size)};
  if (loaded_ && now == *loaded_) return std::nullopt;
  if (failed_ && now == *failed_) return std::nullopt;
  auto failure = [&](const std::string& why) -> std::optional<std::string> {
    failed_ = now;
    return path_ + ": " + why;
  };
  UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return failure(std::string("cannot open: ") + strerror(errno));
  struct stat opened {};
  if (::fstat(fd.get(), &opened) != 0 || !S_ISREG(opened.st_mode)) return failure("not a regular file");
  if (static_cast<uint64_t>(opened.st_size) > kMaxCredentialsFileBytes) return failure("too large");
  // The version is the opened file's: a rename between stat and open reads as a new version next time.
  now = Version{opened.st_dev, opened.st_ino, opened.st_mtim.tv_sec * 1000000000 + opened.st_mtim.tv_nsec,
                static_cast<int64_t>(opened.st_size)};
  std::string text(static_cast<size_t>(opened.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  explicit_bzero(text.data(), text.size());
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("secrets") || !parsed["secrets"].is_object()) {
    return failure("not a credentials file");
  }
  clear();
  if (auto tls = parsed.find("tls"); tls != parsed.end() && tls->is_object()) {
    auto cert = tls->find("ca_cert");
    auto key = tls->find("ca_key");
    if (cert != tls->end() && key != tls->end() && cert->is_string() && key->is_string()) {
      ca_cert_pem_ = cert->get<std::string>();
      ca_key_pem_ = key->get<std::string>();
      explicit_bzero(key->get_ref<std::string&>().data(), key->get_ref<std::string&>().size());
    }
  }
  if (auto placeholders = parsed.find("placeholders"); placeholders != parsed.end() && placeholders->is_object()) {
    for (const auto& [seen, name] : placeholders->items()) {
      // Only spaced's own form: a placeholder is never an empty or short string that would
      // match ordinary header text.
      if (name.is_string() && seen.rfind("space-secret-", 0) == 0 && seen.size() <= 128) {
        placeholders_.emplace(seen, name.get<std::string>());
      }
    }
  }
  for (auto& [name, value] : parsed["secrets"].items()) {
    if (value.is_string()) secrets_.emplace(name, value.get<std::string>());
    if (value.is_string()) explicit_bzero(value.get_ref<std::string&>().data(), value.get_ref<std::string&>().size());
  }
  loaded_ = now;
  failed_.reset();
  return std::nullopt;
}

}  // namespace space::gateway
