#include "runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "caching_allocator.h"
#include "orochi/base/check.h"
#include "orochi/engine/error.h"
#include "pinned_pool.h"

namespace orochi::engine::cuda {
namespace {

std::string Describe(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

// The calling thread's resources on each device, given to the device's spares when it exits.
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

}  // namespace

std::string MiB(size_t bytes) {
  std::ostringstream text;
  text.precision(1);
  text << std::fixed << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return text.str();
}

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
    RecordTotalMemory(device, properties.totalGlobalMem);
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

}  // namespace orochi::engine::cuda
