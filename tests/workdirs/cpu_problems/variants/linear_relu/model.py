"""Reference: Linear, a bias added, ReLU (KernelBench level 2 in small; bias_shape derived from out_features)."""

import torch
import torch.nn as nn

batch_size = 16
in_features = 32
out_features = 24
bias_shape = (out_features,)


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x) + self.bias)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, bias_shape]
