// ProcessService: envd's process.Process service inside the guest agent. Start forks and execs a
// command as a guest user (setsid, the user's groups/gid/uid, the resolved cwd, the environment
// PATH/HOME/USER/LOGNAME < sandbox env < request envs) with pipes or a PTY, and streams its output
// as base64 "data" events to every ServerStream attached to it (Start's own, plus any Connect).
// Each attached stream gets a "start" event first and, once the exit status is known and the
// output reached EOF (or 200 ms after the exit, when a background grandchild keeps a pipe open),
// an "end" event and finish(). A failed exec is reported as a stream error, never as a start.
// The service runs entirely on the agent's single-threaded EventLoop and blocks only for the
// fork-to-exec handshake. It never calls waitpid: the agent reaps every child and hands each
// status to onChildExit(). Output is read only while every attached stream is at or below
// ServerStream::kHighWater, so a slow host stalls the process instead of growing buffers; output
// with no stream attached is discarded, as in envd. Requests are untrusted JSON: every field is
// type-checked and size-bounded, and no handler throws. Ending a Start stream early leaves the
// process running; a timeout from the call context SIGKILLs its process group.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "agent/event_loop.h"
#include "agent/rpc.h"
#include "agent/users.h"

namespace space::agent {

class ProcessService {
 public:
  // Limits on what one untrusted request may make the agent hold.
  static constexpr size_t kMaxProcesses = 4096;
  static constexpr size_t kMaxSpecBytes = 1 << 20;              // cmd + args + envs + cwd + tag of a Start
  static constexpr size_t kMaxPendingInput = 8 << 20;           // SendInput bytes not yet taken by the process
  static constexpr std::chrono::milliseconds kExitLinger{200};  // wait for pipe EOF after the exit
  static constexpr std::chrono::milliseconds kExecHandshakeTimeout{5000};  // fork -> exec, bounded

  ProcessService(EventLoop& loop, const UserDb& users);
  ~ProcessService();  // SIGKILLs every process group, finishes attached streams, releases fds
  ProcessService(const ProcessService&) = delete;
  ProcessService& operator=(const ProcessService&) = delete;

  // Registers /process.Process/{Start,Connect,List,SendInput,CloseStdin,SendSignal,Update}.
  void registerWith(Router& router);
  // Sandbox-wide environment (applied after PATH/HOME/USER/LOGNAME, before per-call envs).
  void setSandboxEnv(std::map<std::string, std::string> env) { sandbox_env_ = std::move(env); }
  // Variables below the sandbox's own (the credential CA's: trust_store.h).
  void setBaseEnv(std::map<std::string, std::string> env) { base_env_ = std::move(env); }
  // The agent (PID 1) reaps every child with waitpid(-1) on SIGCHLD and hands each status here.
  // Returns true if the pid was one of this service's children (including one whose exec failed).
  bool onChildExit(pid_t pid, int wait_status);

 private:
  struct Proc;
  enum FdRole : int { kOut, kErr, kIn };

  void start(const Json& request, const CallContext& ctx, const std::shared_ptr<ServerStream>& stream);
  void connect(const Json& request, const std::shared_ptr<ServerStream>& stream);
  UnaryResult list() const;
  UnaryResult sendInput(const Json& request);
  UnaryResult closeStdin(const Json& request);
  UnaryResult sendSignal(const Json& request);
  UnaryResult update(const Json& request);

  Proc* find(uint64_t id);
  // A running (not yet exited) process named by request["process"] = {"pid"} | {"tag"}.
  std::variant<Proc*, RpcError> select(const Json& request);

  void attach(Proc& p, std::shared_ptr<ServerStream> stream);
  void detach(uint64_t id, const ServerStream* stream);
  void onDrain(uint64_t id);
  bool overHighWater(const Proc& p) const;

  void onFd(uint64_t id, FdRole role, uint32_t events);
  static const char* dataKind(const Proc& p, FdRole role);
  void readOnce(Proc& p, FdRole role);
  void markEof(Proc& p, FdRole role);
  void broadcast(Proc& p, const char* kind, const char* data, size_t len);
  void updateInterest(Proc& p);
  int flushInput(Proc& p);
  void dropInput(Proc& p);

  void onTimeout(uint64_t id);
  void maybeEnd(uint64_t id);
  void endProcess(uint64_t id, bool drain_first);
  void release(Proc& p);

  EventLoop& loop_;
  const UserDb& users_;
  std::map<std::string, std::string> sandbox_env_;
  std::map<std::string, std::string> base_env_;
  std::map<uint64_t, std::unique_ptr<Proc>> procs_;  // by start order; includes exited, not yet ended
  std::map<pid_t, uint64_t> running_;                // pid -> id until the exit status is known
  std::set<pid_t> failed_children_;                  // exec failed, not yet reaped
  uint64_t next_id_ = 1;
  std::vector<char> read_buf_;
  // Stream callbacks hold a weak reference to this so a transport that outlives the service
  // cannot call into freed memory.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace space::agent
