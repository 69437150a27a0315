#!/usr/bin/env bash
# Runs the checks that need a GPU, on a GPU machine that got the build as .gpu/bundle.tar.xz
# (scripts/gpu-bundle.sh), with PyTorch and the CUDA toolkit installed there. Logs and results
# go to $OUT when it is set, else to ./gpu-results.
#   bash scripts/gpu-check.sh tests    engine_device_test (all ops vs the CPU, allocator, threads),
#                                      compute-sanitizer memcheck of it, python_api.test_cuda and
#                                      the CUDA examples through the server (8 copies)
#   bash scripts/gpu-check.sh bench    bench/cuda/bench_cuda.py --models against PyTorch
# Each part takes under 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?tests or bench}
out=${OUT:-$PWD/gpu-results}
mkdir -p "$out"
root=$PWD

# --- unpack: the build where its RUNPATHs and compiled-in paths point ---------------------------
[[ -f .gpu/bundle.tar.xz ]] || { echo "no .gpu/bundle.tar.xz: run scripts/gpu-bundle.sh here" >&2; exit 1; }
staging=$(mktemp -d)
tar -C "$staging" -xJf .gpu/bundle.tar.xz
built_root=$(sed -n 1p "$staging/root")
mkdir -p "$(dirname "$built_root")"
if [[ "$built_root" != "$root" && ! -e "$built_root" ]]; then
  ln -s "$root" "$built_root"
fi
mkdir -p build
cp -a "$staging/build/." build/
dynload=$(cat "$staging/lib-dynload.path")
mkdir -p "$dynload"
cp -a "$staging/lib-dynload/." "$dynload/"
deps=/opt/orochi-deps
mkdir -p "$deps"
cp -a "$staging/deps/." "$deps/"
echo "bundle of commit $(cat "$staging/commit"), unpacked at $root (built at $built_root)"
rm -rf "$staging"

# cuBLAS and cuDNN: the toolkit's, else the ones PyTorch's wheels bring.
nvidia_libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots
                       for p in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))})))
PY
)
export LD_LIBRARY_PATH="$deps:/usr/local/cuda/lib64:${nvidia_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"

status=0
step() {  # step NAME TIMEOUT COMMAND...: runs it, logs to $out/NAME.log, remembers a failure
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local code=$?
  tail -n 25 "$out/$name.log"
  echo "=== $name: exit $code after $((SECONDS - start)) s"
  [[ $code -eq 0 ]] || status=1
}

case "$part" in
  tests)
    { nvidia-smi; nvcc --version; } > "$out/machine.txt" 2>&1
    head -n 15 "$out/machine.txt"
    step engine_device_test 120 build/bin/engine_device_test
    step compute_sanitizer 300 tests/engine/run_compute_sanitizer.sh build
    step python_cuda 120 bash -c "cd tests/python && ../../build/bin/orochi python -m unittest -v test_cuda"
    # The example packages are drawn with numpy by their build scripts, then packed.
    for example in resnet encoder; do
      step "example_$example" 120 bash -c "python3 models/$example/build.py --out build/models/$example"
    done
    step cuda_examples 240 env OROCHI_BINARY="$root/build/bin/orochi" \
      OROCHI_EXAMPLES="$root/build/models" bash -c \
      "cd tests/models && python3 -m unittest -v test_examples.CudaExamplesTest"
    ;;
  bench)
    step bench_cuda 560 env PYTHONUNBUFFERED=1 python3 bench/cuda/bench_cuda.py --models \
      --seconds 1 --json "$out/bench_cuda.json"
    ;;
  *)
    echo "unknown part '$part': tests or bench" >&2
    exit 2
    ;;
esac
exit $status
