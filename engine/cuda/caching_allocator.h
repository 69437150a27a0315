// The caching device allocator: blocks that tensors free are kept, per device, for later
// requests of the same rounded size instead of going back to cudaFree. A block remembers its home
// stream and the other streams that used it (see runtime.h for the ordering), and is reused on
// another stream only once the work queued on those streams has passed it.
//
// Its per-device state also holds what the streams (runtime.cpp) and the pinned pool share
// under the same mutex: the streams of every thread that used the device, spare per-thread
// resources and spare events. Private to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "libraries.h"
#include "orochi/engine/device.h"

namespace orochi::engine::cuda {

struct Block {
  int device = 0;
  void* data = nullptr;
  size_t size = 0;                  // rounded, what cudaMalloc gave
  cudaStream_t stream = nullptr;    // home: the stream it was (re)allocated on
  bool shared = false;              // complete; read by any stream without waiting
  std::vector<cudaStream_t> users;  // other streams that used it (under the device's mutex)
  // !users.empty(), readable without the mutex: the home stream's fast path in UseOnStream.
  std::atomic<bool> has_users{false};
};

struct ThreadResources {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t order_event = nullptr;  // for making this stream wait for another
  cublasHandle_t cublas = nullptr;    // created on first matmul
  cudnnHandle_t cudnn = nullptr;      // created on first convolution
};

// Everything per device, behind one mutex: the allocator's cache and statistics, the streams of
// every thread that used the device, spare per-thread resources and events.
class DeviceState {
 public:
  explicit DeviceState(int device) : device_(device) {}

  std::mutex mutex;

  // --- allocation (mutex held by the caller) ---
  Block* TakeCached(cudaStream_t stream, size_t size);

  // A block given back to the driver rather than to the cache (CachingDisabled()).
  void Dropped(const Block* block) { allocated_bytes_ -= block->size; }

  void Handed(Block* block, cudaStream_t stream, bool from_cache);

  // Keeps a freed block until every stream that may still use it has passed this point.
  void Freed(Block* block);

  // Moves pending blocks whose streams have passed their events to the shared cache.
  void CollectFinished();

  // Gives every cached block back to the driver, after all work on the device has finished.
  void ReleaseCached();

  DeviceMemoryStats Stats() const;

  // --- per-thread resources and events (mutex held by the caller) ---
  ThreadResources* TakeSpareResources();
  void AddStream(cudaStream_t stream) { streams_.push_back(stream); }
  void ReturnResources(ThreadResources* resources) { spare_resources_.push_back(resources); }

  cudaEvent_t TakeEvent();
  void ReturnEvent(cudaEvent_t event) { spare_events_.push_back(event); }

 private:
  struct Pending {
    Block* block;
    std::vector<cudaEvent_t> events;
  };

  int device_;
  std::map<cudaStream_t, std::multimap<size_t, Block*>> by_stream_;
  std::multimap<size_t, Block*> any_stream_;  // no work pending on them anywhere
  std::vector<Pending> pending_;
  std::vector<cudaStream_t> streams_;
  std::vector<ThreadResources*> spare_resources_;
  std::vector<cudaEvent_t> spare_events_;
  size_t allocated_bytes_ = 0;
  size_t cached_bytes_ = 0;
  size_t peak_allocated_bytes_ = 0;
  uint64_t allocations_ = 0;
  uint64_t cache_hits_ = 0;
};

// One state per device, made on first use and never destroyed: blocks may be freed while the
// process exits, after static destructors have run.
DeviceState& State(int device);

// Records `device`'s memory (when the devices are probed), for MemoryStatsOf.
void RecordTotalMemory(int device, size_t bytes);

}  // namespace orochi::engine::cuda
