// The engine's one process-wide pool of intra-op threads.
//
// Interpreter copies call the engine from their own threads, each a busy core. The pool holds
// permits, one per core it may use (IntraOpThreads()), less one for each busy caller and each
// borrowed thread. A call borrows only the permits free at that moment, never waits for one, and
// always works on its own thread too: with one busy copy per core no call borrows anything, and
// with fewer, a call spreads over the idle cores. So the threads working never outnumber the
// permits, however many copies call at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace orochi::engine::cpu {

// Permits borrowed for one call, returned when this goes out of scope. Used directly to size an
// OpenMP team (oneDNN's), whose threads stand in for the pool's idle ones during the call.
class BorrowedThreads {
 public:
  // Borrows up to `wanted` permits (0 if the caller already runs in a pool task, or has a
  // limit of 1).
  explicit BorrowedThreads(int wanted);
  ~BorrowedThreads();
  BorrowedThreads(const BorrowedThreads&) = delete;
  BorrowedThreads& operator=(const BorrowedThreads&) = delete;

  int count() const { return count_; }

 private:
  int count_ = 0;
  bool counted_caller_ = false;  // this call counted its own thread as a busy caller
};

// The threads a call on this thread may use at most, its own included: the pool's size, or less
// under a per-caller limit (SetCallerIntraOpLimit).
int CallerThreadLimit();

// How many threads besides the caller's own `work` units are worth, at least `grain` per thread.
inline int HelpersFor(int64_t work, int64_t grain) {
  return static_cast<int>(std::clamp<int64_t>(work / std::max<int64_t>(grain, 1) - 1, 0, 1 << 16));
}

// Runs fn(begin, end) over [0, count) in chunks of at least `grain`, on the calling thread and on
// borrowed pool threads, and returns when every chunk is done. The chunks are disjoint and cover
// the range; fn must only write what its chunk owns. Nested calls (from inside a chunk) run on
// the calling thread. An exception from fn is rethrown on the calling thread (the first one).
void ParallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace orochi::engine::cpu
