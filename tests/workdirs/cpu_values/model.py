"""Reference: softmax over the rows of a (batch_size, features) input (KernelBench level1/23, scaled down)."""

import torch
import torch.nn as nn

batch_size = 16
features = 256


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return []
