// The seccomp policy of the processes that face a guest, applied in a child process: what it
// refuses fails with the answer the policy names, and what such a process needs still works.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "jail/seccomp_policy.h"

namespace space::jail {
namespace {

// Runs `probe` in a child under the policy; the child's exit code is the probe's (0: as
// expected; else the number of the check that failed).
int underPolicy(SeccompExtras extras, int (*probe)()) {
  pid_t pid = fork();
  if (pid == 0) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(100);
    if (denyWhatNoConfinedProcessNeeds(extras) != 0) _exit(101);
    _exit(probe());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
}

int refusedEverywhere() {
  if (syscall(SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno != EPERM) return 1;
  if (unshare(CLONE_NEWUSER) != -1 || errno != EPERM) return 2;
  if (syscall(SYS_io_uring_setup, 1, nullptr) != -1 || errno != ENOSYS) return 3;
  if (syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) return 4;
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  // The command with bits in the register's upper half, which the kernel ignores.
  if (syscall(SYS_fcntl, fd, (1L << 32) | F_SETLEASE, F_RDLCK) != -1 || errno != EPERM) return 5;
  // What every such process needs: threads (through clone, after clone3's ENOSYS) and fork.
  bool ran = false;
  std::thread([&] { ran = true; }).join();
  if (!ran) return 6;
  pid_t child = fork();
  if (child == 0) _exit(0);
  if (child < 0 || waitpid(child, nullptr, 0) != child) return 7;
  return 0;
}

int execAndDebugRefused() {
  if (ptrace(PTRACE_TRACEME, 0, nullptr, nullptr) != -1 || errno != EPERM) return 1;
  if (syscall(SYS_userfaultfd, 0) != -1 || errno != EPERM) return 2;
  char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
  execv("/bin/true", argv);
  return errno == EPERM ? 0 : 3;
}

// Threads only: fork (glibc's goes through clone), the raw calls and clone without
// CLONE_THREAD are refused, and a thread still starts.
int forkRefusedThreadsKept() {
  if (fork() != -1 || errno != EPERM) return 1;
  if (syscall(SYS_fork) != -1 || errno != EPERM) return 2;
  if (syscall(SYS_vfork) != -1 || errno != EPERM) return 3;
  if (syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0) != -1 || errno != EPERM) return 4;
  bool ran = false;
  std::thread([&] { ran = true; }).join();
  return ran ? 0 : 5;
}

int sharedMemoryRefused() {
  if (syscall(SYS_memfd_create, "x", 0) != -1 || errno != EPERM) return 1;
  if (syscall(SYS_shmget, IPC_PRIVATE, 4096, IPC_CREAT | 0600) != -1 || errno != EPERM) return 2;
  if (syscall(SYS_msgget, IPC_PRIVATE, IPC_CREAT | 0600) != -1 || errno != EPERM) return 3;
  if (syscall(SYS_semget, IPC_PRIVATE, 1, IPC_CREAT | 0600) != -1 || errno != EPERM) return 4;
  if (syscall(SYS_mq_open, "space-test", O_RDWR | O_CREAT, 0600, nullptr) != -1 || errno != EPERM) return 5;
  return 0;
}

// No port of its choosing: listen and bind are refused, for TCP and UDP, to any address or port
// 0; a socket still sends, from a port the kernel picks.
int newPortsRefused() {
  int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen(tcp, 1) != -1 || errno != EPERM) return 1;
  sockaddr_in loopback{};
  loopback.sin_family = AF_INET;
  loopback.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(tcp, reinterpret_cast<sockaddr*>(&loopback), sizeof loopback) != -1 || errno != EPERM) return 2;
  int udp = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(40999);
  if (bind(udp, reinterpret_cast<sockaddr*>(&any), sizeof any) != -1 || errno != EPERM) return 3;
  loopback.sin_port = htons(9);
  if (sendto(udp, "x", 1, 0, reinterpret_cast<sockaddr*>(&loopback), sizeof loopback) != 1) return 4;
  sockaddr_in picked{};
  socklen_t size = sizeof picked;
  if (getsockname(udp, reinterpret_cast<sockaddr*>(&picked), &size) != 0 || picked.sin_port == 0) return 5;
  // Nor by narrowing the kernel's pick to one port (lower 16 bits: the lowest, upper: the highest),
  // in any form of the level's and name's registers.
  int other = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const uint32_t one_port = (40999u << 16) | 40999u;
  if (setsockopt(other, IPPROTO_IP, kIpLocalPortRange, &one_port, sizeof one_port) != -1 || errno != EPERM) return 6;
  if (syscall(SYS_setsockopt, other, (1ULL << 32) | IPPROTO_IP, (1ULL << 32) | kIpLocalPortRange, &one_port,
              sizeof one_port) != -1 ||
      errno != EPERM)
    return 7;
  // Other options stay.
  int one = 1;
  if (setsockopt(other, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) return 8;
  return 0;
}

// No disk reserved past the file-size limit (FALLOC_FL_KEEP_SIZE leaves the size alone), by
// fallocate or the ioctl the kernel turns into it; a write and other ioctls still work.
int diskReservationRefused() {
  char path[] = "/tmp/space-seccomp-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  unlink(path);
  if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 4096) != -1 || errno != EPERM) return 2;
  if (fallocate(fd, 0, 0, 4096) != -1 || errno != EPERM) return 3;
  SpaceReservation reservation;
  reservation.length = 1 << 20;
  if (ioctl(fd, kReserveSpaceIoctl, &reservation) != -1 || errno != EPERM) return 4;
  if (syscall(SYS_ioctl, fd, (1ULL << 32) | kReserveSpaceIoctl, &reservation) != -1 || errno != EPERM) return 5;
  int pending = 0;
  if (ioctl(fd, FIONREAD, &pending) != 0) return 6;
  if (write(fd, "x", 1) != 1) return 7;
  return 0;
}

