// H2ServerSession: the agent's HTTP/2 server for one host connection (h2c, prior knowledge),
// built on nghttp2. It turns requests into Router calls and responses into HTTP/2 frames:
//   POST /<pkg.Service>/<Method>  application/json          unary Connect RPC
//   POST /<pkg.Service>/<Method>  application/connect+json  server-streaming Connect RPC
//   GET  /files?path=P                                      file download (raw bytes)
//   POST /files?path=P                                      file upload (raw bytes, streamed)
// Headers: `authorization: Basic base64(user:)` or `x-space-user` selects the user,
// `connect-timeout-ms` the call deadline. Bytes in via receive(); bytes out via the `out`
// callback, pulled only while the caller's output buffer has room (takeOutput), so a host that
// stops reading stops the flow back to the producers (process pipes) instead of growing memory.
#pragma once

#include <nghttp2/nghttp2.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "agent/event_loop.h"
#include "agent/rpc.h"

namespace space::agent {

class H2StreamResponse;

class H2ServerSession {
 public:
  static constexpr size_t kMaxRequestBody = 16 << 20;  // unary and stream-request bodies
  static constexpr size_t kMaxConcurrentStreams = 1024;

  // `on_output` is called (on the loop) whenever takeOutput() may have something new.
  H2ServerSession(EventLoop& loop, const Router& router, std::function<void()> on_output);
  ~H2ServerSession();  // closes every open stream (services see setOnClose callbacks)
  H2ServerSession(const H2ServerSession&) = delete;
  H2ServerSession& operator=(const H2ServerSession&) = delete;

  // Feeds bytes from the host. An error means the host broke the protocol: drop the session.
  Status receive(std::string_view bytes);
  // Serializes pending frames, at most about `max` bytes; empty when nothing is pending.
  std::string takeOutput(size_t max);
  bool wantsToWrite() const;
  // The session will read nothing more: the host said goodbye or broke the protocol (nghttp2
  // answers many protocol errors with GOAWAY rather than an error return).
  bool terminated();

  // Internal plumbing for H2StreamResponse.
  void resume(int32_t stream_id);
  nghttp2_session* raw() { return session_; }

 private:
  struct Request;
  friend struct H2Callbacks;
  void dispatch(int32_t stream_id, Request& req);
  void dispatchChecked(int32_t stream_id, Request& req);
  void onHeadersDone(int32_t stream_id, Request& req);
  void respondJson(int32_t stream_id, int status, const std::string& body);
  void respondError(int32_t stream_id, const RpcError& err);
  void startStreamResponse(int32_t stream_id, std::shared_ptr<H2StreamResponse> body);
  void closeStream(int32_t stream_id);

  EventLoop& loop_;
  const Router& router_;
  std::function<void()> on_output_;
  nghttp2_session* session_ = nullptr;
  std::map<int32_t, std::unique_ptr<Request>> requests_;
  std::map<int32_t, std::shared_ptr<H2StreamResponse>> responses_;
  std::string pending_out_;  // serialized bytes not yet taken
};

}  // namespace space::agent
