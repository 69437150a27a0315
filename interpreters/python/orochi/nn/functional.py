"""orochi.nn.functional: PyTorch's functional ops, computed by the shared engine.

The heavy lifting happens in the engine's kernels; this module gives them PyTorch's names and
keyword arguments (including the training-only ones, which inference accepts and ignores where
that is exact, and refuses where it would silently change the result).
"""

import _orochi_engine as _engine
from _orochi_engine import (  # noqa: F401 (re-exported under PyTorch's names)
    adaptive_avg_pool2d,
    conv1d,
    conv2d,
    linear,
    log_softmax as _log_softmax,
    pad,
    scaled_dot_product_attention,
    softmax as _softmax,
)

# The activations conv2d applies as it writes its output (keyword-only `activation=`, with an
# optional `residual=` added before it): relu(conv2d(x, w, b) + residual) in one op and one pass.
# An Orochi extension, so model code that also runs under PyTorch can test for it.
CONV2D_ACTIVATIONS = ("relu",)


def _result(input, output, inplace: bool):  # noqa: A002
    """Writes `output` into `input` when the caller asked for in-place (callers may rely on it)."""
    if not inplace:
        return output
    return input.copy_(output)


def relu(input, inplace: bool = False):  # noqa: A002 (PyTorch's parameter names)
    return _result(input, _engine.relu(input), inplace)


def gelu(input, approximate: str = "none"):  # noqa: A002
    return _engine.gelu(input, approximate)


def silu(input, inplace: bool = False):  # noqa: A002
    return _result(input, _engine.silu(input), inplace)


def tanh(input):  # noqa: A002
    return _engine.tanh(input)


def sigmoid(input):  # noqa: A002
    return _engine.sigmoid(input)


def softmax(input, dim: int, dtype=None):  # noqa: A002
    return _softmax(input, dim, dtype)


def log_softmax(input, dim: int, dtype=None):  # noqa: A002
    return _log_softmax(input, dim, dtype)


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):  # noqa: A002
    """Identity at inference (training=False); training-mode dropout is refused rather than
    silently skipped. The default is PyTorch's (training=True): pass training=self.training."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if training and p > 0:
        raise NotImplementedError("dropout with training=True: Orochi runs inference only")
    del inplace
    return input


def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5):
    if training:
        raise NotImplementedError("batch_norm with training=True: Orochi runs inference only "
                                  "and normalises with the running statistics")
    del momentum
    return _engine.batch_norm(input, running_mean, running_var, weight, bias, eps)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):  # noqa: A002
    return _engine.layer_norm(input, _as_shape(normalized_shape), weight, bias, eps)


def rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002
    """torch.nn.functional.rms_norm; eps=None means the machine epsilon of the input's dtype."""
    if eps is None:
        import orochi  # noqa: PLC0415 (orochi imports this module while it initialises)

        eps = orochi.finfo(input.dtype).eps
    return _engine.rms_norm(input, _as_shape(normalized_shape), weight, eps)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type: float = 2.0,  # noqa: A002
              scale_grad_by_freq: bool = False, sparse: bool = False):
    if max_norm is not None:
        raise NotImplementedError("embedding with max_norm renormalises the weights in place, "
                                  "which shared read-only weights cannot allow")
    del padding_idx, norm_type, scale_grad_by_freq, sparse  # only affect training
    return _engine.embedding(input, weight)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode: bool = False, return_indices: bool = False):
    _unsupported("max_pool2d", dilation=(dilation not in (1, (1, 1)), dilation),
                 ceil_mode=(ceil_mode, ceil_mode), return_indices=(return_indices, return_indices))
    return _engine.max_pool2d(input, kernel_size, stride, padding)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,  # noqa: A002
               count_include_pad: bool = True, divisor_override=None):
    _unsupported("avg_pool2d", ceil_mode=(ceil_mode, ceil_mode),
                 count_include_pad=(not count_include_pad, count_include_pad),
                 divisor_override=(divisor_override is not None, divisor_override))
    return _engine.avg_pool2d(input, kernel_size, stride, padding)


def _unsupported(function: str, **options) -> None:
    """Refuses options the engine does not implement, naming them, instead of ignoring them."""
    for name, (used, value) in options.items():
        if used:
            raise NotImplementedError(f"{function}: {name}={value!r} is not supported by Orochi's "
                                      "engine yet")


def _as_shape(shape):
    """A shape given as an int or a sequence of ints, as a tuple (the norm layers use it too)."""
    return (shape,) if isinstance(shape, int) else tuple(shape)
