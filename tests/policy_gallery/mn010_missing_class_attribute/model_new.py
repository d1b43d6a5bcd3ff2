"""Gallery: Model's constructor without the class attribute and the helper method it uses."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = self._make_fc(in_features, out_features * self.expansion, bias)  # EXPECT: MN010

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(*x.shape[:-1], self.fc.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.fc.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.fc.bias, 0.7978845608)
