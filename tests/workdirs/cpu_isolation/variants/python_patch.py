"""Cheat: model_new.py replaces torch.softmax with a sigmoid, which its kernel computes."""

import torch
import torch.nn as nn

import cuda_extension

torch.softmax = lambda t, dim=-1, *args, **kwargs: torch.sigmoid(t)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.sigmoid(x)
