"""Reference: x * weight under a causal mask kept as a buffer (torch.tril), the model's structure."""

import torch
import torch.nn as nn

batch_size = 4
seq_len = 24


class Model(nn.Module):
    def __init__(self, seq_len: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(seq_len))
        self.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.weight).masked_fill(self.mask == 0, 0.0)


def get_inputs():
    return [torch.randn(batch_size, seq_len, seq_len)]


def get_init_inputs():
    return [seq_len]
