"""Judging-side primitives: tensors, device memory budgets, the environment's facts, NVML."""
