#!/usr/bin/env bash
# Sets up Orochi on a fresh Debian machine and shows private interpreter copies at work.
# (Until the server exists, the demo runs through `orochi python`.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --parallel "$(nproc)"
orochi=build/bin/orochi

echo
echo "== one private copy, used like python"
"$orochi" python -c 'import sys, json; print(sys.version.split()[0], json.dumps({"sys.path": sys.path}))'

echo
echo "== four copies in one process, each with its own GIL, running pure Python at once"
"$orochi" python --copies 4 -c '
import _orochi, time
start = time.perf_counter()
total = sum((i * i) % 7 for i in range(3_000_000))
print(f"copy {_orochi.copy_id()}: {total} in {time.perf_counter() - start:.2f}s, id(None)={id(None):#x}")'

echo
echo "Try: $orochi python        (an interactive prompt in a private copy)"
