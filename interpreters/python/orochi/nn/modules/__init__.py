"""Inference-only neural-network modules with PyTorch's names, arguments and state_dict keys.

A model written against `torch.nn` runs here once `torch` is replaced by `orochi`, and a
PyTorch `state_dict` exported to safetensors loads unchanged: every module registers its
parameters and buffers under the same names, in the same order, as its PyTorch namesake.

Orochi only runs inference, so modules are always in eval mode, there is no autograd and
`train(True)` refuses. `load_state_dict` binds the given tensors instead of copying into the
module's own, so read-only weights memory-mapped from a safetensors file are shared by every
interpreter copy without a copy.

Each layer lives in the file PyTorch keeps it in (`linear.py`, `conv.py`, `activation.py`...);
this package re-exports them all, as `torch.nn.modules` does.
"""

from orochi.nn.modules.activation import (
    GELU, MultiheadAttention, ReLU, SiLU, Sigmoid, Softmax, Tanh,
)
from orochi.nn.modules.batchnorm import BatchNorm1d, BatchNorm2d
from orochi.nn.modules.container import ModuleDict, ModuleList, Sequential
from orochi.nn.modules.conv import Conv1d, Conv2d
from orochi.nn.modules.dropout import Dropout
from orochi.nn.modules.flatten import Flatten
from orochi.nn.modules.linear import Identity, Linear
from orochi.nn.modules.module import Module
from orochi.nn.modules.normalization import LayerNorm, RMSNorm
from orochi.nn.modules.pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from orochi.nn.modules.sparse import Embedding
from orochi.nn.modules.transformer import TransformerEncoderLayer
from orochi.nn.parameter import Parameter

__all__ = [
    "Parameter", "Module", "Identity", "Linear", "Conv1d", "Conv2d", "BatchNorm1d",
    "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout", "ReLU", "GELU", "SiLU",
    "Tanh", "Sigmoid", "Softmax", "Flatten", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
    "Sequential", "ModuleList", "ModuleDict", "MultiheadAttention", "TransformerEncoderLayer",
]
