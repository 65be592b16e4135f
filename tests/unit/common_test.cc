#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/fs.h"
#include "common/log.h"
#include "common/process.h"
#include "common/unix_socket.h"

namespace space {
namespace {

using std::chrono::milliseconds;

TEST(ChildProcess, ReportsExitCode) {
  auto p = ChildProcess::spawn({"sh", "-c", "exit 7"}, {});
  ASSERT_TRUE(p.ok()) << p.error().message;
  auto s = p->waitFor(milliseconds(5000));
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->signaled);
  EXPECT_EQ(s->exit_code, 7);
}

TEST(ChildProcess, TerminateEscalatesToKill) {
  auto p = ChildProcess::spawn({"sh", "-c", "trap '' TERM; sleep 30"}, {});
  ASSERT_TRUE(p.ok());
  std::this_thread::sleep_for(milliseconds(100));  // let the shell install its trap
  auto s = p->terminate(milliseconds(200));
  EXPECT_TRUE(s.signaled);
  EXPECT_EQ(s.signal, SIGKILL);
  EXPECT_TRUE(p->reaped());
}

TEST(ChildProcess, DestructorKillsAndReaps) {
  pid_t pid;
  {
    auto p = ChildProcess::spawn({"sleep", "30"}, {});
    ASSERT_TRUE(p.ok());
    pid = p->pid();
  }
  EXPECT_NE(kill(pid, 0), 0);  // gone, not a zombie of ours
}

TEST(ChildProcess, MissingProgramIsAnError) {
  auto p = ChildProcess::spawn({"/nonexistent/program"}, {});
  EXPECT_FALSE(p.ok());
}

TEST(ChildProcess, WritesStdoutToFile) {
  auto dir = TempDir::create(testing::TempDir(), "proc-");
  ASSERT_TRUE(dir.ok());
  std::string out = dir->path() + "/out.log";
  auto p = ChildProcess::spawn({"sh", "-c", "echo hello; echo oops >&2"}, SpawnOptions{out, "", true});
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->waitFor(milliseconds(5000)));
  auto text = readSmallFile(out, 1024);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text.value(), "hello\noops\n");
}

TEST(Fs, WriteFileAtomicReplacesWholeFile) {
  auto dir = TempDir::create(testing::TempDir(), "fs-");
  ASSERT_TRUE(dir.ok());
  std::string path = dir->path() + "/f";
  ASSERT_TRUE(writeFileAtomic(path, "first version, long").ok());
  ASSERT_TRUE(writeFileAtomic(path, "second", 0600).ok());
  EXPECT_EQ(readSmallFile(path, 100).value(), "second");
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  // No temp files left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir->path()), {}), 1);
}

TEST(Fs, AnImageCacheEntryHeldIsNotPrunedUntilLetGo) {
  auto dir = TempDir::create("/tmp", "space-cache-entry-");
  ASSERT_TRUE(dir.ok());
  const std::string entry = dir->path() + "/qemu-abc", manifest = entry + "/manifest.json";
  std::filesystem::create_directory(entry);
  EXPECT_FALSE(holdImageCacheEntry(entry + "/qemu-system-x86_64").valid());  // no manifest: not an entry
  ASSERT_TRUE(writeFileAtomic(manifest, "{}\n", 0644).ok());
  // What images/lib.sh's prune asks before removing an entry.
  const std::string prune_may = "flock -n -x " + manifest + " true";
  {
    UniqueFd held = holdImageCacheEntry(entry + "/qemu-system-x86_64");
    ASSERT_TRUE(held.valid());
    UniqueFd again = holdImageCacheEntry(entry + "/other-file");  // shared: many daemons may hold it
    EXPECT_TRUE(again.valid());
    EXPECT_NE(std::system(prune_may.c_str()), 0);
  }
  EXPECT_EQ(std::system(prune_may.c_str()), 0);
}

TEST(Fs, WriteFileAtomicIntoMissingDirFailsCleanly) {
  auto st = writeFileAtomic("/nonexistent-dir/f", "x");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kInternal);
}

// The temp file must not leak into a child started while it is open (a QEMU, a helper).
TEST(Fs, WriteFileAtomicTempFileIsCloseOnExec) {
  // Every descriptor this process opens from here on is checked at the rename: none lacks
  // FD_CLOEXEC. writeFileAtomic opens only its temp file and the directory.
  auto dir = TempDir::create("/tmp", "space-atomic-");
  ASSERT_TRUE(dir.ok());
  int probe = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ::close(probe);  // the temp file will get this number (the lowest free one)
  std::atomic<bool> stop{false};
  std::atomic<bool> leaked{false};
  std::thread watcher([&] {
    while (!stop) {
      int flags = fcntl(probe, F_GETFD);
      if (flags >= 0 && !(flags & FD_CLOEXEC)) leaked = true;
    }
  });
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(writeFileAtomic(dir->path() + "/f", std::string(1 << 16, 'x'), 0600).ok());
  stop = true;
  watcher.join();
  EXPECT_FALSE(leaked.load());
}

