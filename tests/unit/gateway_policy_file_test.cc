// The gateway's policy file (src/gateway/policy_file.h): spaced replaces it by write-temp +
// rename, and the gateway re-reads it when its (device, inode, mtime, size) changes. A broken
// replacement leaves the previous policy in force and is reported once per version; what is not
// a regular file (a FIFO, a directory, a device, through a symlink or not) is refused without
// blocking and without being read, and nothing larger than kMaxPolicyFileBytes is read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

#include "common/fs.h"
#include "gateway/policy_file.h"

namespace space::gateway {
namespace {

constexpr const char* kPolicyGithub = R"({"egress":"policy","allow":["github.com:443"]})";
constexpr const char* kAllow = R"({"egress":"allow"})";
constexpr const char* kDenyPadded = R"({"egress":"deny" })";  // as long as kAllow

// Fails the test (SIGALRM) instead of hanging it when an open or read blocks.
class HangGuard {
 public:
  HangGuard() { alarm(20); }
  ~HangGuard() { alarm(0); }
};

class PolicyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-gw-policy-");
    ASSERT_TRUE(dir.ok());
    dir_ = std::move(dir.value());
    path_ = dir_.path() + "/policy.json";
    replaceFile(kPolicyGithub);
  }

  // What spaced does: a new inode renamed over the old one.
  void replaceFile(const std::string& text) {
    const std::string tmp = path_ + ".tmp";
    writeInPlace(tmp, text);
    ASSERT_EQ(::rename(tmp.c_str(), path_.c_str()), 0) << strerror(errno);
  }

  // What an editor or `cat >` does: the same inode, truncated and rewritten.
  static void writeInPlace(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    ASSERT_TRUE(out) << path;
  }

  static void setMtime(const std::string& path, time_t seconds) {
    timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << strerror(errno);
  }

  static struct stat statOf(const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st;
  }

  PolicyFile loadOrDie() {
    auto file = PolicyFile::load(path_);
    EXPECT_TRUE(file.ok()) << file.error().message;
    return std::move(file.value());
  }

  static void expectNothing(const PolicyFile::Refresh& r) {
    EXPECT_FALSE(r.reloaded);
    EXPECT_FALSE(r.failure.has_value()) << *r.failure;
  }
  static void expectReloaded(const PolicyFile::Refresh& r) {
    EXPECT_TRUE(r.reloaded);
    EXPECT_FALSE(r.failure.has_value()) << *r.failure;
  }
  static void expectFailure(const PolicyFile::Refresh& r, const std::string& part) {
    EXPECT_FALSE(r.reloaded);
    ASSERT_TRUE(r.failure.has_value());
    EXPECT_NE(r.failure->find(part), std::string::npos) << *r.failure;
  }

  TempDir dir_ = TempDir::adopt("");
  std::string path_;
};

TEST_F(PolicyFileTest, LoadReadsTheModeAndTheRules) {
  PolicyFile file = loadOrDie();
  ASSERT_NE(file.current(), nullptr);
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
  ASSERT_EQ(file.current()->allow.size(), 1u);
  EXPECT_EQ(file.current()->allow[0].text, "github.com:443");
}

TEST_F(PolicyFileTest, LoadRefusesWhatIsNotAValidPolicyAndNamesTheFile) {
  for (const char* text : {"", "{not json", R"({"egress":"maybe"})", R"({"egress":"allow","extra":1})", "[]"}) {
    replaceFile(text);
    auto file = PolicyFile::load(path_);
    ASSERT_FALSE(file.ok()) << text;
    EXPECT_NE(file.error().message.find(path_), std::string::npos) << file.error().message;
  }
  auto missing = PolicyFile::load(dir_.path() + "/nothing-here.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("nothing-here.json"), std::string::npos);
}

TEST_F(PolicyFileTest, AnUnchangedFileKeepsTheSamePolicyObject) {
  PolicyFile file = loadOrDie();
  auto before = file.current();
  for (int i = 0; i < 3; ++i) expectNothing(file.refresh());
  EXPECT_EQ(file.current(), before);
}

TEST_F(PolicyFileTest, AFileRenamedOverItIsLoadedEvenWithTheSameSizeAndMtime) {
  writeInPlace(path_, kAllow);
  setMtime(path_, 1700000000);
  PolicyFile file = loadOrDie();
  auto before = file.current();
  const std::string tmp = path_ + ".tmp";
  writeInPlace(tmp, kDenyPadded);
  setMtime(tmp, 1700000000);
  ASSERT_EQ(::rename(tmp.c_str(), path_.c_str()), 0);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kDeny);
  EXPECT_EQ(before->mode, net::EgressMode::kAllow) << "a decision in flight keeps the policy it began with";
  expectNothing(file.refresh());
}

