"""Not a cheat: the same last-bit differences, declared non-deterministic (as kernels with atomics are)."""

import torch
import torch.nn as nn

import cuda_extension

CUDAOPT_NONDETERMINISTIC = True


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.scale_flaky(x, self.weight, self.bias)
