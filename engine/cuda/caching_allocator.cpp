#include "caching_allocator.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "orochi/base/check.h"
#include "orochi/engine/error.h"
#include "runtime.h"

namespace orochi::engine::cuda {
namespace {

// Sets a device for the lifetime of the guard and restores the previous one: for work done on
// behalf of any thread (freeing blocks, making events) that must not change its current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Sizes are rounded so that freed blocks fit later requests: to 512 bytes below 1 MiB, and to a
// quarter of the power of two below the size above (at most 25% unused), which keeps the number
// of distinct sizes small for the cache.
size_t RoundedSize(size_t bytes) {
  constexpr size_t kSmall = size_t{1} << 20;
  if (bytes < kSmall) return std::max<size_t>(512, (bytes + 511) / 512 * 512);
  size_t power = size_t{1} << (63 - __builtin_clzll(bytes));
  size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

// OROCHI_CUDA_NO_CACHING=1 gives every tensor its own cudaMalloc of exactly its size, freed when
// the tensor dies, so that a memory checker (compute-sanitizer, or the emulated GPU under
// AddressSanitizer) sees a kernel reading past a tensor's end instead of into the rest of a
// rounded, cached block. Each free waits for the device: this is for checking, not for serving.
bool CachingDisabled() {
  static const bool disabled = [] {
    const char* setting = std::getenv("OROCHI_CUDA_NO_CACHING");
    return setting != nullptr && std::strcmp(setting, "1") == 0;
  }();
  return disabled;
}

// The memory of each device, recorded when the devices are probed.
std::array<std::atomic<size_t>, kMaxDevices>& TotalMemories() {
  static std::array<std::atomic<size_t>, kMaxDevices> totals{};
  return totals;
}

size_t TotalMemory(int device) {
  return device >= 0 && device < kMaxDevices ? TotalMemories()[device].load() : 0;
}

}  // namespace

Block* DeviceState::TakeCached(cudaStream_t stream, size_t size) {
  CollectFinished();
  for (auto* cache : {&by_stream_[stream], &any_stream_}) {
    auto found = cache->find(size);
    if (found == cache->end()) continue;
    Block* block = found->second;
    cache->erase(found);
    cached_bytes_ -= size;
    return block;
  }
  return nullptr;
}

void DeviceState::Handed(Block* block, cudaStream_t stream, bool from_cache) {
  block->stream = stream;
  block->shared = false;
  block->users.clear();
  block->has_users.store(false, std::memory_order_relaxed);
  allocated_bytes_ += block->size;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  ++allocations_;
  if (from_cache) ++cache_hits_;
}

void DeviceState::Freed(Block* block) {
  allocated_bytes_ -= block->size;
  cached_bytes_ += block->size;
  std::vector<cudaStream_t> streams;
  if (block->shared) {
    streams = streams_;  // it could have been read by any of them
  } else if (!block->users.empty()) {
    streams = block->users;
    streams.push_back(block->stream);
  } else {
    by_stream_[block->stream].emplace(block->size, block);  // ordered by its stream
    return;
  }
  Pending pending{block, {}};
  for (cudaStream_t stream : streams) {
    cudaEvent_t event = TakeEvent();
    if (event == nullptr || cudaEventRecord(event, stream) != cudaSuccess) {
      // Cannot tell when it is free: never reuse it (a leak, not a corruption).
      if (event != nullptr) spare_events_.push_back(event);
      cached_bytes_ -= block->size;
      for (cudaEvent_t recorded : pending.events) spare_events_.push_back(recorded);
      return;
    }
    pending.events.push_back(event);
  }
  pending_.push_back(std::move(pending));
}

void DeviceState::CollectFinished() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    bool done = true;
    for (cudaEvent_t event : it->events) {
      cudaError_t state = cudaEventQuery(event);
      if (state == cudaErrorNotReady) (void)cudaGetLastError();  // not an error to keep
      done = done && state == cudaSuccess;
    }
    if (!done) {
      ++it;
      continue;
    }
    for (cudaEvent_t event : it->events) spare_events_.push_back(event);
    any_stream_.emplace(it->block->size, it->block);
    it = pending_.erase(it);
  }
}

void DeviceState::ReleaseCached() {
  if (cached_bytes_ == 0) return;  // and never make a context on a device not used yet
  DeviceGuard guard(device_);
  (void)cudaDeviceSynchronize();
  CollectFinished();
  auto release = [this](std::multimap<size_t, Block*>& cache) {
    for (auto& [size, block] : cache) {
      (void)cudaFree(block->data);
      cached_bytes_ -= size;
      delete block;
    }
    cache.clear();
  };
  for (auto& [stream, cache] : by_stream_) release(cache);
  release(any_stream_);
}

