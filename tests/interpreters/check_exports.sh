#!/usr/bin/env bash
# The interpreter library must export exactly one dynamic symbol, the entry point, and define no
# STB_GNU_UNIQUE symbol (which the dynamic linker would bind process-wide, merging the copies).
#   check_exports.sh LIBRARY
set -euo pipefail
library=$1
exported=$(nm -D --defined-only "$library" | awk '{print $3}')
if [ "$exported" != "orochi_copy_entry" ]; then
  echo "FAIL: $library exports:" >&2
  echo "$exported" >&2
  exit 1
fi
echo "ok: the only exported dynamic symbol is orochi_copy_entry"
unique=$(readelf --wide --syms --dyn-syms "$library" | awk '$5 == "UNIQUE"')
if [ -n "$unique" ]; then
  echo "FAIL: $library has STB_GNU_UNIQUE symbols:" >&2
  echo "$unique" >&2
  exit 1
fi
echo "ok: no STB_GNU_UNIQUE symbols in .symtab or .dynsym"
# Also no dynamic symbol *bound* globally from the copy's own definitions: every defined dynamic
# symbol must be the entry point (checked above); undefined ones come from libc, libm, libz,
# libexpat and libstdc++ only, never from a Python library.
if readelf --wide --dynamic "$library" | grep -E 'NEEDED.*python' >/dev/null; then
  echo "FAIL: $library depends on a shared libpython" >&2
  exit 1
fi
echo "ok: no shared libpython dependency"
