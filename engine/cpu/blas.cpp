#include "blas.h"

#include <dlfcn.h>

#include <cstdlib>

#include "orochi/base/check.h"

namespace orochi::engine::cpu {
namespace {

// AVX-512 AMD CPUs are the ones OpenBLAS 0.3.21 misdetects; its SkylakeX kernels need exactly
// these extensions, which Zen 4 and later have.
bool IsAvx512Amd() {
  __builtin_cpu_init();
  return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
}

template <typename Function>
Function Symbol(void* library, const char* name) {
  void* address = dlsym(library, name);
  OROCHI_INTERNAL_ASSERT(address != nullptr, name);
  return reinterpret_cast<Function>(address);
}

BlasLibrary Load() {
  BlasLibrary blas;
  if (const char* chosen = std::getenv("OPENBLAS_CORETYPE"); chosen != nullptr) {
    blas.core_choice = std::string("OPENBLAS_CORETYPE=") + chosen + " from the environment";
  } else if (IsAvx512Amd()) {
    // Before the library loads: it reads the variable once, in its constructor.
    setenv("OPENBLAS_CORETYPE", "SKYLAKEX", /*overwrite=*/0);
    blas.core_choice =
        "SkylakeX kernels chosen for this AVX-512 AMD CPU (OpenBLAS would detect Haswell)";
  } else {
    blas.core_choice = "OpenBLAS's own CPU detection";
  }
  void* library = dlopen(OROCHI_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    OROCHI_INTERNAL_ASSERT(false, error != nullptr ? error : "cannot load " OROCHI_OPENBLAS_SONAME);
  }
  blas.sgemm = Symbol<decltype(&cblas_sgemm)>(library, "cblas_sgemm");
  blas.dgemm = Symbol<decltype(&cblas_dgemm)>(library, "cblas_dgemm");
  blas.set_num_threads =
      Symbol<decltype(&openblas_set_num_threads)>(library, "openblas_set_num_threads");
  blas.get_corename = Symbol<decltype(&openblas_get_corename)>(library, "openblas_get_corename");
  // One thread per call: the engine's own pool splits a GEMM between threads (matmul.cpp).
  // OpenBLAS's thread count is one process-wide setting that calls from many threads would race
  // on, and its threads would come on top of the pool's.
  blas.set_num_threads(1);
  return blas;
}

}  // namespace

const BlasLibrary& Blas() {
  static const BlasLibrary blas = Load();
  return blas;
}

}  // namespace orochi::engine::cpu
