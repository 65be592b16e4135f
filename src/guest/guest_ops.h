// GuestOps: the process and file commands a front end (the REST API today, an E2B-compatible
// one later) runs in a sandbox's guest, as typed requests and results over one AgentClient.
// It owns what the agent's RPC surface looks like: method paths, envd request shapes, signal
// names, the "start, then send stdin, then close it" sequence, and decoding the agent's answers
// into typed values. Front ends parse their own wire format into these types and render the
// results back; none of them builds an agent request.
//
// Everything the guest sends is hostile. Answers are type-checked (a malformed one is
// `unavailable`, like any protocol violation), a streamed process's output is passed on as the
// agent's base64 text only once it is known to be canonical base64 of at most kMaxEventData
// bytes, and events wait for a slow consumer only up to StreamLimits::max_backlog bytes.
// Errors are returned as the agent reported them; mapping them (e.g. to "the VM died") is the
// caller's. GuestOps knows nothing of sandboxes: whoever holds the sandbox's agent lease hands
// it the client, and keeps the lease for as long as the calls and streams run.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agentproto/agent_client.h"
#include "agentproto/commands.h"
#include "common/result.h"

namespace space::guest {

// ---- processes

// A terminal's size in characters; the agent accepts 1..65535 each.
struct PtySize {
  int cols = 80;
  int rows = 24;
};

struct ProcessSpec {
  // Exactly one: a shell command line (run as `/bin/bash -l -c <command>`) or a program + args.
  std::string command;
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::string cwd;                                              // "" = the user's home
  std::string user;                                             // "" = the sandbox's default user
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // the process is killed then; 0 = never
  // Sent once the process started. nullopt and close_stdin: the process gets no stdin at all.
  std::optional<std::string> stdin_data;
  // After stdin_data: close stdin (EOF), or keep it open for sendInput()/closeStdin().
  bool close_stdin = true;
  // Run on a terminal of this size instead of pipes (start() only): stdout and stderr both
  // arrive as kStdout, input goes through sendPtyInput(), and stdin_data must be absent.
  std::optional<PtySize> pty;
  // A name to find the process by before its pid is known (sendSignalTagged); "" = none.
  std::string tag;
};

// The checks every front end makes before it leases a sandbox (so a bad request resumes none):
// exactly one of command/argv, a non-empty command without NUL bytes, argv naming a program.
Status checkProcessSpec(const ProcessSpec& spec);

using ProcessOutput = agentproto::CommandResult;
using ProcessEnd = agentproto::ProcessEnd;

// A decoded data event larger than this is a protocol violation (the agent reads 64 KiB at a time).
inline constexpr size_t kMaxEventData = 1 << 20;

struct ProcessEvent {
  enum class Kind { kStart, kStdout, kStderr, kEnd } kind = Kind::kStart;
  int pid = 0;  // kStart
  // kStdout (PTY output included), kStderr: the bytes as the agent's canonical base64, unchanged.
  std::string data_base64;
  ProcessEnd end;  // kEnd
};

struct StreamLimits {
  // Bytes of events (data plus a fixed overhead each) waiting for the consumer; over it the
  // stream ends in kOverflow and the process runs on.
  size_t max_backlog = 8 << 20;
};

// One process's event stream (a start or a connect). A consumer thread calls next() in a loop;
// the events arrive on the agent client's I/O thread in between. Destroying it stops the stream
// (the process keeps running in the guest and can be connected to again).
class ProcessStream {
 public:
  enum class State {
    kOpen,      // more may come
    kEnded,     // the stream is over: the process ended, or `error` says why not
    kOverflow,  // the consumer fell more than max_backlog behind; the stream was stopped
  };
  struct Batch {
    std::vector<ProcessEvent> events;  // in order
    State state = State::kOpen;
    // With kEnded: the agent's error, a malformed event (unavailable), or stdin that could not
    // be delivered (then the process was killed; the message starts with "stdin: ").
    std::optional<Error> error;
  };

  ~ProcessStream();
  ProcessStream(const ProcessStream&) = delete;
  ProcessStream& operator=(const ProcessStream&) = delete;

  // Waits up to `wait` for an event or the end, then returns everything that arrived. Also
  // delivers the stdin of a started process on this thread once its start event came. Once a
  // batch says kEnded or kOverflow, later calls return that state again with no events.
  Batch next(std::chrono::milliseconds wait);
  // What arrived, without waiting, for a consumer on an event loop (woken by onReady): never
  // blocks, so it never delivers stdin (use it for a stream started without stdin_data, as a
  // PTY's is), and a stream that broke or overflowed is canceled instead of stopped.
  Batch poll();
  // Stops receiving, waiting a bounded time for the agent to see it. The process keeps running.
  void stop();
  // The same without waiting (from a thread that must not block); destroying the stream
  // afterwards does not wait either. Safe from any thread, also while another calls next().
  void cancel();
  // `ready` runs on the agent client's I/O thread each time an event or the end arrives: for a
  // consumer that is woken instead of waiting in next() (a detached HTTP stream). It must not
  // block and must not own this stream. Set before events can matter (right after start).
  void onReady(std::function<void()> ready);

 private:
  friend class GuestOps;
  struct Shared;  // what the I/O thread's callbacks fill in (guest_ops.cc)
  ProcessStream(std::shared_ptr<agentproto::AgentClient> agent, std::shared_ptr<Shared> shared,
                std::shared_ptr<agentproto::AgentStream> stream, std::optional<std::string> stdin_data,
                bool close_stdin);
  void deliverStdin(int pid);
  Batch take(std::chrono::milliseconds wait, bool may_block);

