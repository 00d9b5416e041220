// The training cache's two background threads, each owning its thread and the state it shares
// with the caller's thread: the prefetch worker (prefetch.inl) and the write-behind flusher
// (write_behind.inl). What a thread does is the task it is started on; these classes only say how
// it starts, how it is waited for and how its failure reaches the caller. Both join in their
// destructors, so a core never outlives a running thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "embcache/status.hpp"

namespace embcache::detail {

/// The prefetch worker: one staging task at a time. The task's status (its failure, which it
/// catches itself) is kept for the next boundary, which reports it once.
class prefetch_worker {
 public:
  prefetch_worker() = default;
  prefetch_worker(const prefetch_worker&) = delete;
  prefetch_worker& operator=(const prefetch_worker&) = delete;
  ~prefetch_worker() { join(); }

  /// Starts `task` (callable as `status()`, throwing nothing) after the previous one is joined;
  /// an earlier failure not taken is dropped.
  template <class Task>
  void start(Task task) {
    join();
    failure_ = {};
    thread_ = std::thread([this, task = std::move(task)]() mutable { failure_ = task(); });
  }
  /// Waits for the running task, if any.
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  /// Whether a task was started and not joined yet (it may have ended).
  bool started() const noexcept { return thread_.joinable(); }
  /// The last task's failure (ok when none), once: joins first, then clears it.
  status take_failure() {
    join();
    return std::exchange(failure_, status{});
  }
  /// Drops a failure not taken.
  void clear_failure() {
    join();
    failure_ = {};
  }

 private:
  std::thread thread_;
  status failure_;  // written by the task's thread, read after join()
};

/// The write-behind flusher: pushes the rows a boundary wrote behind while the next pass trains.
/// `idle()` tells the staging worker when no push runs, without joining the flusher. A push
/// error that the task returns (an exception it caught) is kept for the caller's thread until it
/// is taken; the task's ordinary store errors are its own business (the rows stay pending).
class write_behind_flusher {
 public:
  write_behind_flusher() = default;
  write_behind_flusher(const write_behind_flusher&) = delete;
  write_behind_flusher& operator=(const write_behind_flusher&) = delete;
  ~write_behind_flusher() { join(); }

  /// Starts `task` (callable as `status()`, throwing nothing) after the previous one is joined.
  template <class Task>
  void start(Task task) {
    join();
    {
      std::lock_guard<std::mutex> l(mutex_);
      pushing_ = true;
    }
    thread_ = std::thread([this, task = std::move(task)]() mutable {
      status s = task();
      if (!s.ok()) failure_ = std::move(s);
      std::lock_guard<std::mutex> l(mutex_);
      pushing_ = false;
      idle_.notify_all();
    });
  }
  /// Returns once no push runs (any thread; the flusher is not joined).
  void wait_idle() {
    std::unique_lock<std::mutex> l(mutex_);
    idle_.wait(l, [&] { return !pushing_; });
  }
  /// Waits for the flusher's thread, if any.
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  /// Whether a push was started and not joined yet (it may have ended).
  bool started() const noexcept { return thread_.joinable(); }
  /// Joins, then whether a failure waits to be taken.
  bool failed() {
    join();
    return !failure_.ok();
  }
  /// Joins, then the failure (ok when none), once.
  status take_failure() {
    join();
    return std::exchange(failure_, status{});
  }

 private:
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable idle_;
  bool pushing_ = false;  // under mutex_
  status failure_;        // written by the flusher's thread, read after join()
};

}  // namespace embcache::detail
