"""`python -m pytest_cudaopt.candidate FD`: a worker serving requests on the socket FD (serve.py)."""

import sys

from pytest_cudaopt.candidate.serve import main

sys.exit(main(sys.argv[1:]))