  std::shared_ptr<agentproto::AgentClient> agent_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<agentproto::AgentStream> stream_;
  std::optional<std::string> stdin_data_;  // still to send (with close_stdin_) once the pid is known
  bool close_stdin_ = true;
  bool stdin_done_ = false;
  std::optional<State> final_;
  std::atomic<bool> canceled_{false};
};

struct ProcessInfo {
  int pid = 0;
  std::string cmd;
  std::vector<std::string> args;
  std::string cwd;
  std::optional<std::string> tag;
};

enum class Signal { kKill, kTerm, kInt, kHup, kQuit, kUsr1, kUsr2, kStop, kCont };
// "SIGTERM" or "TERM"; nullopt for any other name (only these signals may be sent).
std::optional<Signal> parseSignal(std::string_view name);

// ---- files

enum class FileType { kFile, kDirectory, kSymlink, kOther };

// A file as the agent describes it; a field the agent left out is nullopt.
struct FileEntry {
  std::optional<std::string> name;
  std::optional<std::string> path;
  FileType type = FileType::kOther;
  uint64_t size = 0;
  std::optional<uint32_t> mode;
  std::optional<std::string> permissions;
  std::optional<std::string> owner;
  std::optional<std::string> group;
  std::optional<std::string> modified_at;  // RFC 3339
  std::optional<std::string> symlink_target;
};

// Transfers may take long; their own deadline.
inline constexpr std::chrono::milliseconds kTransferTimeout = std::chrono::hours(1);

// ---- the commands

class GuestOps {
 public:
  explicit GuestOps(std::shared_ptr<agentproto::AgentClient> agent);
  // The deadline of the calls that steer a running process (signal, input, resize); the agent
  // client's default (30 s) unless set. An interactive session sets it short, so a guest that
  // sits on one keystroke cannot stall it for long.
  void setControlTimeout(std::chrono::milliseconds timeout) { control_timeout_ = timeout; }

  // Runs a process to its end and collects its output (stdout + stderr at most `max_output`
  // bytes, else resource_exhausted "output_too_large"). `abandon` is asked about once a second;
  // true ends the wait with `canceled` (the process keeps running). Needs close_stdin.
  Result<ProcessOutput> run(ProcessSpec spec, size_t max_output, const std::function<bool()>& abandon = {});
  // Starts a process and streams its events; stdin_data is sent (and stdin closed, if asked)
  // from ProcessStream::next once the process started.
  Result<std::unique_ptr<ProcessStream>> start(ProcessSpec spec, const StreamLimits& limits = {});
  // Streams the events of a running process, from now on.
  std::unique_ptr<ProcessStream> connect(int pid, const StreamLimits& limits = {});
  Result<std::vector<ProcessInfo>> listProcesses();
  Status sendSignal(int pid, Signal signal);
  // To the oldest running process started with `tag` (ProcessSpec::tag).
  Status sendSignalTagged(const std::string& tag, Signal signal);
  Status sendInput(int pid, std::string_view data);  // nothing is sent for empty data
  Status closeStdin(int pid);
  // For a process started with a PTY: keystrokes (bytes as a terminal sends them), and a new
  // window size (the guest's programs get SIGWINCH).
  Status sendPtyInput(int pid, std::string_view data);  // nothing is sent for empty data
  Status resizePty(int pid, PtySize size);
  // The same calls without waiting, for an event loop: `done` runs once with the outcome, on
  // the agent client's I/O thread (or on this thread at once), under its callback rules
  // (AgentClient::callAsync): short, never blocking, owning what it touches.
  using Done = std::function<void(Status)>;
  void sendPtyInputAsync(int pid, std::string_view data, Done done);
  void resizePtyAsync(int pid, PtySize size, Done done);
  void sendSignalAsync(int pid, Signal signal, Done done);

  // `user`: "" = the sandbox's default user; the guest applies that user's permissions.
  Status remove(const std::string& path, const std::string& user);
  Result<std::vector<FileEntry>> listDir(const std::string& path, int depth, const std::string& user);
  Result<FileEntry> stat(const std::string& path, const std::string& user);
  Result<FileEntry> makeDir(const std::string& path, const std::string& user);
  Result<FileEntry> move(const std::string& source, const std::string& destination, const std::string& user);
  // Source and sink run on the calling thread (see AgentClient::upload/download). `metadata`
  // becomes the file's user metadata (replacing what it had), as envd's X-Metadata-* headers do.
  Result<FileEntry> upload(const std::string& path, agentproto::AgentClient::UploadSource source,
                           const std::string& user, const std::map<std::string, std::string>& metadata = {});
  // `range`: (offset, length) of the bytes wanted; the whole file when absent.
  Status download(const std::string& path, agentproto::AgentClient::DownloadSink sink, const std::string& user,
                  std::optional<std::pair<uint64_t, uint64_t>> range = std::nullopt);

 private:
  std::unique_ptr<ProcessStream> openStream(const std::string& method, const agentproto::Json& request,
                                            const agentproto::CallOptions& options, const StreamLimits& limits,
                                            std::optional<std::string> stdin_data, bool close_stdin);

  agentproto::CallOptions controlOptions() const;
  void controlAsync(const std::string& method, agentproto::Json request, Done done);

  std::shared_ptr<agentproto::AgentClient> agent_;
  std::optional<std::chrono::milliseconds> control_timeout_;
};

}  // namespace space::guest
