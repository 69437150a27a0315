"""orochi.nn: PyTorch-compatible layers for inference.

Laid out as torch.nn: each layer in the file of modules/ PyTorch keeps it in (linear.py,
conv.py, activation.py...), Parameter in parameter.py, the initial values in init.py.

    import orochi.nn as nn
    import orochi.nn.functional as F
"""

from orochi.nn import functional, init, parameter  # noqa: F401 (as torch.nn has them)
from orochi.nn.modules import (  # noqa: F401 (re-exported)
    AdaptiveAvgPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, Dropout, Embedding,
    Flatten, GELU, Identity, LayerNorm, Linear, MaxPool2d, Module, ModuleDict, ModuleList,
    MultiheadAttention, Parameter, ReLU, RMSNorm, Sequential, SiLU, Sigmoid, Softmax, Tanh,
    TransformerEncoderLayer,
)
from orochi.nn.modules import __all__ as _module_names
from orochi.nn import utils  # noqa: E402 (needs the modules above)

__all__ = ["functional", "utils", *_module_names]
