#!/usr/bin/env bash
# Installs what is missing, builds Orochi and its example models, and runs the whole test suite
# (unit, integration, examples and README, CPython's regression tests, lint), then the engine
# under ThreadSanitizer and AddressSanitizer.
#   scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --timeout 1500 --parallel 1

# The engine under ThreadSanitizer: many threads on shared read-only tensors for 10 s.
cmake -S . -B "$build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOROCHI_SANITIZER=thread \
  -DOROCHI_BUILD_BENCHMARKS=OFF
cmake --build "$build-tsan" --parallel "$(nproc)" --target engine_concurrency_test
TSAN_OPTIONS="halt_on_error=1 exitcode=66" OROCHI_CONCURRENCY_SECONDS=10 \
  "$build-tsan/bin/engine_concurrency_test"

# The engine under AddressSanitizer and LeakSanitizer: its CPU tests, the emulated GPU's own
# checks, and the device tests (every op in every dtype) on the emulated GPU with every tensor in
# a device allocation of exactly its size, so that a kernel or copy that strays by one byte is
# reported, as compute-sanitizer's memcheck would on a GPU.
cmake -S . -B "$build-asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOROCHI_SANITIZER=address \
  -DOROCHI_BUILD_BENCHMARKS=OFF
cmake --build "$build-asan" --parallel "$(nproc)" --target engine_test engine_device_test
export ASAN_OPTIONS="halt_on_error=1 detect_leaks=1"
"$build-asan/bin/engine_test"
emulator="$build-asan/cuda_emulator"
if [[ -e "$emulator" ]]; then
  cmake --build "$build-asan" --parallel "$(nproc)" --target cuda_emulator_test
  "$build-asan/bin/cuda_emulator_test"
  # LD_LIBRARY_PATH: AddressSanitizer's dlopen wrapper loses the backend's RUNPATH, through which
  # it finds the stand-in libcuda.so.1.
  LD_LIBRARY_PATH="$emulator" OROCHI_CUDA_NO_CACHING=1 \
    OROCHI_CUDA_BACKEND="$emulator/liborochi_engine_cuda_emulated.so" \
    "$build-asan/bin/engine_device_test"
else
  echo "no CUDA toolkit, so no emulated GPU: the device tests under AddressSanitizer are skipped"
fi
