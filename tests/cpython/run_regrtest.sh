#!/usr/bin/env bash
# Runs the CPython regression-test modules in modules.txt inside Orochi interpreter copies.
#
#   run_regrtest.sh ORCHI_BINARY WORK_DIR COPIES
#
# The test package comes from Debian's libpython3.11-testsuite, copied to WORK_DIR so that the
# copies read nothing under /usr/lib/python3*; OROCHI_PYTHON_PATH puts it on sys.path (also for
# child processes started through sys.executable).
set -euo pipefail
orochi=$(realpath "$1") work=$(realpath -m "$2") copies=$3
here=$(cd "$(dirname "$0")" && pwd)
source_tests=/usr/lib/python3.11/test

[ -f "$source_tests/test_json/__init__.py" ] ||
  { echo "run_regrtest: $source_tests is missing: install libpython3.11-testsuite" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work/tmp"
cp -r "$source_tests" "$work/test"

# test_json's __init__ dereferences the _json accelerator unconditionally (line 14), so it cannot
# even be imported without _json; its C-accelerator test classes skip themselves when _json is
# absent. Guard that one line so the pure-Python json tests run.
sed -i 's/^cjson\.JSONDecodeError = cjson\.decoder\.JSONDecodeError = json\.JSONDecodeError$/if cjson is not None: &/' \
  "$work/test/test_json/__init__.py"
grep -q '^if cjson is not None: cjson.JSONDecodeError' "$work/test/test_json/__init__.py" ||
  { echo "run_regrtest: test_json/__init__.py changed upstream; revisit the guard" >&2; exit 1; }

# skips.txt (and, with several copies, skips-concurrent.txt): "pattern  # reason"; every
# entry must give its reason.
skip_files=("$here/skips.txt")
[ "$copies" = 1 ] || skip_files+=("$here/skips-concurrent.txt")
: > "$work/ignore.txt"
for skip_file in "${skip_files[@]}"; do
  while IFS= read -r line; do
    [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
    pattern=${line%%#*}; pattern=${pattern//[[:space:]]/}
    [[ "$line" == *"#"* ]] || { echo "run_regrtest: skip without a reason: $line" >&2; exit 1; }
    echo "$pattern" >> "$work/ignore.txt"
  done < "$skip_file"
done

mapfile -t modules < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/modules.txt" | awk '{print $1}')
echo "run_regrtest: ${#modules[@]} modules, $(wc -l < "$work/ignore.txt") skipped tests, $copies copies"

cd "$work/tmp"
export OROCHI_PYTHON_PATH="$work"
if [ "$copies" = 1 ]; then
  exec "$orochi" python -m test --tempdir "$work/tmp" --ignorefile "$work/ignore.txt" "${modules[@]}"
else
  exec "$orochi" python --copies "$copies" "$here/regrtest_in_copy.py" "$work/tmp" \
    --ignorefile "$work/ignore.txt" "${modules[@]}"
fi
