// The CPU kernels' choices for this machine: the instruction set of the vectorised math (exp,
// log, tanh, erf, sigmoid, silu, gelu, sin, cos, softmax, log_softmax, layer_norm, rms_norm on
// float32, float16 and bfloat16), and OpenBLAS's kernels for matmul.
//
// Chosen once per process from CPUID: AVX-512 where the CPU and the OS support it, else AVX2
// with FMA, else the scalar kernels. The environment variable OROCHI_CPU_ISA (scalar, avx2 or
// avx512) caps the choice; a value this CPU cannot run, or an unknown one, is an error that every
// op reports. float64 always takes the scalar kernels.
//
// Thread-safety: all functions are thread-safe. SetCpuVectorIsa is for tests and benchmarks:
// calls already running finish with the kernels they started with.
#pragma once

#include <cstdint>
#include <string_view>

#include "orochi/engine/export.h"

namespace orochi::engine {

enum class CpuVectorIsa : uint8_t { kScalar, kAvx2, kAvx512 };

OROCHI_ENGINE_API std::string_view CpuVectorIsaName(CpuVectorIsa isa);  // "scalar", "avx2", ...
// The widest instruction set this CPU and OS support.
OROCHI_ENGINE_API CpuVectorIsa CpuVectorIsaSupported();
// The one the kernels use now.
OROCHI_ENGINE_API CpuVectorIsa CpuVectorIsaInUse();
// Switches the kernels to `isa`; throws Error (kFailedPrecondition) if this CPU cannot run it.
OROCHI_ENGINE_API void SetCpuVectorIsa(CpuVectorIsa isa);

// OpenBLAS's kernel name for this CPU, e.g. "Haswell", "SkylakeX", "Zen", and how it was
// chosen. Servers log both at startup.
OROCHI_ENGINE_API std::string_view BlasCoreName();
OROCHI_ENGINE_API std::string_view BlasCoreChoice();

}  // namespace orochi::engine
