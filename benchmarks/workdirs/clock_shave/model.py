"""Row softmax, small: 512 rows of 4096 float32 (8 MiB in, 8 MiB out: ~4 us of copy on an H200; the
timing benchmark's small kernel). benchmarks/clock_shave.py sets ROWS for its other sizes."""

import torch
import torch.nn as nn

ROWS = 512
COLS = 4096


class Model(nn.Module):
    """softmax(x) along dim 1 of a (ROWS, COLS) tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
