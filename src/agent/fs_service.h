// FsService: the agent's filesystem.Filesystem service (envd semantics) plus the raw file transfer
// handlers. Every filesystem operation runs with the calling user's filesystem credentials
// (fsuid/fsgid and supplementary groups; the agent itself stays root), so permission errors are
// the kernel's and whatever the service creates belongs to the caller. Paths resolve through
// resolvePath against the caller's home. Unary handlers answer synchronously; WatchDir streams
// run on the EventLoop with one inotify fd each, stop when the stream closes, and are finished
// (unavailable) when the service is destroyed. Uploads go to a temp file next to the destination
// that is fsynced and renamed over it on finish, so a failed or aborted upload leaves the old file
// untouched. Requests are untrusted: field types are checked and every walk is bounded. The
// service must outlive the Router it registered with, be destroyed before the EventLoop, and live
// on the loop's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>

#include "agent/event_loop.h"
#include "agent/rpc.h"
#include "agent/users.h"

namespace space::agent {

// The EntryInfo JSON object for abs_path, as the calling thread's current filesystem credentials
// see it (the process service or a caller holding other credentials can reuse it). A symlink is
// described by what it resolves to (type, size, mode, permissions, owner, group, modifiedTime)
// plus "symlinkTarget" = the resolved absolute path; "name" and "path" stay the link's own. A
// dangling or looping symlink has no "type" (FILE_TYPE_UNSPECIFIED) and no "mode", permissions
// "?---------", the link's own size, owner, group and time, and symlinkTarget = its target made
// absolute.
// Types other than regular files and directories are FILE_TYPE_UNSPECIFIED as in envd. Defaults
// are omitted (proto3 JSON); modifiedTime is RFC3339 UTC with 0, 3, 6 or 9 fractional digits.
// Errors: lstat's errno mapped with rpcCodeFromErrno.
std::variant<Json, RpcError> entryInfo(const std::string& abs_path, const UserDb& users);

class FsService {
 public:
  static constexpr size_t kMaxListEntries = 100000;      // ListDir answers above this: resource_exhausted
  static constexpr size_t kMaxWatchesPerStream = 10000;  // inotify watches one WatchDir stream may hold
  static constexpr std::chrono::milliseconds kKeepaliveInterval{50000};  // WatchDir {"keepalive":{}} when idle

  FsService(EventLoop& loop, const UserDb& users);
  ~FsService();
  FsService(const FsService&) = delete;
  FsService& operator=(const FsService&) = delete;

  // Registers Stat, ListDir, MakeDir, Move, Remove, WatchDir and the upload and download handlers.
  // Beyond envd: Move and Remove refuse an empty path (it would mean the home directory), Remove
  // refuses "/" and leaves other mounted filesystems alone (failed_precondition, after removing
  // the rest), ListDir skips subdirectories it cannot read, uploads need write permission on an
  // existing destination and replace a symlink's target rather than the link.
  void registerWith(Router& router);

  // Number of live WatchDir streams (for tests and diagnostics).
  size_t activeWatches() const { return watches_.size(); }

 private:
  class Watch;

  UnaryResult stat(const Json& request, const CallContext& ctx);
  UnaryResult listDir(const Json& request, const CallContext& ctx);
  UnaryResult makeDir(const Json& request, const CallContext& ctx);
  UnaryResult move(const Json& request, const CallContext& ctx);
  UnaryResult remove(const Json& request, const CallContext& ctx);
  void watchDir(const Json& request, const CallContext& ctx, std::shared_ptr<ServerStream> stream);
  std::variant<std::unique_ptr<UploadSink>, RpcError> upload(const std::string& path, const CallContext& ctx);
  std::variant<std::unique_ptr<DownloadSource>, RpcError> download(const std::string& path, const CallContext& ctx);

  // Detaches and forgets a watch (idempotent). Its stream callbacks hold it weakly and turn into
  // no-ops, so none has to be replaced, not even the one that may be running.
  void stopWatch(uint64_t id);

  EventLoop& loop_;
  const UserDb& users_;
  std::unordered_map<uint64_t, std::shared_ptr<Watch>> watches_;
  uint64_t next_watch_id_ = 1;
};

}  // namespace space::agent
