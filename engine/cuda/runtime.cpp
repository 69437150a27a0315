#include "runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "orochi/base/check.h"
#include "orochi/engine/error.h"

namespace orochi::engine::cuda {
namespace {

constexpr int kMaxDevices = 64;

std::string Describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

std::string MiB(size_t bytes) {
  std::ostringstream text;
  text.precision(1);
  text << std::fixed << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return text.str();
}

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

// --- the caching allocator -----------------------------------------------------------------------

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
  Block* TakeCached(cudaStream_t stream, size_t size) {
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

  // A block given back to the driver rather than to the cache (CachingDisabled()).
  void Dropped(const Block* block) { allocated_bytes_ -= block->size; }

  void Handed(Block* block, cudaStream_t stream, bool from_cache) {
    block->stream = stream;
    block->shared = false;
    block->users.clear();
    block->has_users.store(false, std::memory_order_relaxed);
    allocated_bytes_ += block->size;
    peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
    ++allocations_;
    if (from_cache) ++cache_hits_;
  }

  // Keeps a freed block until every stream that may still use it has passed this point.
  void Freed(Block* block) {
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

  // Moves pending blocks whose streams have passed their events to the shared cache.
  void CollectFinished() {
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

  // Gives every cached block back to the driver, after all work on the device has finished.
  void ReleaseCached() {
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

  DeviceMemoryStats Stats() const {
    DeviceMemoryStats stats;
    stats.allocated_bytes = allocated_bytes_;
    stats.cached_bytes = cached_bytes_;
    stats.peak_allocated_bytes = peak_allocated_bytes_;
    stats.allocations = allocations_;
    stats.cache_hits = cache_hits_;
    return stats;
  }

  // --- per-thread resources and events (mutex held by the caller) ---
  ThreadResources* TakeSpareResources() {
    if (spare_resources_.empty()) return nullptr;
    ThreadResources* resources = spare_resources_.back();
    spare_resources_.pop_back();
    return resources;
  }
  void AddStream(cudaStream_t stream) { streams_.push_back(stream); }
  void ReturnResources(ThreadResources* resources) { spare_resources_.push_back(resources); }

  cudaEvent_t TakeEvent() {
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
DeviceState& State(int device) {
  static std::array<DeviceState*, kMaxDevices> states = [] {
    std::array<DeviceState*, kMaxDevices> made{};
    for (int i = 0; i < kMaxDevices; ++i) made[i] = new DeviceState(i);
    return made;
  }();
  OROCHI_INTERNAL_ASSERT(device >= 0 && device < kMaxDevices, "CUDA device index out of range");
  return *states[device];
}

// --- per-thread streams --------------------------------------------------------------------------

class ThreadSlots {
 public:
  ThreadSlots() = default;
  ThreadSlots(const ThreadSlots&) = delete;
  ThreadSlots& operator=(const ThreadSlots&) = delete;
  ~ThreadSlots() {
    for (ThreadResources* resources : slots_) {
      if (resources == nullptr) continue;
      DeviceState& state = State(resources->device);
      std::lock_guard lock(state.mutex);
      state.ReturnResources(resources);
    }
  }

  ThreadResources& Get(int device) {
    ThreadResources*& slot = slots_[device];
    if (slot == nullptr) slot = Make(device);
    return *slot;
  }

 private:
  static ThreadResources* Make(int device) {
    DeviceState& state = State(device);
    {
      std::lock_guard lock(state.mutex);
      if (ThreadResources* spare = state.TakeSpareResources()) return spare;
    }
    auto resources = std::make_unique<ThreadResources>();
    resources->device = device;
    CheckCuda(cudaStreamCreateWithFlags(&resources->stream, cudaStreamNonBlocking),
              "creating a stream", device);
    CheckCuda(cudaEventCreateWithFlags(&resources->order_event, cudaEventDisableTiming),
              "creating an event", device);
    std::lock_guard lock(state.mutex);
    state.AddStream(resources->stream);
    return resources.release();  // kept for the next thread when this one exits
  }

  std::array<ThreadResources*, kMaxDevices> slots_{};
};

thread_local ThreadSlots thread_slots;

ThreadResources& Resources(int device) {
  SetCurrentDevice(device);
  return thread_slots.Get(device);
}

// Orders `resources`' stream after the other-stream work on `tensor`'s block: on its home
// stream, and on every other stream that used it since (a kernel of another thread may have
// written it there).
void UseOnStream(const Tensor& tensor, ThreadResources& resources) {
  auto* block = static_cast<Block*>(tensor.storage()->device_block());
  // `stream` and `shared` were written before the tensor reached any other thread.
  if (block == nullptr || block->shared) return;
  const bool home = block->stream == resources.stream;
  if (home && !block->has_users.load(std::memory_order_acquire)) return;
  std::vector<cudaStream_t> earlier;
  {
    DeviceState& state = State(block->device);
    std::lock_guard lock(state.mutex);
    if (!home) earlier.push_back(block->stream);
    bool listed = home;
    for (cudaStream_t user : block->users) {
      if (user == resources.stream) {
        listed = true;
      } else {
        earlier.push_back(user);
      }
    }
    if (!listed) {
      block->users.push_back(resources.stream);
      block->has_users.store(true, std::memory_order_release);
    }
  }
  for (cudaStream_t stream : earlier) {
    CheckCuda(cudaEventRecord(resources.order_event, stream), "ordering streams", block->device);
    CheckCuda(cudaStreamWaitEvent(resources.stream, resources.order_event, 0), "ordering streams",
              block->device);
  }
}

// --- pinned staging for host -> device copies ----------------------------------------------------
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

  static PinnedPool& Instance() {
    static auto* pool = new PinnedPool;  // never destroyed (see State)
    return *pool;
  }

  Buffer Acquire(size_t bytes, int device) {
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

  // Returns `buffer` once the work queued on `stream` so far (the copy from it) has finished.
  void Release(Buffer buffer, int device, cudaStream_t stream) {
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

  // Returns a buffer whose copy was never queued.
  void Unused(Buffer buffer) {
    std::lock_guard lock(mutex_);
    free_.emplace(buffer.size, buffer.data);
  }

 private:
  struct InFlight {
    Buffer buffer;
    cudaEvent_t event;
    int device;
  };
  struct EventOf {
    cudaEvent_t event;
    int device;
  };

  void Reap() {  // mutex_ held
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

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  std::deque<InFlight> in_flight_;
  size_t total_ = 0;
};

// The memory of each device, recorded when the devices are probed.
std::array<std::atomic<size_t>, kMaxDevices>& TotalMemories() {
  static std::array<std::atomic<size_t>, kMaxDevices> totals{};
  return totals;
}

size_t TotalMemory(int device) {
  return device >= 0 && device < kMaxDevices ? TotalMemories()[device].load() : 0;
}

// --- NVML ----------------------------------------------------------------------------------------
// Loaded with dlopen: it ships with the driver, not the toolkit, and is optional. Only the few
// entry points used are declared (NVML's ABI for them is stable).

struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};

class Nvml {
 public:
  static Nvml& Instance() {
    static auto* nvml = new Nvml;
    return *nvml;
  }

  std::optional<double> Utilisation(int device) {
    std::lock_guard lock(mutex_);
    if (!loaded_) return std::nullopt;
    void*& handle = handles_[device];
    if (handle == nullptr) {
      char bus_id[32] = {};
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count ||
          cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess ||
          handle_by_bus_id_(bus_id, &handle) != 0) {
        handle = nullptr;
        return std::nullopt;
      }
    }
    NvmlUtilization utilization{};
    if (utilization_rates_(handle, &utilization) != 0) return std::nullopt;
    return static_cast<double>(utilization.gpu);
  }

 private:
  Nvml() {
    void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(library, "nvmlInit_v2"));
    handle_by_bus_id_ = reinterpret_cast<int (*)(const char*, void**)>(
        dlsym(library, "nvmlDeviceGetHandleByPciBusId_v2"));
    utilization_rates_ = reinterpret_cast<int (*)(void*, NvmlUtilization*)>(
        dlsym(library, "nvmlDeviceGetUtilizationRates"));
    loaded_ = init != nullptr && handle_by_bus_id_ != nullptr && utilization_rates_ != nullptr &&
              init() == 0;
  }

  std::mutex mutex_;
  bool loaded_ = false;
  int (*handle_by_bus_id_)(const char*, void**) = nullptr;
  int (*utilization_rates_)(void*, NvmlUtilization*) = nullptr;
  std::array<void*, kMaxDevices> handles_{};
};

}  // namespace

// --- errors --------------------------------------------------------------------------------------

void ThrowCudaError(cudaError_t error, std::string_view what, int device) {
  (void)cudaGetLastError();  // a non-sticky error must not fail the next, unrelated check
  const StatusCode code =
      error == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal;
  detail::Throw(code, std::string(what) + " failed on cuda:" + std::to_string(device) + ": " +
                          Describe(error));
}

// --- streams -------------------------------------------------------------------------------------

void SetCurrentDevice(int device) {
  // Asked each time (the runtime keeps it per thread, so this is cheap) rather than remembered:
  // other code on the thread, an extension module say, may select another device.
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return;
  CheckCuda(cudaSetDevice(device), "selecting the device", device);
}

cudaStream_t CurrentStream(int device) { return Resources(device).stream; }

// A cuBLAS or cuDNN handle on `stream`. The libraries allocate a handle's memory themselves,
// outside the caching allocator: when that fails, the cache is emptied and creation tried again.
template <typename Handle, typename Library, typename Status>
Handle CreateHandle(const Library& library, Status out_of_memory,
                    void (*check)(Status, std::string_view, int), const char* name,
                    cudaStream_t stream, int device) {
  Handle handle = nullptr;
  Status status = library.create(&handle);
  if (status == out_of_memory) {
    EmptyCacheOf(device);
    status = library.create(&handle);
  }
  check(status, std::string("creating a ") + name + " handle", device);
  check(library.set_stream(handle, stream), std::string("setting the ") + name + " stream", device);
  return handle;
}

cublasHandle_t CurrentCublas(int device) {
  ThreadResources& resources = Resources(device);
  if (resources.cublas == nullptr) {
    resources.cublas = CreateHandle<cublasHandle_t>(
        Cublas(), CUBLAS_STATUS_ALLOC_FAILED, CheckCublas, "cuBLAS", resources.stream, device);
  }
  return resources.cublas;
}

cudnnHandle_t CurrentCudnn(int device) {
  ThreadResources& resources = Resources(device);
  if (resources.cudnn == nullptr) {
    resources.cudnn =
        CreateHandle<cudnnHandle_t>(Cudnn(), CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
                                    CheckCudnn, "cuDNN", resources.stream, device);
  }
  return resources.cudnn;
}

StreamScope::StreamScope(const Tensor& tensor, std::initializer_list<const Tensor*> others)
    : device_(tensor.device().index) {
  ThreadResources& resources = Resources(device_);
  stream_ = resources.stream;
  UseOnStream(tensor, resources);
  for (const Tensor* other : others) {
    if (other != nullptr && other->defined()) UseOnStream(*other, resources);
  }
}

// --- the backend ---------------------------------------------------------------------------------

int ProbeDevices(std::string* reason) {
  // The runtime loads the driver itself, but its error for a missing one ("insufficient driver")
  // would not say that the driver is absent.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL) == nullptr) {
    const char* error = dlerror();
    *reason = std::string("no CUDA driver: libcuda.so.1 cannot be loaded (") +
              (error != nullptr ? error : "unknown error") + ")";
    return 0;
  }
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error == cudaErrorNoDevice || (error == cudaSuccess && count == 0)) {
    (void)cudaGetLastError();
    *reason = "no CUDA GPU found";
    return 0;
  }
  if (error == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    *reason = "the NVIDIA driver is older than the CUDA runtime Orochi was built with (" +
              std::to_string(CUDART_VERSION / 1000) + "." +
              std::to_string(CUDART_VERSION % 1000 / 10) + "): " + Describe(error);
    return 0;
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    *reason = "CUDA is unavailable: " + Describe(error);
    return 0;
  }
  count = std::min(count, kMaxDevices);
  for (int device = 0; device < count; ++device) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
      (void)cudaGetLastError();
      *reason = "cannot query cuda:" + std::to_string(device);
      return 0;
    }
    TotalMemories()[device].store(properties.totalGlobalMem);
    if (properties.major < 8) {
      *reason = "cuda:" + std::to_string(device) + " (" + properties.name +
                ") has compute capability " + std::to_string(properties.major) + "." +
                std::to_string(properties.minor) +
                "; Orochi's CUDA kernels are built for 8.0 (Ampere) and newer";
      return 0;
    }
  }
  return count;
}

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

void CopyFromHost(const Tensor& source, Tensor& destination, bool share) {
  StreamScope scope(destination, {});
  const auto* from = static_cast<const std::byte*>(source.data());
  auto* to = static_cast<std::byte*>(destination.mutable_data());
  const size_t bytes = static_cast<size_t>(source.numel()) * ItemSize(source.dtype());
  PinnedPool& pool = PinnedPool::Instance();
  for (size_t offset = 0; offset < bytes; offset += PinnedPool::kChunk) {
    const size_t length = std::min(PinnedPool::kChunk, bytes - offset);
    PinnedPool::Buffer buffer = pool.Acquire(length, scope.device());
    std::memcpy(buffer.data, from + offset, length);
    cudaError_t error =
        cudaMemcpyAsync(to + offset, buffer.data, length, cudaMemcpyHostToDevice, scope.stream());
    if (error != cudaSuccess) {
      pool.Unused(buffer);
      ThrowCudaError(error, "copying " + MiB(bytes) + " to the device", scope.device());
    }
    pool.Release(buffer, scope.device(), scope.stream());
  }
  if (share) {
    // Other threads read weights on their own streams without waiting for this one.
    scope.Check(cudaStreamSynchronize(scope.stream()), "uploading a shared tensor");
    DeviceState& state = State(scope.device());
    std::lock_guard lock(state.mutex);
    static_cast<Block*>(destination.storage()->device_block())->shared = true;
  }
}

void CopyToHost(const Tensor& source, Tensor& destination) {
  StreamScope scope(source, {});
  const size_t bytes = static_cast<size_t>(source.numel()) * ItemSize(source.dtype());
  cudaError_t error = cudaMemcpyAsync(destination.mutable_data(), source.data(), bytes,
                                      cudaMemcpyDeviceToHost, scope.stream());
  if (error == cudaSuccess) error = cudaStreamSynchronize(scope.stream());
  if (error != cudaSuccess) {
    ThrowCudaError(error, "copying " + MiB(bytes) + " to the host", scope.device());
  }
}

void CopyBetweenDevices(const Tensor& source, Tensor& destination) {
  const size_t bytes = static_cast<size_t>(source.numel()) * ItemSize(source.dtype());
  {
    StreamScope source_scope(source, {});
    source_scope.Check(cudaStreamSynchronize(source_scope.stream()), "finishing work on a source");
  }
  StreamScope scope(destination, {});
  cudaError_t error =
      cudaMemcpyPeerAsync(destination.mutable_data(), destination.device().index, source.data(),
                          source.device().index, bytes, scope.stream());
  // The source's allocator does not track the destination's stream: finish before returning.
  if (error == cudaSuccess) error = cudaStreamSynchronize(scope.stream());
  if (error != cudaSuccess) {
    ThrowCudaError(error, "copying " + MiB(bytes) + " from " + DeviceName(source.device()),
                   scope.device());
  }
}

void SynchronizeDevice(int device) {
  SetCurrentDevice(device);
  CheckCuda(cudaDeviceSynchronize(), "synchronizing", device);
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

std::optional<double> UtilisationOf(int device) { return Nvml::Instance().Utilisation(device); }

}  // namespace orochi::engine::cuda
