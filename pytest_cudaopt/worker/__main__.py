"""`python -m pytest_cudaopt.worker FD`: a worker serving requests on the socket FD (worker.server)."""

import sys

from pytest_cudaopt.worker.server import main

sys.exit(main(sys.argv[1:]))
