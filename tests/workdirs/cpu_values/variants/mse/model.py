"""Reference: the mean squared error of KernelBench level1/94, at 1024 x 4096."""

import torch
import torch.nn as nn

batch_size = 1024
input_shape = (4096,)
dim = 1


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    scale = torch.rand(())
    return [torch.rand(batch_size, *input_shape) * scale, torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return []
