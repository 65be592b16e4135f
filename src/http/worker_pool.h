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
  // With `max_queued` > 0, a task that finds every thread busy at the maximum waits in a FIFO
  // (at most max_queued of them) for the next thread to finish, instead of being refused.
  WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit, size_t max_queued = 0);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop(); }

  // Starts `task` on an idle thread or a new one, or queues it (see max_queued). False, with the
  // reason, when every thread is busy at the maximum and the queue is full, a thread cannot be
  // created (out of memory or threads) and none will free up, or the pool is stopping: the task
  // was not taken and the caller answers for it.
  bool run(std::function<void()> task, std::string& why);

  // Waits for the running tasks to return and joins every thread; run() fails afterwards.
  void stop();

  // Threads alive now (for tests and logs).
  size_t threads() const;
  // Of those, the threads waiting for a task.
  size_t idleThreads() const;
  // Tasks waiting for a thread (only with max_queued).
  size_t queuedTasks() const;

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
  const size_t max_queued_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  // Handed to idle threads; more than idle_ only while tasks wait for a busy thread (max_queued).
  std::deque<std::function<void()>> tasks_;
  std::list<Worker> workers_;
  size_t live_ = 0;  // threads not yet exited
  size_t idle_ = 0;  // threads waiting for a task
  bool stopping_ = false;
};

}  // namespace space::http::detail
