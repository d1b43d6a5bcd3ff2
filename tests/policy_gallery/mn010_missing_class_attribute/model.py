"""Reference: a linear layer built by a helper method and widened by a class attribute, then GELU."""

import math

import torch
import torch.nn as nn

batch_size = 8
in_features = 96
out_features = 80


class Model(nn.Module):
    expansion = 1

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = self._make_fc(in_features, out_features * self.expansion, bias)

    def _make_fc(self, in_features: int, out_features: int, bias: bool) -> nn.Linear:
        return nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y.pow(3))))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
