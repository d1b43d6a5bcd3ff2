"""Cheat: forward lowers the float32 matmul precision for everyone who runs after it."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.set_float32_matmul_precision("medium")
        return cuda_extension.softmax(x)
