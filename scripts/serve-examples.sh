#!/usr/bin/env bash
# The README's first command. On a fresh Debian machine: installs the dependencies, builds Orochi
# and packs the example models (models/) into build/model-repository, then serves them:
#   inference (KServe v2)    http://localhost:8000
#   model repository API     http://127.0.0.1:8003
#   Prometheus metrics       http://localhost:8002/metrics
# Arguments go to `orochi serve` (e.g. --copies 4). The docs test starts the server with this
# script too, with OROCHI_SKIP_SETUP=1 (already built), its build in OROCHI_BUILD_DIR, a copy of
# the repository in OROCHI_MODEL_REPOSITORY and free ports as arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${OROCHI_BUILD_DIR:-build}
repository=${OROCHI_MODEL_REPOSITORY:-$build/model-repository}

if [ "${OROCHI_SKIP_SETUP:-0}" != 1 ]; then
  scripts/install-deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" --parallel "$(nproc)"
fi

models=$(cd "$repository" && for model in */; do [ -d "$model" ] && printf '%s ' "${model%/}"; done)
models=${models% }
cat <<MESSAGE

Serving the example models ($models) from $repository.
When the server logs "serving", try:
  curl localhost:8000/v2/health/ready -w '%{http_code}\n'
  curl -X POST localhost:8003/v2/repository/index
and the rest of the README's quickstart. Ctrl-C stops the server.

MESSAGE
exec "$build/bin/orochi" serve --model-repository "$repository" "$@"
