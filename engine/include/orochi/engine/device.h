// Devices: which are present, their memory, and waiting for their work.
//
// The CPU is always present. CUDA devices come from liborochi_engine_cuda.so, which the engine
// loads on first use from its own directory; a build without CUDA, a machine without the NVIDIA
// driver or without a GPU has no CUDA devices, and DeviceTypeStatus says which. Nothing
// ever falls back to the CPU: creating or moving a tensor to an unavailable device throws.
//
// Work on a CUDA device is asynchronous. Each thread has its own stream per device (created on
// first use), so interpreter copies on different threads do not wait for each other; reading a
// tensor's values on the host (To(Device{})) waits for the work that produced it.
//
// State: the device list is probed once per process and never changes. The TF32 switch and the
// allocators' statistics are process-wide. Every function here is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "orochi/base/status.h"
#include "orochi/engine/export.h"

namespace orochi::engine {

enum class DeviceType : uint8_t { kCpu = 0, kCuda = 1 };
inline constexpr int kDeviceTypeCount = 2;

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};
OROCHI_ENGINE_API std::string DeviceName(Device device);  // "cpu", "cuda:1"

// 1 for the CPU; the number of usable GPUs for CUDA (0 when unavailable).
OROCHI_ENGINE_API int DeviceCount(DeviceType type);
// OK when `type` has at least one device, else kFailedPrecondition saying why not: "Orochi was
// built without CUDA (...)", "no CUDA driver: ...", "no CUDA GPU found", ...
OROCHI_ENGINE_API Status DeviceTypeStatus(DeviceType type);
// OK when `device` can be used, else kFailedPrecondition saying why not: DeviceTypeStatus's
// message, or "this machine has N CUDA device(s)" for an index past the last ("the CPU is device
// cpu" for a CPU index other than 0).
OROCHI_ENGINE_API Status DeviceStatus(Device device);
// Throws Error (kFailedPrecondition) "<device> is not available: <DeviceStatus's message>" unless
// it can be used.
OROCHI_ENGINE_API void RequireDevice(Device device);

// Waits until all work queued on `device`, by every thread, has finished (a no-op on the CPU).
// Throws Error naming the device if it is unavailable, or the CUDA error of failed work.
OROCHI_ENGINE_API void Synchronize(Device device);

struct DeviceMemoryStats {
  size_t allocated_bytes = 0;       // held by live tensors (rounded block sizes)
  size_t cached_bytes = 0;          // freed, kept by the allocator for reuse
  size_t peak_allocated_bytes = 0;  // highest allocated_bytes so far
  size_t total_bytes = 0;           // the device's memory (0 for the CPU)
  uint64_t allocations = 0;         // blocks handed out
  uint64_t cache_hits = 0;          // of those, served from the cache
};
// The caching allocator's figures for `device`. For the CPU only cached_bytes is tracked (the
// large-block cache of storage.h). Throws Error if the device is unavailable.
OROCHI_ENGINE_API DeviceMemoryStats MemoryStats(Device device);
// Returns the cached blocks of `device` to the driver (after their pending work has finished).
OROCHI_ENGINE_API void EmptyCache(Device device);

// GPU utilisation in percent over the driver's last sample period, from NVML (libnvidia-ml.so.1,
// loaded on first call); nullopt for the CPU or when NVML is unavailable.
OROCHI_ENGINE_API std::optional<double> DeviceUtilisation(Device device);

// Whether float32 matmul on CUDA may use TF32 tensor cores (10-bit mantissa inputs, float32
// accumulation). Off by default, like PyTorch's torch.backends.cuda.matmul.allow_tf32; applies
// to calls that start afterwards.
OROCHI_ENGINE_API void SetAllowTf32(bool allow);
OROCHI_ENGINE_API bool AllowTf32();

// Parses "cpu", "cuda" (cuda:0) or "cuda:N"; false if malformed. Does not check availability.
OROCHI_ENGINE_API bool ParseDevice(std::string_view text, Device* device);

}  // namespace orochi::engine