TEST_F(PolicyFileTest, AnInPlaceRewriteWithANewSizeIsLoaded) {
  PolicyFile file = loadOrDie();
  ino_t inode = statOf(path_).st_ino;
  writeInPlace(path_, kAllow);
  ASSERT_EQ(statOf(path_).st_ino, inode);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
}

TEST_F(PolicyFileTest, AnInPlaceRewriteOfTheSameSizeIsLoadedOnceItsMtimeDiffers) {
  writeInPlace(path_, kAllow);
  setMtime(path_, 1700000000);
  PolicyFile file = loadOrDie();
  writeInPlace(path_, kDenyPadded);
  setMtime(path_, 1700000000);  // the same (inode, mtime, size): indistinguishable, not reloaded
  expectNothing(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
  setMtime(path_, 1700000001);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kDeny);
}

TEST_F(PolicyFileTest, ABrokenFileKeepsTheOldPolicyAndIsReportedOncePerVersion) {
  PolicyFile file = loadOrDie();
  auto before = file.current();
  replaceFile("{not json");
  expectFailure(file.refresh(), "not valid JSON");
  for (int i = 0; i < 3; ++i) expectNothing(file.refresh());
  EXPECT_EQ(file.current(), before);
  replaceFile(R"({"egress":"deny","allow":["a.example"]})");  // another broken version
  expectFailure(file.refresh(), "allow rules would be ignored");
  expectNothing(file.refresh());
  EXPECT_EQ(file.current(), before);
  replaceFile(kAllow);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
  expectNothing(file.refresh());
}

TEST_F(PolicyFileTest, AMissingFileIsReportedOnceAndTheOldPolicyStays) {
  PolicyFile file = loadOrDie();
  auto before = file.current();
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  expectFailure(file.refresh(), "cannot stat");
  expectNothing(file.refresh());
  EXPECT_EQ(file.current(), before);
  replaceFile(kAllow);
  expectReloaded(file.refresh());
}

TEST_F(PolicyFileTest, AFailureAfterTheLoadedVersionCameBackIsReportedAgain) {
  // The loaded file goes away, comes back (the same inode, so nothing to reload), and goes away
  // again: that second failure is news to whoever reads the audit log, and used to be swallowed
  // because the first one's record was never cleared.
  PolicyFile file = loadOrDie();
  const std::string keep = dir_.path() + "/kept.json";
  ASSERT_EQ(::link(path_.c_str(), keep.c_str()), 0);
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  expectFailure(file.refresh(), "cannot stat");
  ASSERT_EQ(::link(keep.c_str(), path_.c_str()), 0);
  expectNothing(file.refresh());
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  expectFailure(file.refresh(), "cannot stat");

  // The same with a broken version renamed in, out and in again.
  ASSERT_EQ(::link(keep.c_str(), path_.c_str()), 0);
  expectNothing(file.refresh());
  const std::string broken = dir_.path() + "/broken.json";
  writeInPlace(broken, "{not json");
  const std::string broken_link = dir_.path() + "/broken-link.json";
  ASSERT_EQ(::link(broken.c_str(), broken_link.c_str()), 0);
  ASSERT_EQ(::rename(broken_link.c_str(), path_.c_str()), 0);
  expectFailure(file.refresh(), "not valid JSON");
  ASSERT_EQ(::link(keep.c_str(), (path_ + ".tmp").c_str()), 0);
  ASSERT_EQ(::rename((path_ + ".tmp").c_str(), path_.c_str()), 0);
  expectNothing(file.refresh());
  ASSERT_EQ(::link(broken.c_str(), broken_link.c_str()), 0);
  ASSERT_EQ(::rename(broken_link.c_str(), path_.c_str()), 0);
  expectFailure(file.refresh(), "not valid JSON");
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
}

TEST_F(PolicyFileTest, AFileOverTheSizeLimitIsRefusedAndOneAtTheLimitIsRead) {
  std::string at_limit = kAllow;
  at_limit.resize(kMaxPolicyFileBytes, ' ');
  replaceFile(at_limit);
  PolicyFile file = loadOrDie();
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);

  std::string over = kDenyPadded;
  over.resize(kMaxPolicyFileBytes + 1, ' ');
  replaceFile(over);
  auto refused = PolicyFile::load(path_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("larger than"), std::string::npos) << refused.error().message;
  expectFailure(file.refresh(), "larger than");
  expectNothing(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
}

TEST_F(PolicyFileTest, AFileWhoseSizeLiesIsReadOnlyUpToTheLimit) {
  // procfs files say they are empty: the read itself must stop, not trust st_size.
  struct stat st {};
  if (::stat("/proc/kallsyms", &st) != 0 || !S_ISREG(st.st_mode)) GTEST_SKIP() << "no /proc/kallsyms";
  PolicyFile file = loadOrDie();
  ASSERT_EQ(::symlink("/proc/kallsyms", (path_ + ".tmp").c_str()), 0);
  ASSERT_EQ(::rename((path_ + ".tmp").c_str(), path_.c_str()), 0);
  HangGuard guard;
  auto refresh = file.refresh();
  ASSERT_TRUE(refresh.failure.has_value());
  // Either it grew past the limit or (a small kernel) it is not JSON: never accepted.
  EXPECT_TRUE(refresh.failure->find("grew past") != std::string::npos ||
              refresh.failure->find("not valid JSON") != std::string::npos)
      << *refresh.failure;
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
}

