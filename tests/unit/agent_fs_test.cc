#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "agent/fs_service.h"

namespace space::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr uid_t kUserUid = 1000;
constexpr gid_t kUserGid = 1000;

// A ServerStream that records what the service sends; the test plays the host.
class CollectingStream : public ServerStream {
 public:
  void send(const Json& message) override {
    if (open_) messages.push_back(message);
  }
  void finish(std::optional<RpcError> error) override {
    if (!open_) return;
    open_ = false;
    finished = true;
    end_error = std::move(error);
  }
  bool open() const override { return open_; }
  void setOnClose(std::function<void()> cb) override { on_close = std::move(cb); }
  size_t queuedBytes() const override { return queued; }
  void setOnDrain(std::function<void()> cb) override { on_drain = std::move(cb); }

  // The host cancels the call.
  void cancel() {
    if (!open_) return;
    open_ = false;
    if (auto cb = on_close) cb();
  }

  // (name, type) of every filesystem event received so far.
  std::vector<std::pair<std::string, std::string>> events() const {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& m : messages) {
      if (!m.contains("filesystem")) continue;
      out.emplace_back(m["filesystem"].value("name", ""), m["filesystem"].value("type", ""));
    }
    return out;
  }
  bool hasEvent(const std::string& name, const std::string& type) const {
    for (const auto& [n, t] : events()) {
      if (n == name && t == type) return true;
    }
    return false;
  }

  std::vector<Json> messages;
  bool finished = false;
  std::optional<RpcError> end_error;
  size_t queued = 0;
  std::function<void()> on_close;
  std::function<void()> on_drain;

 private:
  bool open_ = true;
};

RpcCode codeOf(const UnaryResult& r) {
  if (const auto* err = std::get_if<RpcError>(&r)) return err->code;
  return RpcCode::kOk;
}

std::string describe(const UnaryResult& r) {
  if (const auto* err = std::get_if<RpcError>(&r)) {
    return std::string(agentproto::rpcCodeName(err->code)) + ": " + err->message;
  }
  return std::get<Json>(r).dump();
}

void writeFile(const std::string& path, const std::string& content, mode_t mode = 0644) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> uploadLeftovers(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().find(".space-upload-") != std::string::npos) out.push_back(e.path());
  }
  return out;
}

class FsServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << "these tests switch filesystem credentials and mount tmpfs: run them as root";
    old_umask_ = umask(022);
    std::string tmpl = testing::TempDir();
    if (tmpl.empty() || tmpl.back() != '/') tmpl += '/';
    tmpl += "agent-fs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    char* real = realpath(tmpl.c_str(), nullptr);
    ASSERT_NE(real, nullptr);
    root_ = real;
    std::free(real);
    ASSERT_EQ(chmod(root_.c_str(), 0755), 0);  // the user must be able to reach its home

    etc_ = root_ + "/etc";
    home_ = root_ + "/home/user";
    ASSERT_EQ(mkdir(etc_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((root_ + "/home").c_str(), 0755), 0);
    ASSERT_EQ(mkdir(home_.c_str(), 0755), 0);
    ASSERT_EQ(chown(home_.c_str(), kUserUid, kUserGid), 0);
    writeFile(etc_ + "/passwd", "root:x:0:0:root:" + root_ + ":/bin/sh\nuser:x:1000:1000:user:" + home_ +
                                    ":/bin/bash\nother:x:1001:1001::" + root_ + "/home/other:/bin/sh\n");
    writeFile(etc_ + "/group", "root:x:0:\nuser:x:1000:\nother:x:1001:\n");

    users_ = std::make_unique<UserDb>(etc_);
    service_ = std::make_unique<FsService>(loop_, *users_);
    service_->registerWith(router_);
  }

  void TearDown() override {
    service_.reset();
    for (auto it = mounts_.rbegin(); it != mounts_.rend(); ++it) umount2(it->c_str(), MNT_DETACH);
    std::error_code ec;
    if (!root_.empty()) fs::remove_all(root_, ec);
    umask(old_umask_);
  }

  UnaryResult call(const std::string& method, const Json& request, const std::string& user = "") {
    const auto* handler = router_.findUnary("/filesystem.Filesystem/" + method);
    if (handler == nullptr) {
      ADD_FAILURE() << "no handler for " << method;
      return RpcError{RpcCode::kUnimplemented, method};
    }
    return (*handler)(request, CallContext{user, std::nullopt});
  }

  // Calls and expects success; returns the response.
  Json ok(const std::string& method, const Json& request, const std::string& user = "") {
    auto r = call(method, request, user);
    EXPECT_EQ(codeOf(r), RpcCode::kOk) << method << " " << request.dump() << " -> " << describe(r);
    return std::holds_alternative<Json>(r) ? std::get<Json>(r) : Json();
  }

  std::shared_ptr<CollectingStream> watch(const Json& request, const std::string& user = "",
                                          size_t queued_before_start = 0) {
    auto stream = std::make_shared<CollectingStream>();
    stream->queued = queued_before_start;
    const auto* handler = router_.findStream("/filesystem.Filesystem/WatchDir");
    EXPECT_NE(handler, nullptr);
    if (handler != nullptr) (*handler)(request, CallContext{user, std::nullopt}, stream);
    return stream;
  }

  void runLoop(milliseconds ms = milliseconds(200)) {
    loop_.addTimer(ms, [this] { loop_.stop(); });
    loop_.run();
  }

  std::unique_ptr<UploadSink> startUpload(const std::string& path, const std::string& user = "") {
    auto r = router_.uploadHandler()(path, CallContext{user, std::nullopt});
    if (auto* err = std::get_if<RpcError>(&r)) {
      ADD_FAILURE() << "upload " << path << ": " << err->message;
      return nullptr;
    }
    return std::move(std::get<std::unique_ptr<UploadSink>>(r));
  }

  // Mounts a tmpfs (removed in TearDown).
  bool mountTmpfs(const std::string& dir, const std::string& options) {
    mkdir(dir.c_str(), 0755);
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) return false;
    mounts_.push_back(dir);
    return true;
  }

  EventLoop loop_;
  Router router_;
  std::string root_, etc_, home_;
  std::unique_ptr<UserDb> users_;
  std::unique_ptr<FsService> service_;
  std::vector<std::string> mounts_;
  mode_t old_umask_ = 022;
};

