"""BatchNorm1d in eval mode with its running statistics, weight and bias: right in every state."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.bn
        return cuda_extension.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps)
