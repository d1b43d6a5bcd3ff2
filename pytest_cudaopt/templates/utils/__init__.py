"""The workdir's command line, compatible with the classic workflow; thin wrappers over pytest_cudaopt."""
