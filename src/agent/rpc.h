// The agent's service-facing RPC surface. The HTTP/2 server (h2_server.*) parses requests and
// calls services through these types; services never see HTTP/2. Semantics follow envd's
// Connect services (process.Process/*, filesystem.Filesystem/*) plus raw file transfer.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "agentproto/wire.h"

namespace space::agent {

using Json = nlohmann::json;
using agentproto::RpcCode;
using agentproto::RpcError;

inline RpcError rpcError(RpcCode code, std::string message) { return RpcError{code, std::move(message)}; }

// Per-call facts from the request headers.
struct CallContext {
  std::string user;                                  // "" = the sandbox default user ("user")
  std::optional<std::chrono::milliseconds> timeout;  // Connect-Timeout-Ms, if sent
  // Uploads: envd's X-Metadata-<key> headers, key lower-cased, the first value of a repeated key.
  std::map<std::string, std::string> metadata;
  // Downloads: the byte range wanted (query parameters offset and length; all of it if absent).
  uint64_t offset = 0;
  std::optional<uint64_t> length;
};

// Whether the agent traces its channel and calls to the console: the kernel argument
// space_agent_trace=1 (which the kernel hands to init as an environment variable). For
// diagnosing a lost call; off in production, since the console is a slow serial port.
bool traceEnabled();

// A unary handler's answer: the response message or an error.
using UnaryResult = std::variant<Json, RpcError>;

// One server-streaming response. Owned jointly by the transport and the services feeding it
// (a process's output fans out to every stream attached to it).
class ServerStream {
 public:
  virtual ~ServerStream() = default;
  // Queues one data envelope. Ignored once the stream is no longer open.
  virtual void send(const Json& message) = 0;
  // Ends the stream with an EndStream envelope ({} or {"error":{...}}). Idempotent.
  virtual void finish(std::optional<RpcError> error = std::nullopt) = 0;
  // False once finished, cancelled by the host, or the channel dropped.
  virtual bool open() const = 0;
  // Called once when the stream closes for any reason other than finish() (host cancel, channel
  // drop). Services use it to detach.
  virtual void setOnClose(std::function<void()> cb) = 0;
  // Flow control towards the host: bytes queued and not yet handed to HTTP/2. A producer stops
  // reading its source while this is above kHighWater and resumes from the drain callback.
  virtual size_t queuedBytes() const = 0;
  virtual void setOnDrain(std::function<void()> cb) = 0;

  static constexpr size_t kHighWater = 1 << 20;
  static constexpr size_t kLowWater = 256 << 10;
};

// Receives the body of a file upload chunk by chunk, in order. Nothing is visible at the
// destination until finish() succeeds; abort() (or destruction without finish) leaves the old
// file untouched.
class UploadSink {
 public:
  virtual ~UploadSink() = default;
  virtual std::optional<RpcError> write(std::string_view chunk) = 0;
  // Returns the EntryInfo JSON of the written file.
  virtual UnaryResult finish() = 0;
  virtual void abort() = 0;
};

// Produces the bytes of a file download.
class DownloadSource {
 public:
  virtual ~DownloadSource() = default;
  virtual uint64_t size() const = 0;
  // Reads up to `max` bytes into `out`; returns the number read, 0 at end, or an error.
  virtual std::variant<size_t, RpcError> read(char* out, size_t max) = 0;
};

// The services' registration point.
class Router {
 public:
  using UnaryHandler = std::function<UnaryResult(const Json& request, const CallContext& ctx)>;
  using StreamHandler =
      std::function<void(const Json& request, const CallContext& ctx, std::shared_ptr<ServerStream> stream)>;
  using UploadHandler = std::function<std::variant<std::unique_ptr<UploadSink>, RpcError>(const std::string& path,
                                                                                          const CallContext& ctx)>;
  using DownloadHandler = std::function<std::variant<std::unique_ptr<DownloadSource>, RpcError>(
      const std::string& path, const CallContext& ctx)>;

  // method: "/process.Process/List" style path.
  void unary(std::string method, UnaryHandler h) { unary_[std::move(method)] = std::move(h); }
  void serverStream(std::string method, StreamHandler h) { stream_[std::move(method)] = std::move(h); }
  void upload(UploadHandler h) { upload_ = std::move(h); }
  void download(DownloadHandler h) { download_ = std::move(h); }

  const UnaryHandler* findUnary(const std::string& m) const {
    auto it = unary_.find(m);
    return it == unary_.end() ? nullptr : &it->second;
  }
  const StreamHandler* findStream(const std::string& m) const {
    auto it = stream_.find(m);
    return it == stream_.end() ? nullptr : &it->second;
  }
  const UploadHandler& uploadHandler() const { return upload_; }
  const DownloadHandler& downloadHandler() const { return download_; }

 private:
  std::map<std::string, UnaryHandler> unary_;
  std::map<std::string, StreamHandler> stream_;
  UploadHandler upload_;
  DownloadHandler download_;
};

}  // namespace space::agent
