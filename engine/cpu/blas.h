// OpenBLAS, loaded by the engine itself on first use.
//
// OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE or its own CPU detection.
// Version 0.3.21 (Debian 12) detects AVX-512 AMD CPUs (Zen 4 and 5) as Haswell and then runs
// GEMM about half as fast. Loading it here, after choosing the core, fixes that without
// -march=native or a rebuilt OpenBLAS.
#pragma once

#include <cblas.h>

#include <string>

namespace orochi::engine::cpu {

struct BlasLibrary {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;
  decltype(&openblas_get_corename) get_corename = nullptr;
  std::string core_choice;  // how the core was chosen, for the startup log
};

// Loads OpenBLAS once (thread-safe), single-threaded, and returns its entry points. Aborts with a
// message naming the library if it cannot be loaded: the engine cannot run without it.
const BlasLibrary& Blas();

}  // namespace orochi::engine::cpu
