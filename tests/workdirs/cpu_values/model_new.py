"""The cpu_values example workdir as it stands: a row softmax that subtracts the row max (variants/ holds the MSE loss and the planted cheats)."""

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x):
        return cuda_extension.softmax(x)