// Text logs write control characters as \xNN: a guest's file name or error text with a newline
// or a terminal escape cannot forge a log line.
TEST(Logging, TextLogsEscapeControlCharacters) {
  auto dir = TempDir::create("/tmp", "space-log-");
  ASSERT_TRUE(dir.ok());
  const std::string file = dir->path() + "/stderr";
  int saved = ::dup(2);
  int out = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(out, 0);
  ::dup2(out, 2);
  ::close(out);
  ASSERT_TRUE(initLogging("info", false).ok());
  spdlog::info("guest said: {}",
               "ok\n2026-12-01 00:00:00.000 error forged\x1b[2J\x7f\xc2\x9b"
               "2J");
  spdlog::default_logger()->flush();
  ::dup2(saved, 2);
  ::close(saved);
  auto text = readSmallFile(file, 4096);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("guest said: ok\\x0a2026-12-01 00:00:00.000 error forged\\x1b[2J\\x7f\\xc2\\x9b2J\n"),
            std::string::npos)
      << *text;
  EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 1);
}

TEST(Fs, ReadFileTailAndLimits) {
  auto dir = TempDir::create(testing::TempDir(), "fs-");
  ASSERT_TRUE(dir.ok());
  std::string path = dir->path() + "/f";
  ASSERT_TRUE(writeFileAtomic(path, "0123456789").ok());
  EXPECT_EQ(readFileTail(path, 4).value(), "6789");
  EXPECT_EQ(readFileTail(path, 100).value(), "0123456789");
  auto big = readSmallFile(path, 5);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(readSmallFile(dir->path() + "/missing", 5).error().code, ErrorCode::kNotFound);
}

// A run directory is a jailed QEMU's to write: a link or a FIFO planted there is never read
// through (the host file stays unread; the reader does not block).
TEST(Fs, ReadFileTailRefusesLinksAndFifos) {
  auto dir = TempDir::create(testing::TempDir(), "fs-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/host-secret", "secret").ok());
  ASSERT_EQ(::symlink((dir->path() + "/host-secret").c_str(), (dir->path() + "/console.log").c_str()), 0);
  auto linked = readFileTail(dir->path() + "/console.log", 100);
  ASSERT_FALSE(linked.ok());
  EXPECT_EQ(linked.error().message.find("secret\n"), std::string::npos);
  ASSERT_EQ(::mkfifo((dir->path() + "/fifo").c_str(), 0600), 0);
  EXPECT_FALSE(readFileTail(dir->path() + "/fifo", 100).ok());
}

// A spawned child's log is never opened through a link (it would append to the host file).
TEST(ChildProcess, OutputIsNeverWrittenThroughALink) {
  auto dir = TempDir::create(testing::TempDir(), "proc-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/host-file", "untouched").ok());
  ASSERT_EQ(::symlink((dir->path() + "/host-file").c_str(), (dir->path() + "/qemu.log").c_str()), 0);
  for (bool pid_namespace : {false, true}) {
    SpawnOptions options{dir->path() + "/qemu.log", "", true};
    options.new_pid_namespace = pid_namespace;
    auto child = ChildProcess::spawn({"/bin/echo", "written"}, options);
    if (child.ok()) {
      auto done = child->waitFor(milliseconds(5000));
      ASSERT_TRUE(done.has_value());
      EXPECT_NE(done->exit_code, 0);
    }
    EXPECT_EQ(readSmallFile(dir->path() + "/host-file", 100).value(), "untouched");
  }
}

// In a PID namespace of its own, the child is pid 1 there and sees no other process; here it
// has its ordinary pid, which the handle holds.
TEST(ChildProcess, ANewPidNamespaceShowsTheChildAsPidOne) {
  auto dir = TempDir::create(testing::TempDir(), "proc-");
  ASSERT_TRUE(dir.ok());
  SpawnOptions options{dir->path() + "/out", "", true};
  options.new_pid_namespace = true;
  auto child = ChildProcess::spawn({"/bin/sh", "-c", "echo $$; kill -0 " + std::to_string(getpid())}, options);
  ASSERT_TRUE(child.ok()) << child.error().message;
  EXPECT_GT(child->pid(), 1);
  auto done = child->waitFor(milliseconds(5000));
  ASSERT_TRUE(done.has_value());
  EXPECT_NE(done->exit_code, 0);  // kill -0 of our pid: no such process there
  auto out = readSmallFile(dir->path() + "/out", 4096);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->substr(0, 2), "1\n") << out.value();
  auto missing = ChildProcess::spawn({"/no/such/program"}, options);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("No such file"), std::string::npos) << missing.error().message;
  EXPECT_FALSE(ChildProcess::spawn({"sh", "-c", "true"}, options).ok());  // a path, not a name
}

