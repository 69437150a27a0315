"""orochi.nn.functional called directly: results on small hand-checked cases and the errors
for wrong dtypes, shapes, devices and unsupported options. (Module-level parity with PyTorch
is in test_nn_parity.)"""

import math
import unittest

import orochi
import orochi.nn.functional as F


def t(data, dtype=None):
    return orochi.tensor(data, dtype=dtype)


class FunctionalTest(unittest.TestCase):
    def assertClose(self, actual, expected, places=5):
        flat_actual = actual.flatten().tolist()
        flat_expected = t(expected).flatten().tolist()
        self.assertEqual(len(flat_actual), len(flat_expected))
        for got, want in zip(flat_actual, flat_expected):
            self.assertAlmostEqual(got, want, places=places)

    def test_linear(self):
        x = t([[1.0, 2.0]])
        w = t([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        self.assertClose(F.linear(x, w), [[1, 2, 3]])
        self.assertClose(F.linear(x, w, t([1.0, 1.0, 1.0])), [[2, 3, 4]])
        with self.assertRaisesRegex(RuntimeError, r"linear: the input's last dim must be "
                                                  r"in_features = 2 \(weight \[3, 2\]\), got input \[1, 3\]"):
            F.linear(t([[1.0, 2.0, 3.0]]), w)
        with self.assertRaisesRegex(RuntimeError, "linear: the bias must have out_features = 3"):
            F.linear(x, w, t([1.0]))
        with self.assertRaisesRegex(TypeError, "expected a tensor or None, got int"):
            F.linear(x, w, 1)

    def test_convolutions_and_padding_modes(self):
        x = orochi.arange(16, dtype=orochi.float32).view(1, 1, 4, 4)
        ones = orochi.ones(1, 1, 2, 2)
        self.assertClose(F.conv2d(x, ones), [[[[10, 14, 18], [26, 30, 34], [42, 46, 50]]]])
        self.assertEqual(F.conv2d(x, ones, stride=2).shape, (1, 1, 2, 2))
        self.assertEqual(F.conv2d(x, ones, padding=(1, 0)).shape, (1, 1, 5, 3))
        self.assertEqual(F.conv2d(x, ones, padding="same").shape, (1, 1, 4, 4))
        self.assertEqual(F.conv2d(x, ones, padding="valid").shape, (1, 1, 3, 3))
        self.assertEqual(F.conv2d(x, ones, dilation=2).shape, (1, 1, 2, 2))
        signal = orochi.arange(5, dtype=orochi.float32).view(1, 1, 5)
        self.assertClose(F.conv1d(signal, orochi.ones(1, 1, 2)), [[[1, 3, 5, 7]]])
        self.assertEqual(F.conv1d(signal, orochi.ones(2, 1, 3), padding="same").shape, (1, 2, 5))
        with self.assertRaisesRegex(ValueError, "padding='same' is not supported for strided"):
            F.conv2d(x, ones, stride=2, padding="same")
        with self.assertRaisesRegex(ValueError, "'full'"):
            F.conv2d(x, ones, padding="full")
        with self.assertRaisesRegex(RuntimeError, "conv2d"):
            F.conv2d(x, orochi.ones(1, 2, 2, 2))
        with self.assertRaisesRegex(ValueError, r"conv2d: expected a 4-D \(batched\) or 3-D input, "
                                                r"got shape \[4, 4\]"):
            F.conv2d(orochi.ones(4, 4), ones)
        with self.assertRaisesRegex(ValueError, "conv1d: expected a 3-D weight"):
            F.conv1d(signal, orochi.ones(2, 2))

    def test_conv2d_epilogue(self):
        # relu(conv2d(x) + residual) as one op, against the ops it stands for.
        x = orochi.randn(2, 4, 6, 6)
        weight = orochi.randn(8, 4, 3, 3)
        bias = orochi.randn(8)
        residual = orochi.randn(2, 8, 6, 6)
        plain = F.conv2d(x, weight, bias, padding=1)
        self.assertClose(F.conv2d(x, weight, bias, padding=1, residual=residual),
                         plain + residual)
        self.assertClose(F.conv2d(x, weight, bias, padding=1, residual=residual,
                                  activation="relu"), (plain + residual).relu())
        self.assertClose(F.conv2d(x, weight, bias, padding=1, activation="relu"), plain.relu())
        self.assertIn("relu", F.CONV2D_ACTIVATIONS)
        with self.assertRaisesRegex(ValueError, "activation must be None or 'relu', got 'gelu'"):
            F.conv2d(x, weight, activation="gelu")
        with self.assertRaisesRegex(RuntimeError, "the residual must have the output's shape"):
            F.conv2d(x, weight, residual=residual)  # no padding: the output is [2, 8, 4, 4]

    def test_fuse_conv_bn_eval(self):
        conv = orochi.nn.Conv2d(4, 8, 3, padding=1, bias=False)
        bn = orochi.nn.BatchNorm2d(8)
        bn.running_mean = orochi.randn(8)
        bn.running_var = orochi.rand(8) + 0.5
        bn.weight = orochi.nn.Parameter(orochi.randn(8))
        bn.bias = orochi.nn.Parameter(orochi.randn(8))
        fused = orochi.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)
        x = orochi.randn(2, 4, 6, 6)
        self.assertClose(fused(x), bn(conv(x)), places=4)
        self.assertTrue(fused.weight.is_read_only and fused.bias.is_read_only)
        self.assertIs(orochi.nn.utils.fuse_conv_bn_eval, orochi.nn.utils.fusion.fuse_conv_bn_eval)
        with_bias = orochi.nn.Conv2d(4, 8, 1)
        self.assertClose(orochi.nn.utils.fusion.fuse_conv_bn_eval(with_bias, bn)(x),
                         bn(with_bias(x)), places=4)
        bn.running_mean = bn.running_var = None
        with self.assertRaisesRegex(ValueError, "no running statistics"):
            orochi.nn.utils.fusion.fuse_conv_bn_eval(conv, bn)

    def test_pad(self):
        x = t([[1.0, 2.0]])
        self.assertClose(F.pad(x, (1, 2)), [[0, 1, 2, 0, 0]])
        self.assertClose(F.pad(x, (0, 0, 1, 0), value=5.0), [[5, 5], [1, 2]])
        with self.assertRaisesRegex(RuntimeError, "even number"):
            F.pad(x, (1,))
        with self.assertRaisesRegex(ValueError, "only mode='constant'"):
            F.pad(x, (1, 1), mode="reflect")

    def test_pooling(self):
        x = orochi.arange(16, dtype=orochi.float32).view(1, 1, 4, 4)
        self.assertClose(F.max_pool2d(x, 2), [[[[5, 7], [13, 15]]]])
        self.assertClose(F.avg_pool2d(x, 2), [[[[2.5, 4.5], [10.5, 12.5]]]])
        self.assertClose(F.adaptive_avg_pool2d(x, 1), [[[[7.5]]]])
        self.assertEqual(F.adaptive_avg_pool2d(x, (None, 2)).shape, (1, 1, 4, 2))
        self.assertEqual(F.max_pool2d(x, 3, stride=1, padding=1).shape, (1, 1, 4, 4))
        with self.assertRaisesRegex(NotImplementedError, "ceil_mode=True is not supported"):
            F.max_pool2d(x, 2, ceil_mode=True)
        with self.assertRaisesRegex(NotImplementedError, "count_include_pad=False"):
            F.avg_pool2d(x, 2, count_include_pad=False)

    def test_normalisation(self):
        x = t([[1.0, 2.0, 3.0, 4.0]])
        mean, var = 2.5, 1.25
        expected = [(v - mean) / math.sqrt(var + 1e-5) for v in (1, 2, 3, 4)]
        self.assertClose(F.layer_norm(x, (4,)), [expected])
        self.assertClose(F.layer_norm(x, 4, t([2.0] * 4), t([1.0] * 4)),
                         [[2 * v + 1 for v in expected]])
        rms = math.sqrt((1 + 4 + 9 + 16) / 4 + 1e-6)
        self.assertClose(F.rms_norm(x, [4], eps=1e-6), [[v / rms for v in (1, 2, 3, 4)]])
        self.assertClose(F.rms_norm(x, [4]), [[v / math.sqrt(7.5) for v in (1, 2, 3, 4)]], places=4)
        images = orochi.ones(2, 3, 2, 2)
        normalised = F.batch_norm(images, t([1.0, 0.0, 2.0]), t([1.0, 4.0, 1.0]), eps=0.0)
        self.assertClose(normalised[0, :, 0, 0], [0.0, 0.5, -1.0])
        with self.assertRaisesRegex(NotImplementedError, "inference only"):
            F.batch_norm(images, t([0.0] * 3), t([1.0] * 3), training=True)
        with self.assertRaisesRegex(RuntimeError, "layer_norm"):
            F.layer_norm(x, (3,))

    def test_embedding_and_activations(self):
        table = t([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
        self.assertClose(F.embedding(t([[2, 0]]), table), [[[2, 2], [0, 0]]])
        with self.assertRaisesRegex(RuntimeError, "embedding: indices must be an integer tensor, "
                                                  "got float32"):
            F.embedding(t([0.5]), table)
        with self.assertRaisesRegex(IndexError, "out of range"):
            F.embedding(t([3]), table)
        x = t([-1.0, 0.0, 2.0])
        self.assertClose(F.relu(x), [0, 0, 2])
        self.assertClose(F.silu(x), [v / (1 + math.exp(-v)) for v in (-1, 0, 2)])
        self.assertClose(F.gelu(x), [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in (-1, 0, 2)])
        self.assertClose(F.tanh(x), [math.tanh(v) for v in (-1, 0, 2)])
        self.assertClose(F.sigmoid(x), [1 / (1 + math.exp(-v)) for v in (-1, 0, 2)])
        self.assertClose(F.softmax(x, dim=0).sum(), 1.0)
        self.assertClose(F.log_softmax(x, 0).exp().sum(), 1.0)
        self.assertIs(F.dropout(x, 0.3, training=False), x)
        with self.assertRaisesRegex(NotImplementedError, "inference only"):
            F.dropout(x, 0.3)  # PyTorch's default is training=True
        y = t([-1.0, 2.0])
        self.assertIs(F.relu(y, inplace=True), y)
        self.assertEqual(y.tolist(), [0.0, 2.0])
        with self.assertRaisesRegex(ValueError, "between 0 and 1"):
            F.dropout(x, 2.0)
        with self.assertRaisesRegex(ValueError, "approximate must be 'none' or 'tanh'"):
            F.gelu(x, approximate="fast")

    def test_scaled_dot_product_attention(self):
        q = t([[[1.0, 0.0], [0.0, 1.0]]])
        k = t([[[1.0, 0.0], [0.0, 1.0]]])
        v = t([[[1.0, 2.0], [3.0, 4.0]]])
        weight = math.exp(1 / math.sqrt(2))
        first = (weight * 1 + 3) / (weight + 1)
        out = F.scaled_dot_product_attention(q, k, v)
        self.assertAlmostEqual(out[0, 0, 0].item(), first, places=5)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        self.assertClose(causal[0, 0], [1, 2])
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=t([[True, False], [True, True]]))
        self.assertClose(masked[0, 0], [1, 2])
        self.assertClose(F.scaled_dot_product_attention(q, k, v, scale=0.0)[0, 0], [2, 3])
        with self.assertRaisesRegex(ValueError, "dropout_p must be 0"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        with self.assertRaisesRegex(RuntimeError, "scaled_dot_product_attention: .* disagree"):
            F.scaled_dot_product_attention(q, orochi.ones(1, 2, 3), v)

    def test_devices_and_dtypes_are_checked(self):
        absent = orochi.cuda.device_count()  # one past the last GPU, if any
        with self.assertRaisesRegex(ValueError, f"'cuda:{absent}' is not available"):
            orochi.ones(2, device=orochi.device("cuda", absent))
        with self.assertRaisesRegex(RuntimeError, "int64"):
            F.softmax(t([1, 2]), dim=0)
        with self.assertRaisesRegex(RuntimeError, "layer_norm is not implemented for dtype int64 "
                                                  "on cpu"):
            F.layer_norm(t([1, 2]), (2,))


if __name__ == "__main__":
    unittest.main()
