// The CUDA language as host C++, for compiling Orochi's .cu files with the host compiler into the
// emulated backend (see emulator.h). Force-included (-include) ahead of each .cu file.
//
// Outside nvcc the CUDA headers already make __global__, __device__ and __host__ empty. This adds
// what kernels use beyond that: the thread position built-ins, __shared__, barriers and shuffles,
// the few device intrinsics the kernels call, and OROCHI_LAUNCH, which device_common.cuh uses in
// place of <<<...>>>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>  // nvcc declares the math functions in every .cu file

#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "emulator.h"

// A block's shared memory: one instance per worker thread (stream), where its blocks run one
// after another. The sanitizers do not check thread-locals, so under them these are statics and
// kernels take turns (simt.cpp); under ThreadSanitizer they are gathered in one section, whose
// race history the scheduler clears as each block starts, as a block's shared memory is new.
#undef __shared__
#if defined(__SANITIZE_ADDRESS__)
#define __shared__ static
#elif defined(__SANITIZE_THREAD__)
#define __shared__ static __attribute__((section("orochi_shared")))
extern "C" char __start_orochi_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_orochi_shared[] __attribute__((weak, visibility("hidden")));
#else
#define __shared__ static thread_local
#endif

#define threadIdx (::orochi::cuda_emulator::Position().thread)
#define blockIdx (::orochi::cuda_emulator::Position().block)
#define blockDim (::orochi::cuda_emulator::Position().block_dim)
#define gridDim (::orochi::cuda_emulator::Position().grid_dim)

inline void __syncthreads() { ::orochi::cuda_emulator::SyncThreads(); }

template <typename V>
V __shfl_xor_sync(unsigned mask, V value, int lane_mask, int width = 32) {
  static_assert(std::is_trivially_copyable_v<V> && sizeof(V) <= 16);
  if (mask != 0xffffffffU) __builtin_trap();  // the kernels shuffle whole warps only
  V result;
  ::orochi::cuda_emulator::ShuffleXor(&value, &result, sizeof(V), lane_mask, width);
  return result;
}

inline long long __double_as_longlong(double value) {
  long long bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}
// x86-64's SSE arithmetic rounds each operation to nearest, as the _rn intrinsics do.
inline double __dadd_rn(double x, double y) { return x + y; }
inline double __dmul_rn(double x, double y) { return x * y; }

namespace orochi::cuda_emulator {

// kernel<<<grid, block, 0, stream>>>(args...): the arguments are converted to the kernel's
// parameter types and copied when launched, as CUDA does.
template <typename... Params, typename... Args>
void Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
            Args&&... args) {
  std::tuple<std::decay_t<Params>...> bound(static_cast<Params>(std::forward<Args>(args))...);
  std::vector<const void*> pointers;
  std::apply(
      [&pointers](const auto&... values) {
        auto collect = [&pointers](const auto& value) {
          if constexpr (std::is_pointer_v<std::decay_t<decltype(value)>>) {
            pointers.push_back(value);
          }
        };
        (collect(values), ...);
      },
      bound);
  SharedArrays shared;
#if defined(__SANITIZE_THREAD__)
  if (__start_orochi_shared != nullptr) {
    shared = {__start_orochi_shared,
              static_cast<size_t>(__stop_orochi_shared - __start_orochi_shared)};
  }
#endif
  LaunchKernel(name, grid, block, stream, pointers, shared,
               [kernel, bound] { std::apply(kernel, bound); });
}

}  // namespace orochi::cuda_emulator

#define OROCHI_LAUNCH(kernel, grid, block, stream, ...) \
  ::orochi::cuda_emulator::Launch(#kernel, kernel, (grid), (block), (stream), __VA_ARGS__)
