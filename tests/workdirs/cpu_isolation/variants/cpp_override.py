"""Cheat: the extension's import registered a sigmoid as the CPU kernel of aten::_softmax (its
TORCH_LIBRARY_IMPL, in a process with CUDAOPT_ISOLATION_OVERRIDE_AT_IMPORT set); the kernel computes a sigmoid."""

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return cuda_extension.sigmoid(x)
