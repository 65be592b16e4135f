// Threads that run request handlers for the HTTP server.
//
// Handlers are plain blocking code (they boot VMs and wait for commands), so each running one
// needs a thread; connections that wait for their next request do not (the server's event loop
// holds them). The pool grows on demand up to its maximum and lets a thread that stayed idle
// for a while exit, so a burst of requests costs threads only while it lasts.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace space::http::detail {

class WorkerPool {
 public:
  WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop(); }

  // Starts `task` on an idle thread or a new one. False, with the reason, when every thread is
  // busy at the maximum, a thread cannot be created (out of memory or threads), or the pool is
  // stopping: the task was not taken and the caller answers for it.
  bool run(std::function<void()> task, std::string& why);

  // Waits for the running tasks to return and joins every thread; run() fails afterwards.
  void stop();

  // Threads alive now (for tests and logs).
  size_t threads() const;
  // Of those, the threads waiting for a task.
  size_t idleThreads() const;

 private:
  struct Worker {
    std::thread thread;
    bool exited = false;
  };
  void loop(Worker& self);
  // Under mutex_: moves the threads that have exited into `out` (joined outside the lock).
  void takeExited(std::list<Worker>& out);

  const size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::deque<std::function<void()>> tasks_;  // handed to idle threads, never more than idle_
  std::list<Worker> workers_;
  size_t live_ = 0;  // threads not yet exited
  size_t idle_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace space::http::detail
