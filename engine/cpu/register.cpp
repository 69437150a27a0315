#include "orochi/engine/dispatch.h"

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
  cpu::RegisterElementwiseKernels(registry);
  cpu::RegisterReductionKernels(registry);
  cpu::RegisterMatmulKernels(registry);
  cpu::RegisterIndexKernels(registry);
  cpu::RegisterSpatialKernels(registry);
  cpu::RegisterSortKernels(registry);
}

}  // namespace orochi::engine