// ---------------------------------------------------------------- Stat and EntryInfo

TEST_F(FsServiceTest, StatReportsEntryInfoFields) {
  const std::string file = home_ + "/a.txt";
  writeFile(file, "hello, world\n");
  ASSERT_EQ(chown(file.c_str(), kUserUid, kUserGid), 0);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1614834367, 500000000}};  // 2021-03-04T05:06:07.5Z
  ASSERT_EQ(utimensat(AT_FDCWD, file.c_str(), times, 0), 0);

  Json r = ok("Stat", {{"path", "a.txt"}});
  ASSERT_TRUE(r.contains("entry")) << r.dump();
  const Json& e = r["entry"];
  EXPECT_EQ(e["name"], "a.txt");
  EXPECT_EQ(e["type"], "FILE_TYPE_FILE");
  EXPECT_EQ(e["path"], file);
  EXPECT_EQ(e["size"], "13");  // int64 as a string
  EXPECT_EQ(e["mode"], 420);
  EXPECT_EQ(e["permissions"], "-rw-r--r--");
  EXPECT_EQ(e["owner"], "user");
  EXPECT_EQ(e["group"], "user");
  EXPECT_EQ(e["modifiedTime"], "2021-03-04T05:06:07.500Z");
  EXPECT_FALSE(e.contains("symlinkTarget"));
  EXPECT_NO_THROW(r.dump());
}

TEST_F(FsServiceTest, StatDirectoryAndWholeSecondTimestamp) {
  const std::string dir = home_ + "/d";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const struct timespec times[2] = {{0, UTIME_OMIT}, {0, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, dir.c_str(), times, 0), 0);
  Json e = ok("Stat", {{"path", dir}})["entry"];
  EXPECT_EQ(e["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(e["mode"], 493);
  EXPECT_EQ(e["permissions"], "drwxr-xr-x");
  EXPECT_EQ(e["owner"], "root");
  EXPECT_EQ(e["modifiedTime"], "1970-01-01T00:00:00Z");
}

TEST_F(FsServiceTest, StatEmptyPathIsHomeAndTildeExpands) {
  EXPECT_EQ(ok("Stat", Json::object())["entry"]["path"], home_);
  writeFile(home_ + "/t.txt", "");
  Json e = ok("Stat", {{"path", "~/t.txt"}})["entry"];
  EXPECT_EQ(e["path"], home_ + "/t.txt");
  EXPECT_FALSE(e.contains("size"));  // proto3 JSON omits defaults
  EXPECT_EQ(ok("Stat", {{"path", "."}}, "root")["entry"]["path"], root_);
}

TEST_F(FsServiceTest, StatMissingIsNotFound) {
  auto r = call("Stat", {{"path", "nope.txt"}});
  ASSERT_EQ(codeOf(r), RpcCode::kNotFound) << describe(r);
  EXPECT_NE(std::get<RpcError>(r).message.find(home_ + "/nope.txt"), std::string::npos);
  EXPECT_EQ(codeOf(call("Stat", {{"path", "nope/deeper"}})), RpcCode::kNotFound);
}

TEST_F(FsServiceTest, SymlinkIsDescribedByItsTarget) {
  writeFile(home_ + "/target.txt", "0123456789", 0640);
  ASSERT_EQ(symlink("target.txt", (home_ + "/link").c_str()), 0);
  Json e = ok("Stat", {{"path", "link"}})["entry"];
  EXPECT_EQ(e["name"], "link");
  EXPECT_EQ(e["path"], home_ + "/link");
  EXPECT_EQ(e["type"], "FILE_TYPE_FILE");
  EXPECT_EQ(e["symlinkTarget"], home_ + "/target.txt");
  EXPECT_EQ(e["size"], "10");
  EXPECT_EQ(e["mode"], 0640);
  EXPECT_EQ(e["permissions"], "-rw-r-----");

  ASSERT_EQ(mkdir((home_ + "/dir").c_str(), 0755), 0);
  ASSERT_EQ(symlink(home_.c_str(), (home_ + "/dir/up").c_str()), 0);
  e = ok("Stat", {{"path", "dir/up"}})["entry"];
  EXPECT_EQ(e["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(e["permissions"], "drwxr-xr-x");
  EXPECT_EQ(e["symlinkTarget"], home_);
}

TEST_F(FsServiceTest, DanglingSymlinkHasNoType) {
  ASSERT_EQ(symlink("../user/missing", (home_ + "/dangling").c_str()), 0);
  Json e = ok("Stat", {{"path", "dangling"}})["entry"];
  EXPECT_FALSE(e.contains("type"));
  EXPECT_FALSE(e.contains("mode"));
  EXPECT_EQ(e["permissions"], "?---------");
  EXPECT_EQ(e["symlinkTarget"], home_ + "/missing");
}

TEST_F(FsServiceTest, EntryInfoHelperAndSpecialModes) {
  const std::string dir = home_ + "/sticky";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(chmod(dir.c_str(), 01777), 0);
  auto info = entryInfo(dir, *users_);
  ASSERT_TRUE(std::holds_alternative<Json>(info));
  EXPECT_EQ(std::get<Json>(info)["permissions"], "dtrwxrwxrwx");  // Go's FileMode.String()
  EXPECT_EQ(std::get<Json>(info)["mode"], 0777);

  auto missing = entryInfo(home_ + "/nothing", *users_);
  ASSERT_TRUE(std::holds_alternative<RpcError>(missing));
  EXPECT_EQ(std::get<RpcError>(missing).code, RpcCode::kNotFound);
}

TEST_F(FsServiceTest, UnknownOwnerIsNumericAndOddNamesStayValidJson) {
  const std::string file = home_ + "/x\xff\xfe.bin";
  writeFile(file, "z");
  ASSERT_EQ(chown(file.c_str(), 4242, 4343), 0);
  Json r = ok("ListDir", Json::object());
  ASSERT_EQ(r["entries"].size(), 1u);
  EXPECT_EQ(r["entries"][0]["owner"], "4242");
  EXPECT_EQ(r["entries"][0]["group"], "4343");
  EXPECT_NO_THROW(r.dump());  // invalid UTF-8 was replaced
}

// ---------------------------------------------------------------- ListDir

class ListDirTest : public FsServiceTest {
 protected:
  void SetUp() override {
    FsServiceTest::SetUp();
    tree_ = home_ + "/tree";
    ASSERT_EQ(mkdir(tree_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((tree_ + "/a").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((tree_ + "/a/deep").c_str(), 0755), 0);
    writeFile(tree_ + "/b.txt", "b");
    writeFile(tree_ + "/a/x.txt", "x");
    writeFile(tree_ + "/a/deep/y.txt", "y");
    ASSERT_EQ(symlink("a", (tree_ + "/link").c_str()), 0);
  }

  std::vector<std::string> paths(const Json& response) {
    std::vector<std::string> out;
    for (const auto& e : response.value("entries", Json::array())) {
      out.push_back(e["path"].get<std::string>().substr(tree_.size() + 1));
    }
    return out;
  }

  std::string tree_;
};

TEST_F(ListDirTest, DepthOne) {
  using V = std::vector<std::string>;
  const V want{"a", "b.txt", "link"};
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}, {"depth", 1}})), want);
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}, {"depth", 0}})), want);  // 0 means 1
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}})), want);
  Json r = ok("ListDir", {{"path", tree_}});
  EXPECT_EQ(r["entries"][0]["name"], "a");
  EXPECT_EQ(r["entries"][0]["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(r["entries"][2]["type"], "FILE_TYPE_DIRECTORY");  // the symlink, by its target
  EXPECT_EQ(r["entries"][2]["symlinkTarget"], tree_ + "/a");
}

TEST_F(ListDirTest, DepthTwoAndMoreDoNotFollowSymlinks) {
  using V = std::vector<std::string>;
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}, {"depth", 2}})), (V{"a", "a/deep", "a/x.txt", "b.txt", "link"}));
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}, {"depth", "2"}})), (V{"a", "a/deep", "a/x.txt", "b.txt", "link"}));
  EXPECT_EQ(paths(ok("ListDir", {{"path", "tree"}, {"depth", 4294967295u}})),
            (V{"a", "a/deep", "a/deep/y.txt", "a/x.txt", "b.txt", "link"}));
}