TEST_F(PolicyFileTest, AFifoNeitherBlocksNorIsRead) {
  PolicyFile file = loadOrDie();
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  HangGuard guard;
  // No writer at all: a blocking open would wait for one forever.
  ASSERT_EQ(::rename(fifo.c_str(), path_.c_str()), 0);
  expectFailure(file.refresh(), "not a regular file");
  expectNothing(file.refresh());
  auto load = PolicyFile::load(path_);
  ASSERT_FALSE(load.ok());
  EXPECT_NE(load.error().message.find("not a regular file"), std::string::npos) << load.error().message;

  // A writer with a valid policy waiting in the pipe: the bytes are still there afterwards.
  int end = ::open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(end, 0);
  ASSERT_EQ(::write(end, kAllow, strlen(kAllow)), static_cast<ssize_t>(strlen(kAllow)));
  ASSERT_FALSE(PolicyFile::load(path_).ok());
  char buf[64];
  EXPECT_EQ(::read(end, buf, sizeof buf), static_cast<ssize_t>(strlen(kAllow)));
  ::close(end);
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
}

TEST_F(PolicyFileTest, ADirectoryIsRefusedOnceAndTheOldPolicyStays) {
  PolicyFile file = loadOrDie();
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  ASSERT_EQ(::mkdir(path_.c_str(), 0700), 0);
  expectFailure(file.refresh(), "not a regular file");
  expectNothing(file.refresh());
  EXPECT_FALSE(PolicyFile::load(path_).ok());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
  ASSERT_EQ(::rmdir(path_.c_str()), 0);
  replaceFile(kAllow);
  expectReloaded(file.refresh());
}

TEST_F(PolicyFileTest, ASymlinkIsFollowedAndRetargetingItReloads) {
  const std::string a = dir_.path() + "/a.json", b = dir_.path() + "/b.json";
  writeInPlace(a, kAllow);
  writeInPlace(b, kDenyPadded);
  ASSERT_EQ(::unlink(path_.c_str()), 0);
  ASSERT_EQ(::symlink("a.json", path_.c_str()), 0);
  PolicyFile file = loadOrDie();
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
  expectNothing(file.refresh());
  // Retargeted atomically, as one would publish by symlink.
  ASSERT_EQ(::symlink("b.json", (path_ + ".tmp").c_str()), 0);
  ASSERT_EQ(::rename((path_ + ".tmp").c_str(), path_.c_str()), 0);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kDeny);
  // The target rewritten in place is a new version too.
  writeInPlace(b, kPolicyGithub);
  expectReloaded(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
}

TEST_F(PolicyFileTest, ASymlinkToAFifoADeviceNothingOrItselfIsRefusedOnce) {
  PolicyFile file = loadOrDie();
  const std::string fifo = dir_.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  HangGuard guard;
  auto pointAt = [&](const std::string& target) {
    ASSERT_EQ(::symlink(target.c_str(), (path_ + ".tmp").c_str()), 0);
    ASSERT_EQ(::rename((path_ + ".tmp").c_str(), path_.c_str()), 0);
  };
  pointAt(fifo);
  expectFailure(file.refresh(), "not a regular file");
  expectNothing(file.refresh());
  pointAt("/dev/zero");  // read, it would never end
  expectFailure(file.refresh(), "not a regular file");
  expectNothing(file.refresh());
  pointAt(dir_.path() + "/absent.json");
  expectFailure(file.refresh(), "cannot stat");
  expectNothing(file.refresh());
  const std::string good = dir_.path() + "/good.json";
  writeInPlace(good, kAllow);
  pointAt(good);
  expectReloaded(file.refresh());
  pointAt(path_);  // a loop
  expectFailure(file.refresh(), "cannot stat");
  expectNothing(file.refresh());
  EXPECT_EQ(file.current()->mode, net::EgressMode::kAllow);
}

TEST_F(PolicyFileTest, DeeplyNestedJsonIsRefusedWithoutExhaustingTheStack) {
  PolicyFile file = loadOrDie();
  // 200,000 levels: far past what a recursive parser or destructor survives on an 8 MiB stack.
  constexpr size_t kDepth = 200000;
  std::string nested(kDepth, '[');
  nested.append(kDepth, ']');
  replaceFile(nested);
  expectFailure(file.refresh(), "must be a JSON object");
  replaceFile(std::string(kDepth, '['));
  expectFailure(file.refresh(), "not valid JSON");
  EXPECT_EQ(file.current()->mode, net::EgressMode::kPolicy);
}

}  // namespace
}  // namespace space::gateway
