"""The reference problem of the example workdirs: y = x * weight + bias, per feature."""

import torch
import torch.nn as nn

batch_size = 16
features = 64


class Model(nn.Module):
    """A learnable per-feature scale and shift of a (batch_size, features) input."""

    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
