"""Dropout, as in `torch.nn.modules.dropout` (an identity at inference)."""

from orochi.nn.modules.module import Module

__all__ = ["Dropout"]


class Dropout(Module):
    """Identity at inference; kept so models and their reprs match PyTorch's."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return input

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"
