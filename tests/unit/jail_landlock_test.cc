// The filesystem confinement a gateway puts on itself (jail/landlock.h), applied in a child
// process: what its rules name stays usable for what they allow, and nothing else opens.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>

#include "jail/landlock.h"

namespace space::jail {
namespace {

class FsConfinementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/space-landlock-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    for (const char* dir : {"/rw", "/ro", "/other"}) std::filesystem::create_directory(root_ + dir);
    for (const char* file : {"/ro/f", "/other/g", "/rw/kept"}) {
      FILE* f = std::fopen((root_ + file).c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fputs("x", f);
      std::fclose(f);
    }
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Runs the checks in a child confined to rw/ (read-write) and ro/ (read); its exit code is 0
  // or the number of the first check that failed.
  int confinedChild() {
    pid_t pid = fork();
    if (pid == 0) {
      auto confinement = FsConfinement::prepare({{root_ + "/rw", true}, {root_ + "/ro", false}});
      if (!confinement.ok() || confinement->abi() < 1) _exit(100);
      if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !confinement->apply().ok()) _exit(101);
      _exit(checks());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
  }

  int checks() const {
    auto refused = [](int rc) { return rc == -1 && errno == EACCES; };
    auto opens = [](const std::string& path, int flags) {
      int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0600);
      if (fd >= 0) ::close(fd);
      return fd >= 0 ? 0 : -1;
    };
    const std::string rw = root_ + "/rw", ro = root_ + "/ro", other = root_ + "/other";
    // Its own directory: files made, written, truncated, renamed within it, removed.
    if (opens(rw + "/new", O_WRONLY | O_CREAT | O_TRUNC) != 0) return 1;
    if (::rename((rw + "/new").c_str(), (rw + "/new.1").c_str()) != 0) return 2;
    if (::unlink((rw + "/new.1").c_str()) != 0) return 3;
    if (opens(rw + "/kept", O_RDWR | O_TRUNC) != 0) return 4;
    // But nothing but regular files made there.
    if (!refused(::mkdir((rw + "/d").c_str(), 0700))) return 5;
    if (!refused(::mkfifo((rw + "/fifo").c_str(), 0600))) return 6;
    if (!refused(::symlink("/etc/passwd", (rw + "/link").c_str()))) return 7;
    // Read-only: read, not written, nothing made.
    if (opens(ro + "/f", O_RDONLY) != 0) return 8;
    if (!refused(opens(ro + "/f", O_WRONLY))) return 9;
    if (!refused(opens(ro + "/new", O_WRONLY | O_CREAT))) return 10;
    // Anything else: not read, not made, not a rename's target (a world-writable /tmp with it).
    if (!refused(opens(other + "/g", O_RDONLY))) return 11;
    if (!refused(opens(other + "/new", O_WRONLY | O_CREAT))) return 12;
    if (!refused(opens("/tmp/space-landlock-escape", O_WRONLY | O_CREAT))) return 13;
    if (::rename((rw + "/kept").c_str(), (other + "/kept").c_str()) == 0) return 14;
    if (!refused(opens("/etc/hostname", O_RDONLY))) return 15;
    return 0;
  }

  std::string root_;
};

TEST_F(FsConfinementTest, OnlyTheNamedDirectoriesOpenAndOnlyForWhatTheirRulesAllow) {
  EXPECT_EQ(confinedChild(), 0);
  EXPECT_FALSE(std::filesystem::exists("/tmp/space-landlock-escape"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/other/g"));
}

// A directory that cannot be opened is an error, not a rule quietly left out.
TEST_F(FsConfinementTest, AMissingDirectoryIsAnError) {
  auto confinement = FsConfinement::prepare({{root_ + "/missing", false}});
  ASSERT_FALSE(confinement.ok());
  EXPECT_NE(confinement.error().message.find("missing"), std::string::npos) << confinement.error().message;
}

// A rule for one file reads that file and nothing beside it: not its directory's listing, not
// its siblings, no write. Only a regular file gets one: a rule naming a directory, a link to
// follow or nothing adds nothing (such a path stays closed); one for writing is an error.
TEST_F(FsConfinementTest, AFileRuleReadsThatFileAndNothingBesideIt) {
  ASSERT_EQ(::symlink((root_ + "/other/g").c_str(), (root_ + "/ro/link").c_str()), 0);
  pid_t pid = fork();
  if (pid == 0) {
    auto confinement = FsConfinement::prepare({{root_ + "/other/g", false, true},
                                               {root_ + "/ro", false, true},
                                               {root_ + "/ro/link", false, true},
                                               {root_ + "/gone", false, true}});
    if (!confinement.ok() || confinement->abi() < 1) _exit(100);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !confinement->apply().ok()) _exit(101);
    auto open_rc = [](const std::string& path, int flags) {
      int fd = ::open(path.c_str(), flags | O_CLOEXEC);
      const int error = fd >= 0 ? 0 : errno;
      if (fd >= 0) ::close(fd);
      return error;
    };
    if (open_rc(root_ + "/other/g", O_RDONLY) != 0) _exit(1);
    if (open_rc(root_ + "/other/g", O_WRONLY) != EACCES) _exit(2);
    if (open_rc(root_ + "/other", O_RDONLY | O_DIRECTORY) != EACCES) _exit(3);
    if (open_rc(root_ + "/ro/f", O_RDONLY) != EACCES) _exit(4);
    if (open_rc(root_ + "/ro", O_RDONLY | O_DIRECTORY) != EACCES) _exit(5);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(FsConfinement::prepare({{root_ + "/other/g", true, true}}).ok());
}

}  // namespace
}  // namespace space::jail
