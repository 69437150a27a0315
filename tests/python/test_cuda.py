"""orochi.cuda and tensors on the GPU, run inside an interpreter copy.

    build/bin/orochi python -m unittest -v test_cuda     (from tests/python)

The GPU cases compare every answer with the same call on the CPU. They skip, saying why, where
the engine has no CUDA device; the checks of how a machine without one behaves always run.
"""

import re
import unittest

import orochi
import orochi.nn as nn
import orochi.nn.functional as F

GPU = orochi.cuda.is_available()
NO_GPU = f"no CUDA GPU: {orochi.cuda.unavailable_reason()}"


class WithoutAGpu(unittest.TestCase):
    def test_the_reason_is_given_and_nothing_falls_back(self):
        if GPU:
            self.assertEqual(orochi.cuda.unavailable_reason(), "")
            return
        self.assertEqual(orochi.cuda.device_count(), 0)
        reason = orochi.cuda.unavailable_reason()
        self.assertTrue(reason, "an unavailable device must say why")
        for attempt in (lambda: orochi.zeros(2, device="cuda"),
                        lambda: orochi.ones(2).to("cuda"),
                        lambda: orochi.tensor([1.0], device="cuda:0"),
                        lambda: orochi.arange(3, device="cuda")):
            with self.assertRaisesRegex(ValueError, "'cuda:0' is not available: " + re.escape(reason[:20])):
                attempt()
        for query in (orochi.cuda.synchronize, orochi.cuda.memory_allocated,
                      orochi.cuda.memory_stats, orochi.cuda.current_device):
            with self.assertRaisesRegex(RuntimeError, "CUDA is not available"):
                query()
        orochi.cuda.empty_cache()  # nothing to return; not an error

    def test_tf32_switch_is_kept(self):
        self.assertFalse(orochi.backends.cuda.matmul.allow_tf32)  # PyTorch's default
        orochi.backends.cuda.matmul.allow_tf32 = True
        try:
            self.assertTrue(orochi.backends.cuda.matmul.allow_tf32)
        finally:
            orochi.backends.cuda.matmul.allow_tf32 = False


