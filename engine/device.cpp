// Devices: loading the CUDA library, probing it once, and the device API of device.h.
#include "orochi/engine/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdlib>

#include "device_backend.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

constexpr const char* kCudaLibraryName = "liborochi_engine_cuda.so";

struct CudaLibrary {
  DeviceBackend backend;
  bool loaded = false;
  std::string reason;  // why not loaded
};

// Written once, while Kernels() builds the registry; read only after Kernels() returned.
CudaLibrary& CudaLibraryState() {
  static CudaLibrary state;
  return state;
}

// The directory this engine library was loaded from, with a trailing '/', or "" if unknown.
std::string EngineDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&CudaLibraryState), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

struct DeviceProbe {
  int count = 0;
  std::string reason;
};

const DeviceProbe& CudaProbe() {
  static const DeviceProbe probe = [] {
    DeviceProbe result;
    const DeviceBackend* backend = CudaBackend(&result.reason);
    if (backend != nullptr) result.count = backend->device_count(&result.reason);
    if (result.count > 0) result.reason.clear();
    return result;
  }();
  return probe;
}

std::atomic<bool> allow_tf32{false};

}  // namespace

// Called by Kernels() while it builds the registry (dispatch.cpp), before anyone can look up a
// kernel: the library registers its kernels into `registry`.
void LoadDeviceLibraries(KernelRegistry& registry) {
  CudaLibrary& state = CudaLibraryState();
  // The variable names another build of the CUDA backend: the tests run the backend on an
  // emulated device this way (tests/engine/cuda_emulator).
  const char* chosen = std::getenv("OROCHI_CUDA_BACKEND");
  const std::string path =
      chosen != nullptr && *chosen != '\0' ? chosen : EngineDirectory() + kCudaLibraryName;
  // A missing file means a build without CUDA; a file that does not load (no cuBLAS on this
  // machine) is reported with the loader's error.
  if (access(path.c_str(), F_OK) != 0) {
    state.reason = "Orochi was built without CUDA (" + path + " does not exist)";
    return;
  }
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    state.reason = "cannot load " + path + ": " + (error != nullptr ? error : "unknown error");
    return;
  }
  auto entry =
      reinterpret_cast<OrochiRegisterBackend>(dlsym(library, "orochi_register_cuda_backend"));
  if (entry == nullptr) {
    state.reason = path + " has no orochi_register_cuda_backend";
    return;
  }
  DeviceBackend backend;
  KernelRegistry staged = registry;  // a library that fails halfway leaves no kernels behind
  const int version = entry(&staged, &backend);
  if (version != kDeviceBackendAbiVersion) {
    state.reason = path + " was built for another engine (backend ABI " + std::to_string(version) +
                   ", expected " + std::to_string(kDeviceBackendAbiVersion) + ")";
    return;
  }
  registry = staged;
  state.backend = backend;
  state.loaded = true;
}

const DeviceBackend* CudaBackend(std::string* reason) {
  Kernels();  // loads the library
  const CudaLibrary& state = CudaLibraryState();
  if (!state.loaded && reason != nullptr) *reason = state.reason;
  return state.loaded ? &state.backend : nullptr;
}

int DeviceCount(DeviceType type) { return type == DeviceType::kCpu ? 1 : CudaProbe().count; }

std::string DeviceName(Device device) {
  if (device.type == DeviceType::kCpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

Status DeviceTypeStatus(DeviceType type) {
  if (type == DeviceType::kCpu) return Status::Ok();
  const DeviceProbe& probe = CudaProbe();
  return probe.count > 0 ? Status::Ok() : FailedPrecondition(probe.reason);
}

Status DeviceStatus(Device device) {
  if (device.type == DeviceType::kCpu) {
    return device.index == 0 ? Status::Ok() : FailedPrecondition("the CPU is device cpu");
  }
  OROCHI_RETURN_IF_ERROR(DeviceTypeStatus(device.type));
  const int count = CudaProbe().count;
  if (device.index < 0 || device.index >= count) {
    return FailedPrecondition("this machine has " + std::to_string(count) + " CUDA device(s)");
  }
  return Status::Ok();
}

void RequireDevice(Device device) {
  if (device.type == DeviceType::kCpu) {
    OROCHI_CHECK(device.index == 0, StatusCode::kFailedPrecondition,
                 "cpu:" << device.index << " does not exist (the CPU is device cpu)");
    return;
  }
  const Status status = DeviceStatus(device);
  OROCHI_CHECK(status.ok(), StatusCode::kFailedPrecondition,
               DeviceName(device) << " is not available: " << status.message());
}

void Synchronize(Device device) {
  RequireDevice(device);
  if (device.type == DeviceType::kCuda) CudaBackend()->synchronize(device.index);
}

DeviceMemoryStats MemoryStats(Device device) {
  RequireDevice(device);
  if (device.type == DeviceType::kCpu) {
    DeviceMemoryStats stats;
    stats.cached_bytes = CpuCachedBytes();
    return stats;
  }
  return CudaBackend()->memory_stats(device.index);
}

void EmptyCache(Device device) {
  RequireDevice(device);
  if (device.type == DeviceType::kCpu) {
    EmptyCpuCache();
    return;
  }
  CudaBackend()->empty_cache(device.index);
}

std::optional<double> DeviceUtilisation(Device device) {
  if (device.type == DeviceType::kCpu) return std::nullopt;
  RequireDevice(device);
  return CudaBackend()->utilisation(device.index);
}

void SetAllowTf32(bool allow) { allow_tf32.store(allow, std::memory_order_relaxed); }
bool AllowTf32() { return allow_tf32.load(std::memory_order_relaxed); }

bool ParseDevice(std::string_view text, Device* device) {
  if (text == "cpu") {
    *device = Device{};
    return true;
  }
  constexpr std::string_view kCuda = "cuda";
  if (text.substr(0, kCuda.size()) != kCuda) return false;
  std::string_view rest = text.substr(kCuda.size());
  if (rest.empty()) {
    *device = Device{DeviceType::kCuda, 0};
    return true;
  }
  if (rest.front() != ':' || rest.size() == 1) return false;
  int index = 0;
  auto [end, error] = std::from_chars(rest.data() + 1, rest.data() + rest.size(), index);
  if (error != std::errc() || end != rest.data() + rest.size() || index < 0) return false;
  *device = Device{DeviceType::kCuda, index};
  return true;
}

}  // namespace orochi::engine
