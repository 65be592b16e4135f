// EventLoop: the agent's single-threaded epoll loop. Everything in the agent runs on it: the
// channel, process pipes and PTYs, inotify, timers, signals. Callbacks run on the loop thread;
// nothing in the agent takes a lock.
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>

namespace space::agent {

class EventLoop {
 public:
  using FdCallback = std::function<void(uint32_t events)>;  // EPOLLIN/EPOLLOUT/EPOLLHUP/EPOLLERR bits
  using TimerCallback = std::function<void()>;
  using TimerId = uint64_t;

  EventLoop();
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Watches `fd` (level-triggered) for `events`. The loop does not own the fd; call removeFd
  // before closing it. Re-adding an fd replaces its callback.
  void addFd(int fd, uint32_t events, FdCallback cb);
  void modifyFd(int fd, uint32_t events);
  void removeFd(int fd);

  // One-shot timer; cancelling an expired or unknown id is a no-op.
  TimerId addTimer(std::chrono::milliseconds delay, TimerCallback cb);
  void cancelTimer(TimerId id);

  // Runs a callback on the next loop iteration (after the current callback returns).
  void post(std::function<void()> fn);

  // Runs until stop().
  void run();
  void stop() { running_ = false; }

 private:
  int epfd_;
  bool running_ = false;
  std::unordered_map<int, std::shared_ptr<FdCallback>> fds_;
  std::multimap<std::chrono::steady_clock::time_point, std::pair<TimerId, TimerCallback>> timers_;
  std::unordered_map<TimerId, std::chrono::steady_clock::time_point> timer_index_;
  TimerId next_timer_ = 1;
  std::vector<std::function<void()>> posted_;
};

}  // namespace space::agent
