"""Softmax over dim 1 with one CUDA kernel (kernels/softmax.cu): an online max/sum pass, then the write."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.softmax(x)
