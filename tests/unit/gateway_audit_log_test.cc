// The gateway's audit log (src/gateway/audit_log.h): one complete JSON object per line, and a
// file bounded however many entries a guest provokes: past max_bytes its lines move to FILE.1
// (replacing the previous ones) through descriptors opened once, so rotation needs no right on
// the directory (the gateway has dropped privileges and may make no file); where FILE.1
// cannot be a regular file, FILE is truncated in place. Tests that need another user or a
// resource limit run in a forked child, so the test process keeps its own.
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/fs.h"
#include "gateway/audit_log.h"

namespace space::gateway {
namespace {

constexpr uint64_t kMax = 1024;  // the smallest --audit-max-bytes the gateway accepts

nlohmann::json entry(int seq, size_t pad = 60) {
  return {{"kind", "test"}, {"seq", seq}, {"pad", std::string(pad, 'x')}};
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

uint64_t fileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The file's entries, each line checked to be one complete JSON object with a time. A missing
// file has none.
std::vector<nlohmann::json> readEntries(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  if (!all.empty()) {
    EXPECT_EQ(all.back(), '\n') << path << " ends in the middle of a line";
  }
  std::istringstream lines(all);
  std::string line;
  while (std::getline(lines, line)) {
    auto json = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(json.is_object()) << path << ": not a complete JSON object: " << line.substr(0, 200);
    if (!json.is_object()) continue;
    EXPECT_TRUE(json.contains("time_ms") && json["time_ms"].is_number_integer()) << line.substr(0, 200);
    out.push_back(std::move(json));
  }
  return out;
}

std::vector<int> seqs(const std::vector<nlohmann::json>& entries) {
  std::vector<int> out;
  for (const auto& e : entries) out.push_back(e.value("seq", -1));
  return out;
}

// Runs `body` in a forked child; its return value is the child's exit status (-1: killed).
int inChild(const std::function<int()>& body) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -2;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class AuditLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::create("/tmp", "space-gw-audit-");
    ASSERT_TRUE(dir.ok());
    dir_ = std::move(dir.value());
    path_ = dir_.path() + "/audit.jsonl";
    old_ = path_ + ".1";
  }

  AuditLog openOrDie(uint64_t max_bytes = kMax) {
    auto log = AuditLog::open(path_, max_bytes);
    EXPECT_TRUE(log.ok()) << log.error().message;
    return std::move(log.value());
  }

  // In a child: the directory becomes one we may not write in, as for the gateway once it has
  // dropped privileges (as root, by becoming nobody: root writes anywhere). 0 or a failure code.
  int closeTheDirectoryToUs() const {
    if (geteuid() == 0) {
      if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
        return 10;
    } else if (::chmod(dir_.path().c_str(), 0555) != 0) {
      return 11;
    }
    return 0;
  }