// A log with a second name (in a run directory: a frozen disk layer renamed there) is refused.
TEST(ChildProcess, OutputIsNeverWrittenIntoAFileWithAnotherName) {
  auto dir = TempDir::create(testing::TempDir(), "proc-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/layer", "layer bytes").ok());
  ASSERT_EQ(::link((dir->path() + "/layer").c_str(), (dir->path() + "/qemu.log").c_str()), 0);
  auto child = ChildProcess::spawn({"/bin/echo", "written"}, SpawnOptions{dir->path() + "/qemu.log", "", true});
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.error().message.find("of one name"), std::string::npos) << child.error().message;
  EXPECT_EQ(readSmallFile(dir->path() + "/layer", 64).value(), "layer bytes");
}

// Descriptors passed onto each other's numbers arrive as asked (each moved from a copy above
// every number passed), and a number between passed ones is not inherited.
TEST(ChildProcess, PassedDescriptorsArriveAtTheirNumbersAndNothingBetween) {
  auto dir = TempDir::create(testing::TempDir(), "proc-");
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/a", "A").ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/b", "B").ok());
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/gap", "gap").ok());
  // "a" at 41 goes to 40 and "b" at 40 goes to 41: moved in order, 41 would be "a" twice.
  UniqueFd a(::open((dir->path() + "/a").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd b(::open((dir->path() + "/b").c_str(), O_RDONLY | O_CLOEXEC));
  UniqueFd gap(::open((dir->path() + "/gap").c_str(), O_RDONLY));  // not CLOEXEC, at 42
  ASSERT_TRUE(a.valid() && b.valid() && gap.valid());
  ASSERT_EQ(::dup3(a.get(), 41, O_CLOEXEC), 41);
  ASSERT_EQ(::dup3(b.get(), 40, O_CLOEXEC), 40);
  ASSERT_EQ(::dup2(gap.get(), 42), 42);
  for (bool pid_namespace : {false, true}) {
    SpawnOptions options{dir->path() + "/out", "", true};
    options.new_pid_namespace = pid_namespace;
    options.pass_fds = {{41, 40}, {40, 41}, {40, 43}};
    auto child = ChildProcess::spawn(
        {"/bin/sh", "-c", "cd /proc/self/fd && cat 40 41 43; cat 42 2>/dev/null || echo ' no 42'"}, options);
    ASSERT_TRUE(child.ok()) << child.error().message;
    ASSERT_TRUE(child->waitFor(milliseconds(5000)).has_value());
    auto out = readSmallFile(dir->path() + "/out", 4096);
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(out->substr(0, 3), "ABB") << pid_namespace << ": " << out.value();
    EXPECT_NE(out->find(" no 42"), std::string::npos) << pid_namespace << ": " << out.value();
    std::filesystem::remove(dir->path() + "/out");
  }
  for (int fd : {40, 41, 42}) ::close(fd);
}

// Allocated bytes, not sizes: a sparse file counts what it holds; links are not followed.
TEST(Fs, AllocatedBytesUnderCountsBlocksNotSizes) {
  auto dir = TempDir::create(testing::TempDir(), "fs-");
  ASSERT_TRUE(dir.ok());
  const std::string root = dir->path() + "/tree";
  std::filesystem::create_directories(root + "/sub");
  const uint64_t empty = allocatedBytesUnder(root);
  ASSERT_TRUE(writeFileAtomic(root + "/sub/data", std::string(1 << 20, 'x')).ok());
  UniqueFd sparse(::open((root + "/sparse").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
  ASSERT_TRUE(sparse.valid());
  ASSERT_EQ(::ftruncate(sparse.get(), 1LL << 30), 0);  // 1 GiB long, nothing in it
  std::filesystem::create_directory_symlink("/usr", root + "/link");
  const uint64_t full = allocatedBytesUnder(root);
  EXPECT_GE(full - empty, 1u << 20);
  EXPECT_LT(full - empty, (1u << 20) + (256u << 10));  // neither the sparse length nor /usr
  EXPECT_EQ(allocatedBytesUnder(root + "/missing"), 0u);
}

// A socket nobody listens on any more (its listener closed) refuses; connectUnix would retry
// that until its deadline, as for a peer still starting, unless the peer's pidfd says it exited.
TEST(UnixSocket, ConnectGivesUpAtOnceWhenThePeerThatWouldListenHasExited) {
  auto dir = TempDir::create(std::filesystem::temp_directory_path().string(), "space-connect-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir->path() + "/gone.sock";
  {
    auto closed = listenUnix(path, 1);
    ASSERT_TRUE(closed.ok());
  }  // bound, then no listener
  auto peer = ChildProcess::spawn({"/bin/sh", "-c", "sleep 0.3"}, SpawnOptions{});
  ASSERT_TRUE(peer.ok());
  auto started = std::chrono::steady_clock::now();
  auto fd = connectUnix(path, started + std::chrono::seconds(20), peer->pidfd());
  auto took = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ErrorCode::kUnavailable) << fd.error().message;
  EXPECT_NE(fd.error().message.find("the process that would listen has exited"), std::string::npos)
      << fd.error().message;
  EXPECT_GE(took, milliseconds(250));  // it waited while the peer ran
  EXPECT_LT(took, std::chrono::seconds(3));
  // Without a peer to watch: until the deadline.
  started = std::chrono::steady_clock::now();
  fd = connectUnix(path, started + milliseconds(300));
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(300));
}

TEST(Fs, TempDirRemovesContents) {
  std::string path;
  {
    auto dir = TempDir::create(testing::TempDir(), "fs-");
    ASSERT_TRUE(dir.ok());
    path = dir->path();
    std::filesystem::create_directories(path + "/a/b");
    ASSERT_TRUE(writeFileAtomic(path + "/a/b/c", "x").ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

class LineReaderTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds_), 0); }
  void TearDown() override {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  void send(const std::string& s) { ASSERT_TRUE(writeAll(fds_[1], s, Clock::now() + milliseconds(1000)).ok()); }
  int fds_[2];
};

TEST_F(LineReaderTest, SplitsLines) {
  LineReader r(fds_[0], 100);
  send("one\ntwo\nthr");
  auto deadline = Clock::now() + milliseconds(1000);
  EXPECT_EQ(r.readLine(deadline).value(), "one");
  EXPECT_EQ(r.readLine(deadline).value(), "two");
  send("ee\n");
  EXPECT_EQ(r.readLine(deadline).value(), "three");
}

TEST_F(LineReaderTest, RejectsOverlongLineWithoutGrowingUnbounded) {
  LineReader r(fds_[0], 16);
  send(std::string(1000, 'x'));
  auto line = r.readLine(Clock::now() + milliseconds(1000));
  ASSERT_FALSE(line.ok());
  EXPECT_NE(line.error().message.find("longer than 16"), std::string::npos);
}

TEST_F(LineReaderTest, DeadlineWhenPeerIsSilent) {
  LineReader r(fds_[0], 100);
  send("partial");
  auto start = Clock::now();
  auto line = r.readLine(start + milliseconds(100));
  ASSERT_FALSE(line.ok());
  EXPECT_EQ(line.error().code, ErrorCode::kDeadlineExceeded);
  EXPECT_GE(Clock::now() - start, milliseconds(90));
}

TEST_F(LineReaderTest, PeerCloseIsAnError) {
  LineReader r(fds_[0], 100);
  send("half");
  close(fds_[1]);
  fds_[1] = -1;
  auto line = r.readLine(Clock::now() + milliseconds(1000));
  ASSERT_FALSE(line.ok());
  EXPECT_EQ(line.error().code, ErrorCode::kUnavailable);
}

TEST(UnixSocket, ConnectTimesOutWhenNobodyListens) {
  auto fd = connectUnix(testing::TempDir() + "/no-such.sock", Clock::now() + milliseconds(50));
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ErrorCode::kDeadlineExceeded);
}

// A link to a listening socket is refused, not followed: it could point at another VM's
// monitor or agent.
TEST(UnixSocket, ALinkToASocketIsRefused) {
  auto dir = TempDir::create(testing::TempDir(), "sock-");
  ASSERT_TRUE(dir.ok());
  const std::string real = dir->path() + "/real.sock";
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, real.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  EXPECT_TRUE(connectUnix(real, Clock::now() + milliseconds(500)).ok());  // the socket itself: fine
  ASSERT_EQ(::symlink(real.c_str(), (dir->path() + "/qmp.sock").c_str()), 0);
  auto linked = connectUnix(dir->path() + "/qmp.sock", Clock::now() + milliseconds(500));
  ASSERT_FALSE(linked.ok());
  EXPECT_NE(linked.error().message.find("symbolic link"), std::string::npos) << linked.error().message;
  ASSERT_TRUE(writeFileAtomic(dir->path() + "/plain", "x").ok());
  EXPECT_FALSE(connectUnix(dir->path() + "/plain", Clock::now() + milliseconds(500)).ok());
}

TEST(UnixSocket, OverlongPathIsRefused) {
  auto fd = connectUnix("/tmp/" + std::string(200, 'a'), Clock::now());
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace space
