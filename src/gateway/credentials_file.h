// The values of the sandbox's credential secrets, as spaced keeps them for this gateway in a
// file on tmpfs ({"secrets": {"NAME": "value"}, "tls": {...}}, mode 0400, the gateway's own uid). Re-read when
// it changes (a rotation): the next request uses the new value. A missing file is no secrets.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::gateway {

inline constexpr size_t kMaxCredentialsFileBytes = 8 << 20;

class CredentialsFile {
 public:
  explicit CredentialsFile(std::string path) : path_(std::move(path)) {}
  ~CredentialsFile();
  CredentialsFile(CredentialsFile&&) = default;
  CredentialsFile& operator=(CredentialsFile&&) = default;

  // Reloads the file if it changed. On failure the previous values stay and the error is
  // returned (once per version of the file).
  std::optional<std::string> refresh();
  // The value of secret `name`, or null. Valid until the next refresh().
  const std::string* secret(std::string_view name) const;
  // The sandbox's credential CA ({"tls": {"ca_cert": PEM, "ca_key": PEM}}), empty when the
  // file has none; `generation` changes whenever the file is loaded again.
  const std::string& caCertPem() const { return ca_cert_pem_; }
  const std::string& caKeyPem() const { return ca_key_pem_; }
  uint64_t generation() const { return generation_; }
  // What the guest sees in place of a secret -> the secret's name ({"placeholders": {...}}).
  const std::map<std::string, std::string, std::less<>>& placeholders() const { return placeholders_; }

 private:
  void clear();
  std::string path_;
  std::map<std::string, std::string, std::less<>> secrets_;
  std::string ca_cert_pem_, ca_key_pem_;
  std::map<std::string, std::string, std::less<>> placeholders_;
  uint64_t generation_ = 0;
  struct Version {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t mtime_ns = 0;
    int64_t size = 0;
    bool operator==(const Version&) const = default;
  };
  std::optional<Version> loaded_;  // nullopt: nothing loaded (no file)
  std::optional<Version> failed_;
  int stat_errno_ = 0;  // the last stat failure reported (0: none)
};

}  // namespace space::gateway
