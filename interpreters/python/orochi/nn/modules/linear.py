"""Identity and Linear, as in `torch.nn.modules.linear`."""

from orochi.nn import functional as F
from orochi.nn.init import _kaiming_uniform_bound, _uniform
from orochi.nn.modules.module import Module
from orochi.nn.parameter import Parameter

__all__ = ["Identity", "Linear"]


class Identity(Module):
    def __init__(self, *args, **kwargs):
        del args, kwargs  # accepted and ignored, as by PyTorch
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        bound = _kaiming_uniform_bound(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound, device, dtype))
        if bias:
            self.bias = Parameter(_uniform((out_features,), bound, device, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """MultiheadAttention's out_proj; PyTorch's class name shows in repr()."""
