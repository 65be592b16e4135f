// space-jail: confines one program (a VM's QEMU) and becomes it.
//
//   space-jail [--cgroup-procs FILE]... [--nofile N] [--file-size BYTES] [--no-new-files]
//              [--view [--ro PATH]... [--rw PATH]... [--exec FILE]... [--dev PATH]... [--new-network]]
//              [--no-caps] [--user UID:GID [--group GID]...] -- PROGRAM [ARG]...
//
// In order: joins each cgroup (writes its own pid to each FILE, a group's cgroup.procs), so that
// everything the program allocates from its first instruction counts against its group; sets its
// resource limits (no core dumps: a QEMU's core holds its guest's memory, a tenant's data; at most
// N descriptors; no file written past BYTES, with SIGXFSZ ignored so that such a write fails with
// EFBIG instead of killing the program, and, by its seccomp filter, no unnamed file and no blocks
// reserved past a file's size, which the limit would not see); with --view, replaces its whole
// filesystem with a private one (below); with --no-caps, gives up every capability for good; with
// --user, becomes that uid and gid (real, effective, saved, filesystem), with the --group gids as
// its only supplementary groups (a VM's own uid: docs/threat-model.md); sets no_new_privs, so
// nothing it executes can gain privileges; with --no-new-files, makes it unable to make, remove,
// rename or link any file anywhere (Landlock, Linux 5.13+; without it, it starts nothing), so that
// with --file-size what it can put on disk is bounded by the files it was given (a VM's run
// directory holds no disk quota: docs/threat-model.md); installs a seccomp filter that refuses what
// no QEMU needs and a compromised one could turn against the host or other VMs (denyWhatNoVmNeeds,
// below); then executes PROGRAM in its own place (same pid: the caller's handle, pidfd and recorded
// identity stay valid). Any failure exits 125 before PROGRAM runs, with the reason on stderr.
//
// The view: a mount namespace of its own whose root is an empty, read-only tmpfs holding only
// the system's programs and libraries (/usr and the merged-/usr links, read-only), the device
// nodes named by --dev (on read-only mounts), a /proc of its own PID namespace holding only
// processes (subset=pid: no /proc/sys, whose files uid 0 may write without any capability), and
// each --ro/--rw PATH bound at the same path (so the program's arguments name its files
// unchanged), and each --exec FILE as a --ro one whose program may run (PROGRAM itself when it
// lies outside /usr: every other mount of the view is noexec). Only a --ro PATH or --exec FILE
// may be a symbolic link, and an --exec one must be a regular file. IPC and hostname
// namespaces of its own; with --new-network, an empty network namespace too (for a VM without
// a network slot). Nothing else of the host exists there: not the state database, not other
// sandboxes' files, not host processes. --view requires being pid 1 of a new PID namespace
// (the caller spawns it so), so that /proc shows the program alone.
//
// A separate program rather than code between fork and exec in spaced: spaced is
// multithreaded (only async-signal-safe calls after fork), and the jail is one small place that
// is easy to audit. Arguments are read by hand: everything after "--" is PROGRAM's, untouched.
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/landlock.h>
#include <linux/securebits.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "jail/seccomp_policy.h"

namespace {

constexpr int kFailed = 125;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "space-jail: %s\n", what.c_str());
  std::exit(kFailed);
}

void usage() {
  std::fprintf(stderr,
               "usage: space-jail [--cgroup-procs FILE]... [--nofile N] [--file-size BYTES] [--no-new-files]\n"
               "                  [--view [--ro PATH]... [--rw PATH]... [--exec FILE]... [--dev PATH]...\n"
               "                   [--new-network]]\n"
               "                  [--no-caps] [--user UID:GID [--group GID]...] -- PROGRAM [ARG]...\n"
               "Joins the cgroups, limits resources (no core dumps, N descriptors, no file written past\n"
               "BYTES), with --view sees only the system's programs, the devices and the PATHs given\n"
               "(read-only or read-write, at the same paths; an --exec FILE read-only and, unlike the others,\n"
               "executable) and a /proc of its own PID namespace (it must be pid 1 of one), with\n"
               "--new-network an empty network namespace,\n"
               "with --no-caps drops every capability, with --user becomes UID:GID\n"
               "(supplementary groups: the --group GIDs only), sets no_new_privs, with --no-new-files makes,\n"
               "removes, renames and links no file anywhere (Landlock), refuses keyring, namespace,\n"
               "mount and lease calls (seccomp), then executes PROGRAM as the same process.\n"
               "Exits 125 if any step fails.\n");
}

