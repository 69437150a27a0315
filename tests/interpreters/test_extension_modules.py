"""C extension modules in eight interpreter copies at once, through Orochi's ELF loader: numpy
(linear algebra through OpenBLAS, ufuncs, random, FFT) and the stdlib's _json, _decimal,
_ctypes (calling into libc), _sqlite3 (an in-memory database) and _asyncio, each copy checking
its own answers while the others run.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_extension_modules
"""

import decimal
import json
import os
import subprocess
import unittest

BINARY = os.environ.get("OROCHI_BINARY", os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "build", "bin", "orochi"))
DIST_PACKAGES = "/usr/lib/python3/dist-packages"
COPIES = 8

WORKLOAD = r'''
import _orochi, asyncio, ctypes, decimal, json, sqlite3, sys
import numpy as np

copy = _orochi.copy_id()
results = {}

rng = np.random.default_rng(copy)
for _ in range(8):  # long enough for the copies to overlap
    m = rng.standard_normal((120, 120)) + 120 * np.eye(120)
    x = np.linalg.solve(m, np.ones(120))
    assert np.allclose(m @ x, 1.0), "linalg.solve"
    q, r = np.linalg.qr(m)
    assert np.allclose(q @ r, m), "linalg.qr"
results["ufunc"] = float(np.round(np.exp(np.log(np.arange(1.0, 6.0))).sum(), 9))
results["fft"] = [float(v) for v in np.abs(np.fft.fft([1.0, 0.0, 0.0, 0.0]))]
results["random"] = int(np.random.default_rng(42).integers(0, 1000))
results["json_c"] = json.encoder.c_make_encoder is not None and json.scanner.c_make_scanner is not None
results["json"] = json.loads(json.dumps({"copy": copy, "x": [1.5, None]}))["copy"] == copy
decimal.getcontext().prec = 10 + copy  # module state is per copy
results["decimal"] = str(decimal.Decimal(1) / decimal.Decimal(7))
results["decimal_c"] = type(decimal.Decimal(1)).__module__ == "decimal" and "_pydecimal" not in sys.modules
libc = ctypes.CDLL("libc.so.6")
results["ctypes"] = libc.strlen(b"copy %d" % copy)
db = sqlite3.connect(":memory:")
db.execute("create table t (copy integer, n integer)")
db.executemany("insert into t values (?, ?)", [(copy, n) for n in range(100)])
results["sqlite"] = db.execute("select sum(n), min(copy), max(copy) from t").fetchone()

async def gather():
    async def one(n):
        await asyncio.sleep(0.001)
        return n * copy
    return sum(await asyncio.gather(*(one(n) for n in range(10))))
results["asyncio"] = asyncio.run(gather())
results["asyncio_c"] = asyncio.Future.__module__ == "_asyncio"
print(f"copy {copy}: {json.dumps(results, sort_keys=True)}")
'''


class ExtensionModulesInEightCopies(unittest.TestCase):
    def test_each_copy_runs_numpy_and_the_c_modules_with_correct_answers(self):
        result = subprocess.run(
            [BINARY, "python", "--copies", str(COPIES), "--path", DIST_PACKAGES, "-c", WORKLOAD],
            capture_output=True, text=True, timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = sorted(result.stdout.splitlines())
        self.assertEqual(len(lines), COPIES, result.stdout)
        for copy, line in enumerate(sorted(lines, key=lambda l: int(l.split()[1].rstrip(":")))):
            prefix, _, payload = line.partition(": ")
            self.assertEqual(prefix, f"copy {copy}")
            results = json.loads(payload)
            self.assertEqual(results["ufunc"], 15.0)
            self.assertEqual(results["fft"], [1.0, 1.0, 1.0, 1.0])
            self.assertEqual(results["random"], 89)  # numpy's PCG64 with seed 42
            self.assertTrue(results["json_c"] and results["json"])
            self.assertEqual(results["decimal"],
                             str(decimal.Context(prec=10 + copy).divide(1, 7)))
            self.assertTrue(results["decimal_c"])
            self.assertEqual(results["ctypes"], len(f"copy {copy}"))
            self.assertEqual(results["sqlite"], [4950, copy, copy])
            self.assertEqual(results["asyncio"], 45 * copy)
            self.assertTrue(results["asyncio_c"])

    def test_numpy_arrays_and_tensors_share_memory(self):
        code = (
            "import numpy as np, orochi\n"
            "t = orochi.arange(6.0).reshape(2, 3)\n"
            "a = np.asarray(t)\n"
            "assert a.ctypes.data == t.data_ptr() and a.shape == (2, 3) and a.dtype == np.float32\n"
            "n = np.arange(4, dtype=np.float32)\n"
            "u = orochi.as_tensor(n)\n"
            "assert u.data_ptr() == n.ctypes.data\n"
            "n[0] = 7\n"
            "assert u.tolist() == [7.0, 1.0, 2.0, 3.0]\n"
            "assert orochi.tensor(n).data_ptr() != n.ctypes.data  # tensor() copies, as torch's\n"
            "print('shared')\n")
        result = subprocess.run([BINARY, "python", "--path", DIST_PACKAGES, "-c", code],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual((result.returncode, result.stdout), (0, "shared\n"), result.stderr)

    def test_numpy_is_not_on_the_path_unless_configured(self):
        result = subprocess.run([BINARY, "python", "-c", "import numpy"], capture_output=True,
                                text=True, timeout=120)
        self.assertEqual(result.returncode, 1)
        self.assertIn("ModuleNotFoundError: No module named 'numpy'", result.stderr)


if __name__ == "__main__":
    unittest.main()
