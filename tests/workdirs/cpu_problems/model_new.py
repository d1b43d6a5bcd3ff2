"""The cpu_problems example workdir as it stands: nn.LayerNorm, by a C++ kernel with its weight and bias (variants/ holds the other problems and the planted cheats)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layer_norm(x, self.ln.weight, self.ln.bias, self.ln.eps)
