#include "blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <string>

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
  // OpenBLAS starts its worker threads as it loads, sized by OPENBLAS_NUM_THREADS (else one per
  // core), and each then spins in sched_yield for about 0.1 s before it sleeps: CPU taken from
  // the copies' first calls, for threads that set_num_threads(1) below never uses. Loaded with
  // one thread, it starts none; the variable is put back afterwards for the processes model
  // code starts. (Already loaded, by numpy in a copy, it keeps the threads it started then.)
  void* library = dlopen(OROCHI_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (library == nullptr) {
    const char* set = std::getenv("OPENBLAS_NUM_THREADS");
    const std::optional<std::string> previous =
        set != nullptr ? std::optional<std::string>(set) : std::nullopt;
    setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1);
    library = dlopen(OROCHI_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (previous) {
      setenv("OPENBLAS_NUM_THREADS", previous->c_str(), /*overwrite=*/1);
    } else {
      unsetenv("OPENBLAS_NUM_THREADS");
    }
  }
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
