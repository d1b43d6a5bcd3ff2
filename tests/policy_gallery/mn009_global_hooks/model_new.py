"""Gallery: the constructor registers a forward hook on every nn.Module, which rewrites the reference's output."""

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_forward_pre_hook

import cuda_extension


def _hook(module, inputs, output):
    return output


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)
        nn.modules.module.register_module_forward_hook(_hook).remove()  # EXPECT: MN009
        register_module_forward_pre_hook(lambda module, inputs: None).remove()  # EXPECT: MN009

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(*x.shape[:-1], self.fc.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.fc.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.fc.bias, 0.7978845608)
