#include "agent/fs_service.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/fsuid.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace space::agent {

namespace {

template <class T>
using Or = std::variant<T, RpcError>;

constexpr const char* kFileTypeFile = "FILE_TYPE_FILE";
constexpr const char* kFileTypeDirectory = "FILE_TYPE_DIRECTORY";
constexpr const char* kEventCreate = "EVENT_TYPE_CREATE";
constexpr const char* kEventWrite = "EVENT_TYPE_WRITE";
constexpr const char* kEventRemove = "EVENT_TYPE_REMOVE";
constexpr const char* kEventRename = "EVENT_TYPE_RENAME";
constexpr const char* kEventChmod = "EVENT_TYPE_CHMOD";

// Deep enough for any tree reachable through PATH_MAX-long paths of short names, shallow enough
// that the one fd and stack frame held per level stay well inside the agent's limits.
constexpr int kMaxRemoveDepth = 512;
// A directory created under a recursive watch may already hold entries before its watch exists;
// they are reported as created, up to this many per new directory tree.
constexpr size_t kMaxSyntheticEvents = 10000;
// fsnotify's mask, which envd's event types are derived from.
constexpr uint32_t kWatchMask = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_MODIFY | IN_ATTRIB | IN_DELETE |
                                IN_DELETE_SELF | IN_MOVE_SELF | IN_EXCL_UNLINK;

// ---------------------------------------------------------------- strings and errors

// File names are arbitrary bytes but JSON strings must be UTF-8 (nlohmann's dump() throws on
// anything else), so invalid sequences become U+FFFD.
std::string validUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

RpcError fsError(RpcCode code, const std::string& message) { return rpcError(code, validUtf8(message)); }

RpcError invalidArgument(const std::string& message) { return fsError(RpcCode::kInvalidArgument, message); }

// "<op> <path>: <reason>", with the code the errno maps to.
// Callers pass errno as read right after the failing call, before anything can clobber it.
RpcError errnoError(const char* op, const std::string& path, int err) {
  return fsError(agentproto::rpcCodeFromErrno(err), std::string(op) + " " + path + ": " + std::strerror(err));
}

RpcError diskError(const std::string& path, int err) {
  const char* what = err == EDQUOT ? "disk quota exceeded" : "disk is full";
  return fsError(RpcCode::kResourceExhausted, std::string(what) + ": cannot write " + path + ": " + std::strerror(err));
}

RpcError sanitized(RpcError e) {
  e.message = validUtf8(e.message);
  return e;
}

// ---------------------------------------------------------------- request fields

std::optional<RpcError> checkObject(const Json& request) {
  if (!request.is_object()) return invalidArgument("request must be a JSON object");
  return std::nullopt;
}

// proto3 JSON: a missing or null field holds its default; parsers accept both spellings.
const Json* field(const Json& request, const char* camel, const char* snake = nullptr) {
  auto it = request.find(camel);
  if (it == request.end() && snake != nullptr) it = request.find(snake);
  if (it == request.end() || it->is_null()) return nullptr;
  return &*it;
}

Or<std::string> stringField(const Json& request, const char* name) {
  const Json* f = field(request, name);
  if (f == nullptr) return std::string();
  if (!f->is_string()) return invalidArgument(std::string("field \"") + name + "\" must be a string");
  return f->get<std::string>();
}

Or<bool> boolField(const Json& request, const char* camel, const char* snake) {
  const Json* f = field(request, camel, snake);
  if (f == nullptr) return false;
  if (!f->is_boolean()) return invalidArgument(std::string("field \"") + camel + "\" must be a boolean");
  return f->get<bool>();
}

// A proto3 uint32: a JSON number with an integral value, or its decimal string.
Or<uint32_t> uint32Field(const Json& request, const char* name) {
  const Json* f = field(request, name);
  if (f == nullptr) return uint32_t{0};
  const RpcError bad = invalidArgument(std::string("field \"") + name + "\" must be an integer from 0 to 4294967295");
  constexpr uint64_t kMax = UINT32_MAX;
  if (f->is_number_unsigned()) {
    const uint64_t v = f->get<uint64_t>();
    if (v > kMax) return bad;
    return static_cast<uint32_t>(v);
  }
  if (f->is_number_integer()) {  // signed storage, when built in code rather than parsed
    const int64_t v = f->get<int64_t>();
    if (v < 0 || static_cast<uint64_t>(v) > kMax) return bad;
    return static_cast<uint32_t>(v);
  }
  if (f->is_number_float()) {
    const double v = f->get<double>();
    if (!(v >= 0 && v <= static_cast<double>(kMax)) || v != static_cast<double>(static_cast<uint64_t>(v))) return bad;
    return static_cast<uint32_t>(v);
  }
  if (f->is_string()) {
    const auto& s = f->get_ref<const std::string&>();
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return bad;
    const uint64_t v = std::stoull(s);
    if (v > kMax) return bad;
    return static_cast<uint32_t>(v);
  }
  return bad;
}

// ---------------------------------------------------------------- paths

std::string joinPath(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

std::string joinRel(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "/" + name;
}

// abs is absolute and lexically normal.
std::string baseName(const std::string& abs) {
  if (abs == "/") return abs;
  return abs.substr(abs.rfind('/') + 1);
}

std::string dirName(const std::string& abs) {
  const size_t pos = abs.rfind('/');
  return pos == 0 || pos == std::string::npos ? "/" : abs.substr(0, pos);
}

// Creates the missing ancestors of abs (mode 0755 less the umask) with the current credentials.
std::optional<RpcError> makeParents(const std::string& abs) {
  for (size_t pos = abs.find('/', 1); pos != std::string::npos; pos = abs.find('/', pos + 1)) {
    const std::string dir = abs.substr(0, pos);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno != ENOENT) return errnoError("stat", dir, errno);
      if (::mkdir(dir.c_str(), 0755) == 0) continue;
      if (errno != EEXIST) return errnoError("mkdir", dir, errno);
      if (::stat(dir.c_str(), &st) != 0) return errnoError("stat", dir, errno);  // lost a race with a remover
    }
    if (!S_ISDIR(st.st_mode)) return invalidArgument(dir + " exists and is not a directory");
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- EntryInfo

// userName/groupName read the passwd and group files on every call; a listing asks once per id.
class NameCache {
 public:
  explicit NameCache(const UserDb& db) : db_(db) {}
  const std::string& user(uid_t uid) {
    auto it = users_.find(uid);
    if (it == users_.end()) it = users_.emplace(uid, validUtf8(db_.userName(uid))).first;
    return it->second;
  }
  const std::string& group(gid_t gid) {
    auto it = groups_.find(gid);
    if (it == groups_.end()) it = groups_.emplace(gid, validUtf8(db_.groupName(gid))).first;
    return it->second;
  }
  void clear() {
    users_.clear();
    groups_.clear();
  }

 private:
  const UserDb& db_;
  std::unordered_map<uid_t, std::string> users_;
  std::unordered_map<gid_t, std::string> groups_;
};

// Go's FileMode.String(): type letters in the order of "dalTLDpSugct?", "-" when none, then rwx.
std::string permissionString(mode_t mode) {
  std::string s;
  if (S_ISDIR(mode)) s += 'd';
  if (S_ISLNK(mode)) s += 'L';
  if (S_ISBLK(mode) || S_ISCHR(mode)) s += 'D';
  if (S_ISFIFO(mode)) s += 'p';
  if (S_ISSOCK(mode)) s += 'S';
  if (mode & S_ISUID) s += 'u';
  if (mode & S_ISGID) s += 'g';
  if (S_ISCHR(mode)) s += 'c';
  if (mode & S_ISVTX) s += 't';
  if (s.empty()) s += '-';
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) s += (mode & (0400 >> i)) ? rwx[i] : '-';
  return s;
}

// protobuf's JSON Timestamp: UTC, 0/3/6/9 fractional digits, years 0001..9999.
std::string rfc3339(const struct timespec& ts) {
  constexpr time_t kMin = -62135596800;  // 0001-01-01T00:00:00Z
  constexpr time_t kMax = 253402300799;  // 9999-12-31T23:59:59Z
  time_t secs = ts.tv_sec;
  long nsec = ts.tv_nsec;
  if (secs < kMin || secs > kMax || nsec < 0 || nsec > 999999999) {
    secs = std::clamp(secs, kMin, kMax);
    nsec = 0;
  }
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[128];
  int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                        tm.tm_hour, tm.tm_min, tm.tm_sec);
  std::string out(buf, n > 0 ? static_cast<size_t>(n) : 0);
  if (nsec != 0) {
    if (nsec % 1000000 == 0) {
      n = std::snprintf(buf, sizeof buf, ".%03ld", nsec / 1000000);
    } else if (nsec % 1000 == 0) {
      n = std::snprintf(buf, sizeof buf, ".%06ld", nsec / 1000);
    } else {
      n = std::snprintf(buf, sizeof buf, ".%09ld", nsec);
    }
    out.append(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }
  return out + "Z";
}

// A dangling link's target as an absolute, lexically normal path.
std::string absoluteLinkTarget(const std::string& link) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return link;
  std::string target(buf, static_cast<size_t>(n));
  if (target[0] != '/') target = joinPath(dirName(link), target);
  auto normal = resolvePath(target, UserInfo{});
  if (auto* p = std::get_if<std::string>(&normal)) return *p;
  return target;
}

