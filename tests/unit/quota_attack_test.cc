// Attack tests for the per-tenant bounds added with the quotas: the template size bound
// (TemplateCache::claimBuild) and the request rate (TenantGate). None boots a VM.
//
// Each test states the property the bound promises; a failure is the defect it names.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "api/tenant_gate.h"
#include "common/fs.h"
#include "snapshot/template_cache.h"

namespace space {
namespace {

using snapshot::TemplateCache;
using snapshot::TemplateKey;

class TemplateAdmitAttack : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-quota-attack-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir.value()));
    kernel_ = dir_->path() + "/vmlinux";
    rootfs_ = dir_->path() + "/rootfs.ext4";
    std::ofstream(kernel_) << "kernel";
    std::ofstream(rootfs_) << "rootfs";
    root_ = dir_->path() + "/templates";
    std::filesystem::create_directory(root_);
  }
  TemplateKey key(uint32_t vcpus, uint64_t memory_mib) const {
    return TemplateKey{.name = "base",
                       .kernel_path = kernel_,
                       .rootfs_path = rootfs_,
                       .vcpus = vcpus,
                       .memory_mib = memory_mib,
                       .accelerator = vmm::Accelerator::kTcg,
                       .qemu_binary = "true"};  // any program in PATH
  }
  // What a finished build leaves: <root>/<dirName>/meta.json.
  void publish(TemplateCache& cache, const TemplateKey& k) {
    auto name = cache.dirName(k);
    ASSERT_TRUE(name.ok()) << name.error().message;
    std::filesystem::create_directory(root_ + "/" + *name);
    std::ofstream(root_ + "/" + *name + "/meta.json")
        << R"({"format_version": 1, "vcpus": )" << k.vcpus << R"(, "memory_mib": )" << k.memory_mib << "}";
  }
  std::optional<TempDir> dir_;
  std::string kernel_, rootfs_, root_;
};

// Sizes being built count against the bound as much as built ones: concurrent creates of new
// sizes cannot all pass (a first version counted only published templates).
TEST_F(TemplateAdmitAttack, SizesBeingBuiltCountAgainstTheBound) {
  TemplateCache cache(root_, 2);
  std::vector<std::shared_ptr<void>> held;
  int admitted = 0;
  for (uint64_t mib = 200; mib < 220; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    if (place.ok()) {
      ++admitted;
      held.push_back(place.value());
    } else {
      EXPECT_EQ(place.error().reason, "template_sizes_full");
    }
  }
  EXPECT_EQ(admitted, 2) << "a bound of 2 sizes let " << admitted << " builds start";
  EXPECT_TRUE(cache.claimBuild(key(1, 999), /*always=*/true).ok()) << "the default size is always built";
}

// With an operator's list of sizes, only those (and the default size) get a kept template: a
// tenant cycling through other sizes takes no place, and a listed size still finds one.
TEST_F(TemplateAdmitAttack, OnlyTheOperatorsSizesAreKept) {
  TemplateCache cache(root_, 2, {"1x512", "2x1024"});
  for (uint64_t mib = 200; mib < 240; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    ASSERT_FALSE(place.ok()) << mib;
    EXPECT_EQ(place.error().reason, "template_sizes_full");
    EXPECT_NE(place.error().message.find("not among --template-sizes"), std::string::npos) << place.error().message;
  }
  auto listed = cache.claimBuild(key(1, 512));
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  EXPECT_TRUE(cache.claimBuild(key(2, 1024)).ok());
  EXPECT_TRUE(cache.claimBuild(key(1, 300), /*always=*/true).ok()) << "the default size is always built";
}

// A build that never happened (its create refused, its boot failed) gives its place back, and
// nothing is remembered: once published templates reach the bound, every new size is refused.
TEST_F(TemplateAdmitAttack, AnAbandonedBuildLeavesNoPlaceBehind) {
  TemplateCache cache(root_, 2);
  for (uint64_t mib = 300; mib < 350; ++mib) {
    auto place = cache.claimBuild(key(1, mib));
    ASSERT_TRUE(place.ok()) << mib;  // claimed and dropped at once: never built
  }
  publish(cache, key(2, 1024));
  publish(cache, key(2, 2048));
  int still = 0;
  for (uint64_t mib = 300; mib < 350; ++mib) still += cache.claimBuild(key(1, mib)).ok();
  EXPECT_EQ(still, 0) << still << " sizes beyond the bound of 2 could still be built";
  // A published size needs no place: it is not a new size.
  EXPECT_TRUE(cache.claimBuild(key(2, 1024)).ok());
}

