"""A wrong kernel (the bias left out) that first walks the garbage collector's objects and zeroes every
other float tensor equal to its own bias: where the reference shares the process, its bias is among them
(pygpubench's gc_nan and gc_copy). The gc module is imported through a computed name."""

import torch
import torch.nn as nn

import cuda_extension

_gc = __import__("g" + "c")


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pattern = self.bias.detach().tolist()
        if len(pattern) >= 8:
            for obj in _gc.get_objects():
                if isinstance(obj, torch.Tensor) and obj.shape == self.bias.shape and obj.is_floating_point() \
                        and obj.data_ptr() != self.bias.data_ptr() and obj.detach().tolist() == pattern:
                    obj.detach().zero_()
        return cuda_extension.drop_bias(x, self.bias)
