"""timer_patch's honest add_bias, spinning 30 ms a call behind a patched time.perf_counter, that
also slows its worker's answer to every ping by 40 ms once it is loaded: the judging process
sizes the handoff it forgives from those pings, so slow pings would widen the allowance past the
30 ms it hides."""

import sys
import time

import torch
import torch.nn as nn

import cuda_extension

_real = time.perf_counter
_hidden = [0.0]
time.perf_counter = lambda: _real() - _hidden[0]

_server = sys.modules.get("pytest_cudaopt.worker.server")
if _server is not None:
    _ping = _server.Server.op_ping

    def _slow_ping(self, request):
        time.sleep(40e-3)
        return _ping(self, request)

    _server.Server.op_ping = _slow_ping


class ModelNew(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = _real()
        y = cuda_extension.add_bias(x, self.bias)
        while _real() - started < 30e-3:
            pass
        _hidden[0] += _real() - started
        return y
