"""Reference: a square matrix product (KernelBench level1/1, scaled down)."""

import torch
import torch.nn as nn

N = 48


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
