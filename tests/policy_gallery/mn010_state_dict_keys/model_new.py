"""Gallery: the linear layer under another name than Model's, so Model's weights do not load."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):  # EXPECT: MN010
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(*x.shape[:-1], self.linear.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.linear.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.linear.bias, 0.7978845608)
