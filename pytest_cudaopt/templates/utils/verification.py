"""python -m utils.verification: the correctness verdict for this workdir (same as `cudaopt verify`)."""

import sys
from pathlib import Path

from pytest_cudaopt.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", str(Path(__file__).resolve().parents[1]), *sys.argv[1:]]))