// IPv4 sockets only: no Unix socket (named, abstract or a pair, in any form of the domain's
// register), no IPv6, no netlink of any protocol, no other family.
int onlyInetSockets() {
  if (socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0) != -1 || errno != EPERM) return 1;
  if (socket(AF_UNIX, SOCK_STREAM, 0) != -1 || errno != EPERM) return 2;
  if (syscall(SYS_socket, (1ULL << 32) | AF_UNIX, SOCK_STREAM, 0) != -1 || errno != EPERM) return 3;
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != -1 || errno != EPERM) return 4;
  if (socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG) != -1 || errno != EPERM) return 5;
  if (socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0) != -1 || errno != EPERM) return 6;
  if (socket(AF_ALG, SOCK_SEQPACKET | SOCK_CLOEXEC, 0) != -1 || errno != EPERM) return 7;
  if (socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) < 0) return 8;
  if (socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) < 0) return 9;
  if (socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE) != -1 || errno != EPERM) return 10;
  return 0;
}

int asyncIoRefused() {
  unsigned long context = 0;
  if (syscall(SYS_io_setup, 1, &context) != -1 || errno != ENOSYS) return 1;
  return 0;
}

int execAllowed() {
  char* const argv[] = {const_cast<char*>("/bin/sh"), const_cast<char*>("-c"), const_cast<char*>("exit 42"), nullptr};
  execv("/bin/sh", argv);
  return 9;
}

TEST(SeccompPolicy, RefusesKeysNamespacesLeasesAndIoUringAndKeepsThreadsAndFork) {
  EXPECT_EQ(underPolicy({}, refusedEverywhere), 0);
  EXPECT_EQ(underPolicy({.no_exec = true, .no_debug = true}, refusedEverywhere), 0);
}

// The gateway's extras: no program runs, nothing is debugged, no process is made, no memory
// outside its address space. Without them
// (space-jail's case) an exec works, since the jail's last act is executing QEMU.
TEST(SeccompPolicy, TheGatewaysExtrasRefuseExecDebuggingForkSharedMemoryNewPortsDiskReservationAndAllButInetSockets) {
  EXPECT_EQ(underPolicy({.no_exec = true, .no_debug = true}, execAndDebugRefused), 0);
  EXPECT_EQ(underPolicy({.no_fork = true}, forkRefusedThreadsKept), 0);
  EXPECT_EQ(underPolicy({.no_shared_memory = true}, sharedMemoryRefused), 0);
  EXPECT_EQ(underPolicy({.no_new_ports = true}, newPortsRefused), 0);
  EXPECT_EQ(underPolicy({}, newPortsRefused), 1) << "allowed without the extra";
  EXPECT_EQ(underPolicy({.no_disk_reservation = true}, diskReservationRefused), 0);
  EXPECT_EQ(underPolicy({}, diskReservationRefused), 2) << "allowed without the extra";
  EXPECT_EQ(underPolicy({.inet_sockets_only = true}, onlyInetSockets), 0);
  EXPECT_EQ(underPolicy({}, onlyInetSockets), 1) << "allowed without the extra";
  EXPECT_EQ(underPolicy({.no_async_io = true}, asyncIoRefused), 0);
  EXPECT_EQ(underPolicy({.no_exec = true, .no_debug = true, .no_fork = true}, refusedEverywhere), 7)
      << "all as without no_fork but the fork (check 7)";
  EXPECT_EQ(underPolicy({}, execAllowed), 42);
}

}  // namespace
}  // namespace space::jail
