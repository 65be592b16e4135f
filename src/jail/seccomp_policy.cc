#include "jail/seccomp_policy.h"

#include <fcntl.h>
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
