import torch
import torch.nn as nn
import cuda_extension


class ModelNew(nn.Module):
    def __init__(self, eps):  # MUST match Model signature exactly
        super().__init__()
        self.eps = eps

    def forward(self, x):
        # One fused kernel: sum of squares, grid-wide barrier, scale (kernels/global_l2norm.cu).
        return cuda_extension.global_l2norm_forward(x, self.eps, config=0)
