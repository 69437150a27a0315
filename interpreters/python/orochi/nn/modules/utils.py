"""Argument helpers shared by the layers (PyTorch's `torch.nn.modules.utils`)."""

import itertools
from collections.abc import Iterable


def _ntuple(n, name):
    def parse(x):
        if isinstance(x, Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(itertools.repeat(x, n))

    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")
