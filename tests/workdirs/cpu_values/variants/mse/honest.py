"""The mean squared error over every element, accumulated in double."""

import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return cuda_extension.mse(predictions, targets)
