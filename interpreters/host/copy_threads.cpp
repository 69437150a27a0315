#include "copy_threads.h"

#include <cerrno>

#include "orochi/base/crash_record.h"

namespace orochi::interpreters {
namespace {

struct Launch {
  std::shared_ptr<CopyThreads> threads;
  void* (*start_routine)(void*);
  void* argument;
  // The starter's crash mark: a thread the copy starts during a model's load or predict runs
  // that model's code, and a crash in it is that model's.
  InheritedCrashContext crash_context;
};

pthread_key_t ExitKey();

void* Trampoline(void* raw_launch) {
  auto* launch = static_cast<Launch*>(raw_launch);
  // Owned by the key from here on; CopyThreadExited releases it when the thread ends.
  pthread_setspecific(ExitKey(), new std::shared_ptr<CopyThreads>(std::move(launch->threads)));
  launch->crash_context.MarkCallingThread();
  void* (*start_routine)(void*) = launch->start_routine;
  void* argument = launch->argument;
  delete launch;
  return start_routine(argument);
}

}  // namespace

// Runs in the exiting thread after it has left the copy's code for good.
void CopyThreadExited(void* value) {
  auto* threads = static_cast<std::shared_ptr<CopyThreads>*>(value);
  (*threads)->Exited();
  delete threads;
}

namespace {

pthread_key_t ExitKey() {
  static const pthread_key_t key = [] {
    pthread_key_t created{};
    pthread_key_create(&created, CopyThreadExited);
    return created;
  }();
  return key;
}

}  // namespace

int CopyThreads::Start(pthread_t* thread, const pthread_attr_t* attributes,
                       void* (*start_routine)(void*), void* argument) {
  ExitKey();  // created before the first thread can need it
  {
    std::lock_guard lock(mutex_);
    ++running_;
  }
  auto* launch = new Launch{shared_from_this(), start_routine, argument, {}};
  int error = pthread_create(thread, attributes, Trampoline, launch);
  if (error != 0) {
    delete launch;
    Exited();
  }
  return error;
}

void CopyThreads::Exited() {
  std::lock_guard lock(mutex_);
  if (--running_ == 0) none_running_.notify_all();
}

int64_t CopyThreads::WaitUntilNoneRun(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  none_running_.wait_for(lock, timeout, [this] { return running_ == 0; });
  return running_;
}

}  // namespace orochi::interpreters
