"""Linear + bias + ReLU fused in one C++ kernel that takes a bias of out_features: right on every shape."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias_shape: tuple):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.linear_bias_relu(x, self.linear.weight, self.linear.bias, self.bias)
