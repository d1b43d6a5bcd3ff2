"""An honest add_bias that spins 100 ms per call in C++ (kernels/reach.cpp), with libc's clock_gettime
detoured so that perf_counter does not see the spin (pygpubench's GOT patch and inline detour of
cudaEventElapsedTime, on the CPU's clock)."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.slow_add_bias(x, self.bias)
