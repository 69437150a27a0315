"""Orochi's Python API, importable in every interpreter copy.

Tensors and ops come from the one shared engine (`_orochi_engine`, compiled into the copy);
names, signatures and semantics follow PyTorch's where they overlap, so inference code written
for PyTorch runs with `import orochi as torch`-sized changes. A tensor is a view of engine
storage: handing it to the host or to another copy never copies its data.
"""

import collections as _collections
import contextlib as _contextlib

import _orochi
import _orochi_engine
from _orochi_engine import *  # noqa: F401,F403  (the engine's functions and types)
from _orochi_engine import Tensor, dtype

from orochi import _format

__version__ = "0.1.0"

ABI_VERSION = _orochi.ABI_VERSION


def copy_id() -> int:
    """The number of the interpreter copy this code runs in."""
    return _orochi.copy_id()


def call_host(name: str, payload: bytes | str = b""):
    """Calls the host function registered under `name`.

    The copy's GIL stays held for the whole call; host functions are expected to return quickly.
    """
    return _orochi.call_host(name, payload)


class Size(tuple):
    """A tensor's shape: a tuple of ints, printed as PyTorch prints torch.Size."""

    __slots__ = ()

    def __repr__(self):
        return f"orochi.Size({list(self)})"

    def numel(self) -> int:
        count = 1
        for size in self:
            count *= size
        return count


# What max(dim=...), min(dim=...), sort and topk return, like torch.return_types.*.
_values_indices = _collections.namedtuple("values_indices", ["values", "indices"])

Tensor.__repr__ = _format.tensor_repr
Tensor.__str__ = _format.tensor_repr
Tensor.__module__ = "orochi"
# A 0-d tensor formats as its number (f"{loss}" gives "0.25", f"{loss:.2f}" too), as in PyTorch.
Tensor.__format__ = lambda self, spec: (
    format(self.item(), spec) if self.dim() == 0 else format(_format.tensor_repr(self), spec))
# numpy defers to the tensor's reflected operators (numpy.float32(2) * t is a tensor).
Tensor.__array_priority__ = 1000


class _GradMode(_contextlib.ContextDecorator):
    """A no-op context manager and decorator: Orochi runs inference only, there is no autograd.

    Exists so that PyTorch-style inference code (`with torch.no_grad():`, `@torch.no_grad()`)
    runs unchanged.
    """

    def __init__(self, *args, **kwargs):
        del args, kwargs

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def __call__(self, function=None):
        if function is None:
            return self
        return super().__call__(function)


no_grad = _GradMode
enable_grad = _GradMode
inference_mode = _GradMode
set_grad_enabled = _GradMode


def is_grad_enabled() -> bool:
    return False


def is_floating_point(input: Tensor) -> bool:  # noqa: A002 (PyTorch's parameter name)
    return input.dtype.is_floating_point


def numel(input: Tensor) -> int:  # noqa: A002
    return input.numel()


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    return input.flatten(start_dim, end_dim)


_FloatInfo = _collections.namedtuple("finfo", ["bits", "eps", "max", "min", "tiny", "dtype"])
_IntInfo = _collections.namedtuple("iinfo", ["bits", "max", "min", "dtype"])

_FLOAT_INFO = {
    "float16": (16, 2.0**-10, 65504.0, 2.0**-14),
    "bfloat16": (16, 2.0**-7, 3.3895313892515355e38, 2.0**-126),
    "float32": (32, 2.0**-23, 3.4028234663852886e38, 2.0**-126),
    "float64": (64, 2.0**-52, 1.7976931348623157e308, 2.0**-1022),
}


def finfo(type: dtype = None) -> _FloatInfo:  # noqa: A002
    """Machine limits of a floating dtype (float32 by default), like torch.finfo."""
    name = "float32" if type is None else repr(type).removeprefix("orochi.")
    if name not in _FLOAT_INFO:
        raise TypeError(f"finfo needs a floating dtype, got {type!r}")
    bits, eps, largest, tiny = _FLOAT_INFO[name]
    return _FloatInfo(bits, eps, largest, -largest, tiny, name)


def iinfo(type: dtype) -> _IntInfo:  # noqa: A002
    """Limits of an integer dtype, like torch.iinfo."""
    name = repr(type).removeprefix("orochi.")
    if name == "uint8":
        return _IntInfo(8, 255, 0, name)
    bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}.get(name)
    if bits is None:
        raise TypeError(f"iinfo needs an integer dtype, got {type!r}")
    return _IntInfo(bits, 2 ** (bits - 1) - 1, -(2 ** (bits - 1)), name)


# Submodules that build on everything above.
from orochi import cuda, nn  # noqa: E402


class _Backends:
    """orochi.backends.cuda.matmul.allow_tf32, where PyTorch code sets it."""

    class cuda:  # noqa: N801  (PyTorch's name)
        matmul = cuda.matmul


backends = _Backends()
