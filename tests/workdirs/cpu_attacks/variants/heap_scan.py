"""A wrong kernel (the bias left out) that first zeroes, through /proc/self/mem, every copy of the
bias but its own in its process's memory (kernels/reach.cpp): where the reference shares that
process, its bias is zeroed too and it agrees (pygpubench's heap and stack scans, canary overwrites)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.wipe_bias(x, self.bias, 0)