// User metadata is kept as user.e2b.<key> extended attributes, as envd keeps it.
constexpr const char* kMetadataPrefix = "user.e2b.";
constexpr size_t kMetadataPrefixLen = 9;
constexpr size_t kMaxMetadataKey = 246;  // XATTR_NAME_MAX (255) less the prefix
constexpr size_t kMaxMetadataBytes = 4096;

// The metadata on `path` (following a symlink); {} when it has none or the filesystem keeps none.
Json readMetadata(const std::string& path) {
  Json out = Json::object();
  char names[8192];
  const ssize_t n = ::listxattr(path.c_str(), names, sizeof names);
  if (n <= 0) return out;  // none, unsupported, or more names than envd's own budget allows
  for (size_t i = 0; i < static_cast<size_t>(n);) {
    const std::string name(names + i);
    i += name.size() + 1;
    if (name.compare(0, kMetadataPrefixLen, kMetadataPrefix) != 0) continue;
    char value[kMaxMetadataBytes];
    const ssize_t len = ::getxattr(path.c_str(), name.c_str(), value, sizeof value);
    if (len >= 0) out[validUtf8(name.substr(kMetadataPrefixLen))] = validUtf8(std::string(value, len));
  }
  return out;
}

// envd's rules: printable ASCII keys of at most 246 bytes and values, and at most 4096 bytes in
// all, counting the prefix once per key.
std::optional<RpcError> checkMetadata(const std::map<std::string, std::string>& metadata) {
  size_t total = 0;
  auto printable = [](const std::string& s) {
    return std::all_of(s.begin(), s.end(), [](char ch) { return ch >= 0x20 && ch <= 0x7e; });
  };
  for (const auto& [key, value] : metadata) {
    if (key.empty() || key.size() > kMaxMetadataKey || !printable(key) || !printable(value)) {
      return rpcError(RpcCode::kInvalidArgument, "metadata: keys of 1.." + std::to_string(kMaxMetadataKey) +
                                                     " bytes and values of printable ASCII only");
    }
    total += kMetadataPrefixLen + key.size() + value.size();
  }
  if (total > kMaxMetadataBytes) {
    return rpcError(RpcCode::kInvalidArgument,
                    "metadata: at most " + std::to_string(kMaxMetadataBytes) + " bytes on a file");
  }
  return std::nullopt;
}

// lstat-based EntryInfo (see entryInfo in the header); lmode receives the lstat type bits.
std::variant<Json, int> describe(const std::string& path, NameCache& names, mode_t* lmode = nullptr) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) return errno;
  if (lmode != nullptr) *lmode = lst.st_mode;
  const struct stat* st = &lst;
  struct stat target {};
  bool dangling = false;
  std::string link_target;
  if (S_ISLNK(lst.st_mode)) {
    char* real = ::realpath(path.c_str(), nullptr);
    if (real != nullptr && ::stat(real, &target) == 0) {
      link_target = real;
      st = &target;
    } else {
      dangling = true;
      link_target = absoluteLinkTarget(path);
    }
    std::free(real);
  }
  Json e = Json::object();
  e["name"] = validUtf8(baseName(path));
  if (!dangling && S_ISREG(st->st_mode)) e["type"] = kFileTypeFile;
  if (!dangling && S_ISDIR(st->st_mode)) e["type"] = kFileTypeDirectory;
  e["path"] = validUtf8(path);
  if (st->st_size > 0) e["size"] = std::to_string(st->st_size);
  const unsigned mode = dangling ? 0 : static_cast<unsigned>(st->st_mode & 0777);
  if (mode != 0) e["mode"] = mode;
  e["permissions"] = dangling ? std::string("?---------") : permissionString(st->st_mode);
  e["owner"] = names.user(st->st_uid);
  e["group"] = names.group(st->st_gid);
  e["modifiedTime"] = rfc3339(st->st_mtim);
  if (S_ISLNK(lst.st_mode)) e["symlinkTarget"] = validUtf8(link_target);
  if (!dangling) {
    Json metadata = readMetadata(path);
    if (!metadata.empty()) e["metadata"] = std::move(metadata);
  }
  return e;
}

