"""Row softmax at KernelBench level 1/23's published size: 4096 rows of 393216 float32 (a 6 GiB input)."""

import torch
import torch.nn as nn

batch_size = 4096
dim = 393216


class Model(nn.Module):
    """softmax(x) along dim 1 of a (batch_size, dim) tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
