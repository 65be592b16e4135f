// Filesystem confinement of a process by itself, with Landlock (Linux 5.13 and later): once an
// FsConfinement is applied, the process opens nothing outside the directories it names,
// whatever its uid may open. The network gateway uses it: its uid may create files in every world-writable
// directory of the host (/tmp, /dev/shm), and read every world-readable file, which a
// compromised gateway would use to fill the host's disks and memory or to learn about it.
// Descriptors opened before stay usable. Landlock is the kernel's own interface for this and
// has no Debian-packaged library (liblandlock is not in bookworm): three system calls, here.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::jail {

struct FsRule {
  std::string dir;     // a directory: what lies beneath it (or the one file, below)
  bool write = false;  // read only; or also create, write, truncate, rename and remove regular files
  // `dir` names one regular file, which may then be read and nothing else (a certificate that
  // a trust store's directory links to elsewhere: its own directory would open more). Not
  // with `write`. A path that is not a regular file (gone, a link, a directory) when the
  // ruleset is made is left out rather than an error. The rule holds the file itself: one
  // renamed over it later is not reachable until the process confines itself again.
  bool file = false;
};

// A ruleset made (its directories opened) while the process may still reach them, e.g. as
// root before it drops privileges, and applied later.
class FsConfinement {
 public:
  // Only directories (and what lies beneath them) that a rule names can be opened once it is
  // applied, and only for what the rule allows: no program can be executed and no device,
  // FIFO, socket file, symbolic link or directory made anywhere (a hard link, as a regular
  // file, within a writable directory only). abi() is 0 if the kernel has no
  // Landlock (then apply() confines nothing: the caller decides whether that is acceptable).
  // An error if a rule's directory cannot be opened or the kernel refuses the ruleset.
  static Result<FsConfinement> prepare(const std::vector<FsRule>& rules);
  // Applies to the calling thread and what it starts later: call it while the process has one
  // thread. Needs no_new_privs (or CAP_SYS_ADMIN).
  Status apply();
  int abi() const { return abi_; }

 private:
  int abi_ = 0;
  UniqueFd ruleset_;
};

}  // namespace space::jail
