#!/usr/bin/env bash
# Checks formatting (clang-format) and runs clang-tidy over Orochi's C++ sources.
#   scripts/lint.sh [BUILD_DIR]     (BUILD_DIR holds compile_commands.json; default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
mapfile -t sources < <(git ls-files '*.cpp' '*.h' ':!:interpreters/abi/*')
clang-format --dry-run --Werror "${sources[@]}"
echo "lint: clang-format clean (${#sources[@]} files)"

# clang does not know GCC's -fno-gnu-unique; give clang-tidy a database without it.
database=$(mktemp -d)
trap 'rm -rf "$database"' EXIT
sed 's/ -fno-gnu-unique//g' "$build/compile_commands.json" > "$database/compile_commands.json"
# Only the units this build compiles: engine/cuda/ is absent from a build without CUDA. Tests
# are held to the same checks (tests/.clang-tidy drops two that only ask for speed).
mapfile -t units < <(git ls-files '*.cpp' | while read -r unit; do
  if grep -qF "\"file\": \"$PWD/$unit\"" "$database/compile_commands.json"; then echo "$unit"; fi
done)
# One clang-tidy per core, a few units each; any failure fails the whole.
if ! report=$(printf '%s\0' "${units[@]}" |
  xargs -0 -n 4 -P "$(nproc)" clang-tidy -p "$database" --quiet --warnings-as-errors='*' 2>&1); then
  grep -vE '^[0-9]+ warnings? generated|^Suppressed|^Use -(header-filter|system-headers)' <<<"$report" >&2
  echo "lint: clang-tidy found problems (above)" >&2
  exit 1
fi
echo "lint: clang-tidy clean (${#units[@]} translation units)"
