// What a gateway may do once it serves, set up by the gateway itself: it starts as root, opens
// what it needs (listeners, audit log, upstream namespace), and then confines itself with
// confine() before it reads a byte from the guest. One function for every step, so that what
// the gateway applies and what `space-gateway --probe-confinement` checks (and spaced reports
// at start) cannot drift apart.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "jail/landlock.h"

namespace space::gateway {

// The most entries of the trust store's directories that are looked through for links: to
// give each certificate one leads to a rule (the gateway), and to check it is read (the probe).
// A Debian host's /etc/ssl/certs has about 300.
inline constexpr size_t kMaxTrustStoreEntries = 16384;

struct ConfinementPlan {
  // A user name, or "#<id>" for a uid (and gid) of its own that no account has: spaced gives
  // every slot's gateway its own, so one compromised gateway cannot signal another.
  std::string user = "nobody";
  // What it may still open by path (everything else is closed to it, where the kernel has
  // Landlock): its directory (policy, read again when it changes), its credentials, the trust
  // store and the libraries' files.
  std::vector<jail::FsRule> reachable;
  // Sizes its address space: room for each connection it may hold.
  size_t max_connections = 256;
  // The most bytes of any file it writes (audit log and its rotation, its stderr log).
  uint64_t max_file_bytes = 8 << 20;
};

// The uid and gid of `user` (a name, or "#<id>"); an error for root or an unknown name.
Result<std::pair<uid_t, gid_t>> resolveUser(const std::string& user);

// RLIMIT_NOFILE for a gateway of `max_connections`: two per connection and some for DNS.
uint64_t gatewayDescriptors(size_t max_connections);

// RLIMIT_AS for a gateway of `max_connections`: 64 MiB + 1 MiB per connection (measured: 15 MB
// idle, 50 MB with 250 connections open; bench/RESULTS.md).
uint64_t gatewayAddressSpace(size_t max_connections);

// In this order: the Landlock ruleset is made (its directories opened as root); privileges go
// for good (no groups, the user's uid/gid, an empty bounding set, no_new_privs, checked after
// the fact); the user holds one task (no thread or process can be made: it spins one core at
// most, and it is in no cgroup that would count them), a bounded address space, number of
// descriptors and file size (SIGXFSZ ignored: a write past it fails with EFBIG rather than
// killing it), and is not dumpable (it holds credential values); the ruleset binds (the
// process must have one thread, checked); and the seccomp filter refuses exec, debugging,
// fork, shared memory, listening and binding, disk reservation, sockets but IPv4, and legacy
// AIO (jail/seccomp_policy.h). Returns the Landlock ABI that confines its files, 0 if
// the kernel has none (then only the rest holds). An error leaves the process to exit: it may
// be half done.
Result<int> confine(const ConfinementPlan& plan);

// Run after confine(): tries what a compromised gateway would, in the working directory (the
// plan's first, a scratch directory its user owns, so that only the confinement refuses
// there) and elsewhere, and says what was refused, each by the error the confinement gives:
//   {"landlock_abi": N, "confined": bool, "checks": {"fork": {"refused": bool, "error": "..."}, ...},
//    "works": bool, "needs": {"trust_store": {"path": "...", "readable": bool, "absent": bool,
//    "error": "..."}, "trust_store_dir": {...}}}
// `confined` is true when every check was refused; `works` when what a gateway needs to read
// (the host's trust store, file and directory, where it has them: OpenSSL's environment
// variables first) is still readable. `written` was opened (as root) before confine(), for the
// file-size checks. Nothing it tries outlives it or leaves a file.
nlohmann::json probeConfinement(const ConfinementPlan& plan, int landlock_abi, int written);

}  // namespace space::gateway
