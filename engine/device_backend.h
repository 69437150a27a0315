// The boundary between the CPU-only engine core and a device library loaded at run time.
//
// The core never links a device library. On first use of the kernel registry it dlopens
// liborochi_engine_cuda.so from its own directory and calls its one exported function,
// orochi_register_cuda_backend, which registers the CUDA kernels into the registry and fills a
// DeviceBackend table. Registration needs no GPU (it only stores function pointers), so a build
// with CUDA lists every CUDA kernel even on a machine without one; devices are probed on the
// first call of device_count.
//
// Both sides are built from the same sources by the same compiler, so the table may use C++
// types; kDeviceBackendAbiVersion still guards against a stale library next to a newer core.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "dispatch.h"
#include "orochi/engine/device.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

inline constexpr int kDeviceBackendAbiVersion = 3;

// Every function may throw Error, except release (called from destructors), which reports a
// failure on stderr and carries on.
struct DeviceBackend {
  // The usable devices; 0 with *reason set when there are none. Called once per process.
  int (*device_count)(std::string* reason) = nullptr;
  // `bytes` of device memory on the calling thread's stream; *block receives the allocator's
  // handle of it, which release() takes back.
  void* (*allocate)(int device, size_t bytes, void** block) = nullptr;
  void (*release)(void* block) = nullptr;
  // Host -> device: `source` is a contiguous CPU tensor, `destination` a contiguous device tensor
  // of the same size. With `share`, the copy has finished on return and the block is marked as
  // read by any thread's stream (uploaded weights).
  void (*copy_from_host)(const Tensor& source, Tensor& destination, bool share) = nullptr;
  // Device -> host (contiguous, same size); returns once the bytes are in `destination`.
  void (*copy_to_host)(const Tensor& source, Tensor& destination) = nullptr;
  // Device -> another device of the same type (contiguous, same size).
  void (*copy_between_devices)(const Tensor& source, Tensor& destination) = nullptr;
  void (*synchronize)(int device) = nullptr;
  DeviceMemoryStats (*memory_stats)(int device) = nullptr;
  void (*empty_cache)(int device) = nullptr;
  std::optional<double> (*utilisation)(int device) = nullptr;
  // CUDA IPC (shared_device_memory.h): opens another process's allocation on `device` from the
  // kSharedDeviceMemoryHandleBytes its cudaIpcGetMemHandle wrote (kInvalidArgument when the
  // driver refuses it); closes one (reports a failure on stderr, as release does); copies
  // between such memory and the host, finished on return (kInvalidArgument when the driver
  // says the range is not the allocation's).
  void* (*open_shared_memory)(int device, const void* handle) = nullptr;
  void (*close_shared_memory)(int device, void* pointer) = nullptr;
  void (*copy_shared_memory)(int device, void* destination, const void* source, size_t bytes,
                             bool to_host) = nullptr;
};

// The CUDA backend, loading the library on first use; nullptr with *reason set if it cannot be
// loaded. The registry (Kernels()) is built first, so CUDA kernels are registered by then.
const DeviceBackend* CudaBackend(std::string* reason = nullptr);

}  // namespace orochi::engine

// The device library's entry point: registers its kernels into `registry` and fills `backend`.
// Returns kDeviceBackendAbiVersion; the core refuses a library that returns anything else.
extern "C" {
using OrochiRegisterBackend = int (*)(orochi::engine::KernelRegistry* registry,
                                      orochi::engine::DeviceBackend* backend);
}
