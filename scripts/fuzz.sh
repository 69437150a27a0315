#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz) with clang, libFuzzer, AddressSanitizer and UBSan, replays
# every input kept in tests/fuzz/regressions/<target>/, then fuzzes each target for SECONDS from
# its seed corpus (tests/fuzz/corpus/<target>/, copied: the repository is not written). Exits
# non-zero on any crash; a new crash's input is kept in BUILD_DIR/fuzz-findings/<target>/.
#   scripts/fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET]     (default build-fuzz, 30)
# OROCHI_FUZZ_BUILD_JOBS caps the build's parallel jobs (default: one per core).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath -m "${1:-build-fuzz}")
seconds=${2:-30}

# Only what the fuzzers link: no tests, benchmarks, examples or CUDA backend.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DOROCHI_BUILD_FUZZERS=ON \
  -DOROCHI_BUILD_TESTS=OFF -DOROCHI_BUILD_BENCHMARKS=OFF -DOROCHI_BUILD_EXAMPLES=OFF \
  -DOROCHI_CUDA=OFF >/dev/null
# Target and the longest input it is given: room for a request with data, a small package, a
# header past the smaller header limits. Longer inputs only make each run slower.
targets=(json_pull_parser:4096 kserve_request:4096 package:8192 http_request:8192)
binaries=()
for entry in "${targets[@]}"; do binaries+=("fuzz_${entry%%:*}"); done
cmake --build "$build" --parallel "${OROCHI_FUZZ_BUILD_JOBS:-$(nproc)}" --target "${binaries[@]}"

# Leaks are findings too; UBSan already stops at its first report (-fno-sanitize-recover).
export ASAN_OPTIONS="detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
findings="$build/fuzz-findings"
failed=()
for entry in "${targets[@]}"; do
  target=${entry%%:*}
  max_len=${entry##*:}
  binary="$build/bin/fuzz_$target"
  mkdir -p "$work/$target"
  log="$work/$target/log"

  mapfile -t regressions < <(find "tests/fuzz/regressions/$target" -type f ! -name '*.md' | sort)
  if [[ ${#regressions[@]} -gt 0 ]] && ! "$binary" "${regressions[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $target crashes on a kept regression input (above)" >&2
    failed+=("$target")
    continue
  fi

  cp -r "tests/fuzz/corpus/$target" "$work/$target/corpus"
  rm -rf "${findings:?}/$target"  # what an earlier run found
  mkdir -p "$findings/$target"
  # Reported as crashes: an input that takes 25 s (a hang), and one allocation of 64 MiB for
  # inputs of a few KiB (a client's bytes amplified into memory; no parser needs that much).
  if "$binary" "$work/$target/corpus" -max_total_time="$seconds" -max_len="$max_len" \
    -timeout=25 -malloc_limit_mb=64 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/$target/" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $target: ${#regressions[@]} regression inputs, then $runs runs in $seconds s," \
      "no crash"
  else
    tail -n 60 "$log" >&2
    echo "fuzz: $target crashed; its input is in $findings/$target/ (replay it with" \
      "$build/bin/fuzz_$target FILE; once fixed, keep it in tests/fuzz/regressions/$target/)" >&2
    failed+=("$target")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: crashes in ${failed[*]}" >&2
  exit 1
fi