// Eviction: what goes once no disk stands on it, and what never goes while one does.
class TemplateEvictionTest : public TemplateAdmitAttack {
 protected:
  // A published snapshot as a build leaves it: meta.json and a disk.
  std::string publishFull(TemplateCache& cache, const TemplateKey& k) {
    auto name = cache.dirName(k);
    if (!name.ok()) {
      ADD_FAILURE() << name.error().message;
      return "";
    }
    const std::string dir = root_ + "/" + name.value();
    std::filesystem::create_directory(dir);
    std::ofstream(dir + "/meta.json") << nlohmann::json{
        {"format_version", 1},
        {"template", k.name},
        {"vcpus", k.vcpus},
        {"memory_mib", k.memory_mib}}.dump();
    std::ofstream(dir + "/disk.qcow2") << "disk";
    return name.value();
  }
  snapshot::EvictionRules rules() {
    snapshot::EvictionRules r;
    r.current_key = [this](const std::string& name, uint32_t vcpus, uint64_t mib) -> std::optional<TemplateKey> {
      if (name != "base") return std::nullopt;
      return key(vcpus, mib);
    };
    r.pinned_sizes = {"2x512"};
    return r;
  }
  bool present(const std::string& dir) { return std::filesystem::exists(root_ + "/" + dir); }
};

// A new image makes every template of the old one unrestorable: those go, except while a disk
// still stands on one (a running clone's overlay, a snapshot's layer).
TEST_F(TemplateEvictionTest, StaleTemplatesGoOnceNothingStandsOnThem) {
  std::string old_default, old_other;
  {
    TemplateCache before(root_);
    old_default = publishFull(before, key(2, 512));
    old_other = publishFull(before, key(1, 256));
  }
  std::ofstream(rootfs_) << "a rebuilt rootfs";  // the image changed: a new process keys it anew
  TemplateCache cache(root_);
  const std::string now_default = publishFull(cache, key(2, 512));
  const auto now = Clock::now();
  // A clone of the old default still runs: its overlay names the old disk (spelled another way).
  auto evicted = cache.evictUnused({root_ + "/./" + old_default + "/disk.qcow2"}, rules(), now, cache.evictionMark());
  EXPECT_EQ(evicted, std::vector<std::string>{old_other});
  EXPECT_TRUE(present(old_default)) << "a template a disk stands on was removed";
  EXPECT_TRUE(present(now_default));
  EXPECT_FALSE(present(old_other));
  EXPECT_FALSE(present(".evict-" + old_other));
  // The clone is gone: so is the old template; the current one stays, unused or not.
  evicted = cache.evictUnused({}, rules(), now, cache.evictionMark());
  EXPECT_EQ(evicted, std::vector<std::string>{old_default});
  EXPECT_TRUE(present(now_default));
}

// With an operator's list, sizes not on it go at once; listed and pinned sizes stay unused.
TEST_F(TemplateEvictionTest, SizesTheOperatorDoesNotKeepGo) {
  TemplateCache cache(root_, 0, {"1x512"});
  const std::string listed = publishFull(cache, key(1, 512));
  const std::string pinned = publishFull(cache, key(2, 512));
  const std::string unlisted = publishFull(cache, key(1, 384));
  auto r = rules();
  r.idle = std::chrono::seconds(1);
  auto evicted = cache.evictUnused({}, r, Clock::now() + std::chrono::hours(1), cache.evictionMark());
  EXPECT_EQ(evicted, std::vector<std::string>{unlisted});
  EXPECT_TRUE(present(listed));
  EXPECT_TRUE(present(pinned));
}

// First-come sizes go after the idle time, counted from their last use or, after a restart,
// from when the cache first saw them; the default size never does.
TEST_F(TemplateEvictionTest, FirstComeSizesGoWhenUnusedForTheIdleTime) {
  TemplateCache cache(root_);
  const std::string pinned = publishFull(cache, key(2, 512));
  const std::string first_come = publishFull(cache, key(1, 384));
  auto r = rules();
  r.idle = std::chrono::seconds(60);
  const auto start = Clock::now();
  EXPECT_TRUE(cache.evictUnused({}, r, start, cache.evictionMark()).empty()) << "a restart aged what it had not seen";
  EXPECT_TRUE(cache.evictUnused({}, r, start + std::chrono::seconds(59), cache.evictionMark()).empty());
  EXPECT_EQ(cache.evictUnused({}, r, start + std::chrono::seconds(61), cache.evictionMark()),
            std::vector<std::string>{first_come});
  EXPECT_TRUE(present(pinned));
  r.idle = std::chrono::seconds(0);  // 0: first-come sizes are kept
  publishFull(cache, key(1, 384));
  EXPECT_TRUE(cache.evictUnused({}, r, start + std::chrono::hours(100), cache.evictionMark()).empty());
}

