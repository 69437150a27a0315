// Picks the vectorised kernels' instruction set at run time (cpu_math.h), so that one build runs
// on any x86-64 CPU: the AVX2 and AVX-512 files are only entered on CPUs that have the
// instructions their flags allowed.
#include "vector_math.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "orochi/engine/cpu_math.h"
#include "orochi/engine/error.h"

namespace orochi::engine {
namespace {

CpuVectorIsa DetectIsa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // libgcc's checks include the OS's support for the wider registers' state (XGETBV).
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f")) return CpuVectorIsa::kAvx512;
  if (avx2) return CpuVectorIsa::kAvx2;
#endif
  return CpuVectorIsa::kScalar;
}

const cpu::VectorKernels* KernelsOf(CpuVectorIsa isa) {
  switch (isa) {
    case CpuVectorIsa::kAvx512:
      return &cpu::Avx512Kernels();
    case CpuVectorIsa::kAvx2:
      return &cpu::Avx2Kernels();
    case CpuVectorIsa::kScalar:
      break;
  }
  return nullptr;
}

void RequireSupported(CpuVectorIsa isa, std::string_view source) {
  OROCHI_CHECK(isa <= CpuVectorIsaSupported(), StatusCode::kFailedPrecondition,
               source << "asks for " << CpuVectorIsaName(isa) << ", but this CPU supports only "
                      << CpuVectorIsaName(CpuVectorIsaSupported()));
}

// The choice at start-up: the widest the CPU has, capped by OROCHI_CPU_ISA.
CpuVectorIsa StartupIsa() {
  const char* wanted = std::getenv("OROCHI_CPU_ISA");
  if (wanted == nullptr || *wanted == '\0') return CpuVectorIsaSupported();
  for (CpuVectorIsa isa : {CpuVectorIsa::kScalar, CpuVectorIsa::kAvx2, CpuVectorIsa::kAvx512}) {
    if (CpuVectorIsaName(isa) == wanted) {
      RequireSupported(isa, "OROCHI_CPU_ISA=" + std::string(wanted) + " ");
      return isa;
    }
  }
  OROCHI_CHECK(false, StatusCode::kInvalidArgument,
               "OROCHI_CPU_ISA=" << wanted << " is not one of scalar, avx2, avx512");
  return CpuVectorIsa::kScalar;
}

struct ActiveIsa {
  std::atomic<CpuVectorIsa> isa;
  std::atomic<const cpu::VectorKernels*> kernels;
};

ActiveIsa& Active() {
  // Thrown again on every use while OROCHI_CPU_ISA is wrong, so every op reports it.
  static ActiveIsa active{StartupIsa(), KernelsOf(StartupIsa())};
  return active;
}

}  // namespace

std::string_view CpuVectorIsaName(CpuVectorIsa isa) {
  switch (isa) {
    case CpuVectorIsa::kScalar:
      return "scalar";
    case CpuVectorIsa::kAvx2:
      return "avx2";
    case CpuVectorIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuVectorIsa CpuVectorIsaSupported() {
  static const CpuVectorIsa supported = DetectIsa();
  return supported;
}

CpuVectorIsa CpuVectorIsaInUse() { return Active().isa.load(std::memory_order_relaxed); }

void SetCpuVectorIsa(CpuVectorIsa isa) {
  RequireSupported(isa, "SetCpuVectorIsa ");
  ActiveIsa& active = Active();
  active.kernels.store(KernelsOf(isa), std::memory_order_release);
  active.isa.store(isa, std::memory_order_relaxed);
}

namespace cpu {
const VectorKernels* ActiveVectorKernels() {
  return Active().kernels.load(std::memory_order_acquire);
}
}  // namespace cpu

}  // namespace orochi::engine
