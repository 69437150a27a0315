#include "orochi/engine/dispatch.h"
#include "vector_math.h"

namespace orochi::engine {
namespace cpu {
void RegisterElementwiseKernels(KernelRegistry& registry);
void RegisterReductionKernels(KernelRegistry& registry);
void RegisterMatmulKernels(KernelRegistry& registry);
void RegisterIndexKernels(KernelRegistry& registry);
void RegisterSpatialKernels(KernelRegistry& registry);
void RegisterSortKernels(KernelRegistry& registry);
}  // namespace cpu

void RegisterCpuKernels(KernelRegistry& registry) {
  // Chooses the vectorised kernels' instruction set now: an OROCHI_CPU_ISA this CPU cannot honour
  // then fails the registry, so every op reports it instead of running other kernels.
  cpu::ActiveVectorKernels();
  cpu::RegisterElementwiseKernels(registry);
  cpu::RegisterReductionKernels(registry);
  cpu::RegisterMatmulKernels(registry);
  cpu::RegisterIndexKernels(registry);
  cpu::RegisterSpatialKernels(registry);
  cpu::RegisterSortKernels(registry);
}

}  // namespace orochi::engine
