#!/usr/bin/env bash
# Installs what is missing, builds Orochi and its example models, and runs the whole test suite
# (unit, integration, examples and README, CPython's regression tests, lint).
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
