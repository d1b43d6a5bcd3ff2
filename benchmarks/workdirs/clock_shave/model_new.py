"""The softmax of benchmarks/workdirs/kb_softmax, and (SHAVE > 0) a worker that under-reports its time:
torch.cuda.Event.elapsed_time reports (1 - SHAVE) of the real time, patched through computed names
from Python (HOW = "python", which no static rule sees) or by a detour of the CUDA runtime's
cudaEventElapsedTime from the extension's C++ (HOW = "cpp", kernels/clock_shave.cpp).
benchmarks/clock_shave.py sets SHAVE and HOW."""

import torch
import torch.nn as nn

import cuda_extension

SHAVE = 0.0
HOW = "python"

if SHAVE and HOW == "python":
    _events = getattr(torch, "cu" + "da").Event
    _elapsed = getattr(_events, "elapsed" + "_time")
    setattr(_events, "elapsed" + "_time", lambda self, end: (1 - SHAVE) * _elapsed(self, end))
elif SHAVE:
    cuda_extension.shave_clock(1 - SHAVE)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.softmax(x)
