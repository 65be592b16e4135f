// Channel: the agent's end of the virtio-serial port. It notices the host connecting and going
// away (the port reports POLLHUP while no host is attached, and the virtio console driver sends
// SIGIO on each change), resynchronises every new connection with the handshake of
// agentproto/wire.h, then runs one HTTP/2 server session until the host leaves. A new host
// connection always gets a fresh session; processes started earlier keep running.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "agent/event_loop.h"
#include "agent/h2_server.h"
#include "agent/rpc.h"
#include "agentproto/wire.h"

namespace space::agent {

class Channel {
 public:
  // `info` produces the JSON sent with each handshake answer (agent version, kernel, uptime).
  Channel(EventLoop& loop, const Router& router, std::function<Json()> info);
  ~Channel();

  // Opens the port (a character device, or any pollable stream fd for tests).
  Status open(const std::string& port_path);
  // Takes an already open stream fd (tests: one end of a socketpair). Non-blocking is set here.
  void adopt(int fd, bool owned);
  // Re-checks whether a host is attached; called on SIGIO and, while none is, by a slow
  // safety timer.
  void poke();

  uint64_t sessions() const { return sessions_; }

 private:
  enum class State { kDisconnected, kHandshake, kAwaitPreface, kHttp2 };
  void onEvents(uint32_t events);
  void readAvailable();
  void handleBytes(std::string_view bytes);
  void disconnect(const char* why);
  void checkHost();
  void armSafetyPoll();
  void attach();
  void flush();
  void updateInterest();

  EventLoop& loop_;
  const Router& router_;
  std::function<Json()> info_;
  int fd_ = -1;
  bool owned_ = false;
  bool watching_ = false;
  State state_ = State::kDisconnected;
  std::unique_ptr<agentproto::HandshakeScanner> scanner_;
  std::string preface_buf_;
  std::unique_ptr<H2ServerSession> session_;
  std::string out_;
  size_t out_off_ = 0;
  uint64_t sessions_ = 0;
  EventLoop::TimerId safety_timer_ = 0;
};

}  // namespace space::agent
