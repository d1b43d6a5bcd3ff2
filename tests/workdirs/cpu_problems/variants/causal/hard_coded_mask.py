"""The causal mask hard-coded in the kernel instead of read from the buffer: right, since the mask is structure."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, seq_len: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(seq_len))
        self.register_buffer("mask", torch.tril(torch.ones(seq_len, seq_len)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.causal_scale(x, self.weight)
