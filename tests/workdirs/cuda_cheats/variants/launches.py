"""Honest: the correct kernel launched 256 times per call (about 500 us of GPU work in short kernels),
the yardstick for launches_halved.py."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(255):
            cuda_extension.scale(x, self.weight, self.bias, config=0)
        return cuda_extension.scale(x, self.weight, self.bias, config=0)