DeviceMemoryStats DeviceState::Stats() const {
  DeviceMemoryStats stats;
  stats.allocated_bytes = allocated_bytes_;
  stats.cached_bytes = cached_bytes_;
  stats.peak_allocated_bytes = peak_allocated_bytes_;
  stats.allocations = allocations_;
  stats.cache_hits = cache_hits_;
  return stats;
}

ThreadResources* DeviceState::TakeSpareResources() {
  if (spare_resources_.empty()) return nullptr;
  ThreadResources* resources = spare_resources_.back();
  spare_resources_.pop_back();
  return resources;
}

cudaEvent_t DeviceState::TakeEvent() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return nullptr;
  return event;
}

// One state per device, made on first use and never destroyed: blocks may be freed while the
// process exits, after static destructors have run.
DeviceState& State(int device) {
  static std::array<DeviceState*, kMaxDevices> states = [] {
    std::array<DeviceState*, kMaxDevices> made{};
    for (int i = 0; i < kMaxDevices; ++i) made[i] = new DeviceState(i);
    return made;
  }();
  OROCHI_INTERNAL_ASSERT(device >= 0 && device < kMaxDevices, "CUDA device index out of range");
  return *states[device];
}

void RecordTotalMemory(int device, size_t bytes) { TotalMemories()[device].store(bytes); }

void* Allocate(int device, size_t bytes, void** block_handle) {
  DeviceState& state = State(device);
  cudaStream_t stream = CurrentStream(device);
  const bool exact = CachingDisabled();
  const size_t size = exact ? std::max<size_t>(bytes, 1) : RoundedSize(bytes);
  if (!exact) {
    std::lock_guard lock(state.mutex);
    if (Block* block = state.TakeCached(stream, size)) {
      state.Handed(block, stream, /*from_cache=*/true);
      *block_handle = block;
      return block->data;
    }
  }
  void* data = nullptr;
  cudaError_t error = cudaMalloc(&data, size);
  if (error == cudaErrorMemoryAllocation) {  // give the cache back and try once more
    (void)cudaGetLastError();
    {
      std::lock_guard lock(state.mutex);
      state.ReleaseCached();
    }
    error = cudaMalloc(&data, size);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    DeviceMemoryStats stats = MemoryStatsOf(device);
    OROCHI_CHECK(error != cudaErrorMemoryAllocation, StatusCode::kResourceExhausted,
                 "CUDA out of memory on cuda:" << device << ": cannot allocate " << MiB(size)
                                               << " (" << MiB(stats.allocated_bytes)
                                               << " allocated by Orochi, " << MiB(stats.total_bytes)
                                               << " in total)");
    ThrowCudaError(error, "allocating " + MiB(size), device);
  }
  auto* block = new Block;
  block->device = device;
  block->data = data;
  block->size = size;
  std::lock_guard lock(state.mutex);
  state.Handed(block, stream, /*from_cache=*/false);
  *block_handle = block;
  return data;
}

void Release(void* block_handle) noexcept {
  auto* block = static_cast<Block*>(block_handle);
  try {
    DeviceState& state = State(block->device);
    if (CachingDisabled()) {
      {
        std::lock_guard lock(state.mutex);
        state.Dropped(block);
      }
      // Any stream may still be using it, and cudaFree is only documented as *possibly*
      // waiting for them.
      DeviceGuard guard(block->device);
      (void)cudaDeviceSynchronize();
      (void)cudaFree(block->data);
      delete block;
      return;
    }
    std::lock_guard lock(state.mutex);
    state.Freed(block);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "orochi: freeing a CUDA block failed: %s\n", error.what());
  }
}

DeviceMemoryStats MemoryStatsOf(int device) {
  DeviceMemoryStats stats;
  {
    DeviceState& state = State(device);
    std::lock_guard lock(state.mutex);
    stats = state.Stats();
  }
  // From the device's properties: cudaMemGetInfo would make a context (hundreds of MiB) on
  // every GPU that /metrics asks about.
  stats.total_bytes = TotalMemory(device);
  return stats;
}

void EmptyCacheOf(int device) {
  DeviceState& state = State(device);
  std::lock_guard lock(state.mutex);
  state.ReleaseCached();
}

}  // namespace orochi::engine::cuda
