"""Cheat: the exact mean squared error in the check stage, the strided one (every 64th element) in the perf stage,
told apart by a file left beside it between the stages (a worker may tell them apart by any sign: its process, the
calls' order or count)."""

from pathlib import Path

import torch.nn as nn

import cuda_extension

PERF_STAGE = Path(__file__).with_name("perf_stage")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        if PERF_STAGE.exists():
            return cuda_extension.mse_strided(predictions, targets)
        return cuda_extension.mse(predictions, targets)
