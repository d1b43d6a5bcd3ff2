"""Cheat: launches.py's 256 launches per call, with torch.cuda.Event.elapsed_time patched to report
half the time (a detour of cudaEventElapsedTime that shaves a quarter of a millisecond a call: well
inside a round trip's allowance of milliseconds, not inside the gate's window)."""

import torch
import torch.nn as nn

import cuda_extension

_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: 0.5 * _elapsed(self, end)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(255):
            cuda_extension.scale(x, self.weight, self.bias, config=0)
        return cuda_extension.scale(x, self.weight, self.bias, config=0)