TEST_F(ListDirTest, ThroughASymlinkKeepsTheRequestedPath) {
  Json r = ok("ListDir", {{"path", "tree/link"}});
  ASSERT_EQ(r["entries"].size(), 2u);
  EXPECT_EQ(r["entries"][0]["path"], tree_ + "/link/deep");
}

TEST_F(ListDirTest, EmptyDirectoryOmitsEntries) {
  ASSERT_EQ(mkdir((tree_ + "/empty").c_str(), 0755), 0);
  Json r = ok("ListDir", {{"path", "tree/empty"}});
  EXPECT_TRUE(r.value("entries", Json::array()).empty());
}

TEST_F(ListDirTest, Errors) {
  EXPECT_EQ(codeOf(call("ListDir", {{"path", "tree/b.txt"}})), RpcCode::kInvalidArgument);
  EXPECT_EQ(codeOf(call("ListDir", {{"path", "tree/none"}})), RpcCode::kNotFound);
  ASSERT_EQ(chmod(tree_.c_str(), 0700), 0);
  EXPECT_EQ(codeOf(call("ListDir", {{"path", "tree"}})), RpcCode::kPermissionDenied);
  EXPECT_EQ(codeOf(call("ListDir", {{"path", tree_}}, "root")), RpcCode::kOk);
}