void joinCgroup(const std::string& procs_file) {
  FILE* f = std::fopen(procs_file.c_str(), "we");
  if (f == nullptr) die("cannot open " + procs_file + ": " + std::strerror(errno));
  const bool written = std::fprintf(f, "%d\n", static_cast<int>(getpid())) > 0;
  const bool closed = std::fclose(f) == 0;  // the kernel answers the write at flush
  if (!written || !closed) die("cannot join the cgroup " + procs_file + ": " + std::strerror(errno));
}

void limit(int resource, rlim_t value, const char* name) {
  rlimit r{value, value};
  if (setrlimit(resource, &r) != 0) die(std::string("setrlimit ") + name + ": " + std::strerror(errno));
}

enum class Access { kReadOnly, kReadWrite, kExecutable, kDevice };

struct Bind {
  std::string path;
  Access access;
};

// Absolute, no "." or ".." component, no empty one: named at the same path in the view.
bool plainAbsolutePath(const std::string& path) {
  if (path.size() < 2 || path[0] != '/' || path.back() == '/') return false;
  for (size_t at = 1; at <= path.size();) {
    const size_t end = std::min(path.find('/', at), path.size());
    const std::string part = path.substr(at, end - at);
    if (part.empty() || part == "." || part == "..") return false;
    at = end + 1;
  }
  return true;
}

// 1..2^31-1 in plain decimal digits (no sign, space or wrap-around), else -1.
long positiveId(const std::string& text) {
  if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  const long long n = std::stoll(text);
  return n >= 1 && n <= 0x7fffffffLL ? static_cast<long>(n) : -1;
}

// A number in lo..hi in plain decimal digits (no sign, space or wrap-around), else nothing.
std::optional<unsigned long long> numberIn(const std::string& text, unsigned long long lo, unsigned long long hi) {
  if (text.empty() || text.size() > 19 || text.find_first_not_of("0123456789") != std::string::npos) return {};
  const unsigned long long n = std::stoull(text);
  if (n < lo || n > hi) return {};
  return n;
}

bool isUnder(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

// A detached copy of what is mounted at `path` (its submounts too), with `attributes` set on
// all of it; taken before anything is hidden, so a path under the staging directory works too.
struct Source {
  std::string path;
  bool directory = false;
  std::string link;  // a symbolic link (the merged-/usr ones) is made again, not bound
  int fd = -1;
};

Source takeSource(const std::string& path, uint64_t attributes) {
  Source source{path};
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) die("cannot look at " + path + ": " + std::strerror(errno));
  if (S_ISLNK(st.st_mode)) {
    char target[4096];
    const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
    if (n <= 0) die("cannot read the link " + path + ": " + std::strerror(errno));
    source.link.assign(target, static_cast<size_t>(n));
    return source;
  }
  source.directory = S_ISDIR(st.st_mode);
  const unsigned recursive = source.directory ? AT_RECURSIVE : 0;
  source.fd =
      ::open_tree(AT_FDCWD, path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW | recursive);
  if (source.fd < 0) die("cannot take " + path + ": " + std::strerror(errno));
  mount_attr attr{};
  attr.attr_set = attributes;
  if (::mount_setattr(source.fd, "", AT_EMPTY_PATH | recursive, &attr, sizeof attr) != 0) {
    die("cannot restrict " + path + ": " + std::strerror(errno));
  }
  return source;
}

// Creates `path`'s missing parent directories (the view's own, on its tmpfs). Never through a
// link placed earlier (its target would be resolved on the host: this runs before the pivot).
void makeParents(const std::string& path) {
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) {
    const std::string dir = path.substr(0, at);
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) die("cannot place a path under " + dir + ": not a directory of the view");
      continue;
    }
    if (::mkdir(dir.c_str(), 0755) != 0) die("cannot make " + dir + ": " + std::strerror(errno));
  }
}

