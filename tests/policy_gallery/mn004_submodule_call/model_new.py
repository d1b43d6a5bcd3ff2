"""Gallery: the nn.Linear kept for its parameters is called."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)  # EXPECT: MN004
        return cuda_extension.gelu(y, None, 0.7978845608)
