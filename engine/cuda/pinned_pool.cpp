#include "pinned_pool.h"

#include <vector>

#include "caching_allocator.h"
#include "runtime.h"

namespace orochi::engine::cuda {

PinnedPool& PinnedPool::Instance() {
  static auto* pool = new PinnedPool;  // never destroyed (see State)
  return *pool;
}

PinnedPool::Buffer PinnedPool::Acquire(size_t bytes, int device) {
  size_t size = size_t{64} << 10;
  while (size < bytes) size *= 2;
  for (;;) {
    cudaEvent_t oldest = nullptr;
    {
      std::lock_guard lock(mutex_);
      Reap();
      auto found = free_.lower_bound(size);
      if (found != free_.end()) {
        Buffer buffer{found->second, found->first};
        free_.erase(found);
        return buffer;
      }
      if (total_ + size > kLimit && !in_flight_.empty()) oldest = in_flight_.front().event;
    }
    if (oldest != nullptr) {  // at the limit: wait for the oldest copy, then look again
      CheckCuda(cudaEventSynchronize(oldest), "waiting for a host-to-device copy", device);
      continue;
    }
    void* data = nullptr;
    CheckCuda(cudaHostAlloc(&data, size, cudaHostAllocPortable),
              "allocating " + MiB(size) + " of pinned host memory", device);
    std::lock_guard lock(mutex_);
    total_ += size;
    return {data, size};
  }
}

void PinnedPool::Release(Buffer buffer, int device, cudaStream_t stream) {
  DeviceState& state = State(device);
  cudaEvent_t event = nullptr;
  {
    std::lock_guard lock(state.mutex);
    event = state.TakeEvent();
  }
  if (event == nullptr || cudaEventRecord(event, stream) != cudaSuccess) {
    // No event to tell when the copy is done: wait for it here.
    (void)cudaGetLastError();
    (void)cudaStreamSynchronize(stream);
    if (event != nullptr) {
      std::lock_guard lock(state.mutex);
      state.ReturnEvent(event);
    }
    Unused(buffer);
    return;
  }
  std::lock_guard lock(mutex_);
  in_flight_.push_back({buffer, event, device});
}

void PinnedPool::Unused(Buffer buffer) {
  std::lock_guard lock(mutex_);
  free_.emplace(buffer.size, buffer.data);
}

void PinnedPool::Reap() {
  std::vector<EventOf> done;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    cudaError_t state = cudaEventQuery(it->event);
    if (state == cudaErrorNotReady) (void)cudaGetLastError();
    if (state != cudaSuccess) {
      ++it;
      continue;
    }
    free_.emplace(it->buffer.size, it->buffer.data);
    done.push_back({it->event, it->device});
    it = in_flight_.erase(it);
  }
  for (const EventOf& event : done) {
    DeviceState& state = State(event.device);
    std::lock_guard lock(state.mutex);
    state.ReturnEvent(event.event);
  }
}

}  // namespace orochi::engine::cuda
