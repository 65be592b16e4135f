// AgentClient: the host's end of the agent channel. Given the connected stream to a VM's
// virtio-serial port (QEMU's agent.sock), it performs the session handshake, then runs an
// HTTP/2 client (nghttp2) on its own I/O thread. Any thread may issue calls:
//   call()      unary Connect RPC (JSON in, JSON out)
//   stream()    server-streaming Connect RPC (callbacks per message, then the end status)
//   upload()    POST /files, body streamed with HTTP/2 flow control
//   download()  GET /files, body streamed into a sink
// The I/O thread never runs caller code that may block: an upload's source and a download's
// sink run on the thread that called upload()/download(), with a bounded buffer in between, so
// a slow API client slows its own transfer and not the other calls to this VM, nor their
// deadlines.
// Everything the guest sends is hostile: frames are bounded by nghttp2 settings, messages and
// bodies by explicit limits, every call has a deadline, and a protocol violation fails this
// client (all pending calls get `unavailable`) and nothing else. Create a new client to
// reconnect; the agent starts a fresh session and keeps its processes.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::agentproto {

using Json = nlohmann::json;

struct AgentInfo {
  std::string version;
  std::string kernel;
  std::string hostname;
  double uptime_s = 0;
  Json raw;
};

// While the handshake waits for the guest, other things may fail first (QEMU exiting, a QMP
// event). The handshake also wakes for these fds and asks `check` whether to give up.
struct HandshakeWatch {
  std::vector<int> fds;
  std::function<std::optional<Error>()> check;
};

struct CallOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};  // 0: no deadline (streams only)
  std::string user;                                             // "" = the sandbox default user
  // How much longer than `timeout` this side waits. The guest enforces `timeout` itself (for
  // Process/Start it is the process's lifetime): the grace lets its answer, e.g. the end event
  // of a process it killed at the deadline, arrive before the host gives up.
  std::chrono::milliseconds local_grace{0};
  // Uploads: user metadata for the file (envd's X-Metadata-<key> headers; lower-case keys).
  std::map<std::string, std::string> metadata;
  // Downloads: the bytes from `offset`, at most `length` of them (all to the end if unset).
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  // Unary calls: the most bytes a successful answer may have (more fails the call); 0: the
  // client's limit (kMaxUnaryResponse). A caller that asks every guest for a few figures sets
  // it small, so no guest makes the host parse megabytes on its schedule.
  size_t max_response_bytes = 0;
};

class AgentStream;

class AgentClient {
 public:
  static constexpr size_t kMaxUnaryResponse = 16 << 20;
  static constexpr size_t kMaxEnvelope = 8 << 20;
  // What one client (one sandbox's agent) may hold of answers still arriving, over all its
  // calls: one answer of the largest size and two envelopes. A call whose bytes go past it fails
  // as the guest's fault (`unavailable`).
  static constexpr size_t kMaxBufferedAnswers = 32 << 20;
  // Upload bytes read from a source but not yet handed to HTTP/2: at most kUploadBuffer; each
  // source call is asked for at most kUploadChunk.
  static constexpr size_t kUploadBuffer = 1 << 20;
  static constexpr size_t kUploadChunk = 64 << 10;

  static Result<std::unique_ptr<AgentClient>> connect(UniqueFd fd, Clock::time_point deadline,
                                                      const HandshakeWatch& watch = {});
  // A client whose every call fails with `unavailable` (e.g. after a failed reconnect), so
  // holders of a client reference never hold a dangling one.
  static std::unique_ptr<AgentClient> disconnected(const std::string& reason);
  ~AgentClient();
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  const AgentInfo& info() const { return info_; }
  // False once the connection failed or the guest broke the protocol.
  bool alive() const;
  // PINGs written because a request went unanswered for a second (agent_client.cc,
  // kUnansweredNudge): each one is a guest that missed a notification, or a slow call.
  uint64_t nudges() const;

  Result<Json> call(const std::string& method, const Json& request, const CallOptions& options = {});
  // The same call without waiting for it: `done` gets the answer or the error, once, on the
  // client's I/O thread (or on this thread, at once, if the client is not connected). Same
  // callback rules as stream(). For a caller that must never wait on a guest (housekeeping).
  using ValueFn = std::function<void(Result<Json> answer)>;
  void callAsync(const std::string& method, const Json& request, const CallOptions& options, ValueFn done);

  using MessageFn = std::function<void(const Json& message)>;
  using EndFn = std::function<void(const Status& end)>;
  // Callbacks run on the client's I/O thread: keep them short, never block in them and never
  // call back into this client from them synchronously. They may still run after the caller
  // stopped waiting (a wait that timed out, a cancel() not yet carried out), until on_end has
  // run: capture state they own (a shared_ptr), never the caller's stack.
  std::shared_ptr<AgentStream> stream(const std::string& method, const Json& request, const CallOptions& options,
                                      MessageFn on_message, EndFn on_end);
  // The same stream, its data envelopes handed over as the guest framed them (their payload
  // bytes, never parsed here), for a caller that only relays them (the E2B front end). Only the
  // EndStream envelope is parsed, for on_end's status. Same callback rules as stream().
  using RawMessageFn = std::function<void(std::string_view payload)>;
  std::shared_ptr<AgentStream> streamRaw(const std::string& method, const Json& request, const CallOptions& options,
                                         RawMessageFn on_payload, EndFn on_end);

  // Produces upload bytes: fills `out` with up to `max` bytes, returns how many; 0 = done; an
  // error fails the upload with that error.
  using UploadSource = std::function<Result<size_t>(char* out, size_t max)>;
  // `source` is called on this (the calling) thread only, never after upload() returned. The
  // call's deadline is kept on the I/O thread even while the source blocks: the stream is reset
  // then, and upload() returns deadline_exceeded as soon as the source returns. So a source
  // should bound its own waits (the HTTP server's reads do).
  Result<Json> upload(const std::string& path, UploadSource source, const CallOptions& options = {});
  Result<Json> upload(const std::string& path, std::string data, const CallOptions& options = {});
  // Consumes download bytes in order; an error cancels the download and download() returns it.
  using DownloadSink = std::function<Status(std::string_view chunk)>;
  // `sink` is called on this (the calling) thread only, never after download() returned. The
  // guest is held back by HTTP/2 flow control on this stream alone while the sink is slow, so
  // at most one stream window (8 MiB) waits for it. Deadlines as for upload().
  Status download(const std::string& path, DownloadSink sink, const CallOptions& options = {});
  Result<std::string> download(const std::string& path, size_t max_bytes, const CallOptions& options = {});

  struct Impl;

 private:
  AgentClient() = default;
  std::shared_ptr<Impl> impl_;  // shared with stream handles, which may outlive the client
  AgentInfo info_;
};

// A running server-streaming call.
class AgentStream {
 public:
  virtual ~AgentStream() = default;
  // Resets the stream; on_end gets `canceled` unless it already ended.
  virtual void cancel() = 0;
  // Waits for the end; returns the end status, or deadline_exceeded if it has not ended by then.
  virtual Status wait(std::chrono::milliseconds timeout) = 0;
  virtual bool done() const = 0;
};

}  // namespace space::agentproto