  TempDir dir_ = TempDir::adopt("");
  std::string path_, old_;
};

TEST_F(AuditLogTest, EachWriteIsOneCompleteJsonLineWithItsTime) {
  AuditLog log = openOrDie(1 << 20);
  EXPECT_EQ(log.size(), 0u);
  for (int i = 0; i < 3; ++i) log.write(entry(i));
  auto entries = readEntries(path_);
  EXPECT_EQ(seqs(entries), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(entries[0]["kind"], "test");
  EXPECT_GT(entries[0]["time_ms"].get<int64_t>(), int64_t{1600000000000});
  EXPECT_EQ(log.size(), fileSize(path_));
}

TEST_F(AuditLogTest, OpenAppendsToWhatIsThereAndCountsIt) {
  {
    AuditLog first = openOrDie(1 << 20);
    first.write(entry(0));
  }
  uint64_t before = fileSize(path_);
  AuditLog log = openOrDie(1 << 20);
  EXPECT_EQ(log.size(), before);
  log.write(entry(1));
  EXPECT_EQ(seqs(readEntries(path_)), (std::vector<int>{0, 1}));
  EXPECT_EQ(log.size(), fileSize(path_));
}

TEST_F(AuditLogTest, ItRotatesToDotOneBeforeALineWouldPassMaxBytesAndLosesNoLine) {
  AuditLog log = openOrDie();
  EXPECT_TRUE(exists(old_)) << "FILE.1 is made at the open: rotation needs no right on the directory";
  int seq = 0;
  while (fileSize(old_) == 0) {
    ASSERT_LT(seq, 100) << "never rotated";
    log.write(entry(seq++));
    EXPECT_LE(fileSize(path_), kMax);
  }
  auto rotated = readEntries(old_);
  auto current = readEntries(path_);
  EXPECT_LE(fileSize(old_), kMax);
  EXPECT_EQ(current.size(), 1u) << "the line that did not fit starts the new file";
  std::vector<int> all = seqs(rotated);
  for (int s : seqs(current)) all.push_back(s);
  ASSERT_EQ(static_cast<int>(all.size()), seq);
  for (int i = 0; i < seq; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
  EXPECT_EQ(log.size(), fileSize(path_));
}

TEST_F(AuditLogTest, EachRotationReplacesThePreviousDotOneAndBothStayBounded) {
  // A guest provoking denials in a loop: 5000 entries, about 500 KiB, into 2 KiB of files.
  AuditLog log = openOrDie();
  for (int seq = 0; seq < 5000; ++seq) {
    log.write(entry(seq));
    if (seq % 97 == 0) {
      ASSERT_LE(fileSize(path_), kMax) << seq;
      ASSERT_LE(fileSize(old_), kMax) << seq;
    }
  }
  auto rotated = seqs(readEntries(old_));
  auto current = seqs(readEntries(path_));
  ASSERT_FALSE(rotated.empty());
  ASSERT_FALSE(current.empty());
  EXPECT_EQ(current.back(), 4999);
  EXPECT_EQ(rotated.back() + 1, current.front()) << "FILE.1 is the generation just before FILE";
  EXPECT_GT(rotated.front(), 4900) << "older generations are gone";
}

TEST_F(AuditLogTest, ALineLargerThanMaxBytesIsWrittenWholeAndRotatedAwayByTheNext) {
  // The file holds at most one such line: the bound is max(max_bytes, one line).
  AuditLog log = openOrDie();
  log.write(entry(0, 5000));
  EXPECT_EQ(seqs(readEntries(path_)), std::vector<int>{0});
  log.write(entry(1));
  EXPECT_EQ(seqs(readEntries(old_)), std::vector<int>{0});
  EXPECT_EQ(seqs(readEntries(path_)), std::vector<int>{1});
  log.write(entry(2, 5000));  // rotates the small one out first
  EXPECT_EQ(seqs(readEntries(old_)), std::vector<int>{1});
  EXPECT_EQ(seqs(readEntries(path_)), std::vector<int>{2});
  log.write(entry(3, 5000));
  EXPECT_EQ(seqs(readEntries(old_)), std::vector<int>{2});
  EXPECT_EQ(seqs(readEntries(path_)), std::vector<int>{3});
  EXPECT_LT(fileSize(path_), 5200u);
}

TEST_F(AuditLogTest, BytesThatAreNotUtf8StillMakeACompleteLine) {
  AuditLog log = openOrDie();
  const char raw[] = "ev\xff\xfe\xc3il\x00.example";  // a NUL, a stray byte, a cut sequence
  log.write({{"kind", "dns"}, {"seq", 0}, {"name", std::string(raw, sizeof raw - 1)}});
  log.write({{"kind", "dns"}, {"seq", 1}, {"name", "\"quoted\"\n{\"kind\":\"forged\"}"}});
  auto entries = readEntries(path_);
  ASSERT_EQ(seqs(entries), (std::vector<int>{0, 1}));
  EXPECT_EQ(entries[1]["name"], "\"quoted\"\n{\"kind\":\"forged\"}") << "a newline in a value cannot forge a line";
}

TEST_F(AuditLogTest, ASymlinkOrASecondNameAtEitherPathIsReplacedAndNeverWrittenThrough) {
  // What an earlier gateway, which could write its directory, may have left there: a link to a
  // file root may write, or FILE.1 as a second name of FILE (whose rotation would then empty
  // FILE's history at every turn).
  const std::string victim = dir_.path() + "/victim";
  std::ofstream(victim) << "keep\n";
  ASSERT_EQ(::symlink(victim.c_str(), path_.c_str()), 0);
  ASSERT_EQ(::link(victim.c_str(), old_.c_str()), 0);
  AuditLog log = openOrDie();
  for (int seq = 0; seq < 30; ++seq) log.write(entry(seq));
  EXPECT_EQ(fileSize(victim), 5u);
  for (const std::string& path : {path_, old_}) {
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode) && st.st_nlink == 1) << path;
  }
  auto all = seqs(readEntries(old_));
  ASSERT_FALSE(all.empty());
  for (int seq : seqs(readEntries(path_))) all.push_back(seq);
  EXPECT_EQ(all.back(), 29);
}

TEST_F(AuditLogTest, ADirectoryAtEitherPathIsReplaced) {
  for (const std::string& path : {path_, old_}) {
    ASSERT_EQ(::mkdir(path.c_str(), 0700), 0);
    ASSERT_EQ(::symlink((dir_.path() + "/victim").c_str(), (path + "/link").c_str()), 0);
  }
  std::ofstream(dir_.path() + "/victim") << "keep\n";
  AuditLog log = openOrDie();
  for (int seq = 0; seq < 30; ++seq) log.write(entry(seq));
  EXPECT_EQ(fileSize(dir_.path() + "/victim"), 5u) << "a link inside is removed, not followed";
  EXPECT_FALSE(seqs(readEntries(old_)).empty());
  EXPECT_EQ(seqs(readEntries(path_)).back(), 29);
}

TEST_F(AuditLogTest, RotationReplacesASymlinkAtDotOneAndNeverWritesThroughIt) {
  const std::string victim = dir_.path() + "/victim";
  std::ofstream(victim) << "keep\n";
  ASSERT_EQ(::symlink(victim.c_str(), old_.c_str()), 0);
  AuditLog log = openOrDie();
  for (int seq = 0; seq < 30; ++seq) log.write(entry(seq));
  struct stat st {};
  ASSERT_EQ(::lstat(old_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(fileSize(victim), 5u);
}

TEST_F(AuditLogTest, WhenDotOneCannotBeMadeTheFileIsTruncatedInstead) {
  // Opened by a user that may write FILE but not make FILE.1 in the directory (root could).
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  std::ofstream(path_) << "";
  ASSERT_EQ(::chmod(path_.c_str(), 0666), 0);
  int status = inChild([&]() -> int {
    if (int failed = closeTheDirectoryToUs(); failed != 0) return failed;
    auto opened = AuditLog::open(path_, kMax);
    if (!opened.ok()) return 12;
    for (int seq = 0; seq < 100; ++seq) {
      opened->write(entry(seq));
      if (opened->size() > kMax) return 13;
    }
    return 0;
  });
  ::chmod(dir_.path().c_str(), 0700);
  ASSERT_EQ(status, 0);
  EXPECT_FALSE(exists(old_));
  EXPECT_LE(fileSize(path_), kMax);
  auto current = seqs(readEntries(path_));
  ASSERT_FALSE(current.empty());
  EXPECT_EQ(current.back(), 99);
}

TEST_F(AuditLogTest, AFifoAtDotOneDoesNotBlockTheOpen) {
  ASSERT_EQ(::mkfifo(old_.c_str(), 0600), 0);
  AuditLog log = openOrDie();  // would hang (no reader) without O_NONBLOCK
  for (int seq = 0; seq < 30; ++seq) log.write(entry(seq));
  EXPECT_LE(fileSize(path_), kMax);
  EXPECT_EQ(seqs(readEntries(path_)).back(), 29);
}

TEST_F(AuditLogTest, RotationKeepsTheHistoryWhereTheDirectoryIsClosedToTheWriterAndMakesNoFile) {
  // As in the gateway: opened while privileged, written after dropping to a user that may not
  // write in the directory (root could write there anyway, hence the child). Rotation used to
  // rename, which the gateway's user cannot: it lost the history, or, given the directory,
  // could make files there without end.
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  AuditLog log = openOrDie();
  int status = inChild([&]() -> int {
    if (int failed = closeTheDirectoryToUs(); failed != 0) return failed;
    if (::access(dir_.path().c_str(), W_OK) == 0) return 12;  // the directory is still writable
    for (int seq = 0; seq < 100; ++seq) {
      log.write(entry(seq));
      if (log.size() > kMax) return 13;
    }
    return 0;
  });
  ::chmod(dir_.path().c_str(), 0700);
  ASSERT_EQ(status, 0);
  EXPECT_LE(fileSize(path_), kMax);
  EXPECT_LE(fileSize(old_), kMax);
  std::vector<int> all = seqs(readEntries(old_));
  ASSERT_FALSE(all.empty()) << "the rotated lines were kept";
  for (int seq : seqs(readEntries(path_))) all.push_back(seq);
  ASSERT_EQ(all.back(), 99);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_EQ(all[i], all[i - 1] + 1) << "FILE.1 then FILE, no line lost";
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 2u) << "FILE and FILE.1, nothing else";
}

TEST_F(AuditLogTest, AWriteCutShortByAFullDiskLeavesNoPartialLine) {
  // A full disk (here RLIMIT_FSIZE, which fails writes the same way) cuts a line in the middle;
  // the reader (SandboxManager::networkLog) drops lines that are not JSON, so a partial line
  // left in the file used to cost the next, complete entry too, glued to it.
  AuditLog log = openOrDie(1 << 20);
  log.write(entry(0));
  const uint64_t first = log.size();
  int status = inChild([&]() -> int {
    signal(SIGXFSZ, SIG_IGN);
    rlimit saved{};
    if (getrlimit(RLIMIT_FSIZE, &saved) != 0) return 10;
    rlimit cut{first + 20, saved.rlim_max};
    if (setrlimit(RLIMIT_FSIZE, &cut) != 0) return 11;
    log.write(entry(1));  // 20 bytes fit, then EFBIG
    if (log.size() != first) return 12;
    if (setrlimit(RLIMIT_FSIZE, &saved) != 0) return 13;
    log.write(entry(2));
    return 0;
  });
  ASSERT_EQ(status, 0);
  EXPECT_EQ(seqs(readEntries(path_)), (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace space::gateway
