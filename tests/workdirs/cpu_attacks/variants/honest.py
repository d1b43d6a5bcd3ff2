"""The attack workdir's honest custom path (kernels/bias.cpp's add_bias), for attacks carried by an extension planted in kernels/."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.add_bias(x, self.bias)
