"""A wrong kernel (the bias left out) that first zeroes every copy of the bias in its own memory and,
through /proc/<ppid>/mem, in its parent's (kernels/reach.cpp): the parent of a worker is the judging
process, where the reference's bias lives (pygpubench's /proc/self/mem and ptrace POKETEXT exploits,
aimed one process up)."""

import os

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.wipe_bias(x, self.bias, os.getppid())
