#include "gateway/confinement.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <utility>

#include "jail/seccomp_policy.h"

namespace space::gateway {

namespace {

std::string errnoText(const std::string& what) { return what + ": " + strerror(errno); }

// No way back to root: no supplementary groups, the user's uid/gid, an empty bounding set, no
// new privileges through exec. Checked after the fact, since a silent failure here would leave
// a root process reading guest bytes.
Status dropPrivileges(const std::string& user) {
  auto ids = resolveUser(user);
  if (!ids.ok()) return ids.error();
  const auto [uid, gid] = ids.value();
  for (int cap = 0; cap <= 63; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      return makeError(ErrorCode::kInternal, errnoText("PR_CAPBSET_DROP"));
  }
  if (setgroups(0, nullptr) != 0) return makeError(ErrorCode::kInternal, errnoText("setgroups"));
  if (setresgid(gid, gid, gid) != 0) return makeError(ErrorCode::kInternal, errnoText("setresgid"));
  if (setresuid(uid, uid, uid) != 0) return makeError(ErrorCode::kInternal, errnoText("setresuid"));
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return makeError(ErrorCode::kInternal, errnoText("PR_SET_NO_NEW_PRIVS"));
  if (setuid(0) == 0 || geteuid() != uid || getegid() != gid) {
    return makeError(ErrorCode::kInternal, "privileges were not dropped");
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return makeError(ErrorCode::kInternal, errnoText("capget"));
  if (data[0].effective || data[1].effective || data[0].permitted || data[1].permitted) {
    return makeError(ErrorCode::kInternal, "capabilities remain after dropping privileges");
  }
  return okStatus();
}

Status limit(int resource, rlim_t value, const char* name) {
  const rlimit both{value, value};
  if (setrlimit(resource, &both) != 0) return makeError(ErrorCode::kInternal, errnoText(name));
  return okStatus();
}

}  // namespace

Result<std::pair<uid_t, gid_t>> resolveUser(const std::string& user) {
  uid_t uid = 0;
  gid_t gid = 0;
  if (user.size() > 1 && user[0] == '#') {
    char* end = nullptr;
    errno = 0;
    unsigned long id = std::strtoul(user.c_str() + 1, &end, 10);
    if (errno != 0 || *end != '\0' || id == 0 || id >= 0xffffffffUL) {
      return makeError(ErrorCode::kInvalidArgument, "--user " + user + ": not a valid id");
    }
    uid = static_cast<uid_t>(id);
    gid = static_cast<gid_t>(id);
  } else {
    errno = 0;
    passwd* pw = getpwnam(user.c_str());
    if (!pw) return makeError(ErrorCode::kInvalidArgument, "no such user \"" + user + "\"");
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }
  if (uid == 0) return makeError(ErrorCode::kInvalidArgument, "--user must not be root");
  return std::pair{uid, gid};
}

uint64_t gatewayDescriptors(size_t max_connections) { return uint64_t{2} * max_connections + 256; }

uint64_t gatewayAddressSpace(size_t max_connections) {
  return (uint64_t{64} << 20) + static_cast<uint64_t>(max_connections) * (uint64_t{1} << 20);
}

Result<int> confine(const ConfinementPlan& plan) {
  auto files = jail::FsConfinement::prepare(plan.reachable);
  if (!files.ok()) return files.error();
  SPACE_TRY(dropPrivileges(plan.user));
  // The gateway is one thread and makes no process (the filter below refuses any), and it is in
  // no cgroup whose task or CPU limit would stop a compromised one that made threads: one that
  // made them without end would use up the host's pids, and each could spin a core. So its uid
  // (its own, one per slot) holds one task: a new thread fails (EAGAIN), and it uses one core.
  SPACE_TRY(limit(RLIMIT_NPROC, 1, "RLIMIT_NPROC"));
  // Nor is its memory in a cgroup: its address space is bounded instead. Memory outside the
  // address space (memfd, System V) is refused by the filter below.
  SPACE_TRY(limit(RLIMIT_AS, gatewayAddressSpace(plan.max_connections), "RLIMIT_AS"));
  // Nor its disk: it makes no file (its directory is read-only to it), and each file it writes
  // stops growing here.
  signal(SIGXFSZ, SIG_IGN);
  SPACE_TRY(limit(RLIMIT_FSIZE, plan.max_file_bytes, "RLIMIT_FSIZE"));
  // Nor the kernel memory its descriptors hold (socket buffers, pipes): as many as its
  // connections need, soft and hard, where spaced's hard limit would let it raise its own.
  rlimit descriptors{};
  if (getrlimit(RLIMIT_NOFILE, &descriptors) != 0) return makeError(ErrorCode::kInternal, errnoText("RLIMIT_NOFILE"));
  SPACE_TRY(limit(RLIMIT_NOFILE, std::min<rlim_t>(gatewayDescriptors(plan.max_connections), descriptors.rlim_max),
                  "RLIMIT_NOFILE"));
  // It holds its sandbox's credential values: no core dump, no ptrace by another process of its uid.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return makeError(ErrorCode::kInternal, errnoText("PR_SET_DUMPABLE"));
  // Landlock binds the calling thread (and those it starts) only: checked, not assumed, to be
  // the process's one thread.
  std::error_code ec;
  const auto tasks =
      std::distance(std::filesystem::directory_iterator("/proc/self/task", ec), std::filesystem::directory_iterator());
  if (ec || tasks != 1) {
    return makeError(ErrorCode::kInternal,
                     "cannot confine the gateway's files: it runs " + std::to_string(tasks) + " threads");
  }
  SPACE_TRY(files->apply());
  // A gateway reads guest bytes and never executes, debugs, forks, shares memory, listens or
  // binds, reserves disk, makes a socket other than IPv4, uses legacy AIO, mounts or makes
  // namespaces; a compromised one gets none of it.
  if (int rc = jail::denyWhatNoConfinedProcessNeeds({.no_exec = true,
                                                     .no_debug = true,
                                                     .no_fork = true,
                                                     .no_shared_memory = true,
                                                     .no_new_ports = true,
                                                     .no_disk_reservation = true,
                                                     .inet_sockets_only = true,
                                                     .no_async_io = true});
      rc != 0) {
    return makeError(ErrorCode::kInternal, std::string("cannot install the seccomp filter: ") + std::strerror(-rc));
  }
  return files->abi();
}

nlohmann::json probeConfinement(const ConfinementPlan& plan, int landlock_abi, int written) {
  nlohmann::json checks = nlohmann::json::object();
  bool confined = true;
  // `attempt` returns 0 if what it tried worked (and undid it), or -1 with errno set. Refused
  // means refused by the confinement: the error it gives (`by`), not any error, so that a
  // refusal for another reason (a limit standing in for the filter, a sysctl, a missing file)
  // does not pass for it.
  auto check = [&](const char* name, int by, const std::function<int()>& attempt) {
    errno = 0;
    const int rc = attempt();
    const int error = errno;
    const bool refused = rc != 0 && error == by;
    checks[name] = {{"refused", refused}, {"error", rc != 0 ? strerror(error) : ""}};
    confined = confined && refused;
  };
  // A file may be made (and is removed at once) where it should not be.
  auto makeFile = [](const std::string& path) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    ::close(fd);
    ::unlink(path.c_str());
    return 0;
  };
  auto readFile = [](const char* path) {
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ::close(fd);
    return 0;
  };
  const std::string unique = ".space-gateway-probe-" + std::to_string(getpid());

