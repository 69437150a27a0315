"""orochi.nn.utils: PyTorch's module utilities that make sense for inference."""

from orochi.nn.utils import fusion  # noqa: F401 (orochi.nn.utils.fusion, as in PyTorch)
from orochi.nn.utils.fusion import fuse_conv_bn_eval, fuse_conv_bn_weights  # noqa: F401
