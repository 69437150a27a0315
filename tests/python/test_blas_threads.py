"""The engine's OpenBLAS starts no threads of its own: every GEMM runs on the calling thread or
the engine's intra-op pool, so no idle BLAS worker spins beside a copy after its first product.
Its own module, so that it runs in a copy where nothing has loaded OpenBLAS yet."""

import os
import unittest

import orochi


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def openblas_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return "libopenblas" in maps.read()


class BlasThreadsTest(unittest.TestCase):
    def test_the_first_gemm_starts_no_thread(self):
        self.assertFalse(openblas_loaded(), "something loaded OpenBLAS before this test")
        before = threads()
        # 64 x 64 x 64: past the engine's own small-product loops, one grain of the intra-op
        # pool (so no pool helper starts either): a single-threaded OpenBLAS call.
        a = orochi.ones(64, 64)
        product = a @ a
        self.assertEqual(product[0, 0].item(), 64.0)
        self.assertTrue(openblas_loaded())
        self.assertEqual(threads(), before)


if __name__ == "__main__":
    unittest.main()