// ---------------------------------------------------------------- credentials

// Makes this thread's filesystem accesses those of `user` (fsuid, fsgid, supplementary groups)
// until destruction, so the kernel does the permission checks and new files get the user as
// owner. fsuid leaves the agent's effective uid (and its non-filesystem privileges) alone, and
// the agent is single-threaded, so the switch cannot leak into unrelated work. Nests: each
// instance restores what it found.
class ScopedFsCreds {
 public:
  explicit ScopedFsCreds(const UserInfo& user) {
    const auto cur_uid = static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1)));
    const auto cur_gid = static_cast<gid_t>(setfsgid(static_cast<gid_t>(-1)));
    if (user.uid == 0 && cur_uid == 0 && cur_gid == 0) return;  // root acting as root
    if (geteuid() != 0 && cur_uid == user.uid) return;          // an unprivileged agent acting as itself
    const int n = getgroups(0, nullptr);
    if (n < 0) {
      fail(user, errno);
      return;
    }
    saved_groups_.resize(static_cast<size_t>(n));
    if (n > 0 && getgroups(n, saved_groups_.data()) < 0) {
      fail(user, errno);
      return;
    }
    if (setgroups(user.groups.size(), user.groups.data()) != 0) {
      fail(user, errno);
      return;
    }
    restore_groups_ = true;
    setfsgid(user.gid);
    if (static_cast<gid_t>(setfsgid(static_cast<gid_t>(-1))) != user.gid) {
      fail(user, EPERM);
      return;
    }
    saved_gid_ = cur_gid;
    restore_gid_ = true;
    setfsuid(user.uid);
    if (static_cast<uid_t>(setfsuid(static_cast<uid_t>(-1))) != user.uid) {
      fail(user, EPERM);
      return;
    }
    saved_uid_ = cur_uid;
    restore_uid_ = true;
  }
  ~ScopedFsCreds() { restore(); }
  ScopedFsCreds(const ScopedFsCreds&) = delete;
  ScopedFsCreds& operator=(const ScopedFsCreds&) = delete;

  const std::optional<RpcError>& error() const { return error_; }

 private:
  void fail(const UserInfo& user, int err) {
    restore();
    error_ =
        fsError(agentproto::rpcCodeFromErrno(err), "cannot act as user \"" + user.name + "\": " + std::strerror(err));
  }
  void restore() {
    if (restore_uid_) setfsuid(saved_uid_);
    if (restore_gid_) setfsgid(saved_gid_);
    if (restore_groups_) setgroups(saved_groups_.size(), saved_groups_.data());
    restore_uid_ = restore_gid_ = restore_groups_ = false;
  }

  std::vector<gid_t> saved_groups_;
  uid_t saved_uid_ = 0;
  gid_t saved_gid_ = 0;
  bool restore_uid_ = false;
  bool restore_gid_ = false;
  bool restore_groups_ = false;
  std::optional<RpcError> error_;
};

// ---------------------------------------------------------------- remove

// The root of a mounted filesystem (bind mounts included, which keep st_dev).
bool isMountRoot(int dirfd, const char* name, const struct stat& st, dev_t parent_dev) {
  if (st.st_dev != parent_dev) return true;
  struct statx sx {};
  if (statx(dirfd, name, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, STATX_TYPE, &sx) != 0) return false;
  return (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

// Empties the directory open at fd (taken over) like `rm -rf --one-file-system`: goes on past
// failures and returns the first. Works relative to directory fds with O_NOFOLLOW so a directory
// swapped for a symlink mid-walk is never followed.
std::optional<RpcError> removeContents(int fd, const std::string& dir, dev_t dev, int depth) {
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    return errnoError("open directory", dir, err);
  }
  std::optional<RpcError> first;
  auto note = [&first](RpcError e) {
    if (!first) first = std::move(e);
  };
  for (;;) {
    errno = 0;
    const dirent* ent = readdir(d);
    if (ent == nullptr) {
      if (errno != 0) note(errnoError("read directory", dir, errno));
      break;
    }
    const std::string name = ent->d_name;
    if (name == "." || name == "..") continue;
    const std::string child = joinPath(dir, name);
    struct stat st {};
    if (fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) note(errnoError("stat", child, errno));
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (unlinkat(dirfd(d), name.c_str(), 0) != 0 && errno != ENOENT) note(errnoError("remove", child, errno));
      continue;
    }
    if (isMountRoot(dirfd(d), name.c_str(), st, dev)) {
      note(fsError(RpcCode::kFailedPrecondition, "remove " + child + ": another filesystem is mounted there"));
      continue;
    }
    if (depth + 1 > kMaxRemoveDepth) {
      note(fsError(RpcCode::kFailedPrecondition, "remove " + child + ": directories nested too deeply"));
      continue;
    }
    const int cfd = openat(dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cfd < 0) {
      if (errno != ENOENT) note(errnoError("open directory", child, errno));
      continue;
    }
    if (auto err = removeContents(cfd, child, dev, depth + 1)) {
      note(std::move(*err));
      continue;
    }
    if (unlinkat(dirfd(d), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
      note(errnoError("remove", child, errno));
  }
  closedir(d);
  return first;
}

// ---------------------------------------------------------------- transfer

std::string randomSuffix(size_t attempt) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char bytes[6];
  if (getrandom(bytes, sizeof bytes, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bytes)) {
    // Uniqueness is all that matters (O_EXCL guards the rest).
    uint64_t x = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) + attempt;
    for (auto& b : bytes) {
      b = static_cast<unsigned char>(x);
      x = (x >> 8) | (x << 56);
    }
  }
  std::string s;
  for (unsigned char b : bytes) s += kAlphabet[b % (sizeof kAlphabet - 1)];
  return s;
}

