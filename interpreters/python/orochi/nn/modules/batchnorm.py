"""BatchNorm1d and BatchNorm2d with running statistics, as in `torch.nn.modules.batchnorm`."""

import orochi
from orochi.nn import functional as F
from orochi.nn.init import _ones, _place, _zeros
from orochi.nn.modules.module import Module
from orochi.nn.parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d"]


class _BatchNorm(Module):
    _input_dims = ()  # the input ranks this flavour accepts

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(_ones((num_features,), device, dtype))
            self.bias = Parameter(_zeros((num_features,), device, dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _zeros((num_features,), device, dtype))
            self.register_buffer("running_var", _ones((num_features,), device, dtype))
            self.register_buffer("num_batches_tracked",
                                 _place(orochi.tensor(0, dtype=orochi.int64), device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _optional_state(self):
        # As PyTorch does for state dicts without version metadata (every safetensors file),
        # a missing num_batches_tracked is not an error: it only counts training steps.
        return ("num_batches_tracked",)

    def forward(self, input):
        if input.dim() not in self._input_dims:
            wanted = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"expected {wanted} input (got {input.dim()}D input)")
        mean, var = self.running_mean, self.running_var
        if mean is None:
            mean, var = self._batch_statistics(input)
        return F.batch_norm(input, mean, var, self.weight, self.bias, eps=self.eps)

    def _batch_statistics(self, input):
        """Per-channel mean and biased variance of this batch.

        Without running statistics PyTorch normalises with the batch's own, even in eval mode.
        Computed here, the functional only ever normalises with given statistics.
        """
        channels = input.shape[1]
        values = input.transpose(0, 1).reshape(channels, -1)  # (C, N * spatial)
        mean = values.mean(dim=1)
        centered = values - mean.unsqueeze(1)
        return mean, (centered * centered).mean(dim=1)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _input_dims = (4,)
