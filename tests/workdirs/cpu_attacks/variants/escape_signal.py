"""An honest add_bias whose import signals processes outside its own: SIGTERM to a sibling (its pid in victim.pid, beside model.py) and SIGSTOP then SIGCONT to the judging process, its parent. The sandbox lets the worker signal only its own process group."""

import os
import signal
from pathlib import Path

import torch
import torch.nn as nn

import cuda_extension

_victim = int((Path(__file__).resolve().parent / "victim.pid").read_text())
os.kill(_victim, signal.SIGTERM)
os.kill(os.getppid(), signal.SIGSTOP)
os.kill(os.getppid(), signal.SIGCONT)
print(f"ATTACK SUCCEEDED: killed process {_victim} and stopped the judging process {os.getppid()}", flush=True)


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.add_bias(x, self.bias)
