// The CPU kernels' intra-op thread pool, one per process, and the busy callers it counts.
//
// Thread-safety: every function is thread-safe; SetCallerIntraOpLimit and BusyCaller are per
// thread.
#pragma once

#include <cstdint>

#include "orochi/engine/export.h"

namespace orochi::engine {

// The CPU kernels' intra-op pool, one per process: the cores the engine's calls may use
// together, the calling threads' own included. Every busy caller (BusyCaller, or a thread
// inside a call) holds one; a call borrows only the rest, never waits for one, and runs
// single-threaded when none is free, so with one busy copy per core each call is single-threaded
// and with fewer a call spreads over the idle cores. 0 sets every core
// (std::thread::hardware_concurrency, the default); 1 makes every call single-threaded.
// Thread-safe; takes effect for calls that start afterwards.
OROCHI_ENGINE_API void SetIntraOpThreads(int threads);
OROCHI_ENGINE_API int IntraOpThreads();
// A limit on the threads the calling thread's calls may use (its own included), under the
// pool's size: 0 lifts it. Per thread; a BusyCaller scope starts without one and restores the
// previous limit when it ends. CallerIntraOpThreads() is what this thread's calls may use.
OROCHI_ENGINE_API void SetCallerIntraOpLimit(int threads);
OROCHI_ENGINE_API int CallerIntraOpThreads();
// The pool's permits free now (negative while more callers are busy than it has), and how many
// threads calls have borrowed since the process started: for tests and diagnostics.
OROCHI_ENGINE_API int IntraOpThreadsFree();
OROCHI_ENGINE_API int64_t IntraOpThreadsBorrowed();
// Counts the calling thread as a busy caller of the pool while it lives, also between engine
// calls: an interpreter copy holds one while it runs a request, so that its Python code's core
// is not lent to another copy's call. Nests.
class OROCHI_ENGINE_API BusyCaller {
 public:
  BusyCaller();
  ~BusyCaller();
  BusyCaller(const BusyCaller&) = delete;
  BusyCaller& operator=(const BusyCaller&) = delete;

 private:
  int saved_limit_;
};

}  // namespace orochi::engine
