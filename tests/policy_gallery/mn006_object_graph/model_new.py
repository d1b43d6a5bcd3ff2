"""Gallery: a helper walks from nn.Module to the reference's Model and replaces what its forward runs (never called here: the rule is static)."""

import torch
import torch.nn as nn

import cuda_extension


def _reach_the_reference():
    for cls in nn.Module.__subclasses__():  # EXPECT: MN006
        if cls.__name__ == "Model":
            cls.forward.__code__ = _gelu.__code__  # EXPECT: MN006
            scope = getattr(cls.forward, "__glo" "bals__")  # EXPECT: MN006
            return vars(cls.__init__)["__defaults__"], scope  # EXPECT: MN006
    return None


def _gelu(self, x):
    return x


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(*x.shape[:-1], self.fc.out_features, device=x.device, dtype=x.dtype)
        cuda_extension.linear(x, self.fc.weight, y, x.numel() // x.size(-1))
        return cuda_extension.gelu(y, self.fc.bias, 0.7978845608)
