"""python -m utils.profiling: the speed verdict for this workdir (same as `cudaopt profile`)."""

import sys
from pathlib import Path

from pytest_cudaopt.cli import main

if __name__ == "__main__":
    sys.exit(main(["profile", str(Path(__file__).resolve().parents[1]), *sys.argv[1:]]))
