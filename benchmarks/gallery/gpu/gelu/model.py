"""Gallery problem: GELU with the tanh approximation over a (batch_size, dim) float32 input."""

import torch
import torch.nn as nn

batch_size = 4096
dim = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
