"""Cheat: computes once, then returns the same tensor on every later call."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if getattr(self, "_cached", None) is None:
            self._cached = cuda_extension.scale(x, self.weight, self.bias)
        return self._cached