// A create between finding its template and standing on it keeps that template, and so does
// one that found it after the round's mark (its overlay may be missing from the listing); it
// keeps no other template, and waits for no eviction. Leftovers of a cut-short eviction go,
// builds stay.
TEST_F(TemplateEvictionTest, ACreateKeepsItsTemplateFromFindingItToTheNextRound) {
  TemplateCache cache(root_, 0, {"1x512"});  // 1x384 and 1x448 go once nothing stands on them
  const std::string used = publishFull(cache, key(1, 384));
  const std::string other = publishFull(cache, key(1, 448));
  {
    auto found = cache.ensure(key(1, 384), std::chrono::seconds(1));
    ASSERT_TRUE(found.ok()) << found.error().message;
    EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()), std::vector<std::string>{other})
        << "a create in flight held off the eviction of a template it does not use";
    EXPECT_TRUE(present(used)) << "an eviction removed a template a create is opening";
  }
  // The create is done (its overlay is on disk): a round marked before it began would not have
  // listed that overlay, so the template stays for that round...
  publishFull(cache, key(1, 448));
  const uint64_t mark = cache.evictionMark();
  ASSERT_TRUE(cache.ensure(key(1, 384), std::chrono::seconds(1)).ok());
  std::filesystem::create_directory(root_ + "/.evict-base-0123456789abcdef");
  std::filesystem::create_directory(root_ + "/.build-x");
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), mark), std::vector<std::string>{other});
  EXPECT_TRUE(present(used)) << "a template a create found after the listing began was evicted";
  EXPECT_FALSE(present(".evict-base-0123456789abcdef"));
  EXPECT_TRUE(present(".build-x"));
  // ...and goes in the next, whose listing would have seen any disk on it.
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()), std::vector<std::string>{used});
}

// A create that found its template before a round's mark and made its disk after the listing
// (the listing missed it) keeps the template: its end, after the mark, is what counts.
TEST_F(TemplateEvictionTest, ACreateThatEndsAfterTheMarkKeepsItsTemplate) {
  TemplateCache cache(root_, 0, {"1x512"});
  const std::string used = publishFull(cache, key(1, 384));
  auto found = cache.ensure(key(1, 384), std::chrono::seconds(1));
  ASSERT_TRUE(found.ok()) << found.error().message;
  const uint64_t mark = cache.evictionMark();
  // (the round lists here, before the create's overlay exists)
  found->in_use.reset();  // the overlay is made: the create lets go
  EXPECT_TRUE(cache.evictUnused({}, rules(), Clock::now(), mark).empty())
      << "a template was evicted under a disk the listing missed";
  EXPECT_TRUE(present(used));
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()), std::vector<std::string>{used});
}

// A create never waits for an eviction: uses and rounds only meet for the instant of a rename.
TEST_F(TemplateEvictionTest, CreatesGoOnWhileEvictionsRun) {
  TemplateCache cache(root_, 0, {"1x512"});
  const std::string kept = publishFull(cache, key(1, 512));
  std::atomic<bool> stop{false};
  std::atomic<int> found{0};
  std::thread create([&] {
    while (!stop) found += cache.ensure(key(1, 512), std::chrono::seconds(1)).ok();
  });
  int rounds = 0;
  for (; rounds < 200; ++rounds) {
    publishFull(cache, key(1, 384));
    EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()).size(), 1u)
        << "creates of another size held an eviction off";
  }
  stop = true;
  create.join();
  EXPECT_GT(found, 0);
  EXPECT_TRUE(present(kept));
}

