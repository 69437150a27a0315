"""Activations and MultiheadAttention, as in `torch.nn.modules.activation`."""

import math

import orochi
from orochi.nn import functional as F
from orochi.nn.init import _uniform, _zeros
from orochi.nn.modules.linear import NonDynamicallyQuantizableLinear
from orochi.nn.modules.module import Module, _is_floating
from orochi.nn.parameter import Parameter

__all__ = ["ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "MultiheadAttention"]


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate argument must be either none or tanh, "
                             f"got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            # PyTorch's legacy implicit dim (it warns; so should callers' code reviewers).
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return F.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


def _additive_mask(mask, dtype):
    """PyTorch's MHA masks as an additive float mask: bool True means "may NOT attend"."""
    if mask.dtype == orochi.bool:
        return orochi.zeros(*mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf"))
    if not _is_floating(mask):
        raise AssertionError("only bool and floating types of masks are supported")
    return mask if mask.dtype == dtype else mask.to(dtype)


def _causal_mask(length, source_length, device):
    """Bool (L, S) on `device`, True above the diagonal: the positions a causal query may not
    see."""
    rows = orochi.arange(length, device=device).reshape(length, 1)
    cols = orochi.arange(source_length, device=device).reshape(1, source_length)
    return cols > rows


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention with equal query, key and value sizes.

    Masks follow PyTorch's MHA convention (bool True = not allowed; float masks are added),
    and are turned into the additive form that scaled_dot_product_attention takes.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if not self._qkv_same_embed_dim:
            raise NotImplementedError("MultiheadAttention with kdim or vdim different from "
                                      "embed_dim is not supported")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention(add_bias_kv=True or "
                                      "add_zero_attn=True) is not supported")
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")

        # Xavier-uniform over the (3E, E) packed projection, as PyTorch initialises it.
        bound = math.sqrt(6.0 / (4 * embed_dim))
        self.in_proj_weight = Parameter(_uniform((3 * embed_dim, embed_dim), bound, device,
                                                 dtype))
        if bias:
            self.in_proj_bias = Parameter(_zeros((3 * embed_dim,), device, dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        device=device, dtype=dtype)
        if bias:
            self.out_proj.bias.zero_()  # as PyTorch's _reset_parameters
        self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn

    def _project(self, query, key, value):
        weight, bias = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:
            # Self-attention: one GEMM for the three projections.
            return F.linear(query, weight, bias).chunk(3, dim=-1)
        weights = weight.chunk(3)
        biases = bias.chunk(3) if bias is not None else (None, None, None)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """Returns (output, weights): weights averaged over heads unless average_attn_weights
        is False, None unless need_weights. is_causal without attn_mask applies a causal mask.
        """
        batched = query.dim() == 3
        self_attention = query is key and key is value
        if not batched:
            # Unbatched (L, E): work on a batch of one.
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            # (L, N, E) -> (N, L, E)
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if self_attention:
            key = value = query

        batch, length, _ = query.shape
        source_length = key.shape[1]
        heads, head_dim = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        q, k, v = (x.reshape(batch, -1, heads, head_dim).permute(0, 2, 1, 3) for x in (q, k, v))

        if attn_mask is None and is_causal:
            attn_mask = _causal_mask(length, source_length, q.device)
        mask = None
        if attn_mask is not None:
            mask = _additive_mask(attn_mask, q.dtype)
            if mask.dim() == 2:
                mask = mask.reshape(1, 1, length, source_length)
            else:  # (N * heads, L, S)
                mask = mask.reshape(batch, heads, length, source_length)
        if key_padding_mask is not None:
            padding = _additive_mask(key_padding_mask, q.dtype).reshape(batch, 1, 1,
                                                                        source_length)
            mask = padding if mask is None else mask + padding

        if need_weights:
            scores = (q * (1.0 / math.sqrt(head_dim))) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores + mask
            weights = scores.softmax(-1)
            output = weights @ v
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            weights = None

        output = output.permute(0, 2, 1, 3).reshape(batch, length, self.embed_dim)
        output = self.out_proj(output)
        if not batched:
            output = output.squeeze(0)
            if weights is not None:
                weights = weights.squeeze(0)
        elif not self.batch_first:
            output = output.transpose(0, 1)
        return output, weights
