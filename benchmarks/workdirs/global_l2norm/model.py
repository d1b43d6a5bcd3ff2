import torch
import torch.nn as nn


class Model(nn.Module):
    """Scale a tensor to unit L2 norm over all its elements: y = x / sqrt(sum(x^2) + eps)."""

    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).sum() + self.eps)


batch_size = 4096
features = 1024


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [1e-6]