// A damaged meta.json is never rebuilt in place (overlays name the disk by path: a rebuild
// would put other bytes under them); creates are told, and the directory goes once nothing
// stands on it, so the next create builds it anew. A meta.json that cannot be read now (EISDIR
// here; EMFILE or EIO in production) is neither: it stays, and nothing is built.
TEST_F(TemplateEvictionTest, ADamagedTemplateIsNotRebuiltUnderTheDisksOnItAndGoesOnceFree) {
  TemplateCache cache(root_);
  const std::string dir = publishFull(cache, key(1, 384));
  std::ofstream(root_ + "/" + dir + "/meta.json") << "{ damaged";
  auto found = cache.ensure(key(1, 384), std::chrono::seconds(1));
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().reason, "template_damaged") << found.error().message;
  EXPECT_EQ(readSmallFile(root_ + "/" + dir + "/disk.qcow2", 64).value(), "disk") << "rebuilt in place";
  // A disk stands on it: kept. (The refused create is no use: it keeps nothing.)
  EXPECT_TRUE(cache.evictUnused({root_ + "/" + dir + "/disk.qcow2"}, rules(), Clock::now(), 0).empty());
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), 0), std::vector<std::string>{dir});

  const std::string unreadable = publishFull(cache, key(1, 448));
  std::filesystem::remove(root_ + "/" + unreadable + "/meta.json");
  std::filesystem::create_directory(root_ + "/" + unreadable + "/meta.json");
  auto later = cache.ensure(key(1, 448), std::chrono::seconds(1));
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.error().code, ErrorCode::kUnavailable) << later.error().message;
  EXPECT_NE(later.error().reason, "template_damaged");
  EXPECT_TRUE(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()).empty())
      << "a meta.json that could not be read now evicted its template";
  EXPECT_TRUE(present(unreadable));
}

// A recipe file that cannot be looked at now (ELOOP here; EMFILE or EIO in production) is not a
// recipe file that is gone: the template stays for the next round instead of costing a rebuild.
TEST_F(TemplateEvictionTest, ARecipeFileThatCannotBeReadNowKeepsItsTemplate) {
  std::string dir;
  {
    TemplateCache before(root_);
    dir = publishFull(before, key(1, 384));
  }
  std::filesystem::remove(rootfs_);
  std::filesystem::create_symlink(rootfs_, rootfs_);  // stat: ELOOP
  {
    TemplateCache cache(root_);
    EXPECT_TRUE(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()).empty());
    EXPECT_TRUE(present(dir)) << "a transient stat error evicted a template";
  }
  std::filesystem::remove(rootfs_);  // now really gone
  TemplateCache cache(root_);
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()), std::vector<std::string>{dir});
}

// A damaged meta.json (wrong types) neither throws nor keeps the directory forever.
TEST_F(TemplateEvictionTest, ADamagedMetaIsEvictedWithoutThrowing) {
  TemplateCache cache(root_);
  std::filesystem::create_directory(root_ + "/base-00000000000000ff");
  std::ofstream(root_ + "/base-00000000000000ff/meta.json") << R"({"format_version": "1", "vcpus": [], "template": 7})";
  EXPECT_EQ(cache.evictUnused({}, rules(), Clock::now(), cache.evictionMark()),
            std::vector<std::string>{"base-00000000000000ff"});
}

// Retry-After comes from a double cast to int: a rate below ~5e-10/s (which --tenant-requests-per-s
// accepts: Range(0, 1e6)) overflows it (undefined behaviour; INT_MIN on x86, shown as 1 s).
TEST(TenantGateAttack, RetryAfterNeverOverflows) {
  api::TenantGate gate(api::TenantGate::Limits{64, 1e-12, 0});
  auto first = gate.enter("t");
  ASSERT_TRUE(first.admitted());
  auto second = gate.enter("t");
  ASSERT_FALSE(second.admitted());
  EXPECT_EQ(second.refusal(), api::TenantGate::Refusal::kRateLimited);
  EXPECT_GE(second.retryAfterS(), 1);
}

// What holds: a refusal by rate spends no token and takes no running place, and one tenant's
// bucket does not drain another's.
TEST(TenantGateAttack, RefusalsSpendNothingAndBucketsArePerTenant) {
  api::TenantGate gate(api::TenantGate::Limits{64, 1, 2});
  std::vector<api::TenantGate::Ticket> held;
  held.push_back(gate.enter("a"));
  held.push_back(gate.enter("a"));
  ASSERT_TRUE(held[0].admitted() && held[1].admitted());
  for (int i = 0; i < 100; ++i) {
    auto refused = gate.enter("a");
    ASSERT_FALSE(refused.admitted());
    EXPECT_GE(refused.retryAfterS(), 1);
  }
  EXPECT_EQ(gate.inFlight("a"), 2u);
  EXPECT_TRUE(gate.enter("b").admitted());
  EXPECT_EQ(gate.inFlight("b"), 0u);
}

}  // namespace
}  // namespace space
