#include "dispatch.h"
#include "kernels.h"
#include "vector_math.h"

namespace orochi::engine {
namespace cpu {
namespace {

// Every op's CPU kernel, in op.h's order (the compiler holds designated initializers to it).
constexpr KernelTable kCpuKernels = {
    .copy = Copy,
    .fill = Fill,
    .arange = ArangeFill,
    .neg = UnaryOp,
    .abs = UnaryOp,
    .exp = UnaryOp,
    .log = UnaryOp,
    .sqrt = UnaryOp,
    .rsqrt = UnaryOp,
    .sin = UnaryOp,
    .cos = UnaryOp,
    .tanh = UnaryOp,
    .sigmoid = UnaryOp,
    .relu = UnaryOp,
    .silu = UnaryOp,
    .gelu = UnaryOp,
    .gelu_tanh = UnaryOp,
    .erf = UnaryOp,
    .floor = UnaryOp,
    .ceil = UnaryOp,
    .round = UnaryOp,
    .add = BinaryOp,
    .sub = BinaryOp,
    .mul = BinaryOp,
    .div = BinaryOp,
    .pow = BinaryOp,
    .floor_divide = BinaryOp,
    .remainder = BinaryOp,
    .maximum = BinaryOp,
    .minimum = BinaryOp,
    .eq = BinaryOp,
    .ne = BinaryOp,
    .lt = BinaryOp,
    .le = BinaryOp,
    .gt = BinaryOp,
    .ge = BinaryOp,
    .logical_and = BinaryOp,
    .logical_or = BinaryOp,
    .logical_xor = BinaryOp,
    .where = WhereOp,
    .sum = ReduceOp,
    .mean = ReduceOp,
    .amax = ReduceOp,
    .amin = ReduceOp,
    .prod = ReduceOp,
    .argmax = ReduceOp,
    .argmin = ReduceOp,
    .layer_norm = NormOp,
    .rms_norm = NormOp,
    .index_select = IndexSelect,
    .im2col = Im2col,
    .conv2d = Conv2d,
    .sort = SortRows,
    .softmax = SoftmaxOp,
    .log_softmax = SoftmaxOp,
    .cumsum = CumsumOp,
    .matmul = Matmul,
};
static_assert(HasEveryKernel(kCpuKernels), "the CPU has a kernel for every op of op.h");

}  // namespace
}  // namespace cpu

void RegisterCpuKernels(KernelRegistry& registry) {
  // Chooses the vectorised kernels' instruction set now: an OROCHI_CPU_ISA this CPU cannot honour
  // then fails the registry, so every op reports it instead of running other kernels.
  cpu::ActiveVectorKernels();
  registry.Register(DeviceType::kCpu, cpu::kCpuKernels);
}

}  // namespace orochi::engine
