#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then what a user of the prefix does: run the installed
# `orochi`, and build and run a C++ program outside the tree that embeds the interpreter copies
# through find_package(Orochi).
#   tests/install/test_install.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for installed in bin/orochi bin/orochi-python lib/liborochi_engine.so \
    lib/liborochi_interpreters.a include/orochi/interpreters/model.h \
    include/orochi/engine/tensor.h share/orochi/orochi.json \
    lib/cmake/Orochi/OrochiConfig.cmake lib/cmake/Orochi/OrochiTargets.cmake; do
  [ -e "$prefix/$installed" ] || { echo "install: $installed is missing" >&2; exit 1; }
done
# The engine's private headers (its kernel registry) stay out of the prefix.
for private in include/orochi/engine/dispatch.h; do
  [ ! -e "$prefix/$private" ] || { echo "install: $private is private but installed" >&2; exit 1; }
done
# The installed command runs from the prefix alone (its engine found through its RPATH).
"$prefix/bin/orochi" --version
"$prefix/bin/orochi-python" -c 'import sys; print("orochi-python", sys.version.split()[0])'
"$prefix/bin/orochi" pack "$here/model" -o "$work/double.orochi" > /dev/null

cmake -S "$here/embed" -B "$work/embed" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/embed" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/embed/embed" "$work/double.orochi" 3
echo "install: the prefix serves a program built outside the tree"
