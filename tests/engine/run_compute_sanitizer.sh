#!/usr/bin/env bash
# Runs the engine's device tests (the all-ops consistency test among them) under
# compute-sanitizer's memcheck on a GPU machine: every CUDA kernel and copy, in every dtype,
# checked for out-of-bounds and misaligned accesses and leaked device memory. Without a usable
# GPU it says why and exits 0 (or $OROCHI_SKIP_CODE), as the tests themselves skip.
#   tests/engine/run_compute_sanitizer.sh [BUILD_DIR] [TOOL]     (TOOL: memcheck by default;
#                                                                 racecheck, synccheck, initcheck)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
tool=${2:-memcheck}
test_binary="$build/bin/engine_device_test"
[[ -x "$test_binary" ]] || { echo "no $test_binary: build engine_device_test first" >&2; exit 1; }

sanitizer=$(command -v compute-sanitizer || true)
for candidate in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer=$candidate
done

# The test binary itself reports whether a GPU is usable (and why not).
if ! probe=$("$test_binary" --gtest_filter='Devices.CudaIsAvailableOrSaysWhyNot' 2>&1); then
  echo "$probe" >&2
  exit 1
fi
if grep -q "^CUDA devices: 0" <<<"$probe"; then
  echo "compute-sanitizer: skipped, $(grep '^CUDA devices: 0' <<<"$probe")"
  exit "${OROCHI_SKIP_CODE:-0}"  # ctest sets 77, its "skipped"
fi
[[ -n "$sanitizer" ]] || { echo "compute-sanitizer not found (PATH, /usr/local/cuda)" >&2; exit 1; }

# OROCHI_CUDA_NO_CACHING: every tensor in an allocation of exactly its size, so that an access
# past its end is outside every allocation rather than in the rest of a rounded, cached block.
# No --leak-check: per-thread resources (streams, cuBLAS and cuDNN handles and their workspaces)
# live as long as the process on purpose.
OROCHI_CUDA_NO_CACHING=1 exec "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 \
  "$test_binary" --gtest_filter='DeviceOps.*:CudaDevice.*'