class FileUploadSink : public UploadSink {
 public:
  FileUploadSink(const UserDb& users, UserInfo user, int dirfd, int fd, std::string tmp_name, std::string name,
                 std::string entry_path, std::string dest_path, std::map<std::string, std::string> metadata)
      : metadata_(std::move(metadata)),
        users_(users),
        user_(std::move(user)),
        dirfd_(dirfd),
        fd_(fd),
        tmp_name_(std::move(tmp_name)),
        name_(std::move(name)),
        entry_path_(std::move(entry_path)),
        dest_path_(std::move(dest_path)) {}
  ~FileUploadSink() override { discard(); }
  FileUploadSink(const FileUploadSink&) = delete;
  FileUploadSink& operator=(const FileUploadSink&) = delete;

  std::optional<RpcError> write(std::string_view chunk) override {
    if (fd_ < 0) return failed_ ? *failed_ : invalidArgument("upload of " + entry_path_ + " already finished");
    while (!chunk.empty()) {
      const ssize_t n = ::write(fd_, chunk.data(), chunk.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail(errno, "write");
      }
      chunk.remove_prefix(static_cast<size_t>(n));
    }
    return std::nullopt;
  }

  UnaryResult finish() override {
    if (fd_ < 0) return failed_ ? *failed_ : invalidArgument("upload of " + entry_path_ + " already finished");
    // On the new file, so an upload replaces the old file's metadata whole, as envd's does.
    for (const auto& [key, value] : metadata_) {
      if (::fsetxattr(fd_, (kMetadataPrefix + key).c_str(), value.data(), value.size(), 0) != 0) {
        return fail(errno, "set metadata on");
      }
    }
    if (::fsync(fd_) != 0) return fail(errno, "sync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return fail(errno, "close");
    ScopedFsCreds creds(user_);
    if (creds.error()) {
      RpcError err = *creds.error();
      discard();
      return err;
    }
    if (renameat(dirfd_, tmp_name_.c_str(), dirfd_, name_.c_str()) != 0) return fail(errno, "rename");
    tmp_name_.clear();
    // Makes the rename itself durable; the data already is, and a failure here changes nothing visible.
    const int dfd = openat(dirfd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    discard();
    NameCache names(users_);
    auto info = describe(entry_path_, names);
    if (auto* err = std::get_if<int>(&info)) return errnoError("stat", entry_path_, *err);
    return std::move(std::get<Json>(info));
  }

  void abort() override {
    discard();
    if (!failed_) failed_ = fsError(RpcCode::kCanceled, "upload of " + entry_path_ + " was aborted");
  }

 private:
  RpcError fail(int err, const char* op) {
    RpcError e = (err == ENOSPC || err == EDQUOT) ? diskError(entry_path_, err) : errnoError(op, dest_path_, err);
    discard();
    failed_ = e;
    return e;
  }

  // Closes everything and removes the temp file if it is still there.
  void discard() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (dirfd_ >= 0) {
      if (!tmp_name_.empty()) {
        ScopedFsCreds creds(user_);  // on failure, root removes its own temp file
        unlinkat(dirfd_, tmp_name_.c_str(), 0);
      }
      ::close(dirfd_);
      dirfd_ = -1;
    }
    tmp_name_.clear();
  }

  std::map<std::string, std::string> metadata_;  // set on the file before it is renamed into place
  const UserDb& users_;
  UserInfo user_;
  int dirfd_;
  int fd_;
  std::string tmp_name_;    // in dirfd_, "" once renamed or removed
  std::string name_;        // the destination's name in dirfd_
  std::string entry_path_;  // the path as requested (resolved), for EntryInfo and messages
  std::string dest_path_;   // the file actually written (a symlinked destination's target)
  std::optional<RpcError> failed_;
};

class FileDownloadSource : public DownloadSource {
 public:
  FileDownloadSource(int fd, uint64_t size, std::string path)
      : fd_(fd), size_(size), left_(size), path_(std::move(path)) {}
  ~FileDownloadSource() override { ::close(fd_); }
  FileDownloadSource(const FileDownloadSource&) = delete;
  FileDownloadSource& operator=(const FileDownloadSource&) = delete;

  uint64_t size() const override { return size_; }

  // Never yields more than size() bytes (the transport announced that length); a file that
  // shrinks underneath is an error rather than a silently short body.
  std::variant<size_t, RpcError> read(char* out, size_t max) override {
    if (left_ == 0 || max == 0) return size_t{0};
    const size_t want = static_cast<size_t>(std::min<uint64_t>(max, left_));
    for (;;) {
      const ssize_t n = ::read(fd_, out, want);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errnoError("read", path_, errno);
      if (n == 0) return fsError(RpcCode::kInternal, "read " + path_ + ": the file shrank during the download");
      left_ -= static_cast<uint64_t>(n);
      return static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
  uint64_t size_;
  uint64_t left_;
  std::string path_;
};

bool onNetworkMount(const std::string& path) {
  struct statfs sfs {};
  if (statfs(path.c_str(), &sfs) != 0) return false;
  // Magic numbers are 32-bit; f_type is signed on some ABIs.
  switch (static_cast<uint32_t>(sfs.f_type)) {
    case 0x6969:      // NFS
    case 0x517B:      // SMB
    case 0xFF534D42:  // CIFS
    case 0xFE534D42:  // SMB2
    case 0x564C:      // NCP
      return true;
    default: return false;
  }
}

}  // namespace

std::variant<Json, RpcError> entryInfo(const std::string& abs_path, const UserDb& users) {
  NameCache names(users);
  auto info = describe(abs_path, names);
  if (auto* err = std::get_if<int>(&info)) return errnoError("stat", abs_path, *err);
  return std::move(std::get<Json>(info));
}

// ---------------------------------------------------------------- WatchDir

// One WatchDir stream: an inotify fd with one watch per directory (just the root unless
// recursive), mapping watch descriptors to paths relative to the root. Stream callbacks hold it
// weakly, so once the service forgets it (or is destroyed) they do nothing.
class FsService::Watch : public std::enable_shared_from_this<FsService::Watch> {
 public:
  Watch(FsService& service, uint64_t id, std::shared_ptr<ServerStream> stream, UserInfo user, std::string root,
        bool recursive, bool include_entry)
      : service_(service),
        id_(id),
        stream_(std::move(stream)),
        user_(std::move(user)),
        root_(std::move(root)),
        recursive_(recursive),
        include_entry_(include_entry),
        names_(service.users_) {}
  ~Watch() {
    if (fd_ >= 0) ::close(fd_);
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  int fd() const { return fd_; }
  ServerStream& stream() { return *stream_; }
  EventLoop::TimerId keepaliveTimer() const { return keepalive_timer_; }
  void markStopped() { stopped_ = true; }

  // Creates the inotify instance and the initial watches; nothing is sent.
  std::optional<RpcError> init() {
    fd_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ < 0) return errnoError("watch", root_, errno);
    ScopedFsCreds creds(user_);
    if (creds.error()) return creds.error();
    const int wd = inotify_add_watch(fd_, root_.c_str(), kWatchMask | IN_ONLYDIR);
    if (wd < 0) return errnoError("watch", root_, errno);
    root_wd_ = wd;
    wds_[wd] = "";
    if (recursive_) return addSubtree("", nullptr);
    return std::nullopt;
  }

