#include "http/worker_pool.h"

#include <spdlog/spdlog.h>

#include <system_error>

#include "common/scope_guard.h"

namespace space::http::detail {

WorkerPool::WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit, size_t max_queued)
    : max_threads_(max_threads), idle_exit_(idle_exit), max_queued_(max_queued) {}

size_t WorkerPool::threads() const {
  std::lock_guard lock(mutex_);
  return live_;
}

size_t WorkerPool::idleThreads() const {
  std::lock_guard lock(mutex_);
  return idle_ > tasks_.size() ? idle_ - tasks_.size() : 0;
}

size_t WorkerPool::queuedTasks() const {
  std::lock_guard lock(mutex_);
  return tasks_.size() > idle_ ? tasks_.size() - idle_ : 0;
}

void WorkerPool::takeExited(std::list<Worker>& out) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->exited) out.splice(out.end(), workers_, it);
    it = next;
  }
}

bool WorkerPool::run(std::function<void()> task, std::string& why) {
  std::list<Worker> exited;
  // Joined however this returns (a reason's text may fail for want of memory): a list that
  // goes with threads still joinable would end the process.
  ScopeGuard join_exited([&exited] {
    for (Worker& worker : exited) worker.thread.join();
  });
  bool taken = false;
  {
    std::lock_guard lock(mutex_);
    takeExited(exited);
    if (stopping_) {
      why = "the server is stopping";
    } else if (idle_ > tasks_.size()) {
      tasks_.push_back(std::move(task));
      work_ready_.notify_one();
      taken = true;
    } else if (live_ >= max_threads_) {
      if (tasks_.size() - idle_ < max_queued_) {
        tasks_.push_back(std::move(task));  // the first thread to finish takes it
        taken = true;
      } else if (max_queued_ > 0) {
        why = "all " + std::to_string(live_) + " threads are busy and " + std::to_string(tasks_.size() - idle_) +
              " tasks wait for one (the limit is " + std::to_string(max_queued_) + ")";
      } else {
        why = "the server is running " + std::to_string(live_) + " requests (the limit is " +
              std::to_string(max_threads_) + ")";
      }
    } else {
      // Each step undone by what was done of it: any of them may fail for want of memory, the
      // last for want of a thread.
      bool queued = false, listed = false;
      try {
        // The new thread starts idle and takes the task queued for it.
        tasks_.push_back(std::move(task));
        queued = true;
        workers_.emplace_back();
        listed = true;
        Worker& worker = workers_.back();
        worker.thread = std::thread([this, &worker] { loop(worker); });
        ++idle_;
        ++live_;
        taken = true;
      } catch (const std::exception& e) {
        if (listed) workers_.pop_back();
        if (queued && live_ > 0 && tasks_.size() - 1 - idle_ < max_queued_) {
          taken = true;  // no new thread now, but a running one takes the task when it finishes
        } else {
          if (queued) tasks_.pop_back();
          why = std::string("cannot start a thread for the request: ") + e.what();
        }
      }
    }
  }
  return taken;
}

void WorkerPool::loop(Worker& self) {
  std::unique_lock lock(mutex_);
  while (true) {
    if (tasks_.empty()) {
      if (stopping_) break;
      // A thread idle for idle_exit_ goes away; the next burst creates threads again.
      if (!work_ready_.wait_for(lock, idle_exit_, [&] { return !tasks_.empty() || stopping_; })) break;
      continue;
    }
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    --idle_;
    lock.unlock();
    try {
      task();
    } catch (const std::exception& e) {
      spdlog::error("http: a request task threw: {}", e.what());
    }
    task = nullptr;  // what the task captured goes before the thread counts as idle
    lock.lock();
    ++idle_;
  }
  --idle_;
  --live_;
  self.exited = true;
}

void WorkerPool::stop() {
  std::list<Worker> all;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    work_ready_.notify_all();
  }
  // Threads keep taking the tasks already handed to them, then exit; new ones cannot start.
  while (true) {
    {
      std::lock_guard lock(mutex_);
      all.splice(all.end(), workers_);
    }
    if (all.empty()) return;
    for (Worker& worker : all) worker.thread.join();
    all.clear();
  }
}

}  // namespace space::http::detail
