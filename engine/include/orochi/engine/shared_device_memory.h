// Device memory that another process shares through CUDA IPC: the client side of Triton's CUDA
// shared-memory extension calls cudaIpcGetMemHandle on an allocation of its own and sends the
// handle's bytes; the server opens it here and copies tensors in and out of it, so that a
// same-host client's tensors never cross a socket.
//
// Ownership: the exporting process owns the allocation; a SharedDeviceMemory owns only this
// process's mapping of it, closed by its destructor. The allocation's size is not in the handle:
// the caller checks ranges against the size the client declared, and the driver refuses (as
// kInvalidArgument) a copy it can tell runs past the allocation.
//
// Thread-safety: a SharedDeviceMemory may be used by several threads at once; each copy runs on
// its thread's stream and has finished when it returns.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "orochi/engine/device.h"
#include "orochi/engine/export.h"

namespace orochi::engine {

// sizeof(cudaIpcMemHandle_t).
inline constexpr size_t kSharedDeviceMemoryHandleBytes = 64;

class OROCHI_ENGINE_API SharedDeviceMemory {
 public:
  // Opens the allocation that `handle` (kSharedDeviceMemoryHandleBytes, as cudaIpcGetMemHandle
  // wrote them) names, on `device`. Throws Error: kFailedPrecondition when `device` is not an
  // available CUDA device, kInvalidArgument for a handle of another size or one the driver
  // refuses (a handle of this process, of a process that has gone, or not a handle at all).
  static std::unique_ptr<SharedDeviceMemory> Open(Device device, std::string_view handle);
  ~SharedDeviceMemory();
  SharedDeviceMemory(const SharedDeviceMemory&) = delete;
  SharedDeviceMemory& operator=(const SharedDeviceMemory&) = delete;

  Device device() const { return device_; }

  // Copies `bytes` at `offset` of the allocation into `destination` (host memory), or `source`
  // into them. Throws Error (kInvalidArgument when the driver refuses the range).
  void CopyToHost(size_t offset, void* destination, size_t bytes) const;
  void CopyFromHost(size_t offset, const void* source, size_t bytes) const;

 private:
  SharedDeviceMemory(Device device, void* pointer) : device_(device), pointer_(pointer) {}

  Device device_;
  void* pointer_;  // this process's address of the allocation's first byte
};

}  // namespace orochi::engine