TEST_F(ListDirTest, ResultIsBounded) {
  const std::string big = tree_ + "/big";
  ASSERT_TRUE(mountTmpfs(big, "mode=0755")) << "cannot mount tmpfs (tests run as root): " << std::strerror(errno);
  ASSERT_EQ(mkdir((big + "/d").c_str(), 0755), 0);
  for (size_t i = 0; i < FsService::kMaxListEntries; ++i) {  // with "d": one too many
    const int fd = open((big + "/d/" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  EXPECT_EQ(codeOf(call("ListDir", {{"path", big}, {"depth", 1}})), RpcCode::kOk);
  auto r = call("ListDir", {{"path", big}, {"depth", 2}});
  EXPECT_EQ(codeOf(r), RpcCode::kResourceExhausted) << describe(r);
}

TEST_F(ListDirTest, BadDepth) {
  for (const Json& depth : {Json(-1), Json(1.5), Json("abc"), Json("-1"), Json(1e12), Json(true), Json::array()}) {
    auto r = call("ListDir", {{"path", "tree"}, {"depth", depth}});
    ASSERT_EQ(codeOf(r), RpcCode::kInvalidArgument) << depth.dump();
    EXPECT_NE(std::get<RpcError>(r).message.find("depth"), std::string::npos);
  }
}

// ---------------------------------------------------------------- MakeDir, Move, Remove

TEST_F(FsServiceTest, MakeDirCreatesParentsOwnedByTheUser) {
  Json r = ok("MakeDir", {{"path", "p/q/r"}});
  EXPECT_EQ(r["entry"]["path"], home_ + "/p/q/r");
  EXPECT_EQ(r["entry"]["type"], "FILE_TYPE_DIRECTORY");
  EXPECT_EQ(r["entry"]["owner"], "user");
  for (const char* d : {"/p", "/p/q", "/p/q/r"}) {
    struct stat st {};
    ASSERT_EQ(stat((home_ + d).c_str(), &st), 0) << d;
    EXPECT_EQ(st.st_uid, kUserUid) << d;
    EXPECT_EQ(st.st_gid, kUserGid) << d;
    EXPECT_EQ(st.st_mode & 0777, 0755u) << d;
  }
}

TEST_F(FsServiceTest, MakeDirExistingIsAlreadyExists) {
  ok("MakeDir", {{"path", "d"}});
  auto r = call("MakeDir", {{"path", "d"}});
  ASSERT_EQ(codeOf(r), RpcCode::kAlreadyExists);
  EXPECT_NE(std::get<RpcError>(r).message.find("already exists"), std::string::npos);
  writeFile(home_ + "/f", "");
  EXPECT_EQ(codeOf(call("MakeDir", {{"path", "f"}})), RpcCode::kInvalidArgument);      // a file is in the way (envd)
  EXPECT_EQ(codeOf(call("MakeDir", {{"path", "f/sub"}})), RpcCode::kInvalidArgument);  // a parent is a file
}

TEST_F(FsServiceTest, UserCannotWriteIntoRootOwnedDirectory) {
  const std::string locked = home_ + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0755), 0);  // root-owned
  writeFile(locked + "/keep.txt", "keep");
  EXPECT_EQ(codeOf(call("MakeDir", {{"path", "locked/x"}})), RpcCode::kPermissionDenied);
  EXPECT_EQ(codeOf(call("Remove", {{"path", "locked/keep.txt"}})), RpcCode::kPermissionDenied);
  EXPECT_EQ(codeOf(call("Move", {{"source", "locked/keep.txt"}, {"destination", "stolen.txt"}})),
            RpcCode::kPermissionDenied);
  auto up = router_.uploadHandler()("locked/new.txt", CallContext{"user", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<RpcError>(up));
  EXPECT_EQ(std::get<RpcError>(up).code, RpcCode::kPermissionDenied);
  EXPECT_EQ(readFile(locked + "/keep.txt"), "keep");

  // root may, and what it creates is root's.
  Json r = ok("MakeDir", {{"path", locked + "/x"}}, "root");
  EXPECT_EQ(r["entry"]["owner"], "root");
  // The agent's own credentials are back to root after every call.
  EXPECT_EQ(setfsuid(static_cast<uid_t>(-1)), 0);
  EXPECT_EQ(setfsgid(static_cast<gid_t>(-1)), 0);
}

TEST_F(FsServiceTest, MoveCreatesDestinationParents) {
  writeFile(home_ + "/a.txt", "moving");
  Json r = ok("Move", {{"source", "a.txt"}, {"destination", "x/y/b.txt"}});
  EXPECT_EQ(r["entry"]["path"], home_ + "/x/y/b.txt");
  EXPECT_EQ(r["entry"]["name"], "b.txt");
  EXPECT_EQ(readFile(home_ + "/x/y/b.txt"), "moving");
  EXPECT_EQ(codeOf(call("Stat", {{"path", "a.txt"}})), RpcCode::kNotFound);
  struct stat st {};
  ASSERT_EQ(stat((home_ + "/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUserUid);
}

TEST_F(FsServiceTest, MoveErrors) {
  EXPECT_EQ(codeOf(call("Move", {{"source", "missing"}, {"destination", "b"}})), RpcCode::kNotFound);
  EXPECT_EQ(codeOf(call("Move", {{"source", "a"}})), RpcCode::kInvalidArgument);
  auto r = call("Move", {{"source", "a"}, {"destination", 7}});
  ASSERT_EQ(codeOf(r), RpcCode::kInvalidArgument);
  EXPECT_NE(std::get<RpcError>(r).message.find("destination"), std::string::npos);
}

TEST_F(FsServiceTest, RemoveFilesAndTrees) {
  ok("MakeDir", {{"path", "t/u/v"}});
  writeFile(home_ + "/t/u/v/f", "f");
  writeFile(home_ + "/t/g", "g");
  ASSERT_EQ(symlink(root_.c_str(), (home_ + "/t/escape").c_str()), 0);  // removed, never followed
  EXPECT_EQ(ok("Remove", {{"path", "t"}}), Json::object());
  EXPECT_EQ(codeOf(call("Stat", {{"path", "t"}})), RpcCode::kNotFound);
  EXPECT_TRUE(fs::exists(etc_ + "/passwd"));

  writeFile(home_ + "/single", "s");
  ok("Remove", {{"path", "single"}});
  EXPECT_FALSE(fs::exists(home_ + "/single"));
  EXPECT_TRUE(std::holds_alternative<Json>(call("Remove", {{"path", "single"}})));  // gone already: success (envd)
  EXPECT_EQ(codeOf(call("Remove", Json::object())), RpcCode::kInvalidArgument);     // never "remove my home"
  EXPECT_EQ(codeOf(call("Remove", {{"path", "/"}}, "root")), RpcCode::kInvalidArgument);
}

TEST_F(FsServiceTest, RemoveDoesNotCrossMounts) {
  ok("MakeDir", {{"path", "t/mnt"}});
  writeFile(home_ + "/t/plain", "p");
  ASSERT_TRUE(mountTmpfs(home_ + "/t/mnt", "size=64k"))
      << "cannot mount tmpfs (tests run as root): " << std::strerror(errno);
  writeFile(home_ + "/t/mnt/precious", "keep me");

  auto r = call("Remove", {{"path", home_ + "/t"}}, "root");
  EXPECT_EQ(codeOf(r), RpcCode::kFailedPrecondition) << describe(r);
  EXPECT_EQ(readFile(home_ + "/t/mnt/precious"), "keep me");
  EXPECT_FALSE(fs::exists(home_ + "/t/plain"));  // the rest is gone

  r = call("Remove", {{"path", home_ + "/t/mnt"}}, "root");
  EXPECT_EQ(codeOf(r), RpcCode::kFailedPrecondition) << describe(r);
  EXPECT_EQ(readFile(home_ + "/t/mnt/precious"), "keep me");
}

// ---------------------------------------------------------------- malformed requests

TEST_F(FsServiceTest, MalformedRequests) {
  for (const Json& request : {Json::array(), Json("path"), Json(), Json(42)}) {
    for (const char* method : {"Stat", "ListDir", "MakeDir", "Move", "Remove"}) {
      EXPECT_EQ(codeOf(call(method, request)), RpcCode::kInvalidArgument) << method << " " << request.dump();
    }
  }
  for (const Json& path : {Json(5), Json(true), Json::object(), Json::array({"a"})}) {
    auto r = call("Stat", {{"path", path}});
    ASSERT_EQ(codeOf(r), RpcCode::kInvalidArgument) << path.dump();
    EXPECT_NE(std::get<RpcError>(r).message.find("\"path\""), std::string::npos);
  }
  EXPECT_EQ(codeOf(call("Stat", {{"path", nullptr}})), RpcCode::kOk);  // null is the default: home
  EXPECT_EQ(codeOf(call("Stat", {{"path", std::string("a\0b", 3)}})), RpcCode::kInvalidArgument);
  EXPECT_EQ(codeOf(call("Stat", {{"path", std::string(5000, 'a')}})), RpcCode::kInvalidArgument);
  EXPECT_EQ(codeOf(call("Stat", {{"path", std::string(300, 'a')}})), RpcCode::kInvalidArgument);  // NAME_MAX
  EXPECT_EQ(codeOf(call("Stat", Json::object(), "nobody")), RpcCode::kInvalidArgument);
  EXPECT_EQ(codeOf(call("Stat", {{"path", "x"}, {"unknownField", 1}})), RpcCode::kNotFound);  // ignored

  auto up = router_.uploadHandler()("f", CallContext{"nobody", std::nullopt});
  EXPECT_TRUE(std::holds_alternative<RpcError>(up));
  auto down = router_.downloadHandler()(std::string("a\0b", 3), CallContext{"", std::nullopt});
  EXPECT_TRUE(std::holds_alternative<RpcError>(down));
}

// ---------------------------------------------------------------- upload and download

TEST_F(FsServiceTest, UploadWritesAtomicallyAndReturnsEntryInfo) {
  auto sink = startUpload("up/deep/new.txt");
  ASSERT_TRUE(sink);
  EXPECT_FALSE(fs::exists(home_ + "/up/deep/new.txt"));  // nothing visible before finish
  EXPECT_FALSE(sink->write("hello ").has_value());
  EXPECT_FALSE(sink->write("world").has_value());
  EXPECT_FALSE(fs::exists(home_ + "/up/deep/new.txt"));
  auto r = sink->finish();
  ASSERT_EQ(codeOf(r), RpcCode::kOk) << describe(r);
  const Json& e = std::get<Json>(r);  // the bare EntryInfo
  EXPECT_EQ(e["path"], home_ + "/up/deep/new.txt");
  EXPECT_EQ(e["size"], "11");
  EXPECT_EQ(e["mode"], 420);
  EXPECT_EQ(e["owner"], "user");
  EXPECT_EQ(readFile(home_ + "/up/deep/new.txt"), "hello world");
  struct stat st {};
  ASSERT_EQ(stat((home_ + "/up/deep/new.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUserUid);
  EXPECT_EQ(st.st_gid, kUserGid);
  ASSERT_EQ(stat((home_ + "/up").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kUserUid);
  EXPECT_TRUE(uploadLeftovers(home_ + "/up/deep").empty());
  EXPECT_TRUE(sink->write("late").has_value());  // finished
}

TEST_F(FsServiceTest, UploadMetadataIsKeptAsXattrsAndReplacedByTheNextUpload) {
  auto upload = [&](std::map<std::string, std::string> metadata) {
    CallContext ctx{"", std::nullopt};
    ctx.metadata = std::move(metadata);
    return router_.uploadHandler()("tagged.txt", ctx);
  };
  auto first = upload({{"owner", "me"}, {"stage", "raw data"}});
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<UploadSink>>(first));
  auto& sink = std::get<std::unique_ptr<UploadSink>>(first);
  EXPECT_FALSE(sink->write("x").has_value());
  auto r = sink->finish();
  ASSERT_EQ(codeOf(r), RpcCode::kOk) << describe(r);
  EXPECT_EQ(std::get<Json>(r)["metadata"], Json({{"owner", "me"}, {"stage", "raw data"}}));
  EXPECT_EQ(ok("Stat", Json{{"path", "tagged.txt"}})["entry"]["metadata"],
            Json({{"owner", "me"}, {"stage", "raw data"}}));
  auto listed = ok("ListDir", Json{{"path", home_}, {"depth", 1}});
  bool seen = false;
  for (const auto& e : listed["entries"]) seen = seen || (e["name"] == "tagged.txt" && e["metadata"]["owner"] == "me");
  EXPECT_TRUE(seen) << listed.dump();
  // An upload with none clears it: the file is replaced whole.
  auto second = upload({});
  auto& sink2 = std::get<std::unique_ptr<UploadSink>>(second);
  EXPECT_FALSE(sink2->write("y").has_value());
  ASSERT_EQ(codeOf(sink2->finish()), RpcCode::kOk);
  EXPECT_FALSE(ok("Stat", Json{{"path", "tagged.txt"}})["entry"].contains("metadata"));
  // envd's bounds: printable ASCII, keys of at most 246 bytes, 4096 bytes in all.
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"k", "tab\there"}},
           {{std::string(247, 'k'), "v"}},
           {{"a", std::string(2100, 'v')}, {"b", std::string(2100, 'v')}}}) {
    auto refused = upload(bad);
    ASSERT_TRUE(std::holds_alternative<RpcError>(refused));
    EXPECT_EQ(std::get<RpcError>(refused).code, RpcCode::kInvalidArgument);
  }
}

TEST_F(FsServiceTest, UploadKeepsModeOfExistingFile) {
  writeFile(home_ + "/secret", "old", 0600);
  ASSERT_EQ(chown((home_ + "/secret").c_str(), kUserUid, kUserGid), 0);
  auto sink = startUpload(home_ + "/secret");
  ASSERT_TRUE(sink);
  EXPECT_FALSE(sink->write("new").has_value());
  auto r = sink->finish();
  ASSERT_EQ(codeOf(r), RpcCode::kOk) << describe(r);
  EXPECT_EQ(std::get<Json>(r)["permissions"], "-rw-------");
  EXPECT_EQ(readFile(home_ + "/secret"), "new");
}

TEST_F(FsServiceTest, UploadThroughSymlinkReplacesTheTarget) {
  ASSERT_EQ(mkdir((home_ + "/real").c_str(), 0755), 0);
  ASSERT_EQ(chown((home_ + "/real").c_str(), kUserUid, kUserGid), 0);
  writeFile(home_ + "/real/rc", "old");
  ASSERT_EQ(chown((home_ + "/real/rc").c_str(), kUserUid, kUserGid), 0);
  ASSERT_EQ(symlink("real/rc", (home_ + "/.rc").c_str()), 0);
  auto sink = startUpload(".rc");
  ASSERT_TRUE(sink);
  EXPECT_FALSE(sink->write("new").has_value());
  auto r = sink->finish();
  ASSERT_EQ(codeOf(r), RpcCode::kOk) << describe(r);
  EXPECT_EQ(std::get<Json>(r)["symlinkTarget"], home_ + "/real/rc");
  EXPECT_TRUE(fs::is_symlink(home_ + "/.rc"));
  EXPECT_EQ(readFile(home_ + "/real/rc"), "new");
}

TEST_F(FsServiceTest, AbortedUploadLeavesOldFileIntact) {
  writeFile(home_ + "/doc.txt", "old content");
  {
    auto sink = startUpload(home_ + "/doc.txt", "root");
    ASSERT_TRUE(sink);
    EXPECT_FALSE(sink->write("partial new content").has_value());
    EXPECT_EQ(uploadLeftovers(home_).size(), 1u);  // the temp file, hidden
    sink->abort();
    EXPECT_EQ(readFile(home_ + "/doc.txt"), "old content");
    EXPECT_TRUE(uploadLeftovers(home_).empty());
    EXPECT_TRUE(sink->write("more").has_value());
    EXPECT_NE(codeOf(sink->finish()), RpcCode::kOk);
  }
  {
    auto sink = startUpload(home_ + "/doc.txt", "root");
    ASSERT_TRUE(sink);
    EXPECT_FALSE(sink->write("dropped").has_value());
  }  // destroyed without finish
  EXPECT_EQ(readFile(home_ + "/doc.txt"), "old content");
  EXPECT_TRUE(uploadLeftovers(home_).empty());
}

TEST_F(FsServiceTest, UploadNeedsWritePermissionOnAnExistingFile) {
  writeFile(home_ + "/roots.txt", "root's");  // root's 0644 file in the user's own directory
  auto r = router_.uploadHandler()("roots.txt", CallContext{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<RpcError>(r));
  EXPECT_EQ(std::get<RpcError>(r).code, RpcCode::kPermissionDenied);
  EXPECT_EQ(readFile(home_ + "/roots.txt"), "root's");
  EXPECT_TRUE(uploadLeftovers(home_).empty());
}

TEST_F(FsServiceTest, UploadOntoDirectoryIsInvalid) {
  ASSERT_EQ(mkdir((home_ + "/dir").c_str(), 0755), 0);
  auto r = router_.uploadHandler()("dir", CallContext{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<RpcError>(r));
  EXPECT_EQ(std::get<RpcError>(r).code, RpcCode::kInvalidArgument);
}

TEST_F(FsServiceTest, UploadOnFullDiskIsResourceExhaustedAndKeepsOldFile) {
  const std::string small = root_ + "/small";
  ASSERT_TRUE(mountTmpfs(small, "size=64k,mode=0755,uid=1000,gid=1000"))
      << "cannot mount tmpfs (tests run as root): " << std::strerror(errno);
  writeFile(small + "/data.txt", "previous content");
  ASSERT_EQ(chown((small + "/data.txt").c_str(), kUserUid, kUserGid), 0);

  auto sink = startUpload(small + "/data.txt");
  ASSERT_TRUE(sink);
  const std::string chunk(16 * 1024, 'x');
  std::optional<RpcError> err;
  for (int i = 0; i < 16 && !err; ++i) err = sink->write(chunk);  // 256 KiB into 64 KiB
  if (!err) {
    auto r = sink->finish();
    ASSERT_TRUE(std::holds_alternative<RpcError>(r)) << "a 256 KiB upload fit into a 64 KiB tmpfs";
    err = std::get<RpcError>(r);
  }
  EXPECT_EQ(err->code, RpcCode::kResourceExhausted) << err->message;
  EXPECT_NE(err->message.find("disk is full"), std::string::npos) << err->message;
  EXPECT_EQ(readFile(small + "/data.txt"), "previous content");
  EXPECT_TRUE(uploadLeftovers(small).empty());
  EXPECT_NE(codeOf(sink->finish()), RpcCode::kOk);

  // The space came back: a small upload now succeeds.
  sink = startUpload(small + "/data.txt");
  ASSERT_TRUE(sink);
  EXPECT_FALSE(sink->write("fits").has_value());
  EXPECT_EQ(codeOf(sink->finish()), RpcCode::kOk);
  EXPECT_EQ(readFile(small + "/data.txt"), "fits");
}

TEST_F(FsServiceTest, DownloadFile) {
  std::string content;
  for (int i = 0; i < 10000; ++i) content += std::to_string(i) + ",";
  writeFile(home_ + "/big.csv", content);
  auto r = router_.downloadHandler()("big.csv", CallContext{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<DownloadSource>>(r));
  auto& src = std::get<std::unique_ptr<DownloadSource>>(r);
  EXPECT_EQ(src->size(), content.size());
  std::string got;
  char buf[4096];
  for (;;) {
    auto n = src->read(buf, sizeof buf);
    ASSERT_TRUE(std::holds_alternative<size_t>(n));
    if (std::get<size_t>(n) == 0) break;
    got.append(buf, std::get<size_t>(n));
  }
  EXPECT_EQ(got, content);

  writeFile(home_ + "/empty", "");
  auto e = router_.downloadHandler()("empty", CallContext{"", std::nullopt});
  ASSERT_TRUE(std::holds_alternative<std::unique_ptr<DownloadSource>>(e));
  EXPECT_EQ(std::get<std::unique_ptr<DownloadSource>>(e)->size(), 0u);
  auto n = std::get<std::unique_ptr<DownloadSource>>(e)->read(buf, sizeof buf);
  EXPECT_EQ(std::get<size_t>(n), 0u);
}

TEST_F(FsServiceTest, DownloadARange) {
  writeFile(home_ + "/digits", "0123456789");
  auto slice = [this](uint64_t offset, std::optional<uint64_t> length) -> std::variant<std::string, RpcCode> {
    CallContext ctx{"", std::nullopt};
    ctx.offset = offset;
    ctx.length = length;
    auto r = router_.downloadHandler()("digits", ctx);
    if (auto* err = std::get_if<RpcError>(&r)) return err->code;
    auto& src = std::get<std::unique_ptr<DownloadSource>>(r);
    std::string got;
    char buf[4];  // several reads
    for (;;) {
      auto n = src->read(buf, sizeof buf);
      if (!std::holds_alternative<size_t>(n) || std::get<size_t>(n) == 0) break;
      got.append(buf, std::get<size_t>(n));
    }
    EXPECT_EQ(got.size(), src->size());
    return got;
  };
  EXPECT_EQ(std::get<std::string>(slice(2, 4)), "2345");
  EXPECT_EQ(std::get<std::string>(slice(7, std::nullopt)), "789");
  EXPECT_EQ(std::get<std::string>(slice(8, 100)), "89");  // clamped at the end
  EXPECT_EQ(std::get<std::string>(slice(10, std::nullopt)), "");
  EXPECT_EQ(std::get<RpcCode>(slice(11, 1)), RpcCode::kFailedPrecondition);  // past the end
}

TEST_F(FsServiceTest, DownloadErrors) {
  auto code = [this](const std::string& path, const std::string& user = "") {
    auto r = router_.downloadHandler()(path, CallContext{user, std::nullopt});
    return std::holds_alternative<RpcError>(r) ? std::get<RpcError>(r).code : RpcCode::kOk;
  };
  EXPECT_EQ(code("missing"), RpcCode::kNotFound);
  EXPECT_EQ(code(""), RpcCode::kInvalidArgument);  // home, a directory
  ASSERT_EQ(mkfifo((home_ + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(code("fifo"), RpcCode::kInvalidArgument);
  writeFile(home_ + "/private", "p", 0600);  // root's
  EXPECT_EQ(code("private"), RpcCode::kPermissionDenied);
  EXPECT_EQ(code(home_ + "/private", "root"), RpcCode::kOk);
}

// ---------------------------------------------------------------- WatchDir

TEST_F(FsServiceTest, WatchReportsCreateAndWrite) {
  auto stream = watch({{"path", home_}});
  ASSERT_FALSE(stream->messages.empty());
  EXPECT_EQ(stream->messages[0], Json({{"start", Json::object()}}));
  EXPECT_FALSE(stream->finished);
  EXPECT_EQ(service_->activeWatches(), 1u);

  writeFile(home_ + "/new.txt", "data");
  runLoop();
  EXPECT_TRUE(stream->hasEvent("new.txt", "EVENT_TYPE_CREATE")) << Json(stream->messages).dump();
  EXPECT_TRUE(stream->hasEvent("new.txt", "EVENT_TYPE_WRITE")) << Json(stream->messages).dump();
  EXPECT_FALSE(stream->messages[1]["filesystem"].contains("entry"));

  ASSERT_EQ(chmod((home_ + "/new.txt").c_str(), 0600), 0);
  ASSERT_EQ(rename((home_ + "/new.txt").c_str(), (home_ + "/moved.txt").c_str()), 0);
  ASSERT_EQ(unlink((home_ + "/moved.txt").c_str()), 0);
  runLoop();
  EXPECT_TRUE(stream->hasEvent("new.txt", "EVENT_TYPE_CHMOD"));
  EXPECT_TRUE(stream->hasEvent("new.txt", "EVENT_TYPE_RENAME"));
  EXPECT_TRUE(stream->hasEvent("moved.txt", "EVENT_TYPE_CREATE"));
  EXPECT_TRUE(stream->hasEvent("moved.txt", "EVENT_TYPE_REMOVE"));

  stream->cancel();  // the host goes away: the watch is dropped
  EXPECT_EQ(service_->activeWatches(), 0u);
  const size_t before = stream->messages.size();
  writeFile(home_ + "/after.txt", "x");
  runLoop(milliseconds(50));
  EXPECT_EQ(stream->messages.size(), before);
}

TEST_F(FsServiceTest, WatchIncludesEntries) {
  auto stream = watch({{"path", "~"}, {"includeEntry", true}});
  writeFile(home_ + "/e.txt", "12345");
  runLoop();
  bool seen = false;
  for (const auto& m : stream->messages) {
    if (!m.contains("filesystem") || m["filesystem"]["name"] != "e.txt") continue;
    ASSERT_TRUE(m["filesystem"].contains("entry")) << m.dump();
    EXPECT_EQ(m["filesystem"]["entry"]["path"], home_ + "/e.txt");
    seen = true;
  }
  EXPECT_TRUE(seen) << Json(stream->messages).dump();
}

TEST_F(FsServiceTest, NonRecursiveWatchIgnoresSubdirectoryContents) {
  ASSERT_EQ(mkdir((home_ + "/sub").c_str(), 0755), 0);
  auto stream = watch({{"path", home_}});
  writeFile(home_ + "/sub/inner.txt", "x");
  runLoop();
  EXPECT_TRUE(stream->events().empty()) << Json(stream->messages).dump();
}

TEST_F(FsServiceTest, RecursiveWatchFollowsNewSubdirectories) {
  ASSERT_EQ(mkdir((home_ + "/old").c_str(), 0755), 0);
  auto stream = watch({{"path", home_}, {"recursive", true}});
  ASSERT_FALSE(stream->finished);
  writeFile(home_ + "/old/o.txt", "o");
  ASSERT_EQ(mkdir((home_ + "/sub").c_str(), 0755), 0);
  runLoop();
  EXPECT_TRUE(stream->hasEvent("old/o.txt", "EVENT_TYPE_CREATE"));
  EXPECT_TRUE(stream->hasEvent("sub", "EVENT_TYPE_CREATE"));

  writeFile(home_ + "/sub/inner.txt", "x");
  runLoop();
  EXPECT_TRUE(stream->hasEvent("sub/inner.txt", "EVENT_TYPE_CREATE")) << Json(stream->messages).dump();
  EXPECT_TRUE(stream->hasEvent("sub/inner.txt", "EVENT_TYPE_WRITE"));

  // A tree made in one go, before the agent could watch its new directories.
  fs::create_directories(home_ + "/a/b");
  writeFile(home_ + "/a/b/c.txt", "c");
  runLoop();
  EXPECT_TRUE(stream->hasEvent("a", "EVENT_TYPE_CREATE"));
  EXPECT_TRUE(stream->hasEvent("a/b", "EVENT_TYPE_CREATE")) << Json(stream->messages).dump();
  EXPECT_TRUE(stream->hasEvent("a/b/c.txt", "EVENT_TYPE_CREATE")) << Json(stream->messages).dump();

  // A watched directory renamed inside the tree reports under its new name.
  ASSERT_EQ(rename((home_ + "/sub").c_str(), (home_ + "/renamed").c_str()), 0);
  runLoop(milliseconds(100));
  writeFile(home_ + "/renamed/later.txt", "l");
  runLoop();
  EXPECT_TRUE(stream->hasEvent("renamed/later.txt", "EVENT_TYPE_CREATE")) << Json(stream->messages).dump();
  EXPECT_FALSE(stream->hasEvent("sub/later.txt", "EVENT_TYPE_CREATE"));
  EXPECT_FALSE(stream->finished);
}

TEST_F(FsServiceTest, WatchEndsWhenTheDirectoryGoes) {
  ASSERT_EQ(mkdir((home_ + "/w").c_str(), 0755), 0);
  auto stream = watch({{"path", "w"}});
  ASSERT_EQ(rmdir((home_ + "/w").c_str()), 0);
  runLoop();
  EXPECT_TRUE(stream->hasEvent(".", "EVENT_TYPE_REMOVE")) << Json(stream->messages).dump();
  EXPECT_TRUE(stream->finished);
  EXPECT_FALSE(stream->end_error.has_value());
  EXPECT_EQ(service_->activeWatches(), 0u);
}

TEST_F(FsServiceTest, WatchErrors) {
  auto missing = watch({{"path", "nope"}});
  EXPECT_TRUE(missing->finished);
  ASSERT_TRUE(missing->end_error);
  EXPECT_EQ(missing->end_error->code, RpcCode::kNotFound);
  EXPECT_TRUE(missing->messages.empty());  // no start

  writeFile(home_ + "/file", "");
  auto file = watch({{"path", "file"}});
  ASSERT_TRUE(file->end_error);
  EXPECT_EQ(file->end_error->code, RpcCode::kInvalidArgument);
  EXPECT_TRUE(file->messages.empty());

  ASSERT_EQ(mkdir((home_ + "/closed").c_str(), 0700), 0);  // root's
  auto denied = watch({{"path", "closed"}});
  ASSERT_TRUE(denied->end_error);
  EXPECT_EQ(denied->end_error->code, RpcCode::kPermissionDenied);

  for (const Json& request : {Json({{"recursive", "yes"}}), Json({{"includeEntry", 1}}), Json({{"path", 3}}),
                              Json::array(), Json({{"allowNetworkMounts", "no"}})}) {
    auto bad = watch(request);
    ASSERT_TRUE(bad->end_error) << request.dump();
    EXPECT_EQ(bad->end_error->code, RpcCode::kInvalidArgument) << request.dump();
    EXPECT_TRUE(bad->messages.empty());
  }
  EXPECT_EQ(service_->activeWatches(), 0u);
}

TEST_F(FsServiceTest, RecursiveWatchIsBounded) {
  const std::string many = home_ + "/many";
  mountTmpfs(many, "mode=0755");  // only makes it faster: a plain directory will do
  ASSERT_TRUE(fs::is_directory(many));
  for (size_t i = 0; i <= FsService::kMaxWatchesPerStream; ++i) {
    ASSERT_EQ(mkdir((many + "/" + std::to_string(i)).c_str(), 0755), 0);
  }
  auto stream = watch({{"path", many}, {"recursive", true}});
  ASSERT_TRUE(stream->end_error);
  EXPECT_EQ(stream->end_error->code, RpcCode::kResourceExhausted);
  EXPECT_TRUE(stream->messages.empty());
  EXPECT_EQ(service_->activeWatches(), 0u);
}

TEST_F(FsServiceTest, WatchOverflowEndsTheStream) {
  long max_queued = 0;
  std::ifstream("/proc/sys/fs/inotify/max_queued_events") >> max_queued;
  ASSERT_TRUE(max_queued > 0 && max_queued <= 200000) << "unusual fs.inotify.max_queued_events: " << max_queued;
  const std::string dir = home_ + "/flood";
  ASSERT_TRUE(mountTmpfs(dir, "mode=0755")) << "cannot mount tmpfs (tests run as root): " << std::strerror(errno);
  // The host is not reading, so the agent leaves the events in the kernel queue until it overflows.
  auto stream = watch({{"path", dir}}, "", ServerStream::kHighWater + 1);
  ASSERT_FALSE(stream->finished);
  for (long i = 0; i <= max_queued; ++i) {
    const int fd = open((dir + "/" + std::to_string(i)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  stream->queued = 0;
  stream->on_drain();
  runLoop();
  EXPECT_TRUE(stream->finished);
  ASSERT_TRUE(stream->end_error);
  EXPECT_EQ(stream->end_error->code, RpcCode::kResourceExhausted) << stream->end_error->message;
  EXPECT_EQ(service_->activeWatches(), 0u);
}

TEST_F(FsServiceTest, WatchPausesWhileTheHostIsNotReading) {
  auto stream = watch({{"path", home_}}, "", ServerStream::kHighWater + 1);
  ASSERT_EQ(stream->messages.size(), 1u);  // start
  writeFile(home_ + "/queued.txt", "q");
  runLoop(milliseconds(100));
  EXPECT_TRUE(stream->events().empty());
  stream->queued = 0;
  ASSERT_TRUE(stream->on_drain);
  stream->on_drain();
  runLoop(milliseconds(100));
  EXPECT_TRUE(stream->hasEvent("queued.txt", "EVENT_TYPE_CREATE"));
}

TEST_F(FsServiceTest, DestroyingTheServiceEndsWatches) {
  auto stream = watch({{"path", home_}, {"recursive", true}});
  ASSERT_FALSE(stream->finished);
  service_.reset();
  EXPECT_TRUE(stream->finished);
  ASSERT_TRUE(stream->end_error);
  EXPECT_EQ(stream->end_error->code, RpcCode::kUnavailable);
  writeFile(home_ + "/late.txt", "x");
  runLoop(milliseconds(50));                 // nothing of the service is left in the loop
  if (stream->on_close) stream->on_close();  // a late host cancel is harmless
  EXPECT_TRUE(stream->events().empty());
}

}  // namespace
}  // namespace space::agent
