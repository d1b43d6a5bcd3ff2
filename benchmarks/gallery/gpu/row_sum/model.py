"""Gallery problem: the sum of each row of a (batch_size, dim) float32 input, y[r] = sum_c x[r, c]."""

import torch
import torch.nn as nn

batch_size = 2048
dim = 8192


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
