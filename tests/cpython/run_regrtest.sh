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

# Debian leaves test_sqlite3 out of its testsuite package; scripts/install-deps.sh fetches it from
# the same CPython release's source.
sqlite_tests=${OROCHI_CPYTHON_TESTS:-/opt/orochi/cpython-tests}/3.11.2/test_sqlite3
[ -f "$source_tests/test_json/__init__.py" ] ||
  { echo "run_regrtest: $source_tests is missing: install libpython3.11-testsuite" >&2; exit 1; }
[ -f "$sqlite_tests/__init__.py" ] ||
  { echo "run_regrtest: $sqlite_tests is missing: run scripts/install-deps.sh" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work/tmp" "$work/ctypes-tests/ctypes"
cp -r "$source_tests" "$work/test"
cp -r "$sqlite_tests" "$work/test/test_sqlite3"

# test_ctypes imports ctypes.test, which the embedded stdlib leaves out (it keeps no tests): the
# testsuite's copy joins the ctypes package's path for this run.
cp -r /usr/lib/python3.11/ctypes/test "$work/ctypes-tests/ctypes/test"
sed -i "s|^ctypes_test = import_module('ctypes.test')$|import ctypes; ctypes.__path__.append('$work/ctypes-tests/ctypes')\n&|" \
  "$work/test/test_ctypes.py"
grep -q "^import ctypes; ctypes.__path__.append" "$work/test/test_ctypes.py" ||
  { echo "run_regrtest: test_ctypes.py changed upstream; revisit the ctypes.test path" >&2; exit 1; }

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
