"""`python -m pytest_cudaopt.worker FD`: a worker serving requests on the socket FD (worker.server);
`python -m pytest_cudaopt.worker zygote NAME`: a zygote forking workers (worker.zygote)."""

import sys

if sys.argv[1:2] == ["zygote"]:
    from pytest_cudaopt.worker.zygote import serve

    sys.exit(serve(sys.argv[2]))
from pytest_cudaopt.worker.server import main

sys.exit(main(sys.argv[1:]))
