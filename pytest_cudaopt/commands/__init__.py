"""The `cudaopt` subcommands that are more than a call into a package: the CI gate, init, the starter kernels."""
