#!/usr/bin/env bash
# Installs the pinned validator packages (package-lock.json) into WORK_DIR, out of the source
# tree, and validates docker/kubernetes with them (validate.mjs, with the JSON schemas beside it).
# Usage: run.sh WORK_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: run.sh WORK_DIR}
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here"/*.mjs "$here"/*.schema.json "$work/"
cd "$work"
# Reinstalled only when the lock changed.
if ! cmp -s package-lock.json node_modules/.orochi-lock 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.orochi-lock
fi
export OROCHI_KUBERNETES_DIR="$here/../../docker/kubernetes"
export OROCHI_METRICS_DOC="$here/../../docs/METRICS.md"
node validate.mjs
# Each check catches what it is for: copies broken one way each must fail.
node selftest.mjs