  check("become_root", EPERM, [] { return setuid(0); });
  // The filter answers EPERM; the task limit alone would answer EAGAIN.
  check("fork", EPERM, [] {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) _exit(0);
    waitpid(pid, nullptr, 0);
    return 0;
  });
  check("thread", EAGAIN, [] {
    pthread_t thread;
    int rc = pthread_create(
        &thread, nullptr, [](void*) -> void* { return nullptr; }, nullptr);
    if (rc != 0) {
      errno = rc;
      return -1;
    }
    pthread_join(thread, nullptr);
    return 0;
  });
  // A program that does not exist: the filter refuses before the path is looked up (EPERM);
  // without it the kernel answers ENOENT.
  check("exec", EPERM, [] {
    char* const argv[] = {nullptr};
    return execve("/nonexistent/space-gateway-probe", argv, argv);
  });
  check("debug", EPERM, [] {
    char source = 'x', target = 0;
    iovec local{&target, 1}, remote{&source, 1};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1 ? 0 : -1;
  });
  // unshare of nothing succeeds wherever the call itself is allowed.
  check("new_namespace", EPERM, [] { return unshare(0); });
  // `call` on a new IPv4 socket of `type`, closed after; its result, errno kept.
  auto onInetSocket = [](int type, const std::function<int(int)>& call) {
    int fd = ::socket(AF_INET, type | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = call(fd);
    int err = errno;
    ::close(fd);
    errno = err;
    return rc;
  };
  check("listen", EPERM, [&] { return onInetSocket(SOCK_STREAM, [](int fd) { return ::listen(fd, 1); }); });
  // A port of its choosing, and any port at all (0: the kernel would pick one).
  check("bind", EPERM, [&] {
    return onInetSocket(SOCK_DGRAM, [](int fd) {
      sockaddr_in any{};
      any.sin_family = AF_INET;
      return ::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any);
    });
  });
  // A port of its choosing by the kernel's own pick, narrowed to one.
  check("choose_port", EPERM, [&] {
    return onInetSocket(SOCK_DGRAM, [](int fd) {
      const uint32_t one_port = (40999u << 16) | 40999u;
      return ::setsockopt(fd, IPPROTO_IP, jail::kIpLocalPortRange, &one_port, sizeof one_port);
    });
  });
  check("unix_socket", EPERM, [] {
    int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    ::close(fd);
    return 0;
  });
  // Netlink: socket diagnostics would list every socket of the namespace, routing its addresses
  // and routes (the gateway lists addresses with an ioctl instead). Each tried apart.
  check("diagnose_sockets", EPERM, [] {
    int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) return -1;
    ::close(fd);
    return 0;
  });
  check("routing_netlink", EPERM, [] {
    int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return -1;
    ::close(fd);
    return 0;
  });
  check("more_descriptors", EPERM, [] {
    rlimit now{};
    if (getrlimit(RLIMIT_NOFILE, &now) != 0) return 0;
    const rlimit more{now.rlim_max + 1, now.rlim_max + 1};
    return setrlimit(RLIMIT_NOFILE, &more);
  });
  check("async_io", ENOSYS, [] {
    unsigned long context = 0;
    if (syscall(SYS_io_setup, 1, &context) != 0) return -1;
    syscall(SYS_io_destroy, context);
    return 0;
  });
  check("shared_memory", EPERM, [] {
    int fd = static_cast<int>(syscall(SYS_memfd_create, "space-gateway-probe", 0));
    if (fd < 0) return -1;
    ::close(fd);
    return 0;
  });
  check("memory_beyond_its_bound", ENOMEM, [&] {
    const size_t size = gatewayAddressSpace(plan.max_connections) + (size_t{64} << 20);
    void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return -1;
    munmap(p, size);
    return 0;
  });
  check("file_beyond_its_bound", EFBIG,
        [&] { return ::pwrite(written, "x", 1, static_cast<off_t>(plan.max_file_bytes)) == 1 ? 0 : -1; });
  // The kernel makes it a fallocate that keeps the size.
  check("disk_reserved_by_ioctl", EPERM, [&] {
    jail::SpaceReservation reservation;
    reservation.length = static_cast<int64_t>(plan.max_file_bytes) * 2;
    return ioctl(written, jail::kReserveSpaceIoctl, &reservation);
  });
  check("disk_reserved_beyond_its_bound", EPERM,
        [&] { return fallocate(written, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(plan.max_file_bytes) * 2); });
  // Landlock answers EACCES; the scratch directory (the working one: its ancestors may be
  // closed to the user, as a gateway's are) is the probe's user's own, so that nothing else
  // refuses there.
  check("make_file_in_own_dir", EACCES, [&] { return makeFile(unique); });
  check("make_file_in_tmp", EACCES, [&] { return makeFile("/tmp/" + unique); });
  check("make_file_in_dev_shm", EACCES, [&] { return makeFile("/dev/shm/" + unique); });
  check("read_host_file", EACCES, [&] { return readFile("/etc/passwd"); });
  // Its own entry, which every process may read: only Landlock closes /proc.
  check("read_proc", EACCES, [&] { return readFile("/proc/self/status"); });
  // And what it needs stays open: the trust store OpenSSL verifies upstream certificates
  // against (Debian's default file is a link from /usr/lib/ssl into /etc/ssl, to a bundle
  // made from /usr/share/ca-certificates). A host without one has nothing to read.
  nlohmann::json needs = nlohmann::json::object();
  bool works = true;
  // Where OpenSSL looks: its environment variables (inherited from spaced) first, as it does.
  // The directory's variable is a ':'-separated list, as OpenSSL reads it: each entry must be
  // readable or absent, and the first that is neither is the one reported.
  auto need = [&](const char* name, const char* env, const char* fallback, int flags) {
    const char* set = std::getenv(env);
    const std::string path = set != nullptr && *set != '\0' ? set : fallback;
    bool readable = false, absent = true;
    std::string failure;
    size_t from = 0;
    size_t seen = 0;  // over all the list's directories, as confinementPlan counts
    while (from <= path.size()) {
      const size_t end = (flags & O_DIRECTORY) ? std::min(path.find(':', from), path.size()) : path.size();
      const std::string entry = path.substr(from, end - from);
      from = end + 1;
      if (entry.empty()) continue;
      errno = 0;
      int fd = ::open(entry.c_str(), flags | O_NONBLOCK | O_CLOEXEC);  // a FIFO put there must not hold it
      const int error = errno;
      if (fd >= 0) {
        ::close(fd);
        readable = true;
        absent = false;
        // A directory's links lead to certificates elsewhere, which Landlock judges by where
        // they are: each must be readable too. A broken link is absent, as for OpenSSL, and a
        // file the user may not read anyway (access(2), which Landlock does not judge) is not
        // the confinement's doing: OpenSSL could not read it unconfined either.
        std::error_code ec;
        const std::filesystem::directory_iterator listed_all;
        for (std::filesystem::directory_iterator it =
                 (flags & O_DIRECTORY) ? std::filesystem::directory_iterator(entry, ec) : listed_all;
             !ec && it != listed_all && ++seen <= kMaxTrustStoreEntries; it.increment(ec)) {
          std::error_code link_ec;
          if (!it->is_symlink(link_ec) || !std::filesystem::is_regular_file(it->path(), link_ec)) continue;
          errno = 0;
          const int linked = ::open(it->path().c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // never waits on a FIFO
          const int link_error = errno;
          if (linked >= 0) ::close(linked);
          const bool landlock_refused =
              link_error == EACCES && ::faccessat(AT_FDCWD, it->path().c_str(), R_OK, AT_EACCESS) == 0;
          if (linked < 0 && link_error != ENOENT && (link_error != EACCES || landlock_refused) && failure.empty()) {
            failure = it->path().string() + ": " + strerror(link_error);
          }
        }
      } else if (error != ENOENT) {
        absent = false;
        if (failure.empty()) failure = entry + ": " + strerror(error);
      }
    }
    const bool ok = failure.empty();
    needs[name] = {{"path", path}, {"readable", readable && ok}, {"absent", absent}, {"error", failure}};
    works = works && ok;
  };
  need("trust_store", X509_get_default_cert_file_env(), X509_get_default_cert_file(), O_RDONLY);
  need("trust_store_dir", X509_get_default_cert_dir_env(), X509_get_default_cert_dir(), O_RDONLY | O_DIRECTORY);
  // What the plan leaves it, for whoever reads the report to see: the directories, and of the
  // single files (certificates the trust store links to) how many and the first few, so the
  // report stays short (spaced reads its last 64 KiB).
  constexpr size_t kFilesReported = 8;
  nlohmann::json reachable = nlohmann::json::array();
  size_t files = 0;
  for (const jail::FsRule& rule : plan.reachable) {
    if (rule.file && files++ >= kFilesReported) continue;
    reachable.push_back({{"path", rule.dir}, {"writable", rule.write}, {"file", rule.file}});
  }
  return {
      {"landlock_abi", landlock_abi}, {"confined", confined},    {"checks", checks}, {"works", works}, {"needs", needs},
      {"reachable", reachable},       {"reachable_files", files}};
}

}  // namespace space::gateway
