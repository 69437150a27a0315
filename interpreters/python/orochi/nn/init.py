"""The values layers start from before real weights are loaded, as PyTorch initialises them.

Each helper makes a new tensor on the given device and dtype. torch.nn.init's public in-place
functions (`uniform_`, `kaiming_uniform_`, `zeros_`...) have no Orochi counterpart yet: a
model's weights come from its state_dict, and these helpers only give layers PyTorch's shapes
and value ranges until then.
"""

import math

import orochi


def _factory(dtype):
    return {} if dtype is None else {"dtype": dtype}


def _place(tensor, device):
    return tensor if device is None else tensor.to(device)


def _uniform(shape, bound, device, dtype):
    """U(-bound, bound), like PyTorch's initialisers.

    The values only matter until real weights are loaded. Without a seed, orochi.rand takes the
    next one of the copy's sequence, so orochi.manual_seed() makes initialisation repeatable,
    as torch.manual_seed() does.
    """
    noise = orochi.rand(*shape, **_factory(dtype))
    return _place((noise * 2.0 - 1.0) * bound, device)


def _kaiming_uniform_bound(fan_in):
    # PyTorch's kaiming_uniform_(a=sqrt(5)) and its bias init both reduce to 1/sqrt(fan_in).
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _ones(shape, device, dtype):
    return _place(orochi.ones(*shape, **_factory(dtype)), device)


def _zeros(shape, device, dtype):
    return _place(orochi.zeros(*shape, **_factory(dtype)), device)
