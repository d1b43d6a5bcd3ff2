"""Judging-side primitives: tensors described and compared for storage, device memory
budgets, the environment's facts, NVML per process."""
