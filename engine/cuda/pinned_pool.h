// Pinned host buffers for host -> device copies. Private to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <deque>
#include <map>
#include <mutex>

namespace orochi::engine::cuda {

// Pageable memory cannot be copied asynchronously, so inputs go through pinned buffers. A buffer
// is reused once the copy reading it has finished (its event), so a copy never waits for the
// GPU unless the pool is at its limit.

class PinnedPool {
 public:
  static constexpr size_t kChunk = size_t{16} << 20;  // copies are cut into pieces of this size
  static constexpr size_t kLimit = size_t{256} << 20;

  struct Buffer {
    void* data = nullptr;
    size_t size = 0;
  };

  static PinnedPool& Instance();

  Buffer Acquire(size_t bytes, int device);

  // Returns `buffer` once the work queued on `stream` so far (the copy from it) has finished.
  void Release(Buffer buffer, int device, cudaStream_t stream);

  // Returns a buffer whose copy was never queued.
  void Unused(Buffer buffer);

 private:
  struct InFlight {
    Buffer buffer;
    cudaEvent_t event = nullptr;
    int device = 0;
  };
  struct EventOf {
    cudaEvent_t event = nullptr;
    int device = 0;
  };

  void Reap();  // mutex_ held

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::deque<InFlight> in_flight_;
  size_t total_ = 0;
};

}  // namespace orochi::engine::cuda
