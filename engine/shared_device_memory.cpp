#include "orochi/engine/shared_device_memory.h"

#include "device_backend.h"
#include "orochi/engine/error.h"

namespace orochi::engine {

std::unique_ptr<SharedDeviceMemory> SharedDeviceMemory::Open(Device device,
                                                             std::string_view handle) {
  OROCHI_CHECK(device.type == DeviceType::kCuda, StatusCode::kFailedPrecondition,
               "CUDA shared memory needs a CUDA device, not " << DeviceName(device));
  RequireDevice(device);
  OROCHI_CHECK_ARG(handle.size() == kSharedDeviceMemoryHandleBytes,
                   "a CUDA IPC handle has " << kSharedDeviceMemoryHandleBytes << " bytes, not "
                                            << handle.size());
  void* pointer = CudaBackend()->open_shared_memory(device.index, handle.data());
  return std::unique_ptr<SharedDeviceMemory>(new SharedDeviceMemory(device, pointer));
}

SharedDeviceMemory::~SharedDeviceMemory() {
  CudaBackend()->close_shared_memory(device_.index, pointer_);
}

void SharedDeviceMemory::CopyToHost(size_t offset, void* destination, size_t bytes) const {
  if (bytes == 0) return;
  CudaBackend()->copy_shared_memory(device_.index, destination,
                                    static_cast<const std::byte*>(pointer_) + offset, bytes, true);
}

void SharedDeviceMemory::CopyFromHost(size_t offset, const void* source, size_t bytes) const {
  if (bytes == 0) return;
  CudaBackend()->copy_shared_memory(device_.index, static_cast<std::byte*>(pointer_) + offset,
                                    source, bytes, false);
}

}  // namespace orochi::engine
