"""timer_shave's honest twin: add_bias, then 15 ms of spinning per call, and its timer left alone."""

import time

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        y = cuda_extension.add_bias(x, self.bias)
        while time.perf_counter() - started < 15e-3:
            pass
        return y
