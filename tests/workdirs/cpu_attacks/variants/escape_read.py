"""An honest add_bias whose import reads another workdir's kernel (the folder `victim` beside its own): a candidate that copies a rival's kernels. The sandbox lets the worker read only its own workdir and build."""

from pathlib import Path

import torch
import torch.nn as nn

import cuda_extension

_stolen = (Path(__file__).resolve().parent.parent / "victim" / "kernels" / "secret.cu").read_text()
print(f"ATTACK SUCCEEDED: read {len(_stolen)} characters of another workdir's kernel", flush=True)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.add_bias(x, self.bias)
