#!/usr/bin/env bash
# Installs what is missing, builds Orochi and its example models, and runs the whole test suite
# (unit, integration, examples and README, CPython's regression tests, lint), then the engine
# under ThreadSanitizer and AddressSanitizer, then the fuzzers (scripts/fuzz.sh).
#   scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 1500 --parallel 1

# The emulated GPU's own checks (each shown to stop a faulty kernel), then the device tests (every
# op in every dtype, threads handing tensors over) on it, in sanitizer build BUILD_DIR with the
# given environment. Skipped where there is no CUDA toolkit, hence no emulated GPU.
check_on_emulated_gpu() {  # check_on_emulated_gpu BUILD_DIR [VAR=VALUE...]
  local build_dir=$1
  shift
  local emulator="$build_dir/cuda_emulator"
  cmake --build "$build_dir" --parallel "$(nproc)" --target engine_device_test
  if [[ ! -e "$emulator" ]]; then
    echo "no CUDA toolkit, so no emulated GPU: its checks in $build_dir are skipped"
    return
  fi
  cmake --build "$build_dir" --parallel "$(nproc)" --target cuda_emulator_test
  "$build_dir/bin/cuda_emulator_test"
  # LD_LIBRARY_PATH: the sanitizers' dlopen wrapper loses the backend's RUNPATH, through which it
  # finds the stand-in libcuda.so.1.
  env "$@" LD_LIBRARY_PATH="$emulator" \
    OROCHI_CUDA_BACKEND="$emulator/liborochi_engine_cuda_emulated.so" \
    "$build_dir/bin/engine_device_test"
}

# ThreadSanitizer: the engine's threads on shared read-only tensors for 10 s; on the emulated GPU
# every warp of every kernel is a thread to it, ordered only as CUDA orders them, so kernels on
# two streams without an event between them, or a missing barrier, are reported as races
# (compute-sanitizer's racecheck, without a GPU).
cmake -S . -B "$build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOROCHI_SANITIZER=thread \
  -DOROCHI_BUILD_BENCHMARKS=OFF
cmake --build "$build-tsan" --parallel "$(nproc)" --target engine_concurrency_test
export TSAN_OPTIONS="halt_on_error=1 exitcode=66"
OROCHI_CONCURRENCY_SECONDS=10 "$build-tsan/bin/engine_concurrency_test"
check_on_emulated_gpu "$build-tsan"

# AddressSanitizer and LeakSanitizer: the engine's CPU tests and the server's codec; on the
# emulated GPU every tensor in a device allocation of exactly its size, so that a kernel, copy,
# cuBLAS or cuDNN call that strays by one byte is reported (compute-sanitizer's memcheck,
# without a GPU).
cmake -S . -B "$build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOROCHI_SANITIZER=address \
  -DOROCHI_BUILD_BENCHMARKS=OFF
cmake --build "$build-asan" --parallel "$(nproc)" --target engine_test server_test
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1"
"$build-asan/bin/engine_test"
# The request codec parses whatever a client sends: its parser and encoder, with the random
# requests read both ways, under AddressSanitizer too.
"$build-asan/bin/server_test"
check_on_emulated_gpu "$build-asan" OROCHI_CUDA_NO_CACHING=1

# Coverage-guided fuzzing (libFuzzer, AddressSanitizer, UBSan) of what parses a client's bytes:
# the HTTP request parser as the server configures it, the KServe request codec, the JSON pull
# parser and the package reader, 30 s each, after replaying the inputs of past crashes.
scripts/fuzz.sh "$build-fuzz" 30
