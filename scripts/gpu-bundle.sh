#!/usr/bin/env bash
# Packs a built tree for a GPU machine that cannot build Orochi itself (one that runs another
# distribution, with no Debian CPython 3.11 or network): the stripped binaries and libraries, the
# Debian shared libraries they load that such a machine lacks, and the system Python's extension
# modules, as .gpu/bundle.tar.xz (ignored by git; about 15 MB, so it travels easily with the
# source tree). scripts/gpu-check.sh unpacks and runs it there.
#   scripts/gpu-bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
for needed in bin/orochi bin/engine_device_test bin/bench_cuda lib/liborochi_engine_cuda.so; do
  [[ -e "$build/$needed" ]] || { echo "no $build/$needed: build with CUDA first" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/bin" "$stage/build/lib" "$stage/deps" "$stage/lib-dynload"
for program in orochi engine_device_test bench_cuda; do
  strip -o "$stage/build/bin/$program" "$build/bin/$program"
done
ln -s orochi "$stage/build/bin/orochi-python"
for library in liborochi_engine.so liborochi_engine_cuda.so; do  # (the copy library is embedded)
  strip -o "$stage/build/lib/$library" "$build/lib/$library"
done

# Debian libraries the binaries or the engine's dlopen of OpenBLAS need, except glibc and
# libstdc++, which the other machine has in newer, compatible versions.
openblas=$(ldconfig -p | awk '/libopenblas\.so\.0 / && !found {print $NF; found = 1}')
[[ -n "$openblas" ]] || { echo "libopenblas.so.0 not found" >&2; exit 1; }
{
  ldd "$build/bin/orochi" "$openblas" | awk '/=> \// {print $3}'
  echo "$openblas"
} | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so' |
  grep -v "/$(basename "$build")/lib/" | while read -r library; do
  cp -L "$library" "$stage/deps/"
done

# Copies load the system Python's C extension modules from where the build found them.
dynload=$(/usr/bin/python3.11 -c 'import sysconfig; print(sysconfig.get_path("platstdlib"))')/lib-dynload
cp -a "$dynload/." "$stage/lib-dynload/"
echo "$dynload" > "$stage/lib-dynload.path"
git rev-parse HEAD > "$stage/commit"
pwd > "$stage/root"  # compiled-in paths (RUNPATHs, the copy library) start here

mkdir -p .gpu
tar -C "$stage" -cJf .gpu/bundle.tar.xz .
ls -l .gpu/bundle.tar.xz
echo "on the GPU machine, with this tree and .gpu: bash scripts/gpu-check.sh tests|bench"
