"""The op audit: every ATen op ModelNew.forward sends to the dispatcher, from Python or from C++, against an allow-list."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Ops ModelNew.forward may send to the dispatcher, besides views (ops whose schema says
# they return an alias of an input: view, reshape, t, detach, ...; they move no data).
ALLOCATION_OPS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty.names",
})
# Creation with a fill: the workdir rules allow tensor creation in model_new.py.
CREATION_OPS = frozenset({
    "aten::zeros", "aten::zeros.names", "aten::zeros_like", "aten::new_zeros",
    "aten::ones", "aten::ones.names", "aten::ones_like", "aten::new_ones",
    "aten::full", "aten::full.names", "aten::full_like", "aten::new_full",
    "aten::zero_", "aten::fill_.Scalar",
})
# Metadata queries, for the rare tensors whose sizes/strides are answered by the dispatcher.
METADATA_OPS = frozenset({
    "aten::size.int", "aten::stride.int", "aten::sym_size.int", "aten::sym_stride.int",
    "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::is_contiguous", "aten::is_contiguous.memory_format", "aten::dim", "aten::numel",
    "aten::is_same_size", "aten::is_nonzero",
})
ALLOWED_OPS = ALLOCATION_OPS | CREATION_OPS | METADATA_OPS



@dataclass
class AuditedOp:
    op: str                  # "aten::mul.Tensor"
    caller: str              # "torch.matmul", "Tensor.mul", "cuda_extension.scale", "a Python operator"
    from_cpp: bool           # sent by the extension's C++ code
    where: str               # "model_new.py:14" (the workdir's innermost line)
    via: str = ""            # the torch Python function in between, e.g. "torch/nn/functional.py:2140 softmax"

    def describe(self) -> str:
        if self.from_cpp:
            return (f"{self.where}: {self.op} sent from C++ inside {self.caller} "
                    f"(an ATen op in the extension; allocate with torch::empty* only)")
        via = f" via {self.via}" if self.via else ""
        return f"{self.where}: {self.op} from {self.caller}{via}"


_INTERNAL = ("_dynamo", "_python_dispatch.py", "_ops.py", "_compile.py", "guards.py", "audit.py", "contextlib.py")


def _internal(path: Path) -> bool:
    """Frames between an op's caller and the audit: dispatch machinery, not the caller."""
    text = str(path)
    return any(part in text for part in _INTERNAL)


def op_name(func: Any) -> str:
    """`aten::mul.Tensor` for an OpOverload (`aten::empty_like` for a default overload)."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def is_allowed(func: Any, extra: frozenset[str] = frozenset()) -> bool:
    name = op_name(func)
    packet = func._schema.name
    if name in ALLOWED_OPS or name in extra or packet in extra:
        return True
    # Views move no data (view, reshape, t, transpose, detach, alias, ...).
    return bool(getattr(func, "is_view", False))


class OpAudit(TorchDispatchMode):
    """Records every op that reaches the dispatcher while active, from Python and from C++
    alike, with the Python line in the workdir that led to it and the builtin (torch
    function, tensor method or extension function) that sent it."""

    def __init__(self, workdir: Path, extension: Any = None, extra_allowed: frozenset[str] = frozenset()):
        super().__init__()
        self.workdir = Path(workdir).resolve()
        self.extra = extra_allowed
        self.extension_functions = {id(v): name for name, v in vars(extension).items()
                                    if callable(v)} if extension is not None else {}
        self.ops: list[AuditedOp] = []
        self._builtins: list[Any] = []   # builtins being called right now (innermost last)
        self._previous_profile = None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Else torch wraps __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo and sympy: seconds of the worker's (which never compiles), many more
        # where torch's bytecode is not cached (an H200 image: benchmarks/results/2026-12-03-copy-excess.md).
        return False

    # sys.setprofile sees calls of builtins (c_call/c_return): the innermost one running when
    # an op arrives is what sent it.
    def _profile(self, frame, event, arg):
        if event == "c_call":
            self._builtins.append(arg)
        elif event in ("c_return", "c_exception") and self._builtins:
            self._builtins.pop()

    def __enter__(self):
        self._previous_profile = sys.getprofile()
        result = super().__enter__()
        sys.setprofile(self._profile)
        return result

    def __exit__(self, *exc):
        sys.setprofile(self._previous_profile)
        return super().__exit__(*exc)

    def _where(self) -> tuple[str, str]:
        """(the innermost workdir line, the torch Python function it called, if any)."""
        frame = sys._getframe(2)
        callee = None
        while frame is not None:
            path = Path(frame.f_code.co_filename)
            if path.is_absolute() and self.workdir in path.parents:
                via = ""
                if callee is not None and "torch" in callee.parts:
                    parts = callee.parts[callee.parts.index("torch"):]
                    via = f"{'/'.join(parts)}:{callee_line} {callee_name}"
                return f"{path.relative_to(self.workdir)}:{frame.f_lineno}", via
            if not _internal(path):
                callee, callee_line, callee_name = path, frame.f_lineno, frame.f_code.co_name
            frame = frame.f_back
        return "(outside the workdir)", ""

    def _caller(self) -> tuple[str, bool]:
        for builtin in reversed(self._builtins):
            name = self.extension_functions.get(id(builtin))
            if name is not None:
                return f"cuda_extension.{name}", True
            if getattr(builtin, "__module__", None) == __name__ or builtin is sys.setprofile:
                continue
            owner = getattr(builtin, "__self__", None)
            qual = getattr(builtin, "__qualname__", getattr(builtin, "__name__", repr(builtin)))
            if isinstance(owner, torch.Tensor):
                return f"Tensor.{getattr(builtin, '__name__', qual)}", False
            if qual.startswith("_VariableFunctionsClass."):
                return "torch." + qual.split(".", 1)[1], False
            module = getattr(builtin, "__module__", None) or ""
            return (f"{module}.{qual}" if module else qual), False
        return "a Python operator on tensors (+, *, @, ...)", False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not is_allowed(func, self.extra):
            caller, from_cpp = self._caller()
            where, via = self._where()
            self.ops.append(AuditedOp(op_name(func), caller, from_cpp, where, "" if from_cpp else via))
        return func(*args, **(kwargs or {}))

    def violations(self) -> list[AuditedOp]:
        seen, unique = set(), []
        for op in self.ops:
            key = (op.op, op.where, op.caller)
            if key not in seen:
                seen.add(key)
                unique.append(op)
        return unique
