"""Conv1d and Conv2d, as in `torch.nn.modules.conv`."""

import math

from orochi.nn import functional as F
from orochi.nn.init import _kaiming_uniform_bound, _uniform
from orochi.nn.modules.module import Module
from orochi.nn.modules.utils import _pair, _single
from orochi.nn.parameter import Parameter

__all__ = ["Conv1d", "Conv2d"]


class _ConvNd(Module):
    _to_tuple = None  # _single or _pair
    _functional = ""  # the name of the F function, looked up at call time

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, padding_mode, device, dtype):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            if padding_mode in ("reflect", "replicate", "circular"):
                raise NotImplementedError(
                    f"padding_mode='{padding_mode}' is not supported yet; only 'zeros' is")
            raise ValueError(f"padding_mode must be one of 'zeros', 'reflect', 'replicate' or "
                             f"'circular', but got padding_mode='{padding_mode}'")
        to_tuple = type(self)._to_tuple
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = to_tuple(kernel_size)
        self.stride = to_tuple(stride)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 "{'valid', 'same'}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = to_tuple(padding)
        self.dilation = to_tuple(dilation)
        self.transposed = False
        self.output_padding = to_tuple(0)
        self.groups = groups
        self.padding_mode = padding_mode

        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = _kaiming_uniform_bound(fan_in)
        shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(_uniform(shape, bound, device, dtype))
        if bias:
            self.bias = Parameter(_uniform((out_channels,), bound, device, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        conv = getattr(F, self._functional)
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                    self.groups)

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * len(self.padding):
            text += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class Conv1d(_ConvNd):
    _to_tuple = staticmethod(_single)
    _functional = "conv1d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


class Conv2d(_ConvNd):
    _to_tuple = staticmethod(_pair)
    _functional = "conv2d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)
