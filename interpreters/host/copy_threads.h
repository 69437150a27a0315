// The threads one interpreter copy has started, counted until they have left its code.
//
// A copy's CPython creates threads through the host (OrochiHostTable::start_thread). A thread
// stops counting only in a pthread-key destructor, which runs after the thread has returned
// from (or pthread_exit-ed out of) the copy's code, so "none running" means the copy's code can
// be unmapped without pulling it from under anyone. Thread-safe.
#pragma once

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

namespace orochi::interpreters {

class CopyThreads : public std::enable_shared_from_this<CopyThreads> {
 public:
  // pthread_create for the copy: same contract and return value.
  int Start(pthread_t* thread, const pthread_attr_t* attributes, void* (*start_routine)(void*),
            void* argument);

  // Waits up to `timeout` until no counted thread runs; returns how many still do.
  int64_t WaitUntilNoneRun(std::chrono::milliseconds timeout);

 private:
  friend void CopyThreadExited(void* value);
  void Exited();

  std::mutex mutex_;
  std::condition_variable none_running_;
  int64_t running_ = 0;
};

}  // namespace orochi::interpreters