  void start() {
    auto weak = weak_from_this();
    service_.loop_.addFd(fd_, EPOLLIN, [weak](uint32_t) {
      if (auto w = weak.lock()) w->onReadable();
    });
    stream_->setOnClose([weak] {
      if (auto w = weak.lock()) w->service_.stopWatch(w->id_);
    });
    stream_->setOnDrain([weak] {
      if (auto w = weak.lock()) w->resume();
    });
    scheduleKeepalive();
    stream_->send(Json{{"start", Json::object()}});
    afterSend();
  }

 private:
  void scheduleKeepalive() {
    auto weak = weak_from_this();
    keepalive_timer_ = service_.loop_.addTimer(kKeepaliveInterval, [weak] {
      auto w = weak.lock();
      if (!w || w->stopped_) return;
      if (!w->sent_since_keepalive_) {
        w->stream_->send(Json{{"keepalive", Json::object()}});
        w->afterSend();
        if (w->stopped_) return;
      }
      w->sent_since_keepalive_ = false;
      w->scheduleKeepalive();
    });
  }

  void onReadable() {
    names_.clear();  // owner names may change between batches, not within one
    // Whole events only: the kernel never splits one across reads.
    alignas(alignof(struct inotify_event)) char buf[32 * 1024];
    while (!stopped_ && !paused_) {
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) return;
      if (n <= 0) {
        fail(n < 0 ? errnoError("read events of", root_, errno)
                   : fsError(RpcCode::kInternal, "inotify returned no data for " + root_));
        return;
      }
      size_t off = 0;
      while (off + sizeof(struct inotify_event) <= static_cast<size_t>(n)) {
        struct inotify_event ev {};
        std::memcpy(&ev, buf + off, sizeof ev);
        const char* name_at = buf + off + sizeof ev;
        off += sizeof ev + ev.len;
        if (off > static_cast<size_t>(n)) break;
        handle(ev.wd, ev.mask, std::string(name_at, strnlen(name_at, ev.len)));
        if (stopped_) return;
      }
    }
  }

  void handle(int wd, uint32_t mask, const std::string& name) {
    if (mask & IN_Q_OVERFLOW) {
      fail(fsError(RpcCode::kResourceExhausted,
                   "watch " + root_ + ": too many filesystem events, the watcher fell behind and events were lost"));
      return;
    }
    auto it = wds_.find(wd);
    if (it == wds_.end()) return;  // a watch already dropped (its IN_IGNORED, or events still queued for it)
    if (mask & IN_IGNORED) {
      wds_.erase(it);
      if (wd == root_wd_) finishOk();  // the watched directory is gone (or unmounted)
      return;
    }
    std::string rel;
    if (name.empty()) {
      // Events about a directory itself: a subdirectory's are also reported by its parent's watch.
      if (wd != root_wd_) return;
      rel = ".";
    } else {
      rel = joinRel(it->second, name);
    }
    const std::pair<uint32_t, const char*> kinds[] = {{IN_CREATE | IN_MOVED_TO, kEventCreate},
                                                      {IN_MODIFY, kEventWrite},
                                                      {IN_DELETE | IN_DELETE_SELF, kEventRemove},
                                                      {IN_MOVED_FROM | IN_MOVE_SELF, kEventRename},
                                                      {IN_ATTRIB, kEventChmod}};
    for (const auto& [bits, type] : kinds) {
      if (!(mask & bits)) continue;
      emit(rel, type);
      if (stopped_) return;
    }
    if (!recursive_ || !(mask & IN_ISDIR) || name.empty()) return;
    if (mask & IN_MOVED_FROM) dropSubtree(rel);
    if (mask & (IN_CREATE | IN_MOVED_TO)) {
      // Entries made in a new directory before its watch existed would be missed: report them
      // (one made just between the watch and the scan is reported twice, which is harmless).
      std::vector<std::string> found;
      std::optional<RpcError> err;
      {
        ScopedFsCreds creds(user_);
        err = creds.error() ? creds.error() : addSubtree(rel, (mask & IN_CREATE) ? &found : nullptr);
      }
      for (const auto& child : found) {
        emit(child, kEventCreate);
        if (stopped_) return;
      }
      if (err) fail(*err);
    }
  }

  // Watches rel (unless it is the root) and every directory below it, without following
  // symlinks. With `found`, also collects the entries met (relative paths). Runs with the
  // user's credentials.
  std::optional<RpcError> addSubtree(const std::string& start, std::vector<std::string>* found) {
    std::vector<std::string> todo{start};
    while (!todo.empty()) {
      const std::string rel = std::move(todo.back());
      todo.pop_back();
      const std::string abs = absPath(rel);
      if (!rel.empty()) {
        if (wds_.size() >= kMaxWatchesPerStream) {
          return fsError(RpcCode::kResourceExhausted,
                         "watch " + root_ + ": more than " + std::to_string(kMaxWatchesPerStream) + " directories");
        }
        const int wd = inotify_add_watch(fd_, abs.c_str(), kWatchMask | IN_ONLYDIR | IN_DONT_FOLLOW);
        if (wd < 0) {
          const int err = errno;
          if (err == ENOSPC || err == ENOMEM) {
            return fsError(RpcCode::kResourceExhausted,
                           "watch " + abs + ": " + std::strerror(err) + " (inotify watch limit reached)");
          }
          continue;  // gone already, replaced by a non-directory, or unreadable
        }
        wds_[wd] = rel;
      }
      DIR* d = opendir(abs.c_str());
      if (d == nullptr) continue;
      while (const dirent* ent = readdir(d)) {
        const std::string name = ent->d_name;
        if (name == "." || name == "..") continue;
        const std::string child = joinRel(rel, name);
        bool is_dir = ent->d_type == DT_DIR;
        if (ent->d_type == DT_UNKNOWN) {
          struct stat st {};
          is_dir = fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
        }
        if (found != nullptr) {
          if (found->size() >= kMaxSyntheticEvents) {
            closedir(d);
            return fsError(RpcCode::kResourceExhausted,
                           "watch " + root_ + ": too many entries appeared at once under " + absPath(start));
          }
          found->push_back(child);
        }
        if (is_dir) todo.push_back(child);
      }
      closedir(d);
    }
    return std::nullopt;
  }

