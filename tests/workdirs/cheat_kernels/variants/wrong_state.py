"""Broken, not a cheat: ModelNew names its parameters differently from Model (scale/shift, not weight/bias)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))
        self.shift = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.scale(x, self.scale, self.shift)
