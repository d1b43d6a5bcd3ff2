"""Softmax over dim 1 with one CUDA kernel (kernels/softmax.cu).

Long aligned rows: each row split over an 8-block thread-block cluster, held in shared memory,
read once (partial max/sum exchanged through distributed shared memory). Other shapes: one block
per row, an online max/sum pass, then the write.
"""

import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.softmax(x)
