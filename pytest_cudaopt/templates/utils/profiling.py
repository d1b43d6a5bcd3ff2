"""python -m utils.profiling [--iters N] [--single-run torch_baseline,torch_compile,cuda_extension]:
the speed verdict for this workdir (same as `cudaopt profile`), then the classic line
`Torch Baseline: <t>us, Torch Compile: <t>us, CUDA Extension: <t>us`; --single-run runs the
named contenders once each, untimed, for ncu/nsys."""

import sys
from pathlib import Path

from pytest_cudaopt.classic import main

if __name__ == "__main__":
    sys.exit(main("profiling", Path(__file__).resolve().parents[1], sys.argv[1:]))
