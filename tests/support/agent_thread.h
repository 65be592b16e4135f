// The real guest agent's Channel and HTTP/2 server, with a test's Router, on their own thread
// over one end of a socketpair: what host-side tests put on the far side of an AgentClient.
// Shared by the agent client's flow tests and the guest command tests.
#pragma once

#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <thread>

#include "agent/channel.h"
#include "agent/event_loop.h"
#include "agent/rpc.h"

namespace space::testsupport {

// Runs an agent Channel with `router` on its own thread over `fd` (still the caller's to close).
class AgentThread {
 public:
  AgentThread(int fd, agent::Router& router) : stop_fd_(eventfd(0, EFD_CLOEXEC)) {
    // The agent writes to a peer that may have gone: like the real agent (and spaced), the
    // process ignores SIGPIPE, or a closed stream kills the test runner.
    signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([this, fd, &router] {
      agent::EventLoop loop;
      agent::Channel channel(loop, router, [] { return agent::Json{{"version", "test"}}; });
      channel.adopt(fd, false);
      loop.addFd(stop_fd_, EPOLLIN, [&](uint32_t) { loop.stop(); });
      loop.run();
      loop.removeFd(stop_fd_);
    });
  }
  ~AgentThread() {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
    close(stop_fd_);
  }
  AgentThread(const AgentThread&) = delete;
  AgentThread& operator=(const AgentThread&) = delete;

 private:
  int stop_fd_;
  std::thread thread_;
};

}  // namespace space::testsupport
