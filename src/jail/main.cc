// space-jail: confines one program (a VM's QEMU) and becomes it.
//
//   space-jail [--cgroup-procs FILE]... [--nofile N] -- PROGRAM [ARG]...
//
// In order: joins each cgroup (writes its own pid to each FILE, a group's cgroup.procs), so
// that everything the program allocates from its first instruction counts against its group;
// sets its resource limits (no core dumps: a QEMU's core holds its guest's memory, a tenant's
// data; at most N descriptors); sets no_new_privs, so nothing it executes can gain privileges;
// then executes PROGRAM in its own place (same pid: the caller's handle, pidfd and recorded
// identity stay valid). Any failure exits 125 before PROGRAM runs, with the reason on stderr.
//
// A separate program rather than code between fork and exec in spaced: spaced starts children
// with posix_spawn (a multithreaded process must not run arbitrary code after fork), and the
// jail will grow (a uid of its own, namespaces) in one small place that is easy to audit.
// Arguments are read by hand: everything after "--" is PROGRAM's, untouched.
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kFailed = 125;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "space-jail: %s\n", what.c_str());
  std::exit(kFailed);
}

void usage() {
  std::fprintf(stderr,
               "usage: space-jail [--cgroup-procs FILE]... [--nofile N] -- PROGRAM [ARG]...\n"
               "Joins the cgroups, limits resources (no core dumps, N descriptors), sets no_new_privs,\n"
               "then executes PROGRAM as the same process. Exits 125 if any step fails.\n");
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> cgroups;
  rlim_t nofile = 0;
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
    if (i + 1 >= argc) {
      usage();
      die("missing value for " + arg);
    }
    const std::string value = argv[++i];
    if (arg == "--cgroup-procs") {
      cgroups.push_back(value);
    } else if (arg == "--nofile") {
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(value.c_str(), &end, 10);
      if (errno != 0 || end == value.c_str() || *end != '\0' || n < 64 || n > (1u << 20)) {
        die("--nofile wants 64..1048576, not " + value);
      }
      nofile = static_cast<rlim_t>(n);
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
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(std::string("no_new_privs: ") + std::strerror(errno));
  execvp(argv[i], argv + i);
  die(std::string("cannot execute ") + argv[i] + ": " + std::strerror(errno));
}
