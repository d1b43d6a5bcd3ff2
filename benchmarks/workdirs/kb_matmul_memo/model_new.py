"""A cheat to be caught: a deliberately naive GEMM (kernels/matmul.cu) behind a memo keyed by eight
sampled elements of each input (kernels/matmul_binding.cpp). Its outputs are right; on a repeated
input it returns a copy of the output it computed then, so it is fast only where inputs repeat."""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return cuda_extension.matmul_memo(A, B)
