// Other processes' device memory, opened from CUDA IPC handles (the DeviceBackend's
// open/close/copy_shared_memory): what Triton's CUDA shared-memory extension needs.
#include <cstdio>
#include <cstring>
#include <string>

#include "orochi/engine/error.h"
#include "runtime.h"

namespace orochi::engine::cuda {
namespace {

// The driver's answer to a handle or a range that is not what the client said: the client's
// mistake, not the server's.
[[noreturn]] void ThrowClientError(cudaError_t error, const std::string& what, int device) {
  (void)cudaGetLastError();  // not sticky: the next, unrelated check must not see it
  detail::Throw(StatusCode::kInvalidArgument, what + " failed on cuda:" + std::to_string(device) +
                                                  ": " + cudaGetErrorString(error));
}

}  // namespace

void* OpenSharedMemory(int device, const void* handle) {
  SetCurrentDevice(device);
  cudaIpcMemHandle_t ipc_handle;
  std::memcpy(&ipc_handle, handle, sizeof(ipc_handle));
  void* pointer = nullptr;
  const cudaError_t error =
      cudaIpcOpenMemHandle(&pointer, ipc_handle, cudaIpcMemLazyEnablePeerAccess);
  if (error == cudaErrorMemoryAllocation) {
    ThrowCudaError(error, "opening a CUDA IPC handle", device);
  }
  if (error != cudaSuccess) ThrowClientError(error, "opening the CUDA IPC handle", device);
  return pointer;
}

void CloseSharedMemory(int device, void* pointer) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) (void)cudaSetDevice(device);
  if (const cudaError_t error = cudaIpcCloseMemHandle(pointer); error != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "orochi: closing a CUDA IPC mapping on cuda:%d failed: %s\n", device,
                 cudaGetErrorString(error));
  }
}

void CopySharedMemory(int device, void* destination, const void* source, size_t bytes,
                      bool to_host) {
  const cudaStream_t stream = CurrentStream(device);
  cudaError_t error =
      cudaMemcpyAsync(destination, source, bytes,
                      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream);
  const std::string what =
      "copying " + MiB(bytes) + (to_host ? " from" : " to") + " CUDA shared memory";
  if (error == cudaErrorInvalidValue) ThrowClientError(error, what, device);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) ThrowCudaError(error, what, device);
}

}  // namespace orochi::engine::cuda
