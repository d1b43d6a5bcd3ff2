"""Nests of tensors (the inputs and outputs of a model): leaves, copies, refills, float64 versions, sizes."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

# One copy, in the candidate's package (which imports nothing of the judging side's).
from pytest_cudaopt.candidate.observe import describe_tensor, leaves  # noqa: F401 - offered here too


def structure(value: Any) -> str:
    """A short description of a nest: `tuple(Tensor float32[3, 4] on cpu, int)`."""
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({', '.join(structure(v) for v in value)})"
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k!r}: {structure(v)}" for k, v in value.items()) + ")"
    if isinstance(value, torch.Tensor):
        return f"{type(value).__name__} {describe_tensor(value)}"
    return type(value).__name__


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    """A deep copy of the inputs: every tensor cloned (same strides), other values copied."""
    return [x.clone() if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in inputs]


def clone_nest(value: Any) -> Any:
    """`value` with every tensor in it (nested in lists and tuples) detached and cloned."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_nest(v) for v in value)
    return value


def refill_inputs(target: Sequence[Any], source: Sequence[Any]) -> None:
    """Copy the values of one input set into another's tensors, in place (same storage)."""
    for dst, src in zip(target, source):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)


def to_float64(value: Any) -> Any:
    """A nest with every floating-point tensor converted to float64 (complex to complex128)."""
    if isinstance(value, (tuple, list)):
        return type(value)(to_float64(v) for v in value)
    if isinstance(value, dict):
        return {k: to_float64(v) for k, v in value.items()}
    return value.to(_wide(value)) if isinstance(value, torch.Tensor) else value


def _wide(x: torch.Tensor) -> torch.dtype:
    return torch.complex128 if x.is_complex() else torch.float64 if x.is_floating_point() else x.dtype


def float64_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Fresh float64 copies of the inputs (complex128 for complex), other values as they are."""
    return [x.to(_wide(x), copy=True) if isinstance(x, torch.Tensor) else x for x in inputs]


def float_elements(value: Any) -> int:
    """Elements of the floating-point (and complex) tensors of a nest."""
    return sum(x.numel() for _, x in leaves(value)
               if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()))


def nbytes(value: Any) -> int:
    """Bytes of every tensor of a nest of tuples, lists and dicts."""
    return sum(x.numel() * x.element_size() for _, x in leaves(value) if isinstance(x, torch.Tensor))


def count_tensors(value: Any) -> int:
    """Tensors in a nest of tuples, lists and dicts."""
    return sum(isinstance(x, torch.Tensor) for _, x in leaves(value))


def describe_inputs(inputs: list, names: list[str] | None) -> str:
    """`x: float32[16, 64], n: 3`: the inputs of a case as failures and reports show them."""
    parts = []
    for i, x in enumerate(inputs):
        name = names[i] if names and i < len(names) else f"input{i}"
        if isinstance(x, torch.Tensor):
            dtype = str(x.dtype).removeprefix("torch.")
            parts.append(f"{name}: {dtype}[{', '.join(map(str, x.shape))}]")
        else:
            parts.append(f"{name}: {x!r}")
    return ", ".join(parts)
