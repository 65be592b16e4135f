// The seccomp filter SPACE puts on the processes that face a guest: each QEMU (installed by
// space-jail right before it executes QEMU, under QEMU's own -sandbox filter) and each network
// gateway (installed by space-gateway itself once it has dropped its privileges).
#pragma once

#include <sys/ioctl.h>

#include <cstdint>

namespace space::jail {

struct SeccompExtras {
  // The process never executes a program: execve and execveat fail (a compromised gateway
  // gets no shell). Not for space-jail, whose last act is to execute QEMU.
  bool no_exec = false;
  // The process never debugs or profiles another: ptrace, process_vm_readv/writev,
  // perf_event_open, bpf and userfaultfd fail. QEMU's own filter decides these for QEMU.
  bool no_debug = false;
  // The process makes threads, never another process: fork, vfork and clone without
  // CLONE_THREAD fail. Nothing takes a child down with its gateway (its cgroup, where spaced
  // has cgroups, is emptied only at the gateway's next restart or when its sandbox's network
  // ends), so a compromised one could otherwise leave processes running after it was stopped.
  bool no_fork = false;
  // The process keeps its memory in its own address space and leaves nothing behind it: memfd_create,
  // memfd_secret, shmget, msgget, semget and mq_open fail. Their pages are outside RLIMIT_AS (a
  // gateway's bound where spaced has no cgroups), and System V and POSIX IPC objects outlive the
  // process, where the next sandbox of its slot (the same uid) would find them.
  bool no_shared_memory = false;
  // The process takes no port of its choosing outside the kernel's ephemeral range: listen and
  // bind fail, and so does setsockopt IP_LOCAL_PORT_RANGE (Linux 6.3+), which would narrow the
  // kernel's own pick to one port. A compromised gateway, whose upstream sockets are in the
  // host's network namespace, then accepts no TCP connection there and cannot squat a port
  // below that range (a host service's). Its sockets still get a port the kernel picks when
  // they connect or send (a UDP socket that sent unconnected receives on it, from anyone), so
  // one that makes sockets until the pick is a port it wants gets that port within the range
  // (ip_local_port_range); it listens on the sockets made before its confinement.
  bool no_new_ports = false;
  // The process reserves no disk blocks: fallocate fails, and so do the ioctls of type 'X'
  // (FS_IOC_RESVSP, _RESVSP64, _UNRESVSP*, _ZERO_RANGE, which the kernel turns into fallocate,
  // and XFS's own). RLIMIT_FSIZE bounds what a write adds to a file, but with
  // FALLOC_FL_KEEP_SIZE the file's size does not change, and ext4, xfs and btrfs check the
  // limit only against the size: a descriptor of any file would otherwise fill the disk
  // (reviews helper-72, helper-73).
  bool no_disk_reservation = false;
  // What the process puts on disk stays within RLIMIT_FSIZE in each file it can write (a
  // jailed QEMU's, which may not make a file: space-jail --no-new-files). Landlock judges named
  // files only, and the limit the size only, so these fail with EOPNOTSUPP (openat2 ENOSYS):
  // an open with O_TMPFILE (an unnamed file, one per descriptor); openat2 (whose flags sit in
  // memory a filter cannot read; the C library's open does not use it); fallocate in any mode
  // but the three QEMU uses (0, ZERO_RANGE, PUNCH_HOLE|KEEP_SIZE: KEEP_SIZE alone reserves past
  // the size, INSERT_RANGE moves data past the limit); the ioctls the kernel or XFS turn into
  // reservations (FS_IOC_RESVSP*, _ZERO_RANGE, XFS_IOC_ALLOCSP*, _FREESP*) and XFS's extent
  // size hint (FS_IOC_FSSETXATTR, file_setattr), btrfs's ioctls (subvolumes and snapshots
  // make directories Landlock does not see), setting extended attributes (unbounded on btrfs
  // and XFS), and copy_file_range (ENOSYS: a reflink on XFS and btrfs, whose copy-on-write
  // then takes blocks past the size). Reviews helper-83, helper-84. Unlike
  // no_disk_reservation, fallocate itself stays. Not enough on btrfs: there an extent stays
  // whole while one block of it is used, so overwrites alone pin more than the file's size
  // (docs/threat-model.md).
  bool no_growth_past_file_size = false;
  // The process makes IPv4 sockets only: socket of any other family (netlink included) fails,
  // and socketpair of AF_UNIX. Landlock (before ABI 9) does
  // not stop a connect to a named Unix socket, so a confined process could reach the host's log
  // daemons (/dev/log, journald: logs it fills and forges) and the abstract sockets of its
  // network namespace; NETLINK_SOCK_DIAG would list every socket of the namespace, other
  // sandboxes' gateways' peers included; other families load kernel modules on demand
  // (reviews helper-72, helper-73).
  bool inet_sockets_only = false;
  // The process makes no legacy AIO context: io_setup answers ENOSYS (a context counts against
  // the host-wide aio-max-nr, which one process can use up for every other, helper-73).
  bool no_async_io = false;
};

// Installs the filter on every thread of the process (and those they create), after
// no_new_privs. Returns 0, or libseccomp's negative errno. It refuses with EPERM:
// - the key calls (add_key, keyctl, request_key): a uid's keyring outlives its process and the
//   uid goes to another sandbox next, so two compromised processes could pass data through it;
// - new namespaces (unshare, setns, clone with a CLONE_NEW* flag) and every mount call: in a
//   user namespace of its own a process would get mounts and a network of its own, and the
//   kernel code that only privileged users reach otherwise;
// - F_SETLEASE: a lease on a VM's own disk would hold off the host's reads of it (layer
//   collection reads disk headers);
// - what `extras` names;
// and answers with ENOSYS io_uring (a large part of the kernel that no filter can look into;
// QEMU's disks use a thread pool, aio=threads, and its descriptor monitor falls back to epoll)
// and clone3, whose flags sit in memory that a filter cannot read: the C library then creates
// its threads with clone, whose flags it can. Everything else is allowed. A call of another
// system call ABI (i386, x32) kills the process. libseccomp (not a hand-built BPF program)
// knows each architecture's numbers and the x32 trap.
int denyWhatNoConfinedProcessNeeds(SeccompExtras extras = {});

// IP_LOCAL_PORT_RANGE (Linux 6.3; not in Debian 12's headers), which no_new_ports refuses.
constexpr int kIpLocalPortRange = 51;

// FS_IOC_RESVSP64 and its argument (the kernel's; not in Debian 12's headers), one of the
// ioctls no_disk_reservation refuses: for the checks that try it.
struct SpaceReservation {
  int16_t type = 0;
  int16_t whence = 0;  // SEEK_SET
  int64_t start = 0;
  int64_t length = 0;
  int32_t sysid = 0;
  uint32_t pid = 0;
  int32_t pad[4] = {};
};
static_assert(sizeof(SpaceReservation) == 48);
inline constexpr unsigned long kReserveSpaceIoctl = _IOW('X', 42, SpaceReservation);

}  // namespace space::jail
