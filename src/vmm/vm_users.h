// The identities jailed QEMUs run as: a uid of its own per VM, taken from a range no account
// uses, and one group shared by all of them (a group no account has). The group opens what
// several VMs use at once: a snapshot's memory file, which every child of a branch maps
// privately and which only a VM whose jail view holds it can reach.
//
// Why a uid each: a QEMU that a guest has taken over is, without one, uid 0 without
// capabilities, and uid 0 still owns what uid 0 owns: root's files on any mount it can reach,
// the keyring uid 0 shares with the host, every other VM's processes as far as signals go.
// With a uid of its own it owns only its run directory, its disk overlay and its memory file.
// A uid goes back to the range when its QEMU has been reaped, and is handed out again last
// (oldest released first), so two VMs never hold one at once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"

namespace space::vmm {

class VmUsers {
 public:
  // uids base+1 .. base+count, gid `base` for all. kInvalidArgument if the range is empty, starts
  // at 0 or runs past 2^31 - 1 (some tools read ids as signed).
  static Result<std::shared_ptr<VmUsers>> create(uint32_t base, uint32_t count);

  // One uid, held until the lease is destroyed (or moved from).
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    bool held() const { return owner_ != nullptr; }
    // The uid stays taken for as long as the range exists (its QEMU runs on unwatched).
    void keep() { owner_.reset(); }
    uid_t uid() const { return uid_; }
    gid_t gid() const { return gid_; }

   private:
    friend class VmUsers;
    void release();
    std::shared_ptr<VmUsers> owner_;
    uid_t uid_ = 0;
    gid_t gid_ = 0;
  };

  // The next free uid; kResourceExhausted when every one is held.
  Result<Lease> acquire();
  // A uid already in use by a QEMU this daemon adopts (after a restart): kFailedPrecondition if
  // outside the range or held already.
  Result<Lease> claim(uid_t uid);

  // kFailedPrecondition if an account of this host (passwd) has one of the uids, or a group
  // (group) the gid: a VM's QEMU would own its files.
  Status checkNoAccount() const;

  // Kills (SIGKILL) every process whose real uid is one of the range's and not held, and whose
  // mounts (its jail's view) hold a path under `data_dir`: a QEMU an earlier daemon of this data
  // directory left that recovery did not adopt (one that rewrote its command line, on a node
  // without cgroups), which would otherwise share its uid with the next VM given it. Another
  // daemon's VMs (another data directory) are left alone. Run once, after adoption and before
  // any VM starts. Returns how many.
  size_t killStrangers(const std::string& data_dir) const;

  bool contains(uid_t uid) const { return uid > base_ && uid - base_ <= count_; }
  gid_t gid() const { return base_; }
  size_t held() const;

 private:
  VmUsers(uint32_t base, uint32_t count);
  void release(uid_t uid);

  std::weak_ptr<VmUsers> self_;
  const uint32_t base_;
  const uint32_t count_;
  mutable std::mutex mu_;
  // The free uids, oldest released first: a ring of count_ slots from head_, so that a release
  // (run from destructors) never allocates.
  std::vector<uid_t> ring_;
  size_t head_ = 0;
  size_t free_count_ = 0;
  std::vector<bool> in_use_;  // by uid - base - 1
};

}  // namespace space::vmm
