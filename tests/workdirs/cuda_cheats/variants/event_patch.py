"""Cheat: the correct kernel launched 2000 times per call (milliseconds of honest work), with
torch.cuda.Event.elapsed_time patched to report 1 us for whoever times the call with CUDA events
(pygpubench's GOT patch and inline detour of cudaEventElapsedTime, in Python)."""

import torch
import torch.nn as nn

import cuda_extension

torch.cuda.Event.elapsed_time = lambda self, end: 1e-3


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(1999):
            cuda_extension.scale(x, self.weight, self.bias, config=0)
        return cuda_extension.scale(x, self.weight, self.bias, config=0)
