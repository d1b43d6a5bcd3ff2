"""The `cudaopt` subcommands that are more than a call into a package: the CI gate, the
scaffold of `cudaopt init`, the starter kernels."""