void place(const Source& source, const std::string& root) {
  const std::string target = root + source.path;
  makeParents(target);
  if (!source.link.empty()) {
    if (::symlink(source.link.c_str(), target.c_str()) != 0) die("cannot link " + target + ": " + std::strerror(errno));
    return;
  }
  if (source.directory) {
    if (::mkdir(target.c_str(), 0755) != 0 && errno != EEXIST)
      die("cannot make " + target + ": " + std::strerror(errno));
  } else {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) die("cannot make " + target + ": " + std::strerror(errno));
    ::close(fd);
  }
  if (::move_mount(source.fd, "", AT_FDCWD, target.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    die("cannot bind " + source.path + ": " + std::strerror(errno));
  }
  ::close(source.fd);
}

// See the header comment: the private filesystem the program sees from now on.
void enterView(std::vector<Bind> binds, bool new_network) {
  if (getpid() != 1) die("--view needs a PID namespace of its own (start space-jail as its pid 1)");
  // IPC and hostname namespaces of its own too: the host's System V objects are uid 0's.
  const int namespaces = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | (new_network ? CLONE_NEWNET : 0);
  if (::unshare(namespaces) != 0) die(std::string("unshare: ") + std::strerror(errno));
  // Nothing done here may reach the host's mount table.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    die(std::string("cannot make the mounts private: ") + std::strerror(errno));
  }
  constexpr uint64_t kData = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
  std::vector<Source> sources;
  sources.push_back(takeSource("/usr", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}) {
    struct stat st {};
    if (::lstat(top, &st) == 0)
      sources.push_back(takeSource(top, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
  }
  if (::access("/etc/ld.so.cache", F_OK) == 0)
    sources.push_back(takeSource("/etc/ld.so.cache", MOUNT_ATTR_RDONLY | kData));
  // A read-only path that is a symbolic link (an image in a cache elsewhere) is made as a link,
  // and what it resolves to is bound read-only too. A writable or device path must not be a
  // link: whoever could plant one would choose what becomes writable here.
  for (size_t i = 0, n = binds.size(); i < n; ++i) {
    struct stat st {};
    if (::lstat(binds[i].path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) continue;
    if (binds[i].access != Access::kReadOnly && binds[i].access != Access::kExecutable) {
      die(binds[i].path + " is a symbolic link; refused");
    }
    char* resolved = ::realpath(binds[i].path.c_str(), nullptr);
    if (resolved == nullptr) die("cannot resolve " + binds[i].path + ": " + std::strerror(errno));
    binds.push_back({resolved, binds[i].access});
    std::free(resolved);
  }
  // Shortest first, so that a path inside a directory already bound is seen to be covered:
  // it then has that directory's access (its own bind would land inside the directory).
  // Stable, so that what follows never depends on the sort's whims.
  std::stable_sort(binds.begin(), binds.end(),
                   [](const Bind& a, const Bind& b) { return a.path.size() < b.path.size(); });
  std::vector<std::string> covered = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
  std::vector<const Bind*> placed;
  for (const auto& bind : binds) {
    auto same = std::find_if(placed.begin(), placed.end(), [&](const Bind* p) { return p->path == bind.path; });
    if (same != placed.end()) {
      // Named twice (perhaps once as what a link resolves to): one access, or no view at all.
      if ((*same)->access != bind.access) die(bind.path + " is named with two different accesses; refused");
      continue;
    }
    placed.push_back(&bind);
    bool inside = false;
    for (const auto& dir : covered) inside = inside || bind.path == dir || isUnder(bind.path, dir);
    if (inside) continue;
    uint64_t attributes = kData;
    if (bind.access == Access::kReadOnly) attributes |= MOUNT_ATTR_RDONLY;
    if (bind.access == Access::kExecutable) attributes = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    // Read-only mounts of the device nodes: reading and writing a device still work, but its
    // mode and times (the host's node) cannot be changed.
    if (bind.access == Access::kDevice) attributes = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    sources.push_back(takeSource(bind.path, attributes));
    if (bind.access == Access::kExecutable && sources.back().link.empty()) {
      // One program, never a directory of them: nothing else placed in the view may run. Judged
      // on the mount taken, so a path swapped after a look cannot change what is bound.
      struct stat st {};
      if (::fstat(sources.back().fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        die("--exec " + bind.path + " is not a regular file; refused");
      }
    }
    if (sources.back().directory) covered.push_back(bind.path);
  }
  // Everything is taken: the staging directory can be covered now.
  const std::string root = "/tmp";
  if (::mount("space-jail", root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m") != 0) {
    die(std::string("cannot mount the view's root: ") + std::strerror(errno));
  }
  for (const auto& source : sources) place(source, root);
  // Processes only (subset=pid): /proc/sys and the other kernel files are not there, since
  // writing them needs uid 0, not a capability (core_pattern would run a program as root).
  if (::mkdir((root + "/proc").c_str(), 0555) != 0 ||
      ::mount("proc", (root + "/proc").c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "subset=pid,hidepid=invisible") != 0) {
    die(std::string("cannot mount /proc: ") + std::strerror(errno));
  }
  if (::mount(nullptr, root.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              nullptr) != 0) {
    die(std::string("cannot make the view's root read-only: ") + std::strerror(errno));
  }
  if (::chdir(root.c_str()) != 0 || ::syscall(SYS_pivot_root, ".", ".") != 0 || ::umount2(".", MNT_DETACH) != 0 ||
      ::chdir("/") != 0) {
    die(std::string("cannot enter the view: ") + std::strerror(errno));
  }
}

struct Identity {
  bool set = false;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
};

// Becomes `who` for good: every uid and gid (real, effective, saved; filesystem ones follow),
// and no supplementary group but those named. Checked afterwards, since a half-done switch
// (groups changed, uid not) must never run PROGRAM.
void switchIdentity(const Identity& who) {
  if (::setgroups(who.groups.size(), who.groups.data()) != 0) die(std::string("setgroups: ") + std::strerror(errno));
  if (::setresgid(who.gid, who.gid, who.gid) != 0) die(std::string("setresgid: ") + std::strerror(errno));
  if (::setresuid(who.uid, who.uid, who.uid) != 0) die(std::string("setresuid: ") + std::strerror(errno));
  uid_t r = 0, e = 0, s = 0;
  gid_t gr = 0, ge = 0, gs = 0;
  if (::getresuid(&r, &e, &s) != 0 || r != who.uid || e != who.uid || s != who.uid || ::getresgid(&gr, &ge, &gs) != 0 ||
      gr != who.gid || ge != who.gid || gs != who.gid) {
    die("the uid and gid did not change as asked");
  }
}

// Gives up every capability for good: none held, none that an exec could grant (the bounding
// set is empty, and uid 0 no longer means privileged: SECBIT_NOROOT), none ambient, and the
// bits locked. By hand: libcap would add a library for four system calls. The identity changes
// in between: the bits and the bounding set need CAP_SETPCAP, the change CAP_SETUID/SETGID
// (kept through it: SECBIT_NO_SETUID_FIXUP), and the last step clears what is left.
void dropCapabilities(const Identity& who) {
  const unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                             SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
                             SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
  if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) die(std::string("securebits: ") + std::strerror(errno));
  for (int cap = 0; cap <= 63; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      die("cannot drop capability " + std::to_string(cap) + ": " + std::strerror(errno));
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0) {
    die(std::string("cannot clear ambient capabilities: ") + std::strerror(errno));
  }
  if (who.set) switchIdentity(who);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capset, &header, data) != 0) die(std::string("capset: ") + std::strerror(errno));
}

// Makes the process (and what it executes) unable to make a file of any kind (regular, directory,
// socket, FIFO, device, symbolic link), remove one, rename one or link one, anywhere: a ruleset
// that handles only those rights and grants none. Reading, writing and executing are left to
// the view and the uid. By hand, as in jail/landlock.cc: three system calls, and this program
// links statically against nothing but libseccomp. Needs no_new_privs.
void forbidMakingFiles() {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 0 && (errno == ENOSYS || errno == EOPNOTSUPP)) {
    die("--no-new-files needs Landlock, which this kernel lacks (Linux 5.13+, enabled at boot)");
  }
  if (abi < 0) die(std::string("landlock_create_ruleset (version): ") + std::strerror(errno));
  landlock_ruleset_attr attr{};
  attr.handled_access_fs = LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
                           LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                           LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
                           LANDLOCK_ACCESS_FS_MAKE_SYM;
  // ABI 1 refuses every link and rename across directories by itself; from ABI 2 that is the
  // REFER right, which must then be handled to stay refused.
  if (abi >= 2) attr.handled_access_fs |= LANDLOCK_ACCESS_FS_REFER;
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  if (ruleset < 0) die(std::string("landlock_create_ruleset: ") + std::strerror(errno));
  if (syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    die(std::string("landlock_restrict_self: ") + std::strerror(errno));
  }
  ::close(ruleset);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> cgroups;
  rlim_t nofile = 0;
  rlim_t file_size = 0;
  bool no_new_files = false;
  bool view = false;
  bool no_caps = false;
  bool new_network = false;
  std::vector<Bind> binds;
  Identity who;
  std::vector<gid_t> groups;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "--help" || arg == "-h") {
      usage();
      return 0;
    }
    if (arg == "--view" || arg == "--no-caps" || arg == "--new-network" || arg == "--no-new-files") {
      (arg == "--view"          ? view
       : arg == "--no-caps"     ? no_caps
       : arg == "--new-network" ? new_network
                                : no_new_files) = true;
      continue;
    }
    if (i + 1 >= argc) {
      usage();
      die("missing value for " + arg);
    }
    const std::string value = argv[++i];
    if (arg == "--cgroup-procs") {
      cgroups.push_back(value);
    } else if (arg == "--nofile") {
      const auto n = numberIn(value, 64, 1u << 20);
      if (!n) die("--nofile wants 64..1048576, not " + value);
      nofile = static_cast<rlim_t>(*n);
    } else if (arg == "--file-size") {
      const auto n = numberIn(value, 1u << 20, 1ULL << 50);
      if (!n) die("--file-size wants 1048576..2^50 bytes, not " + value);
      file_size = static_cast<rlim_t>(*n);
    } else if (arg == "--user") {
      const size_t colon = value.find(':');
      const long uid = colon == std::string::npos ? -1 : positiveId(value.substr(0, colon));
      const long gid = colon == std::string::npos ? -1 : positiveId(value.substr(colon + 1));
      if (uid < 0 || gid < 0) die("--user wants UID:GID, both 1..2147483647, not " + value);
      who.set = true;
      who.uid = static_cast<uid_t>(uid);
      who.gid = static_cast<gid_t>(gid);
    } else if (arg == "--group") {
      const long gid = positiveId(value);  // never 0: root's group is not a VM's
      if (gid < 0) die("--group wants a gid 1..2147483647, not " + value);
      groups.push_back(static_cast<gid_t>(gid));
    } else if (arg == "--ro" || arg == "--rw" || arg == "--exec" || arg == "--dev") {
      if (!plainAbsolutePath(value)) die(arg + " wants an absolute path without . or .. parts, not " + value);
      binds.push_back({value, arg == "--ro"     ? Access::kReadOnly
                              : arg == "--rw"   ? Access::kReadWrite
                              : arg == "--exec" ? Access::kExecutable
                                                : Access::kDevice});
    } else {
      usage();
      die("unknown option " + arg);
    }
  }
  if (i >= argc) {
    usage();
    die("no program to run");
  }
  for (const auto& c : cgroups) joinCgroup(c);
  limit(RLIMIT_CORE, 0, "RLIMIT_CORE");
  if (nofile != 0) limit(RLIMIT_NOFILE, nofile, "RLIMIT_NOFILE");
  if (file_size != 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // kept across exec: a write past the bound fails (EFBIG)
    limit(RLIMIT_FSIZE, file_size, "RLIMIT_FSIZE");
  }
  if (!binds.empty() && !view) die("--ro, --rw and --dev need --view");
  if (new_network && !view) die("--new-network needs --view");
  if (!groups.empty() && !who.set) die("--group needs --user");
  who.groups = groups;
  if (view) enterView(binds, new_network);
  if (no_caps) {
    dropCapabilities(who);
  } else if (who.set) {
    switchIdentity(who);  // leaving uid 0 clears every capability anyway
  }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(std::string("no_new_privs: ") + std::strerror(errno));
  if (no_new_files) forbidMakingFiles();
  // A filter of the jail's own, under the one QEMU installs itself (-sandbox), which QEMU sets
  // up late and a compromised QEMU's own code paths shape.
  space::jail::SeccompExtras extras;
  extras.no_growth_past_file_size = file_size != 0;
  if (int rc = space::jail::denyWhatNoConfinedProcessNeeds(extras); rc != 0) {
    die(std::string("cannot install the seccomp filter: ") + std::strerror(-rc));
  }
  execvp(argv[i], argv + i);
  die(std::string("cannot execute ") + argv[i] + ": " + std::strerror(errno));
}
