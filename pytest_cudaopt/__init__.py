"""cudaopt: judge a workdir of hand-written CUDA C++ kernels against its PyTorch reference."""

__version__ = "0.1.0"
