// Guest users and groups, read from /etc/passwd and /etc/group directly: the agent is a static
// binary, and glibc's NSS (getpwnam) cannot load its modules from one reliably.
#pragma once

#include <sys/types.h>

#include <string>
#include <variant>
#include <vector>

#include "agent/rpc.h"

namespace space::agent {

struct UserInfo {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
  std::vector<gid_t> groups;  // supplementary groups (from /etc/group), primary included
};

inline constexpr const char* kDefaultUser = "user";

class UserDb {
 public:
  // etc_dir: "/etc" in the guest; tests point it elsewhere.
  explicit UserDb(std::string etc_dir = "/etc") : etc_dir_(std::move(etc_dir)) {}
  // name "" means the default user. Unknown user: invalid_argument (as envd).
  std::variant<UserInfo, RpcError> lookup(const std::string& name) const;
  std::string userName(uid_t uid) const;   // numeric string if unknown
  std::string groupName(gid_t gid) const;  // numeric string if unknown

 private:
  std::string etc_dir_;
};

// Resolves a request path for a user: "" -> home, "~" and "~/x" expand, relative -> under home.
// Rejects NUL bytes and paths longer than PATH_MAX. The result is absolute and lexically normal
// (no "." or ".." segments); it may leave the home (the guest is the user's to roam).
std::variant<std::string, RpcError> resolvePath(const std::string& path, const UserInfo& user);

}  // namespace space::agent
