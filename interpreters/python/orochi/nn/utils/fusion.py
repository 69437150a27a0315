"""orochi.nn.utils.fusion: fold an eval-mode batch norm into the convolution before it.

`fuse_conv_bn_eval(conv, bn)` returns a new convolution computing `bn(conv(x))` in one op, as
`torch.nn.utils.fusion.fuse_conv_bn_eval` does: with s = bn.weight / sqrt(running_var + eps),
the weight becomes conv.weight * s (per output channel) and the bias
(conv.bias - running_mean) * s + bn.bias. The result equals the two ops up to float rounding
(the fold is computed in float64 and rounded once). The new weight and bias are read-only, like
weights loaded from a package, so the engine prepares their layout once rather than per call.
Folding a loaded (read-only) weight is done once by the engine and kept beside it: every copy of
the model that folds the same batch norm into the same weight gets the same tensors, so the
folded weights are held once, not once per copy.
"""

import _orochi_engine as _engine

from orochi.nn.parameter import Parameter


def fuse_conv_bn_eval(conv, bn, transpose: bool = False):
    """A new convolution equal to `bn(conv(x))` for an eval-mode `bn` with running statistics."""
    if transpose:
        raise NotImplementedError("fuse_conv_bn_eval: transposed convolutions are not supported "
                                  "by Orochi's engine")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fuse_conv_bn_eval: the batch norm has no running statistics (it "
                         "normalises with each batch's own, which no fixed weight can express)")
    fused = type(conv)(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                       conv.padding, conv.dilation, conv.groups, bias=True,
                       padding_mode=conv.padding_mode, device=conv.weight.device,
                       dtype=conv.weight.dtype)
    fused.weight, fused.bias = fuse_conv_bn_weights(conv.weight, conv.bias, bn.running_mean,
                                                    bn.running_var, bn.eps, bn.weight, bn.bias)
    return fused


def fuse_conv_bn_weights(conv_w, conv_b, bn_rm, bn_rv, bn_eps, bn_w, bn_b,
                         transpose: bool = False):
    """(weight, bias) of the convolution equal to conv followed by batch norm (PyTorch's name
    and arguments); conv_b, bn_w and bn_b may be None (zeros, ones, zeros)."""
    if transpose:
        raise NotImplementedError("fuse_conv_bn_weights: transposed convolutions are not "
                                  "supported by Orochi's engine")
    weight, bias = _engine._fold_batch_norm(  # noqa: SLF001 (the engine's own helper)
        conv_w, conv_b, bn_rm, bn_rv, float(bn_eps), bn_w, bn_b)
    return Parameter(weight), Parameter(bias)
