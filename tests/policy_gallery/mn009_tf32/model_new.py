"""Gallery: TF32 switched on for every matmul of the process, the reference's too."""

import torch
import torch.nn as nn

import cuda_extension

torch.backends.cuda.matmul.allow_tf32 = True  # EXPECT: MN009


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(*x.shape[:-1], self.fc.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.fc.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.fc.bias, 0.7978845608)
