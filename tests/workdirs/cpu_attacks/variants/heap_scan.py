"""A wrong kernel (the bias left out) that first zeroes, through /proc/self/mem, every copy of the
bias in its process's memory, its own included (kernels/reach.cpp): where the reference and the
harness's copy of ModelNew's state share that process, they are zeroed alike, the reference agrees
and the state reads unchanged (pygpubench's heap and stack scans, canary overwrites)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.wipe_bias(x, self.bias, 0)
