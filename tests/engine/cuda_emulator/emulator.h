// A CUDA device emulated on the host, for testing the CUDA backend on machines without a GPU.
//
// liborochi_cuda_emulator.so stands in for the CUDA runtime (the cuda* functions the backend
// calls, with its own streams, events and device memory) and runs kernels compiled as host C++
// (see simt.h). The stand-ins for cuBLAS and cuDNN (cublas.cpp, cudnn.cpp) queue their work
// through this header. What is modelled, because the backend's correctness depends on it:
//
//  - Streams run asynchronously, each on its own worker thread, in order, with random pauses
//    between operations, so work that is not ordered by streams and events really does race.
//    Events mark a position in a stream; cudaStreamWaitEvent makes a stream wait for it.
//  - Device memory is separate pages with inaccessible guard pages around them and is filled
//    with 0xff bytes (NaN, -1) when allocated, so reads past an allocation fault and reads of
//    never-written memory show; freed memory stays mapped but inaccessible for a while, so a
//    late use faults too. Copies check that their device side lies in a live allocation.
//  - CUDA IPC works across processes: cudaIpcGetMemHandle moves an allocation's pages into a
//    memfd (same address, same contents), and cudaIpcOpenMemHandle in another process of the
//    same user maps that memfd through /proc/<pid>/fd, with guard pages, as a live allocation
//    of its current device (so a copy past it fails as one past any allocation does).
//  - Kernels run block by block, every CUDA thread a fiber: __syncthreads and warp shuffles wait
//    for exactly the threads that real hardware waits for, and a barrier or shuffle that not
//    every such thread reaches stops the process with the kernel's name (hardware would hang or
//    compute garbage). Launch configurations are checked as the runtime checks them. Kernels on
//    different streams run at the same time.
//  - Built with AddressSanitizer, every access a kernel or copy makes is checked to the byte
//    against the allocation's requested size, and freed memory is poisoned. Built with
//    ThreadSanitizer, every CUDA thread is a thread to it, ordered only by barriers, kernel
//    boundaries on a stream and events: what compute-sanitizer's memcheck and racecheck find on
//    a GPU, these find here (simt.cpp says what is not seen).
//
// The machine has two devices of 16 GiB each (OROCHI_CUDA_EMULATOR_DEVICES sets the count); a
// kernel launched or an event recorded on another device's stream fails, as on real GPUs.
//
// Not modelled: timing, the memory model within a kernel (threads of a block interleave only at
// barriers and shuffles), kernels that read host memory, and floating-point results to the last
// bit (host math functions differ from CUDA's by a few ulps).
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace orochi::cuda_emulator {

// Queues `work` on `stream`; the null stream runs it now, after all work queued on the current
// device's streams.
void Enqueue(cudaStream_t stream, std::function<void()> work);

// Whether [pointer, pointer + bytes) lies within one live device allocation, and (the second)
// one of the device that `stream` belongs to.
bool IsDeviceRange(const void* pointer, size_t bytes);
bool IsDeviceRangeOf(cudaStream_t stream, const void* pointer, size_t bytes);

// The position of the running CUDA thread; valid inside a kernel only.
struct ThreadPosition {
  uint3 thread{};
  uint3 block{};
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadPosition& Position();

// __syncthreads(): waits for every thread of the block.
void SyncThreads();
// __shfl_xor_sync over the full warp: every lane deposits `bytes` (at most 16) from `mine` and
// receives into `result` those of lane (lane ^ lane_mask) within its group of `width` lanes.
void ShuffleXor(const void* mine, void* result, size_t bytes, int lane_mask, int width);

// The __shared__ arrays of the module that launches a kernel, where the scheduler must know them
// (under ThreadSanitizer, see simt.h); otherwise empty.
struct SharedArrays {
  char* begin = nullptr;
  size_t bytes = 0;
};

// A status code with the name and text its library gives it (cudaGetErrorName and
// cudaGetErrorString, cublasGetStatusName and cublasGetStatusString).
template <typename Code>
struct CodeDescription {
  Code code;
  const char* name;
  const char* text;
};

// The entry of `known` for `code`, or `otherwise` for a code the table does not list.
template <typename Code, size_t kCount>
CodeDescription<Code> Describe(const CodeDescription<Code> (&known)[kCount], Code code,
                               CodeDescription<Code> otherwise) {
  for (const CodeDescription<Code>& entry : known) {
    if (entry.code == code) return entry;
  }
  return otherwise;
}

// Checks the configuration as cudaLaunchKernel does (the error is also the thread's last error)
// and queues `body`, run once per CUDA thread, on `stream`. Every non-null pointer among the
// kernel's arguments (`pointers`) must point into device memory of the stream's device: a GPU
// would fault on a host pointer or on another GPU's memory, so the process stops naming both.
cudaError_t LaunchKernel(const char* name, dim3 grid, dim3 block, cudaStream_t stream,
                         const std::vector<const void*>& pointers, SharedArrays shared,
                         std::function<void()> body);

}  // namespace orochi::cuda_emulator
