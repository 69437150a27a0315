// The intra-op pool: permits counted in one atomic, helper threads fed from one queue.
#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "orochi/engine/error.h"
#include "orochi/engine/threads.h"

namespace orochi::engine::cpu {
namespace {

thread_local int busy_depth = 0;        // BusyCaller scopes open on this thread
thread_local bool in_parallel = false;  // running chunks of a ParallelFor (its caller or a helper)
thread_local int caller_limit = 0;      // SetCallerIntraOpLimit; 0: none

int DefaultThreads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

// One ParallelFor in progress: its chunks, handed out in order to whoever asks next.
struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t count = 0;
  int64_t chunk = 1;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first failure; written once, under `mutex`
  std::mutex mutex;
  std::condition_variable finished;
  int helpers_running = 0;  // helpers that took this job and have not finished; under `mutex`

  void Work() {
    for (;;) {
      const int64_t begin = next.fetch_add(chunk);
      if (begin >= count || failed.load(std::memory_order_relaxed)) return;
      try {
        (*fn)(begin, std::min(begin + chunk, count));
      } catch (...) {
        const std::lock_guard lock(mutex);
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  }
};

class Pool {
 public:
  // Never destroyed: helper threads wait in it until the process ends.
  static Pool& Get() {
    static Pool* const pool = new Pool();
    return *pool;
  }

  void Resize(int threads) {
    const std::lock_guard lock(mutex_);
    free_.fetch_add(threads - size_.exchange(threads));
  }
  int size() const { return size_.load(); }

  void EnterCaller() { free_.fetch_sub(1); }
  void LeaveCaller() { free_.fetch_add(1); }

  // Takes up to `wanted` free permits, without waiting; returns how many it took.
  int Borrow(int wanted) {
    int available = free_.load();
    for (;;) {
      const int taken = std::min(wanted, available);
      if (taken <= 0) return 0;
      if (free_.compare_exchange_weak(available, available - taken)) {
        borrowed_total_.fetch_add(taken, std::memory_order_relaxed);
        return taken;
      }
    }
  }
  int free_permits() const { return free_.load(); }
  int64_t borrowed_total() const { return borrowed_total_.load(std::memory_order_relaxed); }
  void Return(int permits) { free_.fetch_add(permits); }

  // Offers `job` to `helpers` idle helper threads (started here on first need).
  void Post(Job* job, int helpers) {
    {
      const std::lock_guard lock(mutex_);
      // Borrowed permits never exceed size - 1, so size - 1 helpers never make a job wait.
      for (; helpers_started_ < size_.load() - 1; ++helpers_started_) {
        std::thread([this] { HelperLoop(); }).detach();
      }
      for (int i = 0; i < helpers; ++i) queue_.push_back(job);
    }
    if (helpers == 1) {
      work_.notify_one();
    } else {
      work_.notify_all();
    }
  }

  // Takes back the offers of `job` no helper has taken yet: the caller has finished the chunks.
  void Withdraw(Job* job) {
    const std::lock_guard lock(mutex_);
    std::erase(queue_, job);
  }

 private:
  void HelperLoop() {
    in_parallel = true;  // a chunk's own ParallelFor runs inline
    for (;;) {
      Job* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        work_.wait(lock, [this] { return !queue_.empty(); });
        job = queue_.front();
        queue_.pop_front();
        const std::lock_guard job_lock(job->mutex);  // taken while still offered: see Withdraw
        ++job->helpers_running;
      }
      job->Work();
      const std::lock_guard job_lock(job->mutex);
      --job->helpers_running;
      job->finished.notify_one();  // under the lock: the caller may free the job once it is out
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;
  std::deque<Job*> queue_;
  int helpers_started_ = 0;
  std::atomic<int> size_{DefaultThreads()};
  // Permits: size, less busy callers and borrowed threads. Negative while the pool shrinks or
  // while more callers are busy than it has permits.
  std::atomic<int> free_{DefaultThreads()};
  std::atomic<int64_t> borrowed_total_{0};
};

}  // namespace

BorrowedThreads::BorrowedThreads(int wanted) {
  wanted = std::min(wanted, CallerThreadLimit() - 1);
  if (in_parallel || wanted <= 0) return;
  Pool& pool = Pool::Get();
  if (busy_depth == 0) {  // a caller outside any BusyCaller counts itself while it computes
    pool.EnterCaller();
    counted_caller_ = true;
  }
  count_ = pool.Borrow(wanted);
}

BorrowedThreads::~BorrowedThreads() {
  Pool& pool = Pool::Get();
  if (count_ > 0) pool.Return(count_);
  if (counted_caller_) pool.LeaveCaller();
}

int CallerThreadLimit() {
  const int size = Pool::Get().size();
  return caller_limit > 0 ? std::min(caller_limit, size) : size;
}

void ParallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t pieces = count / grain;
  if (in_parallel || pieces < 2) {
    fn(0, count);
    return;
  }
  const BorrowedThreads borrowed(static_cast<int>(std::min<int64_t>(pieces - 1, 1 << 16)));
  if (borrowed.count() == 0) {
    fn(0, count);
    return;
  }
  Job job;
  job.fn = &fn;
  job.count = count;
  // A few chunks per thread, so a thread the machine slows down leaves its share to the others.
  const int64_t threads = borrowed.count() + 1;
  job.chunk = std::max(grain, (count + 4 * threads - 1) / (4 * threads));
  Pool& pool = Pool::Get();
  pool.Post(&job, borrowed.count());
  in_parallel = true;
  job.Work();
  in_parallel = false;
  pool.Withdraw(&job);  // no call waits for a helper to come free
  std::unique_lock lock(job.mutex);
  job.finished.wait(lock, [&job] { return job.helpers_running == 0; });
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace orochi::engine::cpu

namespace orochi::engine {

void SetIntraOpThreads(int threads) {
  OROCHI_CHECK_ARG(threads >= 0,
                   "intra-op threads must be 0 (every core) or more, got " << threads);
  cpu::Pool::Get().Resize(threads == 0 ? cpu::DefaultThreads() : threads);
}

int IntraOpThreads() { return cpu::Pool::Get().size(); }

void SetCallerIntraOpLimit(int threads) {
  OROCHI_CHECK_ARG(threads >= 0,
                   "a caller's intra-op thread limit must be 0 (none) or more, got " << threads);
  cpu::caller_limit = threads;
}

int CallerIntraOpThreads() { return cpu::CallerThreadLimit(); }

int IntraOpThreadsFree() { return cpu::Pool::Get().free_permits(); }

int64_t IntraOpThreadsBorrowed() { return cpu::Pool::Get().borrowed_total(); }

BusyCaller::BusyCaller() : saved_limit_(cpu::caller_limit) {
  if (cpu::busy_depth++ == 0) cpu::Pool::Get().EnterCaller();
  cpu::caller_limit = 0;
}

BusyCaller::~BusyCaller() {
  cpu::caller_limit = saved_limit_;
  if (--cpu::busy_depth == 0) cpu::Pool::Get().LeaveCaller();
}

}  // namespace orochi::engine
