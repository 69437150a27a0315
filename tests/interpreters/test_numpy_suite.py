"""numpy's own test suite, run with pytest inside an interpreter copy.

Debian's numpy, pytest and hypothesis are all C-extension-backed or import C extensions, and each
comes into the copy through Orochi's ELF loader. A skip passes only when its reason is one this
file records and explains; a new skip, a failure or an error fails the test.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_numpy_suite
"""

import os
import re
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree

BINARY = os.environ.get("OROCHI_BINARY", os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "build", "bin", "orochi"))
DIST_PACKAGES = "/usr/lib/python3/dist-packages"

# Core ufuncs, array creation and coercion, indexing, linear algebra and random.
MODULES = [
    "numpy.core.tests.test_ufunc",
    "numpy.core.tests.test_umath",
    "numpy.core.tests.test_multiarray",
    "numpy.core.tests.test_numeric",
    "numpy.core.tests.test_array_coercion",
    "numpy.core.tests.test_indexing",
    "numpy.linalg.tests.test_linalg",
    "numpy.random.tests.test_generator_mt19937",
    "numpy.random.tests.test_random",
]

# Every skip numpy's suite makes here, with why it is expected (a pattern on pytest's reason).
EXPECTED_SKIPS = {
    # numpy's generic-signature tests only apply to ufuncs without a fixed signature.
    r"^For generic signatures only$": "numpy's own parametrisation, skipped everywhere",
    # pickle protocol 5 is available on 3.8+, so the test of the error without it is moot.
    r"this tests the error messages when trying toprotocol 5": "CPython 3.11 has protocol 5",
    # The test machines have no fr_FR locale installed (Debian's `locales` is not configured).
    r"^No French locale available$": "no fr_FR locale on the machine",
    # Debian builds numpy against the system BLAS/LAPACK, without numpy's own xerbla.
    r"^Numpy xerbla not linked in\.$": "Debian's numpy uses the system LAPACK",
    # numpy skips its 64-bit-index memory test unless asked, because of CI memory limits.
    r"^Bad memory reports lead to OOM in ci testing$": "numpy skips it outside its own CI",
}


def run_suite(work_dir):
    report = os.path.join(work_dir, "numpy-suite.xml")
    # Subprocesses that numpy's tests start (sys.executable is orochi-python) find numpy too.
    env = dict(os.environ, OROCHI_PYTHON_PATH=DIST_PACKAGES)
    command = [BINARY, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", "--pyargs", *MODULES]
    result = subprocess.run(command, cwd=work_dir, env=env, capture_output=True, text=True,
                            timeout=1500)
    return result, report


class NumpySuiteInACopy(unittest.TestCase):
    def test_numpy_tests_pass_and_every_skip_is_expected(self):
        with tempfile.TemporaryDirectory() as work_dir:
            result, report = run_suite(work_dir)
            summary = result.stdout.strip().splitlines()[-1:] or ["(no output)"]
            print("pytest:", summary[0])
            self.assertTrue(os.path.exists(report),
                            f"pytest wrote no report\n{result.stdout[-4000:]}{result.stderr}")
            suites = ElementTree.parse(report).getroot()

        failures, skips, passed = [], {}, 0
        for case in suites.iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            failed = case.find("failure")
            if failed is None:
                failed = case.find("error")
            skipped = case.find("skipped")
            if failed is not None:
                failures.append(f"{name}: {failed.get('message', '')[:300]}")
            elif skipped is not None and skipped.get("type") != "pytest.xfail":
                skips.setdefault(skipped.get("message", ""), []).append(name)
            elif skipped is None:
                passed += 1
        self.assertEqual(failures, [], "numpy tests failed inside the copy")
        self.assertEqual(result.returncode, 0, result.stdout[-4000:] + result.stderr)

        for reason, cases in sorted(skips.items()):
            print(f"skipped ({len(cases)}): {reason}")
            self.assertTrue(any(re.search(pattern, reason) for pattern in EXPECTED_SKIPS),
                            f"unexpected skip {reason!r} in {cases[:3]}")
        # The suite is large; a collection problem would show up as far fewer tests.
        self.assertGreater(passed, 8000)


if __name__ == "__main__":
    unittest.main()
