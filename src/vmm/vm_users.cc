#include "vmm/vm_users.h"

#include <dirent.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>

#include <cstdlib>
#include <string>

#include "common/fs.h"
#include "common/process.h"

namespace space::vmm {

Result<std::shared_ptr<VmUsers>> VmUsers::create(uint32_t base, uint32_t count) {
  constexpr uint64_t kMaxId = (uint64_t{1} << 31) - 1;
  if (base == 0 || count == 0 || uint64_t{base} + count > kMaxId) {
    return makeError(ErrorCode::kInvalidArgument, "VM uids " + std::to_string(base) + "+1.." +
                                                      std::to_string(uint64_t{base} + count) +
                                                      ": the range must be non-empty, above 0 and below 2^31");
  }
  std::shared_ptr<VmUsers> users(new VmUsers(base, count));
  users->self_ = users;
  return users;
}

VmUsers::VmUsers(uint32_t base, uint32_t count)
    : base_(base), count_(count), ring_(count), free_count_(count), in_use_(count, false) {
  for (uint32_t i = 0; i < count; ++i) ring_[i] = base + 1 + i;
}

Result<VmUsers::Lease> VmUsers::acquire() {
  std::lock_guard lock(mu_);
  if (free_count_ == 0) {
    return makeError(ErrorCode::kResourceExhausted,
                     "all " + std::to_string(count_) + " VM uids are in use (--vm-uid-base's range)");
  }
  Lease lease;
  lease.uid_ = ring_[head_];
  head_ = (head_ + 1) % count_;
  --free_count_;
  in_use_[lease.uid_ - base_ - 1] = true;
  lease.gid_ = base_;
  lease.owner_ = self_.lock();
  return lease;
}

Result<VmUsers::Lease> VmUsers::claim(uid_t uid) {
  if (!contains(uid)) {
    return makeError(ErrorCode::kFailedPrecondition, "uid " + std::to_string(uid) + " is not a VM uid of this node");
  }
  std::lock_guard lock(mu_);
  if (in_use_[uid - base_ - 1]) {
    return makeError(ErrorCode::kFailedPrecondition, "uid " + std::to_string(uid) + " is held by another VM");
  }
  // Adoption happens once, at start: a linear search of the free ring is fine. The ones after
  // it move up one slot, keeping their order.
  size_t at = 0;
  while (ring_[(head_ + at) % count_] != uid) ++at;
  for (; at + 1 < free_count_; ++at) ring_[(head_ + at) % count_] = ring_[(head_ + at + 1) % count_];
  --free_count_;
  in_use_[uid - base_ - 1] = true;
  Lease lease;
  lease.uid_ = uid;
  lease.gid_ = base_;
  lease.owner_ = self_.lock();
  return lease;
}

Status VmUsers::checkNoAccount() const {
  std::string found;
  ::setpwent();
  while (passwd* pw = ::getpwent()) {
    if (contains(pw->pw_uid)) {
      found = "the account " + std::string(pw->pw_name) + " has uid " + std::to_string(pw->pw_uid);
      break;
    }
  }
  ::endpwent();
  if (found.empty()) {
    if (group* gr = ::getgrgid(base_))
      found = "the group " + std::string(gr->gr_name) + " has gid " + std::to_string(base_);
  }
  if (found.empty()) return okStatus();
  return makeError(ErrorCode::kFailedPrecondition, found + ", which is among the VM uids (" + std::to_string(base_) +
                                                       "+1.." + std::to_string(uint64_t{base_} + count_) +
                                                       "); choose another --vm-uid-base");
}

size_t VmUsers::killStrangers(const std::string& data_dir) const {
  size_t killed = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    auto uid = processUid(static_cast<pid_t>(pid));
    if (!uid.ok() || !contains(uid.value())) continue;
    {
      std::lock_guard lock(mu_);
      if (in_use_[uid.value() - base_ - 1]) continue;
    }
    // Its mount table, which a process without capabilities cannot change, names its run
    // directory (bound at its own path), whatever its command line says.
    auto mounts = readSmallFile("/proc/" + std::to_string(pid) + "/mountinfo", 1 << 20);
    if (!mounts.ok() || mounts->find(" " + data_dir + "/") == std::string::npos) continue;
    if (::kill(static_cast<pid_t>(pid), SIGKILL) == 0) ++killed;
  }
  ::closedir(proc);
  return killed;
}

size_t VmUsers::held() const {
  std::lock_guard lock(mu_);
  return count_ - free_count_;
}

void VmUsers::release(uid_t uid) {
  std::lock_guard lock(mu_);
  in_use_[uid - base_ - 1] = false;
  ring_[(head_ + free_count_) % count_] = uid;
  ++free_count_;
}

VmUsers::Lease::Lease(Lease&& other) noexcept : owner_(std::move(other.owner_)), uid_(other.uid_), gid_(other.gid_) {
  other.owner_.reset();
}

VmUsers::Lease& VmUsers::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::move(other.owner_);
    other.owner_.reset();
    uid_ = other.uid_;
    gid_ = other.gid_;
  }
  return *this;
}

VmUsers::Lease::~Lease() { release(); }

void VmUsers::Lease::release() {
  if (!owner_) return;
  owner_->release(uid_);
  owner_.reset();
}

}  // namespace space::vmm
