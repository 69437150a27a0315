"""MaxPool2d, AvgPool2d and AdaptiveAvgPool2d, as in `torch.nn.modules.pooling`."""

from orochi.nn import functional as F
from orochi.nn.modules.module import Module
from orochi.nn.modules.utils import _pair

__all__ = ["MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        if return_indices:
            raise NotImplementedError("MaxPool2d(return_indices=True) is not supported")
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input):
        # Options left at their defaults are not passed, so only a model that needs them
        # depends on the functional supporting them.
        options = {}
        if _pair(self.dilation) != (1, 1):
            options["dilation"] = self.dilation
        if self.ceil_mode:
            options["ceil_mode"] = True
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, **options)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):
        options = {}  # as in MaxPool2d: only the non-default ones
        if self.ceil_mode:
            options["ceil_mode"] = True
        if not self.count_include_pad:
            options["count_include_pad"] = False
        if self.divisor_override is not None:
            options["divisor_override"] = self.divisor_override
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, **options)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"
