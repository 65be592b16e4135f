// A terminal session: one WebSocket client (spacectl shell, the web console) attached to one guest
// process running on a PTY (GET /v1/sandboxes/{id}/pty, docs/api.md).
//
// The wire, both ways on one WebSocket:
//   client -> server  binary: keystrokes, as a terminal sends them
//                     text:   {"type":"resize","cols":C,"rows":R}
//   server -> client  text:   {"type":"started","pid":N} first
//                     binary: what the process writes to its terminal
//                     text:   {"type":"exit","exit_code":N,"status":"exit status N"} last, or
//                             {"type":"error","code":...,"message":...}; then a close frame
// A client that closes or is lost kills the process (as a hung-up terminal does).
//
// Threads: the connection's thread runs a private Asio loop that owns the WebSocket (reads,
// writes, pings) and makes the agent calls for input and resizes (with the GuestOps' control
// deadline: a guest that does not take a keystroke in time ends the session); a second thread
// waits for the process's events and posts them to the loop. Memory per session is bounded by
// max_queued_output plus the process stream's backlog (StreamLimits) plus one batch: a client
// that reads slower than the process writes stops the pump, the stream's backlog fills and the
// session ends with "client_too_slow" instead of holding the output.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "guest/guest_ops.h"
#include "http/message.h"

namespace space::api {

struct PtySessionLimits {
  size_t max_client_message = 64 * 1024;  // one frame of keystrokes or one control message
  size_t max_queued_output = 1 << 20;     // bytes waiting for the client before the pump waits
  // A client that sends nothing (not even a pong to our pings) for this long is gone.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  // A full queue that the client has not drained at all for this long: "client_too_slow" (a
  // client that reads nothing but answers pings would otherwise hold the session forever).
  std::chrono::milliseconds stalled_client_timeout{std::chrono::seconds(15)};
  // Asked every reauthorize_every while the session runs: false ends it ("unauthenticated"),
  // so a terminal does not outlive the key or console session that opened it. Empty: never.
  std::function<bool()> authorized;
  std::chrono::milliseconds reauthorize_every{std::chrono::seconds(5)};
};

struct PtySessionEnd {
  // "exited", "client_closed", "client_too_slow", "error", "aborted", "unauthenticated"
  std::string outcome;
  int exit_code = -1;  // with "exited"
};

// Whether the request asks for a WebSocket (Upgrade: websocket, GET).
bool isWebSocketUpgrade(const http::Request& req);

// Completes the WebSocket handshake on `connection` (taken over from the server right after
// `req`) and runs the session until the process ends or the client leaves. `pending` are the
// events that came before the handshake (after the start event). Does not return before the
// pump thread has ended; the process is killed unless it ended.
PtySessionEnd runPtySession(const http::Request& req, http::TakenConnection connection, guest::GuestOps& ops,
                            guest::ProcessStream& stream, int pid, std::vector<guest::ProcessEvent> pending,
                            const PtySessionLimits& limits);

}  // namespace space::api
