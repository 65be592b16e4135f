#include "jail/landlock.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace space::jail {
namespace {

// Rights of later ABIs than Debian 12's kernel headers know (values from the kernel's uapi).
constexpr uint64_t kTruncate = 1ULL << 14;  // ABI 3
constexpr uint64_t kIoctlDev = 1ULL << 15;  // ABI 5

// Every filesystem right the running kernel knows: what it handles is refused unless a rule
// allows it; what it does not handle would stay allowed.
uint64_t handledBy(int abi) {
  uint64_t handled = (1ULL << 13) - 1;  // ABI 1: EXECUTE .. MAKE_SYM
  if (abi >= 2) handled |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) handled |= kTruncate;
  if (abi >= 5) handled |= kIoctlDev;
  return handled;
}

std::string errnoText(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

Result<FsConfinement> FsConfinement::prepare(const std::vector<FsRule>& rules) {
  FsConfinement confinement;
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 0) {
    if (errno == ENOSYS || errno == EOPNOTSUPP) return confinement;  // not built in, or not enabled at boot
    return makeError(ErrorCode::kInternal, errnoText("landlock_create_ruleset (version)"));
  }
  const uint64_t handled = handledBy(static_cast<int>(abi));
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = handled;
  UniqueFd ruleset(static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0)));
  if (!ruleset.valid()) return makeError(ErrorCode::kInternal, errnoText("landlock_create_ruleset"));
  const uint64_t read = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  // Renames stay within one directory (an audit log's rotation): REFER, which links across
  // directories, is not given.
  const uint64_t write = read | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_MAKE_REG |
                         LANDLOCK_ACCESS_FS_REMOVE_FILE | (kTruncate & handled);
  for (const FsRule& rule : rules) {
    if (rule.file && rule.write) {
      return makeError(ErrorCode::kInvalidArgument, "a rule for one file allows reading only: " + rule.dir);
    }
    // A file's rule is opened without following a last link, as the caller named the file
    // itself (canonical), and only a regular file gets it: the kernel would take a directory
    // too. One that is gone or became something else since it was named (a trust store being
    // refreshed) is left out, closed like every path no rule names.
    UniqueFd dir(::open(rule.dir.c_str(), O_PATH | O_CLOEXEC | (rule.file ? O_NOFOLLOW : O_DIRECTORY)));
    struct stat st {};
    if (rule.file && (!dir.valid() || ::fstat(dir.get(), &st) != 0 || !S_ISREG(st.st_mode))) continue;
    if (!dir.valid()) return makeError(ErrorCode::kInvalidArgument, errnoText("cannot confine to " + rule.dir));
    landlock_path_beneath_attr beneath{};
    beneath.allowed_access = rule.file ? LANDLOCK_ACCESS_FS_READ_FILE : rule.write ? write : read;
    beneath.parent_fd = dir.get();
    if (syscall(SYS_landlock_add_rule, ruleset.get(), LANDLOCK_RULE_PATH_BENEATH, &beneath, 0) != 0) {
      return makeError(ErrorCode::kInternal, errnoText("landlock_add_rule " + rule.dir));
    }
  }
  confinement.abi_ = static_cast<int>(abi);
  confinement.ruleset_ = std::move(ruleset);
  return confinement;
}

Status FsConfinement::apply() {
  if (!ruleset_.valid()) return okStatus();
  if (syscall(SYS_landlock_restrict_self, ruleset_.get(), 0) != 0) {
    return makeError(ErrorCode::kInternal, errnoText("landlock_restrict_self"));
  }
  ruleset_.reset();
  return okStatus();
}

}  // namespace space::jail
