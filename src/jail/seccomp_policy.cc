#include "jail/seccomp_policy.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <netinet/in.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <initializer_list>

namespace space::jail {

int denyWhatNoConfinedProcessNeeds(SeccompExtras extras) {
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (filter == nullptr) return -ENOMEM;
  const uint32_t refuse = SCMP_ACT_ERRNO(EPERM);
  int rc = seccomp_attr_set(filter, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  // On every thread of the process, also those a library started already.
  if (rc == 0) rc = seccomp_attr_set(filter, SCMP_FLTATR_CTL_TSYNC, 1);
  auto refuseAll = [&](std::initializer_list<int> calls) {
    for (const int call : calls) {
      if (rc == 0) rc = seccomp_rule_add(filter, refuse, call, 0);
    }
  };
  refuseAll({SCMP_SYS(add_key), SCMP_SYS(keyctl), SCMP_SYS(request_key), SCMP_SYS(unshare), SCMP_SYS(setns),
             SCMP_SYS(mount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot), SCMP_SYS(open_tree),
             SCMP_SYS(move_mount), SCMP_SYS(fsopen), SCMP_SYS(fsconfig), SCMP_SYS(fsmount), SCMP_SYS(fspick),
             SCMP_SYS(mount_setattr)});
  if (extras.no_exec) refuseAll({SCMP_SYS(execve), SCMP_SYS(execveat)});
  if (extras.no_debug) {
    refuseAll({SCMP_SYS(ptrace), SCMP_SYS(process_vm_readv), SCMP_SYS(process_vm_writev), SCMP_SYS(perf_event_open),
               SCMP_SYS(bpf), SCMP_SYS(userfaultfd)});
  }
  if (extras.no_fork) {
    refuseAll({SCMP_SYS(fork), SCMP_SYS(vfork)});
    if (rc == 0) {
      rc = seccomp_rule_add(filter, refuse, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
    }
  }
  if (extras.no_shared_memory) {
    refuseAll({SCMP_SYS(memfd_create), SCMP_SYS(memfd_secret), SCMP_SYS(shmget), SCMP_SYS(msgget), SCMP_SYS(semget),
               SCMP_SYS(mq_open)});
  }
  if (extras.no_new_ports) {
    refuseAll({SCMP_SYS(listen), SCMP_SYS(bind)});
    // Level and name are ints: their low 32 bits, as the kernel reads them.
    if (rc == 0) {
      rc = seccomp_rule_add(filter, refuse, SCMP_SYS(setsockopt), 2,
                            SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, IPPROTO_IP),
                            SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, kIpLocalPortRange));
    }
  }
  if (extras.no_disk_reservation) {
    refuseAll({SCMP_SYS(fallocate)});
    // An ioctl's command is an unsigned int (its low 32 bits, as for fcntl below); its type is
    // bits 8-15.
    if (rc == 0)
      rc = seccomp_rule_add(filter, refuse, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xff00u, 'X' << 8));
  }
  if (extras.no_growth_past_file_size) {
    const uint32_t unsupported = SCMP_ACT_ERRNO(EOPNOTSUPP);
    // Flags and modes are ints: their low 32 bits, as the kernel reads them. __O_TMPFILE is
    // the bit O_TMPFILE adds to O_DIRECTORY.
    constexpr uint64_t kTmpFileBit = O_TMPFILE & ~O_DIRECTORY;
    if (rc == 0) {
      rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(open), 1,
                            SCMP_A1(SCMP_CMP_MASKED_EQ, kTmpFileBit, kTmpFileBit));
    }
    if (rc == 0) {
      rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(openat), 1,
                            SCMP_A2(SCMP_CMP_MASKED_EQ, kTmpFileBit, kTmpFileBit));
    }
    if (rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(openat2), 0);
    // fallocate's modes QEMU uses, and no other: 0 and FALLOC_FL_ZERO_RANGE (checked against
    // the limit, as they grow the size) and FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (frees).
    // KEEP_SIZE without PUNCH_HOLE reserves past the size; INSERT_RANGE moves data past the
    // limit, which ext4 does not check (helper-83); later modes are refused until judged. A
    // rule tests (mode & mask) == value, so one rule per other bit of the int.
    constexpr uint64_t kKeepOrPunch = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE;
    if (rc == 0) {
      rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(fallocate), 1,
                            SCMP_A1(SCMP_CMP_MASKED_EQ, kKeepOrPunch, FALLOC_FL_KEEP_SIZE));
    }
    for (int bit = 0; bit < 32; ++bit) {
      const uint64_t flag = uint64_t{1} << bit;
      if ((flag & (kKeepOrPunch | FALLOC_FL_ZERO_RANGE)) != 0) continue;
      if (rc == 0) {
        rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(fallocate), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, flag, flag));
      }
    }
    // ioctls by type and number (bits 0-15), whatever size and direction bits a caller puts
    // above them: 'X' RESVSP 40, RESVSP64 42, ZERO_RANGE 57, XFS's ALLOCSP 10, FREESP 11,
    // ALLOCSP64 36, FREESP64 37 (reservations), FSSETXATTR 32 (an XFS extent size hint makes
    // writes allocate whole extents past the limit, helper-83); and btrfs's whole type 0x94,
    // whose subvolume and snapshot calls make directories Landlock does not see (helper-83;
    // QEMU uses none of them, FICLONE included).
    for (const uint64_t number : {40, 42, 57, 10, 11, 36, 37, 32}) {
      if (rc == 0) {
        rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(ioctl), 1,
                              SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffu, ('X' << 8) | number));
      }
    }
    if (rc == 0) {
      rc = seccomp_rule_add(filter, unsupported, SCMP_SYS(ioctl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xff00u, 0x94u << 8));
    }
    // Extended attributes: no limit but the filesystem's (btrfs and XFS take megabytes per
    // file, helper-83), and QEMU without virtio-9p sets none. setxattrat (463) and file_setattr
    // (469, which sets the extent size hint) by number: libseccomp 2.5 has no names for them,
    // and calls from 424 on have one number on every architecture.
    for (const int call : {SCMP_SYS(setxattr), SCMP_SYS(lsetxattr), SCMP_SYS(fsetxattr), 463, 469}) {
      if (rc == 0) rc = seccomp_rule_add(filter, unsupported, call, 0);
    }
    // copy_file_range shares extents on XFS and btrfs (a reflink), which copy-on-write then
    // multiplies past the file's size (helper-84). QEMU uses it for block-job copy offload
    // only, and reads and writes instead where the call does not exist.
    if (rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(copy_file_range), 0);
  }
  if (extras.inet_sockets_only) {
    // Every family but AF_INET, on the domain's low 32 bits (an int, as the kernel reads it);
    // families past 63 do not exist (EAFNOSUPPORT) whatever the filter says.
    for (uint64_t family = 0; family < 64; ++family) {
      if (family == AF_INET) continue;
      if (rc == 0)
        rc = seccomp_rule_add(filter, refuse, SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, family));
    }
    if (rc == 0)
      rc = seccomp_rule_add(filter, refuse, SCMP_SYS(socketpair), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, AF_UNIX));
  }
  if (extras.no_async_io && rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(io_setup), 0);
  // One rule per flag: a rule's argument test is (flags & mask) == value, so "any of them" is
  // several rules. CLONE_NEWTIME is left out: in clone's flags its bit is part of the exit signal.
  for (const uint64_t flag :
       {CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET}) {
    if (rc == 0) rc = seccomp_rule_add(filter, refuse, SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
  }
  if (rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  // fcntl's command is an unsigned int: the kernel ignores the upper half of the register, so
  // the rule must too (an EQ on all 64 bits let (1 << 32) | F_SETLEASE through).
  if (rc == 0) {
    rc = seccomp_rule_add(filter, refuse, SCMP_SYS(fcntl), 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, F_SETLEASE));
  }
  for (const int call : {SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter), SCMP_SYS(io_uring_register)}) {
    if (rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), call, 0);
  }
  if (rc == 0) rc = seccomp_load(filter);
  seccomp_release(filter);
  return rc;
}

}  // namespace space::jail
