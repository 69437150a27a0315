// The one symbol liborochi_engine_cuda.so exports: the engine core calls it when it builds its
// kernel registry (see device_backend.h). It needs no GPU: it only registers function pointers.
#include <type_traits>

#include "device_backend.h"
#include "runtime.h"

namespace orochi::engine::cuda {
void RegisterCudaKernels(KernelRegistry& registry);  // kernels.cpp
}  // namespace orochi::engine::cuda

extern "C" __attribute__((visibility("default"))) int orochi_register_cuda_backend(
    orochi::engine::KernelRegistry* registry, orochi::engine::DeviceBackend* backend) {
  namespace cuda = orochi::engine::cuda;
  cuda::RegisterCudaKernels(*registry);
  backend->device_count = cuda::ProbeDevices;
  backend->allocate = cuda::Allocate;
  backend->release = cuda::Release;
  backend->copy_from_host = cuda::CopyFromHost;
  backend->copy_to_host = cuda::CopyToHost;
  backend->copy_between_devices = cuda::CopyBetweenDevices;
  backend->synchronize = cuda::SynchronizeDevice;
  backend->memory_stats = cuda::MemoryStatsOf;
  backend->empty_cache = cuda::EmptyCacheOf;
  backend->utilisation = cuda::UtilisationOf;
  backend->open_shared_memory = cuda::OpenSharedMemory;
  backend->close_shared_memory = cuda::CloseSharedMemory;
  backend->copy_shared_memory = cuda::CopySharedMemory;
  return orochi::engine::kDeviceBackendAbiVersion;
}

static_assert(std::is_same_v<decltype(&orochi_register_cuda_backend), OrochiRegisterBackend>);
