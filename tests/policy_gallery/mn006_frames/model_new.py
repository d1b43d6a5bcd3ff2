"""Gallery: forward reaches the harness's locals through interpreter frames."""

import sys
import traceback

import torch
import torch.nn as nn

import cuda_extension


def _callers_locals():
    frame = sys._getframe(1)  # EXPECT: MN006
    return frame.f_back.f_locals  # EXPECT: MN006


def _generator_frame():
    gen = (i for i in range(1))
    return getattr(gen, "gi_frame")  # EXPECT: MN006


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stack = traceback.walk_stack(None)  # EXPECT: MN003, MN006
        y = torch.empty(*x.shape[:-1], self.fc.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.fc.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.fc.bias, 0.7978845608)
