#!/usr/bin/env bash
# Installs the pinned OpenAI client library (package-lock.json) into WORK_DIR, out of the source
# tree, and runs client.mjs with it against BASE_URL.
# Usage: run.sh WORK_DIR BASE_URL TOKEN
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=${1:?usage: run.sh WORK_DIR BASE_URL TOKEN}
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/client.mjs" "$work/"
cd "$work"
# Reinstalled only when the lock changed.
if ! cmp -s package-lock.json node_modules/.orochi-lock 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json node_modules/.orochi-lock
fi
node client.mjs "$2" "$3"
