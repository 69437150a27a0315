// What the emulator's own files share beyond emulator.h.
#pragma once

#include "emulator.h"

namespace orochi::cuda_emulator {

// Records `error` as the calling thread's last error (cudaGetLastError) and returns it.
cudaError_t SetLastError(cudaError_t error);
// cudaErrorInvalidResourceHandle unless `stream` belongs to the calling thread's current device:
// a kernel launch on another device's stream fails.
cudaError_t CheckKernelStream(cudaStream_t stream);
// The device whose memory `pointer` points into, or -1 if it is not device memory.
int DeviceOfPointer(const void* pointer);
// The device of `stream` (the null stream: the calling thread's current device).
int DeviceOfStream(cudaStream_t stream);
// Names the kernel running on this worker thread for the fault handler (null: none).
void SetRunningKernel(const char* name, unsigned block);

}  // namespace orochi::cuda_emulator
