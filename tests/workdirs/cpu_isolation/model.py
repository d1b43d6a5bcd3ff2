"""The isolation workdir's reference: a softmax over each row of a (batch_size, features) input."""

import torch
import torch.nn as nn

batch_size = 8
features = 33


class Model(nn.Module):
    """torch.softmax over the last dimension: what a candidate that reaches torch would patch."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return []
