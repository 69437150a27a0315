// The CUDA runtime side of the backend: errors, per-thread streams and library handles, host <->
// device copies and device probing (runtime.cpp), other processes' memory opened through CUDA
// IPC (shared_memory.cpp), the caching device allocator (caching_allocator.cpp), the pinned
// staging pool for uploads (pinned_pool.cpp) and the utilisation read from NVML (nvml.cpp).
//
// Threads: every thread gets, per device and on first use, its own non-blocking stream, event,
// and cuBLAS and cuDNN handles. They are never destroyed: when a thread exits they go to a pool
// that the next new thread takes from, so a stream outlives every block allocated on it and
// nothing is torn down while the CUDA runtime shuts down.
//
// Ordering across threads: a block remembers the stream it was allocated on (its "home"). A
// kernel on another stream that uses it first makes its stream wait for the home stream's work
// so far (StreamScope), and the block records that stream, so that once freed it is reused only
// after that work too. Blocks uploaded as shared (read-only weights) are complete before any
// other thread sees them and need no waits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "libraries.h"
#include "orochi/engine/device.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine::cuda {

// The most devices the backend uses (more are ignored).
inline constexpr int kMaxDevices = 64;

// `bytes` as "12.5 MiB", for messages.
std::string MiB(size_t bytes);

// Throws Error naming `what`, the device and CUDA's error (kResourceExhausted for out of memory,
// kInternal otherwise).
[[noreturn]] void ThrowCudaError(cudaError_t error, std::string_view what, int device);
inline void CheckCuda(cudaError_t error, std::string_view what, int device) {
  if (error != cudaSuccess) [[unlikely]] {
    ThrowCudaError(error, what, device);
  }
}
// Makes `device` current for the calling thread (cheap when it already is).
void SetCurrentDevice(int device);
// The calling thread's stream, cuBLAS and cuDNN handles on `device` (made current), created on
// first use; the handles work on that stream.
cudaStream_t CurrentStream(int device);
cublasHandle_t CurrentCublas(int device);
cudnnHandle_t CurrentCudnn(int device);

// For work on `tensor` and `others` (one device; null or undefined entries are skipped): makes
// their device current, orders the calling thread's stream after work on these tensors queued
// by other threads, and gives that stream.
class StreamScope {
 public:
  StreamScope(const Tensor& tensor, std::initializer_list<const Tensor*> others);
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Throws an Error naming `what` if a launch failed.
  void Check(cudaError_t error, std::string_view what) const { CheckCuda(error, what, device_); }

 private:
  int device_;
  cudaStream_t stream_;
};

// --- the DeviceBackend functions (see device_backend.h) ------------------------------------------
int ProbeDevices(std::string* reason);
void* Allocate(int device, size_t bytes, void** block);
void Release(void* block) noexcept;
void CopyFromHost(const Tensor& source, Tensor& destination, bool share);
void CopyToHost(const Tensor& source, Tensor& destination);
void CopyBetweenDevices(const Tensor& source, Tensor& destination);
void SynchronizeDevice(int device);
DeviceMemoryStats MemoryStatsOf(int device);
void EmptyCacheOf(int device);
std::optional<double> UtilisationOf(int device);
void* OpenSharedMemory(int device, const void* handle);  // shared_memory.cpp
void CloseSharedMemory(int device, void* pointer) noexcept;
void CopySharedMemory(int device, void* destination, const void* source, size_t bytes,
                      bool to_host);

}  // namespace orochi::engine::cuda
