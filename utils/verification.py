"""python -m utils.verification: the correctness verdict for this workdir (same as `cudaopt verify`),
then the classic lines `[PASS] check i/n ...` and `[PASS] verify success` / `[FAIL] ...`."""

import sys
from pathlib import Path

from pytest_cudaopt.classic import main

if __name__ == "__main__":
    sys.exit(main("verification", Path(__file__).resolve().parents[1], sys.argv[1:]))
