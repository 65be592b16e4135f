// Terminal sessions: one WebSocket client (spacectl shell, the web console) attached to one guest
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
// Threads: none per session. The handler starts the process and opens a session here, which
// returns one end of a socket pair; the HTTP server relays the client's connection to it
// (Response::relay) on its event loop, and the handler returns. The other end is a Beast
// WebSocket on this module's one event loop, shared by every session: it reads keystrokes and
// resizes, writes output, pings, and is woken by the agent client when the process has events
// (ProcessStream::onReady). Agent calls never block it: keystrokes and resizes go one at a time,
// in order, as asynchronous calls with the GuestOps' control deadline (a guest that does not take
// one in time ends the session). A second thread does what may block: it asks every few seconds
// whether what let each session in is still valid (that may read the state store), and releases
// what ended sessions held (the last reference to an agent client joins its thread).
//
// Memory per session is bounded by max_queued_output plus the process stream's backlog
// (StreamLimits) plus one batch, and max_queued_input: a client that reads slower than the process
// writes stops the draining, the stream's backlog fills and the session ends with
// "client_too_slow"; a guest slower than the client's typing stops the reading.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/result.h"
#include "guest/guest_ops.h"
#include "http/message.h"

namespace space::api {

namespace detail {
struct PtyLoop;
}

struct PtySessionLimits {
  size_t max_client_message = 64 * 1024;  // one frame of keystrokes or one control message
  size_t max_queued_output = 1 << 20;     // bytes waiting for the client before draining waits
  // Keystrokes and resizes read from the client that the guest has not taken yet: over it, the
  // session reads nothing more from the client until the guest catches up.
  size_t max_queued_input = 256 * 1024;
  // A client that sends nothing (not even a pong to our pings) for this long is gone.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  // A full queue that the client has not drained at all for this long: "client_too_slow" (a
  // client that reads nothing but answers pings would otherwise hold the session forever).
  std::chrono::milliseconds stalled_client_timeout{std::chrono::seconds(15)};
  // How often each session's PtyProcess::authorized is asked.
  std::chrono::milliseconds reauthorize_every{std::chrono::seconds(5)};
};

struct PtySessionEnd {
  // "exited", "client_closed", "client_too_slow", "error", "aborted", "unauthenticated"
  std::string outcome;
  int exit_code = -1;  // with "exited"
};

// What a session takes over from its handler: a process started with a PTY whose start event has
// come (its pid known).
struct PtyProcess {
  guest::GuestOps ops;  // its guest's agent, with a short control deadline
  std::unique_ptr<guest::ProcessStream> stream;
  int pid = 0;
  std::vector<guest::ProcessEvent> pending;  // events that came after the start, before the session
  // Held for the session's life, released on the loop: the agent lease, the session's place.
  std::shared_ptr<void> keep;
  // Asked every reauthorize_every, off the loop: false ends the session ("unauthenticated"), so
  // a terminal does not outlive the key or console session that opened it. Empty: never.
  std::function<bool()> authorized;
  // Runs once, on the loop, when the session ended (for the log).
  std::function<void(const PtySessionEnd&)> ended;
};

// Whether the request is a WebSocket upgrade with all that its handshake needs (GET, Upgrade:
// websocket, Connection: upgrade, a key, version 13), so no process starts for one that fails.
bool isWebSocketUpgrade(const http::Request& req);

class PtySessions {
 public:
  explicit PtySessions(PtySessionLimits limits = {});
  // Ends every session (their processes are killed) and joins the threads.
  ~PtySessions();
  PtySessions(const PtySessions&) = delete;
  PtySessions& operator=(const PtySessions&) = delete;

  // Opens a session for the WebSocket upgrade (GET `target` with `headers`, as the client sent
  // them) that started `process`. The plan's peer is
  // the session's end of a socket pair: hand it to Response::relay with the client's connection,
  // and the session answers the upgrade (101) and runs until the process ends or the client
  // leaves; the process is killed unless it ended. A plan that is dropped (a refused relay) ends
  // the session as "client_closed". Fails only when no socket can be made (the process is
  // killed then too).
  Result<http::RelayPlan> open(const std::string& target,
                               const std::vector<std::pair<std::string, std::string>>& headers, PtyProcess process);
  // Sessions not yet ended.
  size_t openSessions() const;

 private:
  std::unique_ptr<detail::PtyLoop> loop_;
  std::thread thread_;
  std::thread side_;
};

}  // namespace space::api
