// What a thread of the serving process is doing, for the record a fatal signal leaves.
//
// A native crash in model code (a C extension's bug, ctypes reading address 0, a C stack
// overflowed by deep recursion) ends the whole process: copies share it. The supervisor
// restarts it, and to say which model did it (and to quarantine a model that keeps doing it),
// the dying process writes one line to a descriptor the supervisor reads:
//
//   crash signal=11 model=digits:1 copy=3 activity=predict
//
// followed, when the mark has a Python stack writer and the faulting thread was running Python
// code of that copy, by the copy's Python stack as faulthandler writes it:
//
//   Stack (most recent call first):
//     File "<package digits:1>/code/model.py", line 12 in predict
//
// ScopedCrashContext marks what the calling thread does while it lives (a model's predict or
// load in a copy); the handler that InstallCrashRecorder sets reads the faulting thread's mark.
// Everything the handler does is async-signal-safe: the mark is a fixed buffer, the line is
// formatted by hand and written with write(2), then the signal is raised again with its
// default action so that the process still dies of it.
//
// A thread that model code starts (Python's threading, a C extension's own workers) runs that
// model's code as much as its predict does, but outside any call: InheritedCrashContext carries
// the starting thread's mark over to it, so that a crash there names the model too
// ("activity=thread:predict").
//
// Thread-safety: ScopedCrashContext marks the calling thread only, and marks do not nest (a
// thread runs one predict or one load at a time); InstallCrashRecorder is called once, before
// the threads that may crash start.
#pragma once

#include <cstdint>
#include <string_view>

namespace orochi {

class ScopedCrashContext {
 public:
  // Writes the Python stack of the thread's current call in its copy to a descriptor, from a
  // signal handler (interpreters::Interpreter::python_stack_writer); nonzero if it had none.
  using PythonStackWriter = int32_t (*)(int fd);

  // `model` (e.g. "digits:1") and `activity` (e.g. "predict") are cut to fit the mark.
  ScopedCrashContext(std::string_view model, int copy, std::string_view activity,
                     PythonStackWriter python_stack = nullptr);
  ~ScopedCrashContext();  // the thread is unmarked again
  ScopedCrashContext(const ScopedCrashContext&) = delete;
  ScopedCrashContext& operator=(const ScopedCrashContext&) = delete;
};

// The mark of the thread that creates it, for the thread that thread starts.
class InheritedCrashContext {
 public:
  // Captures the calling thread's mark, if it has one.
  InheritedCrashContext();
  // Marks the calling thread (the started one) with the captured mark for the rest of its life,
  // its activity prefixed with "thread:"; does nothing if the starter had no mark.
  void MarkCallingThread() const;

 private:
  bool set_ = false;
  int copy_ = -1;
  char model_[160] = {};
  char activity_[24] = {};
  ScopedCrashContext::PythonStackWriter python_stack_ = nullptr;
};

// Handles SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP and SIGSYS by writing a crash line to
// `fd`, then dying of the signal. Each thread that has carried a ScopedCrashContext has an
// alternate signal stack, so that a crash by stack overflow is recorded too. One of them but
// SIGABRT that was sent (kill, tgkill, sigqueue) rather than raised by a fault, by this process
// or one it started, is ignored: model code aiming at one of the server's own threads, or at one
// that runs another model, faulted nothing there, and would otherwise end every model with a
// record that names none, or the wrong one.
void InstallCrashRecorder(int fd);

// Whether a process that died of `signal_number` had the chance to write a crash line: one of
// the signals above. A line read after a death by any other signal (SIGKILL, say) was written
// by someone else, and is not the process's record.
bool IsRecordedSignal(int signal_number);

}  // namespace orochi
