"""The attack workdir's reference: a row-wise bias added to a (batch_size, features) input."""

import torch
import torch.nn as nn

batch_size = 16
features = 24


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