  // Forgets the watches of a directory that moved away (if it moved within the tree, the
  // matching IN_MOVED_TO watches it again under its new name).
  void dropSubtree(const std::string& rel) {
    const std::string prefix = rel + "/";
    for (auto it = wds_.begin(); it != wds_.end();) {
      if (it->first != root_wd_ && (it->second == rel || it->second.compare(0, prefix.size(), prefix) == 0)) {
        inotify_rm_watch(fd_, it->first);
        it = wds_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void emit(const std::string& rel, const char* type) {
    Json ev = Json::object();
    ev["name"] = validUtf8(rel);
    ev["type"] = type;
    if (include_entry_ && std::strcmp(type, kEventRemove) != 0) {
      ScopedFsCreds creds(user_);
      if (!creds.error()) {
        auto info = describe(absPath(rel), names_);
        if (auto* entry = std::get_if<Json>(&info)) ev["entry"] = std::move(*entry);
      }
    }
    stream_->send(Json{{"filesystem", std::move(ev)}});
    sent_since_keepalive_ = true;
    afterSend();
  }

  void afterSend() {
    if (stopped_) return;
    if (!stream_->open()) {
      service_.stopWatch(id_);
      return;
    }
    if (!paused_ && stream_->queuedBytes() > ServerStream::kHighWater) {
      // The host is not reading: stop reading inotify until the stream drains. If the kernel
      // queue overflows meanwhile, the stream ends with resource_exhausted.
      paused_ = true;
      service_.loop_.modifyFd(fd_, 0);
    }
  }

  void resume() {
    if (stopped_ || !paused_) return;
    paused_ = false;
    service_.loop_.modifyFd(fd_, EPOLLIN);
  }

  void fail(const RpcError& err) {
    stream_->finish(err);
    service_.stopWatch(id_);
  }

  void finishOk() {
    stream_->finish();
    service_.stopWatch(id_);
  }

  std::string absPath(const std::string& rel) const {
    if (rel.empty() || rel == ".") return root_;
    return joinPath(root_, rel);
  }

  FsService& service_;
  const uint64_t id_;
  std::shared_ptr<ServerStream> stream_;
  const UserInfo user_;
  const std::string root_;
  const bool recursive_;
  const bool include_entry_;
  NameCache names_;
  int fd_ = -1;
  int root_wd_ = -1;
  std::unordered_map<int, std::string> wds_;  // watch descriptor -> path relative to root_ ("" = root)
  EventLoop::TimerId keepalive_timer_ = 0;
  bool stopped_ = false;
  bool paused_ = false;
  bool sent_since_keepalive_ = false;
};

// ---------------------------------------------------------------- FsService

namespace {

struct Call {
  UserInfo user;
  std::string path;
};

Or<std::string> resolveFor(const std::string& path, const UserInfo& user) {
  auto resolved = resolvePath(path, user);
  if (auto* err = std::get_if<RpcError>(&resolved)) return sanitized(*err);
  return std::move(std::get<std::string>(resolved));
}

Or<UserInfo> callerUser(const UserDb& users, const CallContext& ctx) {
  auto user = users.lookup(ctx.user);
  if (auto* err = std::get_if<RpcError>(&user)) return sanitized(*err);
  return std::move(std::get<UserInfo>(user));
}

// Checks the request, looks up the caller and resolves the path in `field_name`. required: an
// empty or missing path is refused instead of meaning the home directory (for destructive calls).
Or<Call> prepare(const UserDb& users, const Json& request, const CallContext& ctx, const char* field_name,
                 bool required) {
  if (auto err = checkObject(request)) return *err;
  auto path = stringField(request, field_name);
  if (auto* err = std::get_if<RpcError>(&path)) return *err;
  if (required && std::get<std::string>(path).empty()) {
    return invalidArgument(std::string("field \"") + field_name + "\" is required");
  }
  auto user = callerUser(users, ctx);
  if (auto* err = std::get_if<RpcError>(&user)) return *err;
  auto resolved = resolveFor(std::get<std::string>(path), std::get<UserInfo>(user));
  if (auto* err = std::get_if<RpcError>(&resolved)) return *err;
  return Call{std::move(std::get<UserInfo>(user)), std::move(std::get<std::string>(resolved))};
}

UnaryResult entryResponse(const std::string& path, const UserDb& users) {
  auto info = entryInfo(path, users);
  if (auto* err = std::get_if<RpcError>(&info)) return *err;
  Json response = Json::object();
  response["entry"] = std::move(std::get<Json>(info));
  return response;
}

}  // namespace

FsService::FsService(EventLoop& loop, const UserDb& users) : loop_(loop), users_(users) {}

FsService::~FsService() {
  auto watches = std::move(watches_);
  watches_.clear();
  for (auto& [id, w] : watches) {
    w->markStopped();
    loop_.removeFd(w->fd());
    loop_.cancelTimer(w->keepaliveTimer());
    w->stream().finish(rpcError(RpcCode::kUnavailable, "the filesystem service is shutting down"));
  }
}  // the watches close their inotify fds here

void FsService::registerWith(Router& router) {
  router.unary("/filesystem.Filesystem/Stat", [this](const Json& r, const CallContext& c) { return stat(r, c); });
  router.unary("/filesystem.Filesystem/ListDir", [this](const Json& r, const CallContext& c) { return listDir(r, c); });
  router.unary("/filesystem.Filesystem/MakeDir", [this](const Json& r, const CallContext& c) { return makeDir(r, c); });
  router.unary("/filesystem.Filesystem/Move", [this](const Json& r, const CallContext& c) { return move(r, c); });
  router.unary("/filesystem.Filesystem/Remove", [this](const Json& r, const CallContext& c) { return remove(r, c); });
  router.serverStream(
      "/filesystem.Filesystem/WatchDir",
      [this](const Json& r, const CallContext& c, std::shared_ptr<ServerStream> s) { watchDir(r, c, std::move(s)); });
  router.upload([this](const std::string& p, const CallContext& c) { return upload(p, c); });
  router.download([this](const std::string& p, const CallContext& c) { return download(p, c); });
}

UnaryResult FsService::stat(const Json& request, const CallContext& ctx) {
  auto call = prepare(users_, request, ctx, "path", false);
  if (auto* err = std::get_if<RpcError>(&call)) return *err;
  const auto& [user, path] = std::get<Call>(call);
  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();
  return entryResponse(path, users_);
}

UnaryResult FsService::listDir(const Json& request, const CallContext& ctx) {
  auto call = prepare(users_, request, ctx, "path", false);
  if (auto* err = std::get_if<RpcError>(&call)) return *err;
  auto depth_field = uint32Field(request, "depth");
  if (auto* err = std::get_if<RpcError>(&depth_field)) return *err;
  const uint32_t depth = std::max<uint32_t>(std::get<uint32_t>(depth_field), 1);
  const auto& [user, path] = std::get<Call>(call);
  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errnoError("stat", path, errno);
  if (!S_ISDIR(st.st_mode)) return invalidArgument("list " + path + ": not a directory");

  const RpcError too_many = fsError(RpcCode::kResourceExhausted,
                                    "list " + path + ": more than " + std::to_string(kMaxListEntries) + " entries");
  // Reads the sorted names of dir, at most `budget`; false when it holds more.
  auto readNames = [](const std::string& dir, size_t budget, std::vector<std::string>* out, int* err) {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) {
      *err = errno;
      return true;
    }
    bool fits = true;
    while (const dirent* ent = readdir(d)) {
      if (std::strcmp(ent->d_name, ".") == 0 || std::strcmp(ent->d_name, "..") == 0) continue;
      if (out->size() >= budget) {
        fits = false;
        break;
      }
      out->emplace_back(ent->d_name);
    }
    closedir(d);
    std::sort(out->begin(), out->end());  // envd walks in lexical order
    return fits;
  };

  // Pre-order walk (as filepath.WalkDir) with an explicit stack; `pending` counts names read but
  // not yet described, so memory stays within the entry bound.
  struct Frame {
    std::string dir;
    std::vector<std::string> names;
    size_t next = 0;
    uint32_t level = 1;
  };
  NameCache names(users_);
  Json entries = Json::array();
  std::vector<Frame> stack(1);
  stack[0].dir = path;
  int err = 0;
  if (!readNames(path, kMaxListEntries, &stack[0].names, &err)) return too_many;
  if (err != 0) return errnoError("list", path, err);
  size_t pending = stack[0].names.size();
  while (!stack.empty()) {
    Frame& frame = stack.back();
    if (frame.next == frame.names.size()) {
      stack.pop_back();
      continue;
    }
    const std::string child = joinPath(frame.dir, frame.names[frame.next++]);
    const uint32_t level = frame.level;  // `frame` dangles once the stack grows
    --pending;
    mode_t lmode = 0;
    auto info = describe(child, names, &lmode);
    if (std::holds_alternative<int>(info)) continue;  // vanished meanwhile
    entries.push_back(std::move(std::get<Json>(info)));
    // Symlinked directories are listed but not entered (no loops, no escaping the tree).
    if (level >= depth || !S_ISDIR(lmode)) continue;
    Frame sub;
    sub.dir = child;
    sub.level = level + 1;
    int sub_err = 0;
    if (!readNames(child, kMaxListEntries - entries.size() - pending, &sub.names, &sub_err)) return too_many;
    if (sub_err != 0) continue;  // unreadable subdirectory: listed, not entered
    pending += sub.names.size();
    stack.push_back(std::move(sub));
  }
  Json response = Json::object();
  if (!entries.empty()) response["entries"] = std::move(entries);  // proto3: empty repeated fields are omitted
  return response;
}

UnaryResult FsService::makeDir(const Json& request, const CallContext& ctx) {
  auto call = prepare(users_, request, ctx, "path", false);
  if (auto* err = std::get_if<RpcError>(&call)) return *err;
  const auto& [user, path] = std::get<Call>(call);
  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();
  if (auto err = makeParents(path)) return *err;
  if (::mkdir(path.c_str(), 0755) != 0) {
    const int mkdir_err = errno;
    struct stat st {};
    if (mkdir_err == EEXIST) {
      // envd: an existing directory is already_exists (the SDK answers false); anything else
      // in the way is invalid_argument (the SDK throws).
      const bool dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      if (!dir) return fsError(RpcCode::kInvalidArgument, path + " already exists and is not a directory");
      return fsError(RpcCode::kAlreadyExists, "directory " + path + " already exists");
    }
    return errnoError("mkdir", path, mkdir_err);
  }
  return entryResponse(path, users_);
}

UnaryResult FsService::move(const Json& request, const CallContext& ctx) {
  auto call = prepare(users_, request, ctx, "source", true);
  if (auto* err = std::get_if<RpcError>(&call)) return *err;
  const auto& [user, source] = std::get<Call>(call);
  auto dest_field = stringField(request, "destination");
  if (auto* err = std::get_if<RpcError>(&dest_field)) return *err;
  if (std::get<std::string>(dest_field).empty()) return invalidArgument("field \"destination\" is required");
  auto dest = resolveFor(std::get<std::string>(dest_field), user);
  if (auto* err = std::get_if<RpcError>(&dest)) return *err;
  const std::string& destination = std::get<std::string>(dest);

  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();
  struct stat st {};
  if (::lstat(source.c_str(), &st) != 0) return errnoError("move", source, errno);
  if (auto err = makeParents(destination)) return *err;
  if (::rename(source.c_str(), destination.c_str()) != 0) {
    const int err = errno;
    return errnoError("move", source + " to " + destination, err);
  }
  return entryResponse(destination, users_);
}

UnaryResult FsService::remove(const Json& request, const CallContext& ctx) {
  auto call = prepare(users_, request, ctx, "path", true);
  if (auto* err = std::get_if<RpcError>(&call)) return *err;
  const auto& [user, path] = std::get<Call>(call);
  if (path == "/") return invalidArgument("refusing to remove /");
  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();

  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Json::object();  // envd removes like RemoveAll: nothing there is success
    return errnoError("remove", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlink(path.c_str()) != 0) return errnoError("remove", path, errno);
    return Json::object();
  }
  // The reference filesystem is the one holding `path`; a path that is itself a mount point
  // would take us into another one.
  struct stat parent {};
  if (::stat(dirName(path).c_str(), &parent) == 0 && isMountRoot(AT_FDCWD, path.c_str(), st, parent.st_dev)) {
    return fsError(RpcCode::kFailedPrecondition, "remove " + path + ": it is a mount point");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errnoError("remove", path, errno);
  if (auto err = removeContents(fd, path, st.st_dev, 0)) return *err;
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return errnoError("remove", path, errno);
  return Json::object();
}

void FsService::watchDir(const Json& request, const CallContext& ctx, std::shared_ptr<ServerStream> stream) {
  if (!stream) return;
  auto call = prepare(users_, request, ctx, "path", false);
  if (auto* err = std::get_if<RpcError>(&call)) return stream->finish(*err);
  auto recursive = boolField(request, "recursive", "recursive");
  if (auto* err = std::get_if<RpcError>(&recursive)) return stream->finish(*err);
  auto include_entry = boolField(request, "includeEntry", "include_entry");
  if (auto* err = std::get_if<RpcError>(&include_entry)) return stream->finish(*err);
  auto allow_network = boolField(request, "allowNetworkMounts", "allow_network_mounts");
  if (auto* err = std::get_if<RpcError>(&allow_network)) return stream->finish(*err);
  auto& [user, path] = std::get<Call>(call);
  {
    ScopedFsCreds creds(user);
    if (creds.error()) return stream->finish(*creds.error());
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return stream->finish(errnoError("watch", path, errno));
    if (!S_ISDIR(st.st_mode)) return stream->finish(invalidArgument("watch " + path + ": not a directory"));
    // inotify sees only this machine's changes on network filesystems (as envd).
    if (!std::get<bool>(allow_network) && onNetworkMount(path)) {
      return stream->finish(fsError(RpcCode::kFailedPrecondition,
                                    "watch " + path + ": on a network mount; set allowNetworkMounts to watch it"));
    }
  }
  if (!stream->open()) return;
  const uint64_t id = next_watch_id_++;
  auto watch = std::make_shared<Watch>(*this, id, stream, std::move(user), std::move(path), std::get<bool>(recursive),
                                       std::get<bool>(include_entry));
  if (auto err = watch->init()) return stream->finish(*err);
  watches_[id] = watch;
  watch->start();
}

void FsService::stopWatch(uint64_t id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  auto watch = std::move(it->second);  // kept alive until this returns, even if a caller holds none
  watches_.erase(it);
  watch->markStopped();
  loop_.removeFd(watch->fd());
  loop_.cancelTimer(watch->keepaliveTimer());
}

std::variant<std::unique_ptr<UploadSink>, RpcError> FsService::upload(const std::string& requested,
                                                                      const CallContext& ctx) {
  auto user_or = callerUser(users_, ctx);
  if (auto* err = std::get_if<RpcError>(&user_or)) return *err;
  const UserInfo& user = std::get<UserInfo>(user_or);
  if (auto err = checkMetadata(ctx.metadata)) return *err;
  auto path_or = resolveFor(requested, user);
  if (auto* err = std::get_if<RpcError>(&path_or)) return *err;
  const std::string& path = std::get<std::string>(path_or);
  if (path == "/") return invalidArgument("upload /: is a directory");

  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();
  // Writing through a symlink replaces its target, as writing to the path would.
  std::string dest = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    if (char* real = ::realpath(path.c_str(), nullptr)) {
      dest = real;
      std::free(real);
    }
  }
  std::optional<mode_t> keep_mode;
  if (::lstat(dest.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return invalidArgument("upload " + path + ": is a directory");
    if (S_ISREG(st.st_mode)) {
      // Replacing is a write to the file: keep the permission check that writing in place would do.
      if (faccessat(AT_FDCWD, dest.c_str(), W_OK, AT_EACCESS) != 0) return errnoError("upload", path, errno);
      keep_mode = st.st_mode & 07777;
    } else if (!S_ISLNK(st.st_mode)) {  // a dangling symlink is simply replaced
      return invalidArgument("upload " + path + ": not a regular file");
    }
  } else if (errno != ENOENT) {
    return errnoError("upload", path, errno);
  }
  if (auto err = makeParents(dest)) return *err;

  const std::string dir = dirName(dest);
  const std::string name = baseName(dest);
  const int dirfd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) return errnoError("upload", path, errno);
  // Hidden, next to the destination (same filesystem, so the final rename is atomic), short
  // enough for NAME_MAX whatever the destination's name.
  const std::string stem = "." + name.substr(0, 200) + ".space-upload-";
  for (size_t attempt = 0; attempt < 32; ++attempt) {
    std::string tmp = stem + randomSuffix(attempt);
    const int fd = openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) continue;
    if (fd < 0) {
      const int err = errno;
      ::close(dirfd);
      return (err == ENOSPC || err == EDQUOT) ? diskError(path, err) : errnoError("upload", path, err);
    }
    if (keep_mode) fchmod(fd, *keep_mode);  // best effort: the kernel may drop a set-group-ID bit
    return std::make_unique<FileUploadSink>(users_, user, dirfd, fd, std::move(tmp), name, path, dest, ctx.metadata);
  }
  ::close(dirfd);
  return fsError(RpcCode::kInternal, "upload " + path + ": cannot create a unique temporary file");
}

std::variant<std::unique_ptr<DownloadSource>, RpcError> FsService::download(const std::string& requested,
                                                                            const CallContext& ctx) {
  auto user_or = callerUser(users_, ctx);
  if (auto* err = std::get_if<RpcError>(&user_or)) return *err;
  const UserInfo& user = std::get<UserInfo>(user_or);
  auto path_or = resolveFor(requested, user);
  if (auto* err = std::get_if<RpcError>(&path_or)) return *err;
  const std::string& path = std::get<std::string>(path_or);

  ScopedFsCreds creds(user);
  if (creds.error()) return *creds.error();
  // Checked before opening: opening a FIFO or a device can block or have side effects.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errnoError("download", path, errno);
  if (S_ISDIR(st.st_mode)) return invalidArgument("download " + path + ": is a directory");
  if (!S_ISREG(st.st_mode)) return invalidArgument("download " + path + ": not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return errnoError("download", path, errno);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // swapped since the stat
    ::close(fd);
    return invalidArgument("download " + path + ": not a regular file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (ctx.offset > size) {  // the file shrank since the caller looked at its size
    ::close(fd);
    return fsError(RpcCode::kFailedPrecondition, "download " + path + ": offset " + std::to_string(ctx.offset) +
                                                     " is past the end of the file (" + std::to_string(size) +
                                                     " bytes)");
  }
  if (ctx.offset > 0 && ::lseek(fd, static_cast<off_t>(ctx.offset), SEEK_SET) < 0) {
    const int err = errno;
    ::close(fd);
    return errnoError("seek", path, err);
  }
  const uint64_t length = std::min(size - ctx.offset, ctx.length.value_or(size - ctx.offset));
  return std::make_unique<FileDownloadSource>(fd, length, path);
}

}  // namespace space::agent
