#include "agent/event_loop.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace space::agent {

using Clock = std::chrono::steady_clock;

EventLoop::EventLoop() : epfd_(epoll_create1(EPOLL_CLOEXEC)) {
  if (epfd_ < 0) {
    perror("space-agent: epoll_create1");
    abort();
  }
}

EventLoop::~EventLoop() { close(epfd_); }

void EventLoop::addFd(int fd, uint32_t events, FdCallback cb) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  bool known = fds_.count(fd) > 0;
  fds_[fd] = std::make_shared<FdCallback>(std::move(cb));
  if (epoll_ctl(epfd_, known ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) {
    // Regular files cannot be polled; callers only add pollable fds, so this is a bug.
    perror("space-agent: epoll_ctl add");
    abort();
  }
}

void EventLoop::modifyFd(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::removeFd(int fd) {
  if (fds_.erase(fd) > 0) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

EventLoop::TimerId EventLoop::addTimer(std::chrono::milliseconds delay, TimerCallback cb) {
  TimerId id = next_timer_++;
  auto when = Clock::now() + delay;
  timers_.emplace(when, std::make_pair(id, std::move(cb)));
  timer_index_[id] = when;
  return id;
}

void EventLoop::cancelTimer(TimerId id) {
  auto it = timer_index_.find(id);
  if (it == timer_index_.end()) return;
  auto range = timers_.equal_range(it->second);
  for (auto t = range.first; t != range.second; ++t) {
    if (t->second.first == id) {
      timers_.erase(t);
      break;
    }
  }
  timer_index_.erase(it);
}

void EventLoop::post(std::function<void()> fn) { posted_.push_back(std::move(fn)); }

void EventLoop::run() {
  running_ = true;
  std::vector<epoll_event> events(64);
  while (running_) {
    if (!posted_.empty()) {
      auto batch = std::move(posted_);
      posted_.clear();
      for (auto& fn : batch) fn();
      continue;
    }
    int timeout = -1;
    if (!timers_.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(timers_.begin()->first - Clock::now()).count();
      timeout = left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30)) + 1;
    }
    int n = epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n < 0 && errno != EINTR) {
      perror("space-agent: epoll_wait");
      abort();
    }
    for (int i = 0; i < n; ++i) {
      auto it = fds_.find(events[i].data.fd);
      if (it == fds_.end()) continue;  // removed by an earlier callback of this batch
      auto cb = it->second;            // keeps the callback alive if it removes itself
      (*cb)(events[i].events);
    }
    auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      auto cb = std::move(timers_.begin()->second.second);
      timer_index_.erase(timers_.begin()->second.first);
      timers_.erase(timers_.begin());
      cb();
    }
  }
}

}  // namespace space::agent
