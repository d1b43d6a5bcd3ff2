"""An honest add_bias whose import starts a program (a shell): from there anything the user may run. The sandbox lets the worker start no program."""

import subprocess

import torch
import torch.nn as nn

import cuda_extension

_said = subprocess.run(["/bin/sh", "-c", "echo shell-ran"], capture_output=True, text=True, check=True).stdout
print(f"ATTACK SUCCEEDED: started /bin/sh, which said {_said.strip()}", flush=True)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.add_bias(x, self.bias)
