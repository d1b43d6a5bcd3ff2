"""An honest add_bias whose import writes outside the candidate's own folder: a file next to the
workdir and one in its parent folder (pygpubench's replace_torch, which writes torch.py where the
harness would import it)."""

from pathlib import Path

import torch
import torch.nn as nn

import cuda_extension

MARK = "written-by-the-candidate"
for _folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent):
    (_folder / MARK).write_text("the candidate wrote here\n")


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.add_bias(x, self.bias)
