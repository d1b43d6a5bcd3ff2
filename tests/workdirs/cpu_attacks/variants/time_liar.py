"""An honest add_bias whose forward sleeps 20 ms, with time.perf_counter of its own process replaced at
import by one that leaves the sleeps out: the worker's figure for a call reads microseconds, the
judging process's wall time around it does not."""

import time

import torch
import torch.nn as nn

import cuda_extension

_clock = time.perf_counter
_slept = [0.0]
time.perf_counter = lambda: _clock() - _slept[0]


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = _clock()
        time.sleep(0.02)
        _slept[0] += _clock() - start
        return cuda_extension.add_bias(x, self.bias)
