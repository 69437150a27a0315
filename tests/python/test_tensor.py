"""orochi.Tensor and the tensor functions, run inside an interpreter copy.

    build/bin/orochi python -m unittest -v test_tensor     (from tests/python)

Expected values are written out by hand (they are PyTorch's answers for the same calls).
"""

import hashlib
import math
import os
import tempfile
import unittest

import orochi


def t(data, dtype=None):
    return orochi.tensor(data, dtype=dtype)


class Case(unittest.TestCase):
    def assertTensor(self, actual, expected, dtype=None, places=5):
        self.assertIsInstance(actual, orochi.Tensor)
        if dtype is not None:
            self.assertIs(actual.dtype, dtype)
        got = actual.tolist()
        self._close(got, expected, places)

    def _close(self, got, expected, places):
        if isinstance(expected, list):
            self.assertIsInstance(got, list)
            self.assertEqual(len(got), len(expected))
            for g, e in zip(got, expected):
                self._close(g, e, places)
        elif isinstance(expected, float) and math.isnan(expected):
            self.assertTrue(math.isnan(got))
        elif isinstance(expected, float):
            self.assertAlmostEqual(got, expected, places=places)
        else:
            self.assertEqual(got, expected)


class CreationTest(Case):
    def test_tensor_from_nested_lists_infers_dtype(self):
        self.assertTensor(t([[1, 2], [3, 4]]), [[1, 2], [3, 4]], orochi.int64)
        self.assertTensor(t([1, 2.5]), [1.0, 2.5], orochi.float32)
        self.assertTensor(t([True, False]), [True, False], orochi.bool)
        self.assertTensor(t(3.5), 3.5, orochi.float32)
        self.assertEqual(t(3.5).shape, ())
        self.assertEqual(t([[]]).shape, (1, 0))

    def test_tensor_with_dtype_converts(self):
        self.assertTensor(t([1.7, -1.7], dtype=orochi.int32), [1, -1], orochi.int32)
        self.assertTensor(t([1, 0, 2], dtype=orochi.bool), [True, False, True], orochi.bool)
        self.assertTensor(t([0.1], dtype=orochi.float64), [0.1], orochi.float64, places=15)
        self.assertTensor(t([1.5], dtype="float16"), [1.5], orochi.float16)
        self.assertTensor(t([1.5], dtype=orochi.bfloat16).float(), [1.5])

    def test_tensor_of_tensors_and_ragged_lists(self):
        self.assertTensor(t([t(1.0), t(2.0)]), [1.0, 2.0])
        self.assertTensor(t([t([1, 2]), t([3, 4])]), [[1, 2], [3, 4]])
        with self.assertRaisesRegex(ValueError, "expected a sequence of length 2 at dim 1, got 1"):
            t([[1, 2], [3]])
        with self.assertRaisesRegex(ValueError, "ragged"):
            t([[1, 2], 3])
        with self.assertRaisesRegex(TypeError, "expected numbers.*got str"):
            t(["a"])
        with self.assertRaisesRegex(RuntimeError, "does not fit in 64 bits"):
            t([2**70])

    def test_tensor_from_bytes_reinterprets_and_copies(self):
        data = bytes(memoryview(t([1.0, -2.0])))
        self.assertTensor(t(data, dtype=orochi.float32), [1.0, -2.0])
        self.assertTensor(t(b"\x01\x02"), [1, 2], orochi.uint8)
        with self.assertRaisesRegex(ValueError, "3 bytes are not a whole number of float32"):
            t(b"abc", dtype=orochi.float32)

    def test_tensor_from_a_buffer_copies(self):
        source = bytearray(b"\x01\x02\x03")
        copied = t(memoryview(source))
        source[0] = 9
        self.assertEqual(copied.tolist(), [1, 2, 3])

    def test_factories(self):
        self.assertTensor(orochi.zeros(2, 3), [[0.0] * 3] * 2, orochi.float32)
        self.assertTensor(orochi.zeros((2,), dtype=orochi.int8), [0, 0], orochi.int8)
        self.assertTensor(orochi.ones([2]), [1.0, 1.0])
        self.assertEqual(orochi.empty(4, 5).shape, (4, 5))
        self.assertTensor(orochi.full((2,), 7), [7, 7], orochi.int64)
        self.assertTensor(orochi.full((2,), 0.5), [0.5, 0.5], orochi.float32)
        self.assertTensor(orochi.full((1,), True), [True], orochi.bool)
        like = t([[1, 2]], dtype=orochi.int32)
        self.assertTensor(orochi.zeros_like(like), [[0, 0]], orochi.int32)
        self.assertTensor(orochi.ones_like(like, dtype=orochi.float32), [[1.0, 1.0]])
        self.assertTensor(orochi.full_like(like, 3), [[3, 3]], orochi.int32)
        self.assertEqual(orochi.empty_like(like).shape, (1, 2))
        self.assertTensor(orochi.arange(4), [0, 1, 2, 3], orochi.int64)
        self.assertTensor(orochi.arange(1, 2, 0.25), [1.0, 1.25, 1.5, 1.75], orochi.float32)
        self.assertTensor(orochi.arange(5, 0, -2), [5, 3, 1])
        self.assertTensor(orochi.eye(2, 3), [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
        self.assertTensor(orochi.linspace(0, 1, 5), [0.0, 0.25, 0.5, 0.75, 1.0])

    def test_random_tensors_are_seeded(self):
        a = orochi.rand(3, 4, seed=7)
        self.assertEqual(a.tolist(), orochi.rand(3, 4, seed=7).tolist())
        self.assertNotEqual(a.tolist(), orochi.rand(3, 4, seed=8).tolist())
        self.assertTrue(bool(((a >= 0) & (a < 1)).all()))
        orochi.manual_seed(3)
        first = orochi.randn(5).tolist()
        orochi.manual_seed(3)
        self.assertEqual(orochi.randn(5).tolist(), first)
        self.assertIs(orochi.randn(2, dtype=orochi.float64).dtype, orochi.float64)

    def test_bad_sizes_and_devices(self):
        with self.assertRaisesRegex(TypeError, "expected a sequence of ints as the size, got float"):
            orochi.zeros(2.5)
        absent = f"cuda:{orochi.cuda.device_count()}"  # one past the last GPU, if any
        with self.assertRaisesRegex(ValueError, f"'{absent}' is not available"):
            orochi.zeros(2, device=absent)
        with self.assertRaisesRegex(ValueError, "unknown device 'tpu'"):
            orochi.zeros(2, device="tpu")
        with self.assertRaisesRegex(TypeError, "unknown dtype 'complex64'"):
            orochi.zeros(2, dtype="complex64")


class PropertiesTest(Case):
    def test_shape_dtype_device(self):
        x = orochi.zeros(2, 3, 4)
        self.assertEqual(x.shape, (2, 3, 4))
        self.assertEqual(repr(x.shape), "orochi.Size([2, 3, 4])")
        self.assertEqual(x.size(), (2, 3, 4))
        self.assertEqual(x.size(-1), 4)
        self.assertEqual(x.shape.numel(), 24)
        self.assertEqual((x.dim(), x.ndim, x.numel(), len(x)), (3, 3, 24, 2))
        self.assertEqual(x.stride(), (12, 4, 1))
        self.assertEqual(x.stride(1), 4)
        self.assertIs(x.dtype, orochi.float32)
        self.assertEqual(x.element_size(), 4)
        self.assertEqual(str(x.device), "cpu")
        self.assertEqual(repr(x.device), "device(type='cpu')")
        self.assertEqual(x.device, orochi.device("cpu"))
        self.assertEqual(x.device.type, "cpu")
        self.assertFalse(x.is_cuda)
        self.assertFalse(x.is_read_only)
        self.assertTrue(x.is_contiguous())
        self.assertFalse(x.transpose(0, 1).is_contiguous())
        self.assertTrue(x.is_floating_point())
        self.assertFalse(x.requires_grad)
        self.assertIsNone(x.grad)

    def test_dtype_objects(self):
        self.assertEqual(repr(orochi.float32), "orochi.float32")
        self.assertIs(orochi.float, orochi.float32)
        self.assertIs(orochi.long, orochi.int64)
        self.assertIs(orochi.half, orochi.float16)
        self.assertEqual(orochi.float64.itemsize, 8)
        self.assertTrue(orochi.bfloat16.is_floating_point)
        self.assertFalse(orochi.int8.is_floating_point)
        self.assertEqual(orochi.finfo(orochi.float32).eps, 2.0**-23)
        self.assertEqual(orochi.iinfo(orochi.int8).max, 127)
        self.assertIs(orochi.promote_types(orochi.int32, orochi.float16), orochi.float16)
        self.assertIs(orochi.result_type(t([1]), 1.0), orochi.float32)

    def test_item_tolist_and_conversions(self):
        self.assertEqual(t([[1, 2]]).tolist(), [[1, 2]])
        self.assertEqual(t(2**62).item(), 2**62)
        self.assertEqual(t([True]).item(), True)
        self.assertEqual(float(t([2.5])), 2.5)
        self.assertEqual(int(t(7)), 7)
        self.assertEqual([10, 20, 30][t(1)], 20)
        self.assertTrue(bool(t(1)))
        with self.assertRaisesRegex(RuntimeError, "ambiguous"):
            bool(t([1, 2]))
        with self.assertRaisesRegex(ValueError, "2 elements cannot be converted"):
            t([1, 2]).item()
        with self.assertRaisesRegex(TypeError, "len\\(\\) of a 0-d tensor"):
            len(t(1))

    def test_to_and_dtype_shortcuts(self):
        x = t([1.5, -2.5])
        self.assertIs(x.to(orochi.int32).dtype, orochi.int32)
        self.assertEqual(x.to("cpu").data_ptr(), x.data_ptr())
        self.assertIs(x.to("cpu", orochi.float64).dtype, orochi.float64)
        self.assertIs(x.to(dtype=orochi.float16).dtype, orochi.float16)
        self.assertIs(x.to(t([1])).dtype, orochi.int64)
        self.assertNotEqual(x.to(orochi.float32, copy=True).data_ptr(), x.data_ptr())
        self.assertEqual(x.to(orochi.float32).data_ptr(), x.data_ptr())
        for name, dtype in [("double", orochi.float64), ("half", orochi.float16),
                            ("bfloat16", orochi.bfloat16), ("long", orochi.int64),
                            ("int", orochi.int32), ("short", orochi.int16), ("char", orochi.int8),
                            ("byte", orochi.uint8), ("bool", orochi.bool), ("float", orochi.float32)]:
            self.assertIs(getattr(x, name)().dtype, dtype)
        self.assertEqual(x.int().tolist(), [1, -2])
        self.assertIs(x.type_as(t([1])).dtype, orochi.int64)
        self.assertEqual(x.cpu().tolist(), [1.5, -2.5])
        absent = orochi.cuda.device_count()  # one past the last GPU, if any
        with self.assertRaisesRegex(ValueError, f"'cuda:{absent}' is not available"):
            x.to(f"cuda:{absent}")
        with self.assertRaisesRegex(ValueError, f"'cuda:{absent}' is not available"):
            x.cuda(absent)

    def test_repr_matches_pytorch(self):
        self.assertEqual(repr(t([1.0, 2.0])), "tensor([1., 2.])")
        self.assertEqual(repr(t([1.5, 2.25])), "tensor([1.5000, 2.2500])")
        self.assertEqual(repr(t([[1, 2], [3, 4]])), "tensor([[1, 2],\n        [3, 4]])")
        self.assertEqual(repr(t([1, 2], dtype=orochi.int32)), "tensor([1, 2], dtype=orochi.int32)")
        self.assertEqual(repr(t([True])), "tensor([True])")
        self.assertEqual(repr(t(3.0)), "tensor(3.)")
        self.assertEqual(repr(t([1e-5, 1.0])), "tensor([1.0000e-05, 1.0000e+00])")
        self.assertEqual(repr(t([float("nan"), 1.0])), "tensor([nan, 1.])")
        self.assertEqual(repr(orochi.zeros(0)), "tensor([])")
        self.assertEqual(repr(orochi.zeros(0, 2)), "tensor([], size=(0, 2))")
        self.assertIn("...", repr(orochi.zeros(2000)))
        self.assertEqual(str(t([1.0])), "tensor([1.])")
        self.assertEqual(f"{t(2.5):.1f}", "2.5")


class ViewsTest(Case):
    def test_views_share_storage(self):
        x = orochi.arange(6)
        for view in (x.view(2, 3), x.reshape((3, 2)), x.view(-1, 2), x[1:], x.unsqueeze(0),
                     x.view(2, 3).t(), x.view(2, 3).permute(1, 0), x.expand(2, 6),
                     x.narrow(0, 1, 2), x.view(1, 6).squeeze(0), x.view(2, 3).select(1, 0)):
            view_base = view.data_ptr() - view.storage_offset() * 8
            self.assertEqual(view_base, x.data_ptr())

    def test_shape_functions(self):
        x = orochi.arange(24).reshape(2, 3, 4)
        self.assertEqual(x.permute(2, 0, 1).shape, (4, 2, 3))
        self.assertEqual(x.permute((2, 0, 1)).shape, (4, 2, 3))
        self.assertEqual(x.transpose(0, 2).shape, (4, 3, 2))
        self.assertEqual(orochi.transpose(x, 0, 1).shape, (3, 2, 4))
        self.assertEqual(x.swapaxes(0, 1).shape, (3, 2, 4))
        self.assertEqual(x.T.shape, (4, 3, 2))
        self.assertEqual(x.mT.shape, (2, 4, 3))
        self.assertEqual(x.flatten().shape, (24,))
        self.assertEqual(x.flatten(1).shape, (2, 12))
        self.assertEqual(orochi.flatten(x, 0, 1).shape, (6, 4))
        self.assertEqual(x.unsqueeze(-1).shape, (2, 3, 4, 1))
        self.assertEqual(orochi.zeros(1, 3, 1).squeeze().shape, (3,))
        self.assertEqual(orochi.zeros(1, 3, 1).squeeze(0).shape, (3, 1))
        self.assertEqual(orochi.zeros(3, 1).expand(-1, 4).shape, (3, 4))
        self.assertEqual(orochi.zeros(3, 1).expand_as(orochi.zeros(3, 2)).shape, (3, 2))
        self.assertEqual(x.view_as(orochi.zeros(6, 4)).shape, (6, 4))
        self.assertEqual(x.reshape_as(orochi.zeros(4, 6)).shape, (4, 6))
        self.assertEqual(orochi.reshape(x, (4, -1)).shape, (4, 6))
        self.assertEqual(x.transpose(0, 1).reshape(-1).tolist()[:4], [0, 1, 2, 3])
        self.assertTrue(x.transpose(0, 1).contiguous().is_contiguous())
        self.assertEqual(x.clone().tolist(), x.tolist())
        self.assertNotEqual(x.clone().data_ptr(), x.data_ptr())
        self.assertEqual(x.detach().data_ptr(), x.data_ptr())

    def test_shape_errors(self):
        x = orochi.arange(6)
        with self.assertRaisesRegex(RuntimeError, "6"):
            x.view(4, 2)
        with self.assertRaisesRegex(RuntimeError, "view"):
            x.view(2, 3).t().view(6)
        with self.assertRaisesRegex(IndexError, "dim"):
            x.unsqueeze(5)
        with self.assertRaisesRegex(RuntimeError, "permute"):
            x.view(2, 3).permute(0, 0)
        with self.assertRaisesRegex(RuntimeError, "t\\(\\) expects a tensor with <= 2 dims"):
            orochi.zeros(1, 2, 3).t()

    def test_split_chunk_cat_stack(self):
        x = orochi.arange(10)
        self.assertEqual([p.tolist() for p in x.split(4)], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
        self.assertEqual([p.shape for p in orochi.chunk(x.view(2, 5), 2, dim=1)], [(2, 3), (2, 2)])
        self.assertTensor(orochi.cat([t([1]), t([2, 3])]), [1, 2, 3])
        self.assertTensor(orochi.concat([t([[1]]), t([[2]])], dim=1), [[1, 2]])
        self.assertTensor(orochi.cat([t([1]), t([0.5])]), [1.0, 0.5], orochi.float32)
        self.assertTensor(orochi.stack([t([1, 2]), t([3, 4])], dim=1), [[1, 3], [2, 4]])
        with self.assertRaisesRegex(RuntimeError, "cat"):
            orochi.cat([orochi.zeros(2, 2), orochi.zeros(3, 3)])
        with self.assertRaisesRegex(TypeError, ""):
            orochi.cat([t([1]), 2])


class IndexingTest(Case):
    def setUp(self):
        self.x = orochi.arange(12).reshape(3, 4)

    def test_basic_indices(self):
        x = self.x
        self.assertTensor(x[1], [4, 5, 6, 7])
        self.assertTensor(x[-1, -1], 11)
        self.assertTensor(x[:, 1], [1, 5, 9])
        self.assertTensor(x[0, ::2], [0, 2])
        self.assertTensor(x[1:, 1:3], [[5, 6], [9, 10]])
        self.assertTensor(x[::2, ::3], [[0, 3], [8, 11]])
        self.assertTensor(x[..., 0], [0, 4, 8])
        self.assertTensor(x[0, ...], [0, 1, 2, 3])
        self.assertEqual(x[None].shape, (1, 3, 4))
        self.assertEqual(x[:, None, 1].shape, (3, 1))
        self.assertEqual(x[..., None].shape, (3, 4, 1))
        self.assertEqual(x[5:].shape, (0, 4))
        self.assertTensor(x[-2:][:, -1], [7, 11])
        self.assertTensor(x[t(2)], [8, 9, 10, 11])

    def test_advanced_indices(self):
        x = self.x
        self.assertTensor(x[t([2, 0])], [[8, 9, 10, 11], [0, 1, 2, 3]])
        self.assertTensor(x[[0, -1]], [[0, 1, 2, 3], [8, 9, 10, 11]])
        self.assertTensor(x[:, t([[0], [3]])], [[[0], [3]], [[4], [7]], [[8], [11]]])
        self.assertTensor(x[t([0, 2]), t([1, 3])], [1, 11])
        self.assertTensor(x[t([0, 2]), 1:3], [[1, 2], [9, 10]])
        self.assertTensor(x[x > 8], [9, 10, 11])
        self.assertTensor(x[t([True, False, True])], [[0, 1, 2, 3], [8, 9, 10, 11]])
        self.assertTensor(x[:, t([False, True, False, True])], [[1, 3], [5, 7], [9, 11]])

    def test_index_errors(self):
        x = self.x
        with self.assertRaisesRegex(IndexError, "index 3 is out of bounds for dimension 0 with size 3"):
            x[3]
        with self.assertRaisesRegex(IndexError, "index 9 is out of bounds for dimension 0"):
            x[t([0, 9])]
        with self.assertRaisesRegex(IndexError, "too many indices for tensor of dimension 2"):
            x[0, 0, 0]
        with self.assertRaisesRegex(IndexError, "single ellipsis"):
            x[..., ...]
        with self.assertRaisesRegex(ValueError, "step must be greater than zero"):
            x[::-1]
        with self.assertRaisesRegex(IndexError, "must be integer or bool tensors, not float32"):
            x[t([0.0])]
        with self.assertRaisesRegex(TypeError, "valid indices, got str"):
            x["a"]
        with self.assertRaisesRegex(IndexError, "shape of the mask"):
            x[t([True, False])]

    def test_assignment(self):
        x = orochi.zeros(3, 4)
        x[0] = 1
        x[1, 1:3] = t([2.0, 3.0])
        x[:, -1] = 9
        x[2, ::2] = t([[4.0, 5.0]])[0]
        self.assertTensor(x, [[1, 1, 1, 9], [0, 2, 3, 9], [4, 0, 5, 9]])
        x[x > 4] = -1
        self.assertTensor(x, [[1, 1, 1, -1], [0, 2, 3, -1], [4, 0, -1, -1]])
        x[t([0, 2])] = t([7.0, 7.0, 7.0, 7.0])
        self.assertTensor(x[0], [7, 7, 7, 7])
        self.assertTensor(x[2], [7, 7, 7, 7])
        x[..., 0] = t([1.0, 2.0, 3.0])
        self.assertTensor(x[:, 0], [1, 2, 3])
        view = x[1]
        view[:] = 0  # writes through the view into x
        self.assertTensor(x[1], [0, 0, 0, 0])
        with self.assertRaisesRegex(RuntimeError, "cannot expand \\[2\\] to \\[4\\]"):
            x[0] = t([1.0, 2.0])


class OperatorsTest(Case):
    def test_arithmetic_and_broadcasting(self):
        a = t([[1.0, 2.0], [3.0, 4.0]])
        b = t([10.0, 20.0])
        self.assertTensor(a + b, [[11, 22], [13, 24]])
        self.assertTensor(a - b, [[-9, -18], [-7, -16]])
        self.assertTensor(a * b, [[10, 40], [30, 80]])
        self.assertTensor(a / b, [[0.1, 0.1], [0.3, 0.2]])
        self.assertTensor(a**2, [[1, 4], [9, 16]])
        self.assertTensor(2**a, [[2, 4], [8, 16]])
        self.assertTensor(-a, [[-1, -2], [-3, -4]])
        self.assertTensor(+a, [[1, 2], [3, 4]])
        self.assertTensor(abs(-a), [[1, 2], [3, 4]])
        self.assertTensor(1 - a, [[0, -1], [-2, -3]])
        self.assertTensor(3 / b, [0.3, 0.15])
        self.assertTensor(b // 3, [3, 6])
        self.assertTensor(a @ a, [[7, 10], [15, 22]])
        self.assertTensor(a @ b, [50, 110])
        self.assertTensor(orochi.matmul(b, a), [70, 100])
        self.assertTensor(a.add(1), [[2, 3], [4, 5]])
        self.assertTensor(orochi.sub(a, b), [[-9, -18], [-7, -16]])
        self.assertTensor(a.mul(b).div(b), [[1, 2], [3, 4]])
        self.assertTensor(orochi.true_divide(a, 2), [[0.5, 1], [1.5, 2]])
        self.assertTensor(a.pow(0.5), [[1, 2**0.5], [3**0.5, 2]])
        self.assertTensor(orochi.maximum(a, t(2.5)), [[2.5, 2.5], [3, 4]])
        self.assertTensor(a.minimum(t(2.5)), [[1, 2], [2.5, 2.5]])

    def test_promotion_follows_pytorch(self):
        ints = t([1, 2])
        self.assertIs((ints + 1).dtype, orochi.int64)
        self.assertIs((ints + 1.5).dtype, orochi.float32)
        self.assertIs((ints / 2).dtype, orochi.float32)
        self.assertTensor(ints / 2, [0.5, 1.0])
        self.assertIs((t([1], dtype=orochi.int32) + 1).dtype, orochi.int32)
        self.assertIs((t([1.0], dtype=orochi.float16) + 1.5).dtype, orochi.float16)
        self.assertIs((t([1.0], dtype=orochi.float64) + t([1.0])).dtype, orochi.float64)
        self.assertIs((t([True]) + 1).dtype, orochi.int64)
        self.assertIs((t([1.0]) + t(1.0, dtype=orochi.float64)).dtype, orochi.float32)
        self.assertTensor(t([0.0], dtype=orochi.float64) + 0.1, [0.1], places=15)

    def test_comparisons_and_logic(self):
        a = t([1, 2, 3])
        self.assertTensor(a == 2, [False, True, False], orochi.bool)
        self.assertTensor(a != 2, [True, False, True])
        self.assertTensor(a < 2, [True, False, False])
        self.assertTensor(a <= 2, [True, True, False])
        self.assertTensor(a > t([0, 5, 1]), [True, False, True])
        self.assertTensor(a >= 2.5, [False, False, True])
        self.assertTensor(orochi.eq(a, a), [True, True, True])
        m = a > 1
        n = a < 3
        self.assertTensor(m & n, [False, True, False])
        self.assertTensor(m | n, [True, True, True])
        self.assertTensor(m ^ n, [True, False, True])
        self.assertTensor(~m, [True, False, False])
        self.assertTensor(orochi.logical_not(m), [True, False, False])
        self.assertTensor(m.logical_and(n), [False, True, False])
        with self.assertRaisesRegex(TypeError, "only defined for bool"):
            ~a

    def test_unary_functions(self):
        x = t([0.5, 1.0, 2.0])
        cases = {
            "exp": math.exp, "log": math.log, "sqrt": math.sqrt,
            "rsqrt": lambda v: 1 / math.sqrt(v), "sin": math.sin, "cos": math.cos,
            "tanh": math.tanh, "sigmoid": lambda v: 1 / (1 + math.exp(-v)), "erf": math.erf,
            "abs": abs, "neg": lambda v: -v, "relu": lambda v: max(v, 0.0),
            "floor": math.floor, "ceil": math.ceil,
        }
        for name, reference in cases.items():
            with self.subTest(name):
                expected = [float(reference(v)) for v in x.tolist()]
                self.assertTensor(getattr(x, name)(), expected)
                self.assertTensor(getattr(orochi, name)(x), expected)
        self.assertTensor(t([0.4, 1.5, 2.5, -0.5]).round(), [0.0, 2.0, 2.0, -0.0])
        self.assertTensor(orochi.silu(t([1.0])), [1 / (1 + math.exp(-1))])
        self.assertTensor(orochi.gelu(t([1.0])), [0.8413447])
        self.assertTensor(orochi.gelu(t([1.0]), "tanh"), [0.8411920])
        self.assertIs(t([1, 4]).sqrt().dtype, orochi.float32)
        self.assertIs(t([-1, 4]).abs().dtype, orochi.int64)

    def test_in_place_ops_write_into_the_tensor(self):
        x = t([1.0, 2.0])
        pointer = x.data_ptr()
        x += 1
        x *= t([2.0, 3.0])
        x -= 1
        x /= 2
        self.assertTensor(x, [1.5, 4.0])
        self.assertEqual(x.data_ptr(), pointer)
        x.add_(1).mul_(2)
        self.assertTensor(x, [5.0, 10.0])
        x.clamp_(max=6)
        x.exp_()
        self.assertTensor(x.log_(), [5.0, 6.0])
        x.fill_(3)
        self.assertTensor(x, [3.0, 3.0])
        x.zero_()
        self.assertTensor(x, [0.0, 0.0])
        x.copy_(t([1, 2]))
        self.assertTensor(x, [1.0, 2.0])
        x.masked_fill_(x > 1, -1)
        self.assertTensor(x, [1.0, -1.0])
        with self.assertRaisesRegex(RuntimeError, "broadcast"):
            x += orochi.ones(3)

    def test_operand_errors(self):
        x = t([1.0])
        with self.assertRaisesRegex(TypeError, "unsupported operand"):
            x + "a"
        with self.assertRaisesRegex(TypeError, "unsupported operand"):
            x.add(None)
        with self.assertRaisesRegex(RuntimeError, "cannot be broadcast"):
            orochi.ones(2) + orochi.ones(3)
        with self.assertRaisesRegex(RuntimeError, "matmul"):
            orochi.ones(2, 3) @ orochi.ones(2, 3)
        with self.assertRaisesRegex(TypeError, ""):
            orochi.ones(2) @ 2

    def test_tensor_is_hashable_by_identity(self):
        x = t([1])
        self.assertEqual({x: 1}[x], 1)
        self.assertIn(x, {x})


class ReductionsTest(Case):
    def test_reductions(self):
        x = t([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
        self.assertTensor(x.sum(), 21.0)
        self.assertTensor(orochi.sum(x, dim=0), [5, 7, 9])
        self.assertTensor(x.sum(1, keepdim=True), [[9], [12]])
        self.assertTensor(x.sum(dim=(0, 1)), 21.0)
        self.assertTensor(x.mean(-1), [3, 4])
        self.assertTensor(x.prod(0), [4, 10, 18])
        self.assertTensor(x.amax(1), [5, 6])
        self.assertTensor(x.amin(), 1)
        self.assertTensor(x.max(), 6)
        self.assertTensor(x.min(), 1)
        values, indices = x.max(dim=1)
        self.assertTensor(values, [5, 6])
        self.assertTensor(indices, [1, 2], orochi.int64)
        result = orochi.min(x, 0, keepdim=True)
        self.assertTensor(result.values, [[1, 2, 3]])
        self.assertTensor(result.indices, [[0, 1, 0]])
        self.assertTensor(x.max(t(4.0)), [[4, 5, 4], [4, 4, 6]])
        self.assertTensor(x.argmax(), 5)
        self.assertTensor(x.argmin(dim=1), [0, 1])
        self.assertTensor(x.argmax(1, keepdim=True), [[1], [2]])
        self.assertTensor(x.var(), 3.5)
        self.assertTensor(x.var(1, unbiased=False), [8 / 3, 8 / 3])
        self.assertTensor(x.std(dim=1, correction=0), [math.sqrt(8 / 3)] * 2)
        self.assertTensor((x > 4).any(), True)
        self.assertTensor((x > 0).all(1), [True, True])
        self.assertTensor(orochi.any(x > 5, dim=0), [False, False, True])
        self.assertIs(t([1, 2]).sum().dtype, orochi.int64)
        self.assertIs(t([1, 2]).sum(dtype=orochi.float32).dtype, orochi.float32)

    def test_softmax(self):
        x = t([[1.0, 2.0, 3.0]])
        expected = [math.exp(v) / sum(math.exp(u) for u in (1, 2, 3)) for v in (1, 2, 3)]
        self.assertTensor(x.softmax(-1), [expected])
        self.assertTensor(orochi.softmax(x, dim=1), [expected])
        self.assertTensor(x.log_softmax(1), [[math.log(v) for v in expected]])
        self.assertIs(x.softmax(-1, dtype=orochi.float64).dtype, orochi.float64)

    def test_cumsum(self):
        x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        self.assertTensor(x.cumsum(-1), [[1, 3, 6], [4, 9, 15]], orochi.float32)
        self.assertTensor(orochi.cumsum(x, dim=0), [[1, 2, 3], [5, 7, 9]])
        self.assertTensor(x.cumsum(1, dtype=orochi.float64), [[1, 3, 6], [4, 9, 15]],
                          orochi.float64)
        self.assertTensor(t([1, 2, 3]).cumsum(0), [1, 3, 6], orochi.int64)
        self.assertTensor(t([True, False, True]).cumsum(0), [1, 1, 2], orochi.int64)
        with self.assertRaisesRegex(IndexError, "dim"):
            x.cumsum(2)

    def test_reduction_errors(self):
        with self.assertRaisesRegex(RuntimeError, "mean"):
            t([1, 2]).mean()
        with self.assertRaisesRegex(IndexError, "dim"):
            orochi.zeros(2).sum(3)


class SelectionTest(Case):
    def test_where_masked_fill_clamp(self):
        x = t([1.0, -2.0, 3.0])
        self.assertTensor(orochi.where(x > 0, x, t(0.0)), [1, 0, 3])
        self.assertTensor(orochi.where(x > 0, x, 0.0), [1, 0, 3])
        self.assertTensor(orochi.where(x > 0, 1.0, x), [1, -2, 1])
        self.assertTensor(x.where(x > 0, -x), [1, 2, 3])
        self.assertTensor(x.masked_fill(x < 0, 9), [1, 9, 3])
        self.assertTensor(orochi.masked_fill(x, x > 2, 0), [1, -2, 0])
        self.assertTensor(x.clamp(min=0), [1, 0, 3])
        self.assertTensor(x.clamp(-1, 2), [1, -1, 2])
        self.assertTensor(orochi.clip(x, max=0), [0, -2, 0])
        with self.assertRaisesRegex(RuntimeError, "at least one of min and max"):
            x.clamp()
        with self.assertRaisesRegex(RuntimeError, "bool"):
            orochi.where(x, x, x)

    def test_sort_topk_gather(self):
        x = t([[3.0, 1.0, 2.0], [0.0, 5.0, 4.0]])
        values, indices = x.sort()
        self.assertTensor(values, [[1, 2, 3], [0, 4, 5]])
        self.assertTensor(indices, [[1, 2, 0], [0, 2, 1]])
        self.assertTensor(orochi.sort(x, dim=0, descending=True).values, [[3, 5, 4], [0, 1, 2]])
        self.assertTensor(x.argsort(dim=1, descending=True), [[0, 2, 1], [1, 2, 0]])
        top = x.topk(2)
        self.assertTensor(top.values, [[3, 2], [5, 4]])
        self.assertTensor(top.indices, [[0, 2], [1, 2]])
        self.assertTensor(orochi.topk(x, 1, dim=0, largest=False).values, [[0, 1, 2]])
        self.assertTensor(x.gather(1, t([[2], [0]])), [[2], [0]])
        self.assertTensor(orochi.index_select(x, 1, t([2, 0])), [[2, 3], [4, 0]])
        self.assertTensor(x.masked_select(x > 2), [3, 5, 4])
        with self.assertRaisesRegex(RuntimeError, "topk"):
            x.topk(4)


class BufferProtocolTest(Case):
    def test_memoryview_of_a_tensor_shares_memory(self):
        x = t([[1.0, 2.0], [3.0, 4.0]])
        view = memoryview(x)
        self.assertEqual((view.format, view.shape, view.strides, view.readonly), ("f", (2, 2), (8, 4), False))
        view[0, 1] = 7.0
        self.assertEqual(x[0, 1].item(), 7.0)
        column = memoryview(x[:, 1])
        self.assertEqual(column.strides, (8,))
        self.assertEqual(column.tolist(), [7.0, 4.0])
        for dtype, code in [(orochi.bool, "?"), (orochi.uint8, "B"), (orochi.int8, "b"),
                            (orochi.int16, "h"), (orochi.int32, "i"), (orochi.int64, "q"),
                            (orochi.float16, "e"), (orochi.float64, "d")]:
            self.assertEqual(memoryview(orochi.zeros(1, dtype=dtype)).format, code)

    def test_buffer_export_refusals(self):
        with self.assertRaisesRegex(BufferError, "bfloat16"):
            memoryview(orochi.zeros(2, dtype=orochi.bfloat16))
        with self.assertRaisesRegex(BufferError, "contiguous"):
            hashlib.sha256(orochi.zeros(4).view(2, 2).t().flatten()[::2])  # wants a plain buffer
        self.assertEqual(hashlib.sha256(orochi.zeros(4)).hexdigest(),
                         hashlib.sha256(bytes(16)).hexdigest())

    def test_tensor_from_a_buffer_without_copying(self):
        data = bytearray(8)
        shared = orochi.frombuffer(data, dtype=orochi.float32)
        memoryview(data).cast("f")[1] = 2.5
        self.assertEqual(shared.tolist(), [0.0, 2.5])
        shared[0] = 1.5  # and back into the bytearray
        self.assertEqual(memoryview(data).cast("f").tolist(), [1.5, 2.5])
        self.assertEqual(orochi.frombuffer(data, dtype=orochi.uint8, count=2, offset=1).shape, (2,))
        as_tensor = orochi.as_tensor(memoryview(data).cast("f"))
        self.assertEqual(as_tensor.data_ptr(), shared.data_ptr())
        del data  # the tensor keeps the exporter alive
        self.assertEqual(shared.tolist(), [1.5, 2.5])

    def test_readonly_buffers_give_read_only_tensors(self):
        shared = orochi.frombuffer(b"\x00\x00\x80\x3f", dtype=orochi.float32)
        self.assertTrue(shared.is_read_only)
        self.assertEqual(shared.tolist(), [1.0])
        with self.assertRaisesRegex(RuntimeError, "read-only"):
            shared += 1
        with self.assertRaisesRegex(ValueError, "read-only"):
            shared[0] = 2

    def test_strided_buffers_and_errors(self):
        strided = memoryview(bytearray(range(8)))[::2]
        tensor = orochi.as_tensor(strided)
        self.assertEqual(tensor.stride(), (2,))
        self.assertEqual(tensor.tolist(), [0, 2, 4, 6])
        with self.assertRaisesRegex(ValueError, "negative or unaligned strides"):
            orochi.as_tensor(memoryview(bytearray(4))[::-1])
        with self.assertRaisesRegex(TypeError, "format 'I'"):
            orochi.as_tensor(memoryview(bytearray(4)).cast("I"))
        with self.assertRaisesRegex(ValueError, "does not hold a whole number of float32"):
            orochi.frombuffer(bytearray(6), dtype=orochi.float32)


class SafetensorsTest(Case):
    def test_round_trip_through_a_file_and_bytes(self):
        tensors = {"a": t([[1.0, 2.0]]), "b": t([1, 2, 3], dtype=orochi.int16),
                   "c": orochi.arange(6).view(2, 3).t()}
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "weights.safetensors")
            orochi.save_safetensors(tensors, path, metadata={"format": "pt"})
            loaded = orochi.load_safetensors(path)
            with open(path, "rb") as file:
                from_bytes = orochi.load_safetensors(file.read())
        for result in (loaded, from_bytes):
            self.assertEqual(sorted(result), ["a", "b", "c"])
            self.assertEqual(result["c"].tolist(), [[0, 3], [1, 4], [2, 5]])
            self.assertIs(result["b"].dtype, orochi.int16)
            self.assertTrue(all(value.is_read_only for value in result.values()))
        with self.assertRaisesRegex(RuntimeError, "read-only"):
            loaded["a"].add_(1)
        self.assertTrue(memoryview(loaded["a"]).readonly)
        with self.assertRaisesRegex(TypeError, "read-only"):
            memoryview(loaded["a"]).cast("B")[0] = 0

    def test_errors_name_the_problem(self):
        with self.assertRaises(FileNotFoundError):
            orochi.load_safetensors("/nonexistent/weights.safetensors")
        with self.assertRaisesRegex(ValueError, "header"):
            orochi.load_safetensors(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
        with self.assertRaisesRegex(TypeError, "dict of str to orochi.Tensor"):
            orochi.save_safetensors({"a": 1}, "/tmp/unused.safetensors")


class HostileInputTest(Case):
    """Inputs that once crashed a copy or gave wrong numbers; each must now give PyTorch's
    answer or a clear error."""

    def test_types_cannot_be_instantiated_half_built(self):
        for make in (lambda: orochi.Tensor.__new__(orochi.Tensor), lambda: orochi.Tensor(),
                     lambda: orochi.dtype.__new__(orochi.dtype)):
            with self.assertRaisesRegex(TypeError, "cannot be constructed"):
                make()
        with self.assertRaises(TypeError):
            orochi.device.__new__(orochi.device)

    def test_zero_dim_tensors_have_no_dims(self):
        scalar = t(3.0)
        for call in (lambda: scalar.size(0), lambda: scalar.stride(0), lambda: scalar.sum(1),
                     lambda: scalar.softmax(-2), lambda: scalar.select(0, 0)):
            with self.assertRaisesRegex(IndexError, "a 0-d tensor has no dimensions|0-d"):
                call()
        for call in (lambda: scalar.split(1), lambda: scalar.split([1]),
                     lambda: scalar.chunk(1), lambda: orochi.cat([scalar, scalar]),
                     lambda: scalar.narrow(0, 0, 1)):
            with self.assertRaisesRegex(RuntimeError, "0-d|at least 1 dimension"):
                call()
        self.assertTensor(scalar.transpose(0, -1), 3.0)
        self.assertEqual(scalar.unsqueeze(0).shape, (1,))

    def test_sizes_that_overflow_are_refused(self):
        with self.assertRaisesRegex(MemoryError, "more bytes than fit in 64 bits"):
            orochi.zeros(2**62)
        with self.assertRaisesRegex(RuntimeError, "more elements than fit in 64 bits"):
            orochi.zeros(2**31, 2**31, 4)
        with self.assertRaisesRegex(RuntimeError, "more elements than fit in 64 bits"):
            orochi.arange(6).expand(2**61, 6).contiguous()
        with self.assertRaisesRegex(ValueError, "does not hold 4611686018427387904 float32"):
            orochi.frombuffer(bytearray(16), dtype=orochi.float32, count=2**62)
        with self.assertRaisesRegex(IndexError, "narrow"):
            orochi.zeros(2, 3).narrow(1, 2**62, 2**62)

    def test_nesting_is_bounded(self):
        deep = [1.0]
        for _ in range(200):
            deep = [deep]
        with self.assertRaisesRegex(ValueError, "nested deeper than 64"):
            orochi.tensor(deep)
        looped = []
        looped.append(looped)
        with self.assertRaisesRegex(ValueError, "nested deeper than 64"):
            orochi.tensor(looped)
        with self.assertRaisesRegex(ValueError, "at most 64 dimensions"):
            orochi.zeros(*[1] * 100)
        with self.assertRaisesRegex(RuntimeError, "at most 64 dimensions"):
            orochi.zeros(1)[(None,) * 100]

    def test_low_rank_inputs_to_nn_functions(self):
        import orochi.nn.functional as F
        with self.assertRaisesRegex(ValueError, "conv2d: expected a 4-D"):
            F.conv2d(t(1.0), orochi.zeros(1, 1, 1, 1))
        with self.assertRaisesRegex(ValueError, "at least 2 dims"):
            F.scaled_dot_product_attention(orochi.ones(1, 2, 2), t(1.0), orochi.ones(1, 2, 2))
        with self.assertRaisesRegex(ValueError, "adaptive_avg_pool2d: expected a 3-D or 4-D"):
            F.adaptive_avg_pool2d(orochi.ones(5), (None, 2))
        with self.assertRaisesRegex(RuntimeError, "too small for the kernel"):
            F.max_pool2d(orochi.ones(1, 1, 3, 3), 5)

    def test_python_numbers_never_widen_the_tensor(self):
        self.assertIs((t(2.0) * 0.5).dtype, orochi.float32)
        self.assertIs((t(3, dtype=orochi.int32) + 1).dtype, orochi.int32)
        self.assertTensor(t(3, dtype=orochi.uint8) + 1000, 235, orochi.uint8)  # wraps as in torch
        self.assertIs((t([True]) + True).dtype, orochi.bool)

    def test_writes_convert_numbers_exactly(self):
        x = orochi.zeros(2, dtype=orochi.int64)
        x[0] = 123456789.0
        x[1] = 2**62 + 1
        self.assertEqual(x.tolist(), [123456789, 2**62 + 1])
        self.assertEqual(x.fill_(2**53 + 1).tolist(), [2**53 + 1] * 2)
        self.assertEqual(orochi.full((1,), 2**53 + 1).tolist(), [2**53 + 1])
        self.assertEqual(orochi.arange(2**53, 2**53 + 3).tolist(), [2**53, 2**53 + 1, 2**53 + 2])
        self.assertEqual(x.masked_fill(x > 0, 2**60 + 3).tolist(), [2**60 + 3] * 2)

    def test_integer_floor_division_and_bitwise_operators(self):
        self.assertTensor(t([2**40 + 1, 7, -7]) // 2, [2**39, 3, -4])
        with self.assertRaisesRegex(RuntimeError, "ZeroDivisionError"):
            t([5]) // 0
        with self.assertRaisesRegex(RuntimeError, "ZeroDivisionError"):
            7 // t([1, 0])
        with self.assertRaisesRegex(TypeError, "bool tensors only"):
            t([1, 2, 3]) & 2
        self.assertTensor(t([True, False]) | True, [True, True])

    def test_in_place_ops_keep_pytorchs_casting_rules(self):
        integers = t([1, 3])
        with self.assertRaisesRegex(RuntimeError, "float32 can't be cast to the in-place output "
                                               "type int64"):
            integers /= 2
        with self.assertRaisesRegex(RuntimeError, "can't be cast"):
            integers.sqrt_()
        expanded = orochi.zeros(1).expand(3)
        with self.assertRaisesRegex(RuntimeError, "expanded tensor"):
            expanded += t([1.0, 2.0, 3.0])
        self.assertEqual(integers.tolist(), [1, 3])

    def test_assignment_from_an_overlapping_source(self):
        y = orochi.arange(4)
        y[[1, 2, 3]] = y[0:3]
        self.assertEqual(y.tolist(), [0, 0, 1, 2])
        x = orochi.arange(6).reshape(2, 3)
        x[[1, 0]] = x
        self.assertEqual(x.tolist(), [[3, 4, 5], [0, 1, 2]])

    def test_mask_assignment_on_a_strided_view(self):
        boxes = orochi.tensor([[-1.0, 2.0, 3.0], [4.0, -5.0, 6.0]])
        corner = boxes[:, :2]
        corner[corner < 0] = 0
        self.assertEqual(boxes.tolist(), [[0.0, 2.0, 3.0], [4.0, 0.0, 6.0]])

    def test_data_inference(self):
        self.assertIs(t([]).dtype, orochi.float32)
        self.assertEqual(orochi.arange(4)[[]].tolist(), [])
        self.assertIs(t([t(0.1, dtype=orochi.float64)]).dtype, orochi.float64)
        self.assertEqual(t([t(0.1, dtype=orochi.float64)]).tolist(), [0.1])
        self.assertIs(t([t(1, dtype=orochi.int32)]).dtype, orochi.int32)
        flags = t(b"\x00\x05", dtype=orochi.bool)
        self.assertEqual(flags.tolist(), [False, True])
        self.assertEqual(flags.sum().item(), 1)
        self.assertTensor(orochi.arange(5)[::2**62], [0])

    def test_buffers_that_cannot_be_shared(self):
        import sys
        with self.assertRaisesRegex(ValueError, "not aligned for float64"):
            orochi.frombuffer(bytearray(17), dtype=orochi.float64, offset=1)
        misaligned = memoryview(bytearray(17))[1:].cast("d")
        self.assertEqual(orochi.as_tensor(misaligned).tolist(), [0.0, 0.0])  # copied instead
        contiguous_bytes = bytes(memoryview(orochi.tensor([1.0])))
        with self.assertRaises(BufferError):
            orochi.load_safetensors(memoryview(bytearray(contiguous_bytes * 8))[::2])
        del sys


class PyTorchSemanticsTest(Case):
    """Calls whose answers once differed from PyTorch's; each expected value is torch's."""

    def test_python_ints_keep_their_value_in_true_division(self):
        self.assertTensor(t([16384, -32768, 32767], orochi.int16) / 32768,
                          [0.5, -1.0, 0.999969482421875], orochi.float32)
        self.assertTensor(t([128, 255], orochi.uint8) / 256, [0.5, 0.99609375], orochi.float32)
        self.assertTensor(t(100, orochi.int8) / 1000, 0.1, orochi.float32)
        self.assertTensor(t(100, orochi.int8).div(1000), 0.1, orochi.float32)
        self.assertTensor(t([10], orochi.int8) + 300, [54], orochi.int8)  # operands still wrap

    def test_ints_stored_into_integer_tensors_must_fit(self):
        for make in (lambda: t([300], orochi.uint8),
                     lambda: orochi.full((2,), 300, dtype=orochi.uint8),
                     lambda: t([10, 100], orochi.int8).clamp(-200, 50),
                     lambda: t([1], orochi.int32).clamp(max=2**40),
                     lambda: orochi.zeros(2, dtype=orochi.uint8).masked_fill(t([True, False]), -256),
                     lambda: orochi.zeros(2, dtype=orochi.uint8).fill_(256)):
            with self.assertRaisesRegex(RuntimeError, "cannot be converted to .* without overflow"):
                make()
        target = orochi.zeros(2, dtype=orochi.uint8)
        with self.assertRaisesRegex(RuntimeError, "value 300 cannot be converted to uint8"):
            target[0] = 300
        self.assertEqual(target.tolist(), [0, 0])
        self.assertTensor(t([-128, 127], orochi.int8), [-128, 127], orochi.int8)
        self.assertTensor(t([2], orochi.bool), [True], orochi.bool)

    def test_unsigned_dtypes_take_negative_ints_down_to_minus_max(self):
        # torch 1.13's answers: c10 lets a negative int down to -max wrap into an unsigned dtype.
        self.assertTensor(t([-1, -255], orochi.uint8), [255, 1], orochi.uint8)
        self.assertTensor(orochi.zeros(2, dtype=orochi.uint8).masked_fill(t([True, False]), -1),
                          [255, 0], orochi.uint8)
        self.assertTensor(orochi.zeros(2, dtype=orochi.uint8).fill_(-3), [253, 253], orochi.uint8)
        target = orochi.zeros(2, dtype=orochi.uint8)
        target[0] = -1
        self.assertEqual(target.tolist(), [255, 0])
        with self.assertRaisesRegex(RuntimeError, "value -256 cannot be converted to uint8"):
            orochi.full((1,), -256, dtype=orochi.uint8)

    def test_floats_stored_into_tensors_must_fit(self):
        # torch 1.13 refuses these rather than store INT_MIN or inf (its checked conversion).
        nan, inf = float("nan"), float("inf")
        for make in (lambda: orochi.full((2,), nan, dtype=orochi.int64),
                     lambda: t([1, 2]).fill_(nan),
                     lambda: t([1, 2]).fill_(inf),
                     lambda: t([1, 2], orochi.int8).masked_fill(t([True, False]), 1e10),
                     lambda: orochi.full((2,), -0.5, dtype=orochi.uint8),
                     lambda: orochi.full((2,), 1e300),
                     lambda: orochi.full((2,), 1e5, dtype=orochi.float16),
                     lambda: orochi.full((2,), 100000, dtype=orochi.float16),
                     lambda: orochi.full((2,), 1e39, dtype=orochi.bfloat16),
                     lambda: t([1.0, 2.0]).masked_fill(t([True, False]), 1e300),
                     lambda: t([nan], orochi.int64),
                     lambda: t([1e10], orochi.int8),
                     lambda: orochi.where(t([True, False]), t([1], orochi.int8), 300),
                     lambda: t([1], orochi.int8).where(t([True, False]), -300),
                     lambda: orochi.where(t([True, False]), t([1.0], orochi.float16), 1e10)):
            with self.assertRaisesRegex(RuntimeError, "cannot be converted to .* without overflow"):
                make()
        for dtype, value in ((orochi.int64, nan), (orochi.int64, inf), (orochi.float32, 1e300)):
            target = orochi.zeros(3, dtype=dtype)
            with self.assertRaisesRegex(RuntimeError, "without overflow"):
                target[1] = value
            self.assertEqual(target.tolist(), [0, 0, 0])
        # What torch allows: infinities and NaN in float dtypes, truncation into ints, a float
        # made by torch.tensor turning into inf, and where() promoting instead of converting.
        self.assertTensor(orochi.full((1,), inf, dtype=orochi.float16), [inf], orochi.float16)
        self.assertTensor(t([1.0]).fill_(nan), [nan])
        self.assertTensor(orochi.full((2,), -2.9, dtype=orochi.int64), [-2, -2], orochi.int64)
        self.assertTensor(orochi.full((1,), nan, dtype=orochi.bool), [True], orochi.bool)
        self.assertTensor(t([1e300, 100000], orochi.float16), [inf, inf], orochi.float16)
        self.assertTensor(orochi.where(t([True, False]), t([1], orochi.int8), 2.5), [1.0, 2.5],
                          orochi.float32)
        self.assertTensor(orochi.where(t([True, False]), t([1], orochi.uint8), -1), [1, 255],
                          orochi.uint8)

    def test_errors_have_pytorchs_exception_types(self):
        # torch 1.13 raises RuntimeError for each of these (model code may catch it).
        x = orochi.arange(24).reshape(2, 3, 4)
        for call in (lambda: x.t(),
                     lambda: x.split([2, 3], dim=2),
                     lambda: x.split([-1, 5], dim=2),
                     lambda: orochi.arange(0, 5, -1),
                     lambda: orochi.arange(0, 5, 0),
                     lambda: orochi.tensor([2**63]),
                     lambda: x + 2**64,
                     lambda: bool(t([1, 2])),
                     lambda: bool(t([])),
                     lambda: t([1.0]).clamp(),
                     lambda: t([1, 2]).add_(1.5),
                     lambda: t([1, 2]).__itruediv__(2),
                     lambda: orochi.zeros(3, 1).expand(3, 2).add_(1)):
            with self.assertRaises(RuntimeError) as caught:
                call()
            self.assertNotIsInstance(caught.exception, (ValueError, TypeError, IndexError))

    def test_python_bools_and_floats_as_indices(self):
        # torch 1.13: a bool is a new dim masked by it; a float is an IndexError.
        x = orochi.arange(6).reshape(2, 3)
        self.assertEqual(x[True].shape, (1, 2, 3))
        self.assertEqual(x[False].shape, (0, 2, 3))
        self.assertEqual(x[True, 1].shape, (1, 3))
        self.assertEqual(x[0, False].shape, (0, 3))
        self.assertEqual(x[..., True].shape, (2, 3, 1))
        self.assertTensor(t(5)[True], [5])
        target = x.clone()
        target[False] = 7
        self.assertTensor(target, [[0, 1, 2], [3, 4, 5]])
        target[True] = 7
        self.assertTensor(target, [[7, 7, 7], [7, 7, 7]])
        with self.assertRaisesRegex(IndexError, "valid indices, got float"):
            x[1.0]
        with self.assertRaisesRegex(TypeError, "valid indices, got str"):
            x["a"]

    def test_uint8_index_tensors_are_masks(self):
        # torch 1.13 reads a uint8 index tensor as a mask (deprecated there), not as positions.
        x = orochi.arange(24).reshape(2, 3, 4)
        self.assertTensor(x[t([1, 0], orochi.uint8)], [x[0].tolist()])
        self.assertEqual(x[t([[1, 0, 1], [0, 0, 2]], orochi.uint8)].tolist(),
                         [[0, 1, 2, 3], [8, 9, 10, 11], [20, 21, 22, 23]])
        target = orochi.zeros(3)
        target[t([0, 1, 1], orochi.uint8)] = 5.0
        self.assertEqual(target.tolist(), [0.0, 5.0, 5.0])

    def test_any_and_all_of_uint8_are_uint8(self):
        # torch 1.13's dtypes: uint8 in, uint8 out; every other dtype gives bool.
        x = t([[1, 0], [3, 0]], orochi.uint8)
        self.assertTensor(x.any(), 1, orochi.uint8)
        self.assertTensor(x.all(1), [0, 0], orochi.uint8)
        self.assertTensor(orochi.zeros(0, dtype=orochi.uint8).all(), 1, orochi.uint8)
        self.assertTensor(t([1, 0], orochi.int8).any(), True, orochi.bool)

    def test_cat_skips_one_dimensional_empty_tensors(self):
        # torch 1.13 skips shape-[0] tensors in cat (torch.tensor([]) as a starting value), but
        # they still count in the result's dtype.
        self.assertTensor(orochi.cat([orochi.ones(1, 2), orochi.zeros(0)]), [[1.0, 1.0]],
                          orochi.float32)
        self.assertTensor(orochi.cat([t([]), orochi.ones(2, 1)], dim=1), [[1.0], [1.0]])
        self.assertIs(orochi.cat([orochi.ones(1, 2), orochi.zeros(0, dtype=orochi.float64)]).dtype,
                      orochi.float64)
        self.assertEqual(orochi.cat([orochi.zeros(0), orochi.zeros(0)]).shape, (0,))
        self.assertEqual(orochi.cat([orochi.zeros(0, 3), t([])]).shape, (0, 3))
        with self.assertRaisesRegex(RuntimeError, "same number of dimensions"):
            orochi.cat([orochi.zeros(2, 3), orochi.zeros(1)])
        with self.assertRaisesRegex(RuntimeError, "sizes must match"):
            orochi.cat([orochi.zeros(0, 2), orochi.zeros(2, 3)])

    def test_integer_powers(self):
        self.assertTensor(t([1, -1, 2, -1]) ** t([-1, -1, -1, -2]), [1, -1, 0, 1])
        for power in (lambda: t([1, 2]) ** -1, lambda: t([3], orochi.uint8).pow(-1)):
            with self.assertRaisesRegex(RuntimeError, "negative integer powers"):
                power()
        self.assertTensor(t([2.0]) ** -1, [0.5])
        self.assertTensor(orochi.pow(2, t([2, 3])), [4, 8], orochi.int64)
        self.assertTensor(2 ** t([0.5]), [1.4142135], orochi.float32)

    def test_floor_division_rounds_like_python(self):
        self.assertTensor(t([2**53 + 1, 2**60 + 3]) // 1, [2**53 + 1, 2**60 + 3], orochi.int64)
        self.assertTensor(t([-7, 7]) // t([2, -2]), [-4, -4], orochi.int64)
        self.assertTensor(7 // t([2, -2]), [3, -4], orochi.int64)
        self.assertTensor(t([1.0, 0.7]) // 0.1, [9.0, 6.0], orochi.float32)
        self.assertTensor(t([-5.0, 5.0]) // float("inf"), [-1.0, 0.0])
        self.assertTensor(t([-7.0, 7.0]).floor_divide(t([2.0, -2.0])), [-4.0, -4.0])
        self.assertTensor(t([2**63 - 1]) // -1, [-(2**63 - 1)])
        x = t([7, -7])
        x //= 2
        self.assertTensor(x, [3, -4], orochi.int64)

    def test_remainder_takes_the_divisors_sign_like_python(self):
        # torch 1.13's answers.
        self.assertTensor(t([-7, 7, -7, 7]) % t([3, 3, -3, -3]), [2, 1, -1, -2], orochi.int64)
        self.assertTensor(7 % t([3, -3]), [1, -2], orochi.int64)
        self.assertTensor(t([5], dtype=orochi.uint8) % 3, [2], orochi.uint8)
        self.assertTensor(t([1, 2], dtype=orochi.int32) % 1.5, [1.0, 0.5], orochi.float32)
        self.assertTensor(t([-7.5, 7.5, 5.0]) % 2, [0.5, 1.5, 1.0])
        self.assertTensor(t([-7.5, 7.5, 5.0]).remainder(-2), [-1.5, -0.5, -1.0])
        self.assertTrue(math.isnan((t([1.0]) % 0).item()))
        self.assertEqual(math.copysign(1.0, (t([-0.0]) % 2).item()), -1.0)
        self.assertTensor(orochi.remainder(t([5.5], dtype=orochi.float16), 2), [1.5],
                          orochi.float16)
        self.assertTensor(t([2**63 - 1, -(2**63)]) % -1, [0, 0])
        x = t([7, -7])
        x %= 4
        self.assertTensor(x, [3, 1], orochi.int64)
        with self.assertRaisesRegex(RuntimeError, "ZeroDivisionError"):
            t([5]) % 0
        with self.assertRaises(RuntimeError):
            t([True]) % t([True])

    def test_repeat_and_flip_as_pytorch(self):
        # torch 1.13's answers.
        x = orochi.arange(6).reshape(2, 3)
        self.assertEqual(x.repeat(2, 1).tolist(), [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]])
        self.assertEqual(x.repeat((2, 2)).tolist(), [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]] * 2)
        self.assertEqual(tuple(x.repeat(1, 2, 1).shape), (1, 4, 3))
        self.assertEqual(tuple(x.repeat(2, 0).shape), (4, 0))
        self.assertEqual(x.t().repeat(1, 2).tolist(), [[0, 3, 0, 3], [1, 4, 1, 4], [2, 5, 2, 5]])
        self.assertEqual(orochi.tensor(5).repeat(3).tolist(), [5, 5, 5])
        with self.assertRaisesRegex(RuntimeError, "can not be smaller than number of dimensions"):
            x.repeat(2)
        with self.assertRaises(RuntimeError):
            x.repeat(-1, 1)
        self.assertEqual(x.flip(0).tolist(), [[3, 4, 5], [0, 1, 2]])
        self.assertEqual(x.flip(0, 1).tolist(), [[5, 4, 3], [2, 1, 0]])
        self.assertEqual(orochi.flip(x, [-1]).tolist(), [[2, 1, 0], [5, 4, 3]])
        self.assertEqual(x.t().flip(1).tolist(), [[3, 0], [4, 1], [5, 2]])
        self.assertEqual(orochi.tensor(5).flip(0).tolist(), 5)
        flipped = x.flip(())
        flipped[0, 0] = 9
        self.assertEqual(x[0, 0].item(), 0)  # a copy, as PyTorch's flip
        with self.assertRaisesRegex(RuntimeError, "dim 0 appears multiple times"):
            x.flip(0, 0)
        with self.assertRaises(IndexError):
            x.flip(2)

    def test_reductions_honour_dtype(self):
        self.assertTensor(t([100, 100], orochi.int8).sum(dtype=orochi.int8), -56, orochi.int8)
        self.assertTensor(t([1, 2], orochi.int32).sum(dtype=orochi.int32), 3, orochi.int32)
        self.assertTensor(t([3, 4], orochi.int32).prod(dtype=orochi.int32), 12, orochi.int32)
        self.assertTensor(t([1, 2], orochi.int32).sum(), 3, orochi.int64)

    def test_relu_keeps_nan(self):
        import orochi.nn.functional as F
        self.assertTensor(orochi.relu(t([-1.0, float("nan"), 2.0])), [0.0, float("nan"), 2.0])
        self.assertTensor(F.relu(t([float("nan")])), [float("nan")])

    def test_zero_dim_tensors_take_dim_0_and_minus_1(self):
        scalar = t(5.0)
        self.assertTensor(scalar.sum(0), 5.0)
        self.assertTensor(scalar.mean(dim=0, keepdim=True), 5.0)
        self.assertEqual(scalar.mean(dim=0, keepdim=True).shape, ())
        self.assertTensor(scalar.argmax(0), 0, orochi.int64)
        self.assertTensor(scalar.max(-1).values, 5.0)
        self.assertTensor(scalar.softmax(-1), 1.0)
        self.assertTensor(scalar.squeeze(0), 5.0)
        self.assertTensor(scalar.index_select(0, t([0])), 5.0)
        self.assertTensor(scalar.sort(0).values, 5.0)

    def test_empty_batches_reduce_to_empty_results(self):
        empty = orochi.zeros(0, 10)
        self.assertEqual(empty.argmax(-1).shape, (0,))
        self.assertEqual(empty.argmax(-1, keepdim=True).shape, (0, 1))
        self.assertEqual(empty.max(-1).values.shape, (0,))
        self.assertEqual(empty.min(1).indices.shape, (0,))
        self.assertEqual(empty.amax(1).shape, (0,))
        # torch 1.13's exception types: IndexError for argmax/argmin of an empty tensor and for
        # reducing over an empty dim, RuntimeError for max()/amax() of a whole empty tensor.
        with self.assertRaisesRegex(IndexError, "cannot reduce an empty tensor"):
            empty.argmax()
        for reduce in (lambda: empty.argmax(0), lambda: empty.max(0), lambda: empty.min(dim=0),
                       lambda: empty.amax(0), lambda: orochi.zeros(0).argmin(0)):
            with self.assertRaisesRegex(IndexError, "cannot reduce over an empty dimension"):
                reduce()
        for reduce in (lambda: empty.max(), lambda: empty.amax(), lambda: orochi.zeros(0).min()):
            with self.assertRaisesRegex(RuntimeError, "without a dim") as caught:
                reduce()
            self.assertNotIsInstance(caught.exception, IndexError)

    def test_split_with_sizes_and_tuples(self):
        first, second = orochi.arange(10).split([3, 7])
        self.assertTensor(first, [0, 1, 2])
        self.assertTensor(second, [3, 4, 5, 6, 7, 8, 9])
        self.assertEqual(len(orochi.arange(12).reshape(3, 4).split([1, 1, 2], dim=1)), 3)
        self.assertIsInstance(orochi.arange(10).split(3), tuple)
        self.assertIsInstance(orochi.arange(10).chunk(3), tuple)
        with self.assertRaisesRegex(RuntimeError, "add up to 11, but dimension 0 has size 10"):
            orochi.arange(10).split([3, 8])

    def test_format_stride_and_sorting(self):
        self.assertEqual(f"{t(3)}", "3")
        self.assertEqual(f"{t(2.5):.2f}", "2.50")
        self.assertEqual(f"{t([1, 2])}", "tensor([1, 2])")
        self.assertEqual(orochi.arange(6).reshape(2, 3).stride(), (3, 1))
        self.assertTensor(t([True, False, True]).sort().values, [False, True, True])
        self.assertTensor(t([3.0, 1.0, 3.0]).argsort(stable=True), [1, 0, 2])
        self.assertTensor(t([1.0, 1.0, 0.0]).sort(descending=True, stable=True).indices, [0, 1, 2])

    def test_dims_and_indices_out_of_range_raise_index_error(self):
        x = orochi.arange(6.0).reshape(2, 3)
        for call in (lambda: x.sum(dim=5), lambda: x.transpose(0, 7), lambda: x.size(9),
                     lambda: x.stride(-3), lambda: x.unsqueeze(9), lambda: x.softmax(dim=4),
                     lambda: x.log_softmax(-3), lambda: x.squeeze(4), lambda: x.flatten(0, 5),
                     lambda: x.permute(0, 5), lambda: x.argmax(dim=2), lambda: x.max(dim=2),
                     lambda: x.sort(dim=2), lambda: x.topk(1, dim=2), lambda: x.split(1, dim=2),
                     lambda: x.chunk(2, dim=2), lambda: orochi.cat([x, x], dim=2),
                     lambda: orochi.stack([x, x], dim=3), lambda: x.select(2, 0),
                     lambda: x.narrow(2, 0, 1), lambda: x.index_select(2, t([0])),
                     lambda: x.gather(2, t([[0]]))):
            with self.assertRaisesRegex(IndexError, "dimension -?[0-9] is out of range"):
                call()
        for call in (lambda: orochi.arange(3)[10], lambda: x[:, 9], lambda: x[t([5])],
                     lambda: x[[0, 5]], lambda: x.select(0, 5), lambda: x.narrow(0, 5, 0),
                     lambda: x.narrow(0, -3, 1), lambda: x.index_select(0, t([2])),
                     lambda: x.index_select(0, t([-1]))):
            with self.assertRaisesRegex(IndexError, "out of (range|bounds)|outside"):
                call()
        import orochi.nn.functional as F
        with self.assertRaisesRegex(IndexError, "index 3 is out of range"):
            F.embedding(t([3]), x)
        # What PyTorch reports as RuntimeError stays one.
        for call in (lambda: x.narrow(0, 1, 2), lambda: x.narrow(0, 0, -1), lambda: x.topk(4),
                     lambda: x.gather(1, t([[3]]))):
            with self.assertRaises(RuntimeError):
                call()
        self.assertTensor(x.narrow(1, 3, 0), [[], []])  # a start at the end selects nothing
        self.assertTensor(x.narrow(1, -1, 1), [[2.0], [5.0]])

    def test_bools_cannot_be_subtracted_or_negated(self):
        mask = t([True, False])
        for call in (lambda: mask - mask, lambda: mask - True, lambda: True - mask,
                     lambda: mask.sub(t(False)), lambda: orochi.sub(mask, mask)):
            with self.assertRaisesRegex(RuntimeError, "with two bool tensors is not supported. "
                                                      "Use the `\\^` or `logical_xor\\(\\)`"):
                call()
        for call in (lambda: mask - 1, lambda: 1.5 - mask, lambda: t([1, 2]) - mask,
                     lambda: t([1.0, 2.0]) - True, lambda: t([1, 2]).sub_(True)):
            with self.assertRaisesRegex(RuntimeError, "with a bool tensor is not supported. If you "
                                                      "are trying to invert a mask, use the `~`"):
                call()
        for call in (lambda: -mask, lambda: mask.neg(), lambda: orochi.negative(mask)):
            with self.assertRaisesRegex(RuntimeError, "Negation, the `-` operator, on a bool "
                                                      "tensor is not supported"):
                call()
        self.assertTensor(~mask, [False, True], orochi.bool)
        self.assertTensor(mask ^ t([True, True]), [False, True], orochi.bool)
        self.assertTensor(mask + mask, [True, False], orochi.bool)
        self.assertTensor(t([3, 2]) - 1, [2, 1], orochi.int64)

    def test_a_short_list_holding_sequences_indexes_like_a_tuple(self):
        x = orochi.arange(6).reshape(2, 3)
        rows = [[0, 1, 2], [3, 4, 5]]
        self.assertTensor(x[[[0, 1]]], rows)
        self.assertTensor(x[[0, 1]], rows)
        self.assertTensor(x[[[0, 1], [1, 0]]], [1, 3])
        self.assertTensor(x[[[0, 1], [1, 2]]], [1, 5])
        self.assertTensor(x[[[0, 1], [1, 0]],], [rows, [rows[1], rows[0]]])
        self.assertTensor(x[[[0, 1]],], [rows])
        self.assertTensor(x[[(0, 1)]], rows)
        self.assertTensor(x[((0, 1), (1, 0))], [1, 3])
        self.assertTensor(x[[0, slice(None)]], [0, 1, 2])
        self.assertTensor(x[[slice(None), 1]], [1, 4])
        self.assertTensor(x[[None, 0]], [[0, 1, 2]])
        self.assertTensor(x[[0, ...]], [0, 1, 2])
        self.assertTensor(x[[t(0), 1]], 1)
        self.assertTensor(x[[0, [0, 1]]], [0, 1])
        self.assertTensor(x[[True, False]], [[0, 1, 2]])
        self.assertTensor(x[[[True, False]]], [[0, 1, 2]])
        self.assertEqual(x[[0] * 31].shape, (31, 3))
        self.assertEqual(x[[[0]] * 32].shape, (32, 1, 3))  # 32 items: always one index
        with self.assertRaisesRegex(IndexError, "too many indices for tensor of dimension 2"):
            x[[[0, 1], [1, 0], [0, 0]]]
        target = x.clone()
        target[[[0, 1]]] = 9
        self.assertTensor(target, [[9, 9, 9], [9, 9, 9]])
        target[[slice(None), 1]] = 0
        self.assertTensor(target, [[9, 0, 9], [9, 0, 9]])
        target[[[0, 1], [1, 0]]] = 7  # torch 1.13 writes (0, 1) and (1, 0)
        self.assertTensor(target, [[9, 7, 9], [7, 0, 9]])

    def test_assignment_with_several_tensor_indices(self):
        # Each expected tensor is torch 1.13's for the same assignment into arange(60).reshape(3, 4, 5).
        def assigned(index, value):
            target = orochi.arange(60).reshape(3, 4, 5)
            target[index] = value
            return target

        # Adjacent indices: their broadcast dims stand where they were ([4, 2] here).
        x = assigned((slice(None), [0, 2], [1, 3]), orochi.arange(6).reshape(3, 2) * -1)
        self.assertEqual(x[:, 0, 1].tolist(), [0, -2, -4])
        self.assertEqual(x[:, 2, 3].tolist(), [-1, -3, -5])
        self.assertEqual(x[:, 1, 1].tolist(), [6, 26, 46])
        # Separated indices: their broadcast dims come first ([2, 4] here).
        x = assigned(([0, 2], slice(None), [1, 3]), orochi.arange(8).reshape(2, 4) * -1)
        self.assertEqual(x[0, :, 1].tolist(), [0, -1, -2, -3])
        self.assertEqual(x[2, :, 3].tolist(), [-4, -5, -6, -7])
        # Indices broadcast against each other; repeated positions keep the last value.
        x = assigned((t([[0, 1], [2, 0]]), t([[1], [3]])), -9)
        self.assertEqual(x[0, 1].tolist(), [-9] * 5)
        self.assertEqual(x[0, 3].tolist(), [-9] * 5)
        self.assertEqual(x[1, 3].tolist(), [35, 36, 37, 38, 39])
        x = assigned(([0, 0], [1, 1], [2, 2]), t([-5, -6]))
        self.assertEqual(x[0, 1, 2].item(), -6)
        # A bool mask with an int index, and an int after an int.
        x = assigned((t([True, False, True]), slice(None), [0, 4]), t([[-1], [-2]]))
        self.assertEqual(x[0, :, 0].tolist(), [-1] * 4)
        self.assertEqual(x[2, :, 4].tolist(), [-2] * 4)
        self.assertEqual(x[1, :, 0].tolist(), [20, 25, 30, 35])
        x = assigned((1, [0, 2], [1, 3]), t([-7, -8]))
        self.assertEqual([x[1, 0, 1].item(), x[1, 2, 3].item(), x[1, 0, 3].item()], [-7, -8, 23])
        with self.assertRaisesRegex(IndexError, "could not be broadcast together with shapes"):
            assigned(([0, 1], [1, 2, 3]), 0)
        with self.assertRaisesRegex(IndexError, "could not be broadcast together with shapes"):
            orochi.arange(60).reshape(3, 4, 5)[[0, 1], [1, 2, 3]]
        with self.assertRaisesRegex(IndexError, "index 5 is out of bounds"):
            assigned(([0, 5], [1, 1]), 0)

    def test_index_messages_and_assignment_broadcasting(self):
        with self.assertRaisesRegex(IndexError, "index 4 is out of bounds for dimension 1 "):
            orochi.ones(3, 4, 5)[0, 4]
        target = orochi.zeros(4)
        target[t([0, 1])] = t([[1.0, 2.0]])
        target[2:] = t([[3.0, 4.0]])
        self.assertTensor(target, [1.0, 2.0, 3.0, 4.0])

    def test_numpy_scalars_are_numbers(self):
        import sys
        if "/usr/lib/python3/dist-packages" not in sys.path:
            sys.path.append("/usr/lib/python3/dist-packages")
        try:
            import numpy
        except ImportError:
            self.skipTest("numpy is not installed (python3-numpy)")
        x = t([1.0, 2.0])
        self.assertTensor(x * numpy.float32(2), [2.0, 4.0], orochi.float32)
        self.assertTensor(numpy.float32(2) * x, [2.0, 4.0], orochi.float32)
        self.assertTensor(t([1, 2]) + numpy.int64(1), [2, 3], orochi.int64)
        self.assertTensor(x > numpy.float32(1.5), [False, True], orochi.bool)
        self.assertTensor(x.clamp(max=numpy.float32(1.5)), [1.0, 1.5])
        self.assertTensor(x.masked_fill(t([True, False]), numpy.float64(7)), [7.0, 2.0])


class GradModeTest(unittest.TestCase):
    def test_no_grad_is_a_context_manager_and_a_decorator(self):
        with orochi.no_grad():
            value = orochi.ones(1) + 1

        @orochi.no_grad()
        def decorated(x):
            return x * 2

        @orochi.inference_mode()
        def decorated_too(x):
            return x * 3

        self.assertEqual(value.tolist(), [2.0])
        self.assertEqual(decorated(orochi.ones(1)).tolist(), [2.0])
        self.assertEqual(decorated_too(orochi.ones(1)).tolist(), [3.0])
        with orochi.enable_grad(), orochi.set_grad_enabled(False):
            self.assertFalse(orochi.is_grad_enabled())
        x = orochi.ones(1)
        self.assertIs(x.requires_grad_(), x)

    @unittest.skipIf(orochi.cuda.is_available(), "this machine has a GPU (see test_cuda)")
    def test_cuda_module_reports_no_gpu(self):
        self.assertFalse(orochi.cuda.is_available())
        self.assertEqual(orochi.cuda.device_count(), 0)
        reason = orochi.cuda.unavailable_reason()
        self.assertNotEqual(reason, "")
        with self.assertRaisesRegex(RuntimeError, "CUDA is not available: "):
            orochi.cuda.synchronize()
        with self.assertRaisesRegex(ValueError, "'cuda:0' is not available: "):
            orochi.ones(2).cuda()


if __name__ == "__main__":
    unittest.main()
