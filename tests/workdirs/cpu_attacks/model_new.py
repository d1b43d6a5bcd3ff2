"""The attack workdir's custom path: kernels/bias.cpp's drop_bias, which leaves the bias out (wrong on purpose)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.drop_bias(x, self.bias)
