// The policy file the gateway enforces, re-read when it changes. spaced replaces it by
// write-temp + rename, so the gateway stats it before each decision: a new (inode, mtime,
// size) means a new policy, and the next DNS question or connection obeys it, no signal needed.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "common/result.h"
#include "net/policy.h"

namespace space::gateway {

// A policy file larger than this is refused: 256 rules of 300 characters fit many times over.
inline constexpr size_t kMaxPolicyFileBytes = 1 << 20;

class PolicyFile {
 public:
  // Reads and validates the file; an error names the file and what is wrong with it.
  static Result<PolicyFile> load(const std::string& path);

  // Reloads the file if it changed since the last look. A file that fails to load leaves the
  // previous policy in force; the failure is returned once per version of the file (so the
  // caller audits it once, not at every connection).
  struct Refresh {
    bool reloaded = false;
    std::optional<std::string> failure;
  };
  Refresh refresh();

  // Shared, so a decision that spans an upstream round trip keeps the policy it began with.
  std::shared_ptr<const net::Policy> current() const { return policy_; }

 private:
  struct Version {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t mtime_ns = 0;
    int64_t size = 0;
    bool operator==(const Version&) const = default;
  };
  static Result<std::pair<net::Policy, Version>> read(const std::string& path);

  std::string path_;
  std::shared_ptr<const net::Policy> policy_;
  Version loaded_;
  std::optional<Version> failed_;  // the version whose failure was already reported
};

}  // namespace space::gateway
