"""Gallery problem: a learnable per-feature scale and shift, y = x * weight + bias, x of shape (batch_size, features)."""

import torch
import torch.nn as nn

batch_size = 4096
features = 2048


class Model(nn.Module):
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