@unittest.skipUnless(GPU, NO_GPU)
class OnTheGpu(unittest.TestCase):
    def assertClose(self, gpu, cpu, tolerance=1e-5):
        self.assertEqual(gpu.device.type, "cuda")
        self.assertEqual(list(gpu.shape), list(cpu.shape))
        self.assertIs(gpu.dtype, cpu.dtype)
        difference = (gpu.cpu().double() - cpu.double()).abs()
        scale = cpu.double().abs().max().item() if cpu.numel() else 0.0
        self.assertLessEqual(difference.max().item() if cpu.numel() else 0.0,
                             tolerance * max(1.0, scale))

    def test_moving_tensors(self):
        x = orochi.randn(3, 4, seed=1)
        on_gpu = x.to("cuda")
        self.assertTrue(on_gpu.is_cuda)
        self.assertEqual(on_gpu.device, orochi.device("cuda", 0))
        self.assertEqual(x.cuda().cpu().tolist(), x.tolist())
        self.assertEqual(on_gpu.to("cuda:0").device, orochi.device("cuda", 0))
        self.assertEqual(on_gpu.to(orochi.float64).dtype, orochi.float64)
        self.assertTrue(on_gpu.to(orochi.float64).is_cuda)
        self.assertEqual(orochi.zeros(2, 2, device="cuda").cpu().tolist(), [[0, 0], [0, 0]])
        self.assertEqual(orochi.arange(4, device="cuda").tolist(), [0, 1, 2, 3])
        self.assertEqual(orochi.full((2,), 7, device="cuda").tolist(), [7, 7])
        self.assertEqual(orochi.ones_like(on_gpu).device.type, "cuda")

    def test_shape_ops_from_the_engine_stay_on_the_device(self):
        # repeat, flip, split with sizes, pad and integer arange are engine ops: they run on the
        # tensor's device, with the CPU's answers.
        x = orochi.arange(6, device="cuda").reshape(2, 3)
        for result, expected in ((x.repeat(1, 2), [[0, 1, 2, 0, 1, 2], [3, 4, 5, 3, 4, 5]]),
                                 (x.flip(0, 1), [[5, 4, 3], [2, 1, 0]]),
                                 (x.split([1, 2], dim=1)[1], [[1, 2], [4, 5]]),
                                 (F.pad(x, (1, 0)), [[0, 0, 1, 2], [0, 3, 4, 5]])):
            self.assertTrue(result.is_cuda)
            self.assertEqual(result.tolist(), expected)
        big = orochi.arange(2**60, 2**60 + 3, device="cuda")
        self.assertTrue(big.is_cuda)
        self.assertEqual(big.tolist(), [2**60, 2**60 + 1, 2**60 + 2])

    def test_host_reads_wait_for_the_device(self):
        x = orochi.arange(10, dtype=orochi.float32, device="cuda")
        self.assertEqual(x.sum().item(), 45.0)
        self.assertEqual(float(x.max()), 9.0)
        self.assertTrue(bool(x[3] == 3))
        self.assertEqual(x[orochi.tensor([1, -1], device="cuda")].tolist(), [1.0, 9.0])
        # Indices may live on the CPU (lists, tensors) for a tensor on the GPU, as in PyTorch.
        self.assertEqual(x[[2, -2]].tolist(), [2.0, 8.0])
        self.assertEqual(x[orochi.tensor([0, 4])].device.type, "cuda")
        self.assertEqual(x[x > 6].tolist(), [7.0, 8.0, 9.0])
        grid = x.reshape(2, 5)
        self.assertEqual(grid[[0, 1], [4, 0]].tolist(), [4.0, 5.0])
        self.assertEqual(grid[:, orochi.tensor([True, False, False, False, True])].tolist(),
                         [[0.0, 4.0], [5.0, 9.0]])
        self.assertIn("device='cuda:0'", repr(x))
        with self.assertRaisesRegex(BufferError, "cuda:0 has no buffer in host memory"):
            memoryview(x)

    def test_ops_match_the_cpu(self):
        a = orochi.randn(4, 8, seed=2)
        b = orochi.randn(8, 5, seed=3)
        ga, gb = a.cuda(), b.cuda()
        self.assertClose(ga @ gb, a @ b, 1e-4)
        self.assertClose(F.softmax(ga, dim=-1), F.softmax(a, dim=-1))
        self.assertClose(F.gelu(ga), F.gelu(a))
        self.assertClose(F.layer_norm(ga, (8,)), F.layer_norm(a, (8,)), 1e-4)
        self.assertClose(ga.sum(dim=0), a.sum(dim=0), 1e-5)
        self.assertClose((ga * 2 + 1).exp(), (a * 2 + 1).exp(), 1e-5)
        self.assertEqual(ga.argmax(dim=1).tolist(), a.argmax(dim=1).tolist())
        image = orochi.randn(2, 3, 16, 16, seed=4)
        weight = orochi.randn(6, 3, 3, 3, seed=5)
        self.assertClose(F.conv2d(image.cuda(), weight.cuda(), padding=1),
                         F.conv2d(image, weight, padding=1), 1e-4)

    def test_mixed_devices_are_refused(self):
        with self.assertRaisesRegex(Exception, "expected all tensors on the same device"):
            orochi.ones(2) + orochi.ones(2, device="cuda")

    def test_modules_move_and_match(self):
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        x = orochi.randn(5, 8, seed=6)
        expected = net(x)
        net.to("cuda")
        self.assertTrue(next(net.parameters()).is_cuda)
        self.assertClose(net(x.cuda()), expected, 1e-4)

    def test_attention_masks_are_made_on_the_inputs_device(self):
        layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True)
        x = orochi.randn(2, 5, 16, seed=7)
        padding = orochi.tensor([[False] * 5, [False, False, False, True, True]])
        causal = nn.MultiheadAttention(16, 4, batch_first=True)
        expected = (layer(x, src_key_padding_mask=padding), causal(x, x, x, is_causal=True,
                                                                    need_weights=False)[0])
        layer.to("cuda")
        causal.to("cuda")
        gx = x.cuda()
        self.assertClose(layer(gx, src_key_padding_mask=padding.cuda()), expected[0], 1e-4)
        self.assertClose(causal(gx, gx, gx, is_causal=True, need_weights=False)[0], expected[1],
                         1e-4)

    def test_memory_is_cached_and_counted(self):
        orochi.cuda.synchronize()
        before = orochi.cuda.memory_allocated()
        x = orochi.empty(1 << 20, device="cuda")
        self.assertGreaterEqual(orochi.cuda.memory_allocated(), before + 4 * (1 << 20))
        del x
        self.assertLessEqual(orochi.cuda.memory_allocated(), before)
        self.assertGreaterEqual(orochi.cuda.memory_reserved(), 4 * (1 << 20))
        stats = orochi.cuda.memory_stats()
        self.assertGreater(stats["total_bytes"], 0)
        y = orochi.empty(1 << 20, device="cuda")  # served from the cache
        self.assertGreater(orochi.cuda.memory_stats()["cache_hits"], stats["cache_hits"])
        del y
        orochi.cuda.empty_cache()


if __name__ == "__main__":
    unittest.main()
