#include <dlfcn.h>

#include <array>
#include <mutex>
#include <optional>

#include "runtime.h"

namespace orochi::engine::cuda {
namespace {

// NVML, for the GPU utilisation metric. Loaded with dlopen: it ships with the driver, not the
// toolkit, and is optional. Only the few entry points used are declared (NVML's ABI for them is
// stable).

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

std::optional<double> UtilisationOf(int device) { return Nvml::Instance().Utilisation(device); }

}  // namespace orochi::engine::cuda
