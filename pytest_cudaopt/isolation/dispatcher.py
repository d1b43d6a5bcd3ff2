"""The dispatcher road: every operator's kernels per dispatch key, backend fallbacks and the Python dispatcher's kernels."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_cudaopt.isolation.changes import DISPATCHER, Change, origin_of, short

# One kernel line of torch._C._dispatch_dump(op):
#   "CPU: registered at /path/RegisterCPU_1.cpp:4392 :: (Tensor _0, ...) -> Tensor _0 [ boxed unboxed ]"
#   "CPU (inactive): registered at ..." (overridden), "Autograd[alias]: registered at ..."
_KERNEL = re.compile(r"^(?P<key>[A-Za-z0-9_]+(?:\[alias\])?)(?: \(inactive\))?: registered at (?P<where>.+?)"
                     r"(?: :: .*)?$")
_DEFINED = re.compile(r"^debug: registered at (?P<where>.+)$")
# The top folders of torch's source tree: the folder above one is where torch was built.
_TORCH_TREES = frozenset({"aten", "torch", "c10", "caffe2", "functorch", "build", "third_party"})
# What this torch must offer for the dispatcher to be read; without it the road is not verified.
NEEDED = ("_dispatch_get_all_op_names", "_dispatch_dump")


@dataclass
class Registrations:
    """The text of torch._C._dispatch_dump for every operator, the keys with a backend
    fallback, the Python dispatcher's kernels of every OpOverload created so far, and
    torch's package folder (its own Python registrations, made lazily, are trusted)."""

    dumps: dict[str, str] = field(default_factory=dict)
    fallbacks: frozenset[str] = frozenset()
    py_kernels: dict[str, dict[Any, Any]] = field(default_factory=dict)
    torch_dir: str = ""

    @functools.cached_property
    def namespaces(self) -> frozenset[str]:
        return frozenset(name.split("::")[0] for name in self.dumps)

    @functools.cached_property
    def cpp_roots(self) -> frozenset[str]:
        """The source trees of torch's own C++ registrations at the snapshot: the folder above
        `aten/`, `torch/`, `c10/`, `build/`... (`/__w/pytorch/pytorch`), where torch was built."""
        roots = set()
        for text in self.dumps.values():
            for _, where in _parse(text):
                parts = Path(where.rpartition(":")[0]).parts
                if not parts or parts[0] != "/" or parts[-1].endswith(".py"):
                    continue
                top = next((i for i, part in enumerate(parts) if part in _TORCH_TREES), None)
                if top is not None and top >= 2:
                    roots.add(str(Path(*parts[:top])))
        return frozenset(roots)


def missing_api() -> list[str]:
    import torch

    return [f"torch._C.{name}" for name in NEEDED if not hasattr(torch._C, name)]


def has_fallback_api() -> bool:
    import torch

    return hasattr(torch._C, "_dispatch_has_backend_fallback")


def _parse(dump: str) -> frozenset[tuple[str, str]]:
    """(dispatch key, where registered) of every kernel in one operator's dump; the schema's
    own registration as key "(schema)"."""
    found = set()
    for line in dump.splitlines():
        defined = _DEFINED.match(line)
        if defined:
            found.add(("(schema)", defined["where"]))
            continue
        match = _KERNEL.match(line)
        if match:
            found.add((match["key"], match["where"]))
    return frozenset(found)


def _dumps() -> dict[str, str]:
    import torch

    dump = torch._C._dispatch_dump
    return {name: dump(name) for name in torch._C._dispatch_get_all_op_names()}


def _fallbacks() -> frozenset[str]:
    import torch

    has = getattr(torch._C, "_dispatch_has_backend_fallback", None)
    if has is None:
        return frozenset()
    found = set()
    for key in torch._C.DispatchKey.__members__.values():
        try:
            if has(key):
                found.add(key.name)
        except (RuntimeError, TypeError):
            continue
    return frozenset(found)


def _overloads() -> dict[str, Any]:
    """name -> OpOverload for every overload that torch.ops has created so far."""
    import torch
    from torch._ops import OpOverload, OpOverloadPacket

    found = {}
    for ns_name in list(getattr(torch.ops, "_dir", [])):
        namespace = getattr(torch.ops, ns_name, None)
        for packet in list(vars(namespace).values()) if namespace is not None else []:
            if isinstance(packet, OpOverloadPacket):
                for overload in list(vars(packet).values()):
                    if isinstance(overload, OpOverload):
                        found[str(overload)] = overload
    return found


def take() -> Registrations:
    import torch

    return Registrations(_dumps(), _fallbacks(), {name: dict(op.py_kernels) for name, op in _overloads().items()},
                         str(Path(torch.__file__).resolve().parent))


def _trusted(where: str, before: Registrations) -> bool:
    """A registration torch made itself (lazily, after the snapshot: a library it loads on
    first use): Python code in torch's package, or C++ in the source tree torch was built in."""
    path = where.rpartition(":")[0] or where
    if path.endswith(".py"):
        try:
            resolved = str(Path(path).resolve())
        except OSError:
            return False
        return resolved.startswith(before.torch_dir + "/")
    return Path(path).is_absolute() and any(path.startswith(root + "/") for root in before.cpp_roots)


def kernel_changes(before: Registrations) -> list[Change]:
    """Kernels registered since `before` for an operator that existed then or in a namespace
    that existed then (an extension may define ops in a namespace of its own)."""
    found = []
    for name, text in _dumps().items():
        old_text = before.dumps.get(name)
        if old_text == text or (old_text is None and name.split("::")[0] not in before.namespaces):
            continue
        old = _parse(old_text) if old_text is not None else frozenset()
        for key, where in sorted(_parse(text) - old):
            if _trusted(where, before):
                continue
            if key == "(schema)":
                found.append(Change(DISPATCHER, name, f"a new operator in the existing namespace "
                                    f"{name.split('::')[0]}, defined at {where}", where))
            else:
                found.append(Change(DISPATCHER, f"{name} / {key}", f"a kernel registered at {where}", where))
    return found


def changes(before: Registrations, kernels: bool = True) -> list[Change]:
    """`kernel_changes` (unless `kernels` is False: the dump of every operator is the slow
    part), new backend fallbacks, and Python dispatcher kernels defined outside torch."""
    found = kernel_changes(before) if kernels else []
    for key in sorted(_fallbacks() - before.fallbacks):
        found.append(Change(DISPATCHER, f"backend fallback / {key}",
                            "a fallback kernel registered for every operator of that key"))
    for name, op in _overloads().items():
        old = before.py_kernels.get(name, {})
        for key, fn in list(op.py_kernels.items()):
            if old.get(key) is fn:
                continue
            origin = origin_of(fn)
            if _trusted(origin, before):
                continue
            found.append(Change(DISPATCHER, f"{name} / {getattr(key, 'name', key)} (Python dispatcher)",
                                f"py_kernels entry {short(fn)}", origin, _py_undo(op, key, old.get(key))))
    return found


def _py_undo(op: Any, key: Any, fn: Any):
    def undo() -> None:
        if fn is None:
            op.py_kernels.pop(key, None)
        else:
            op.py_kernels[key] = fn
        op._dispatch_cache.clear() if hasattr(op, "_dispatch_cache") else None
    return undo
