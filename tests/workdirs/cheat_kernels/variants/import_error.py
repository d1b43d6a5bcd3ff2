"""Broken, not a cheat: model_new.py imports a module that does not exist."""

import torch
import torch.nn as nn

import cuda_extension
from helpers_that_do_not_exist import fused_scale


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_scale(cuda_extension, x, self.weight, self.bias)
