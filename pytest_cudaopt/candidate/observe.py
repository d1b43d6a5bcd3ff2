"""What the worker observes around a call of the candidate, as plain data: the op audit, poisoned memory, CUDA faults, outputs that are not fresh, the profiler's events; the judging side decides from them."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.autograd.profiler
from torch.utils._python_dispatch import TorchDispatchMode

# Bound at import, before any workdir code runs.
_profile = torch.autograd.profiler.profile
_record_function = torch.autograd.profiler.record_function

# Ops ModelNew.forward may send to the dispatcher, besides views (they move no data).
ALLOWED_OPS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty.names",
    # creation with a fill: the workdir rules allow tensor creation in model_new.py
    "aten::zeros", "aten::zeros.names", "aten::zeros_like", "aten::new_zeros",
    "aten::ones", "aten::ones.names", "aten::ones_like", "aten::new_ones",
    "aten::full", "aten::full.names", "aten::full_like", "aten::new_full", "aten::zero_", "aten::fill_.Scalar",
    # metadata queries, for the rare tensors whose sizes/strides are answered by the dispatcher
    "aten::size.int", "aten::stride.int", "aten::sym_size.int", "aten::sym_stride.int",
    "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::is_contiguous", "aten::is_contiguous.memory_format", "aten::dim", "aten::numel",
    "aten::is_same_size", "aten::is_nonzero"})


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


# Frames between an op's caller and the audit: dispatch machinery, not the caller.
_INTERNAL = ("_dynamo", "_python_dispatch.py", "_ops.py", "_compile.py", "guards.py", "observe.py", "contextlib.py")


def op_name(func: Any) -> str:
    """`aten::mul.Tensor` for an OpOverload (`aten::empty_like` for a default overload)."""
    schema = func._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


class OpAudit(TorchDispatchMode):
    """Records every op that reaches the dispatcher, from Python and C++, with the workdir line and its sender."""

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
        # Else torch wraps __torch_dispatch__ in torch._disable_dynamo, which imports torch._dynamo (seconds).
        return False

    # sys.setprofile sees calls of builtins: the innermost one running when an op arrives is what sent it.
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
            if not any(part in str(path) for part in _INTERNAL):
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
        name = op_name(func)
        if not (name in ALLOWED_OPS or name in self.extra or func._schema.name in self.extra
                or getattr(func, "is_view", False)):
            caller, from_cpp = self._caller()
            where, via = self._where()
            self.ops.append(AuditedOp(name, caller, from_cpp, where, "" if from_cpp else via))
        return func(*args, **(kwargs or {}))

    def violations(self) -> list[AuditedOp]:
        unique: dict[tuple, AuditedOp] = {}
        for op in self.ops:
            unique.setdefault((op.op, op.where, op.caller), op)
        return list(unique.values())


class CudaFault(Exception):
    """A CUDA error (illegal memory access, launch failure): this process's context is unusable."""


FAULT_MARKERS = ("CUDA error", "illegal memory access", "unspecified launch failure",
                  "device-side assert", "misaligned address", "an illegal instruction",
                  "CUBLAS_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED")


def is_cuda_fault(exc: BaseException) -> bool:
    """True for errors that leave the CUDA context unusable (sticky errors)."""
    accel = getattr(torch, "AcceleratorError", None)
    if isinstance(exc, CudaFault) or accel is not None and isinstance(exc, accel):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in FAULT_MARKERS)


def context_alive(device: torch.device | str | None = None) -> bool:
    """Probe the CUDA context after an error: synchronise and run a one-element kernel (a sticky
    fault, an illegal address or a device-side assert, makes the probe fail too)."""
    if not torch.cuda.is_available():
        return False
    try:
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize(dev)
        probe = torch.ones(1, device=dev)
        probe.add_(1)
        torch.cuda.synchronize(dev)
        return float(probe.item()) == 2.0
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def leaves(value: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every leaf of a nest of tuples, lists and dicts: `output[1]['y']`."""
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}[{key!r}]")
    else:
        yield path, value


def describe_tensor(t: torch.Tensor) -> str:
    """`float32[16, 256] on cpu`."""
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}[{', '.join(str(s) for s in t.shape)}] on {t.device}"


def storage_span(t: torch.Tensor) -> tuple[torch.device, int, int] | None:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return None if start == 0 or storage.nbytes() == 0 else (t.device, start, start + storage.nbytes())


def overlaps(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


class OutputHistory:
    """Weak references to what earlier calls returned: one still alive that comes back is a cached output."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []

    def add(self, output: Any) -> None:
        for _, leaf in leaves(output):
            if isinstance(leaf, torch.Tensor):
                self._refs.append(weakref.ref(leaf))
        self._refs = [r for r in self._refs if r() is not None]

    def alive(self) -> list[torch.Tensor]:
        return [t for t in (r() for r in self._refs) if t is not None]


def unfresh_output(output: Any, inputs: list, model_new: torch.nn.Module, earlier: list[torch.Tensor],
                   names: list[str] | None = None, file: str = "model_new.py") -> tuple[str, str] | None:
    """(check, message) for the first output tensor that is no plain torch.Tensor, or whose storage
    overlaps an input, a parameter or buffer of ModelNew, or an output of an earlier call still alive."""
    input_spans = [(i, storage_span(x)) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
    state_spans = [(n, storage_span(t)) for n, t in [*model_new.named_parameters(), *model_new.named_buffers()]]
    earlier_spans = [(t, storage_span(t)) for t in earlier]
    for path, leaf in leaves(output):
        if not isinstance(leaf, torch.Tensor):
            continue
        if type(leaf) is not torch.Tensor:
            return "output type", (f"{file}: ModelNew.forward returned a {type(leaf).__module__}."
                                   f"{type(leaf).__qualname__} as {path}; outputs must be plain torch.Tensor objects")
        for old, span in earlier_spans:
            if leaf is old or overlaps(storage_span(leaf), span):
                what = "the same tensor object" if leaf is old else "a tensor sharing storage with the output"
                return "cached output", (f"{file}: ModelNew.forward returned {what} returned by an earlier call as "
                                         f"{path} ({describe_tensor(leaf)}); every call must compute a fresh output "
                                         f"(a cached or reused output)")
        span = storage_span(leaf)
        for i, other in input_spans:
            if overlaps(span, other):
                what = "is" if leaf is inputs[i] else "shares storage with (a view of)"
                label = f"input {i} ({names[i]})" if names and i < len(names) else f"input {i}"
                return "output aliases input", (f"{file}: {path} {describe_tensor(leaf)} {what} {label}; outputs "
                                                f"must own fresh storage, not return an input or a view of one")
        for name, other in state_spans:
            if overlaps(span, other):
                return "output aliases state", (f"{file}: {path} {describe_tensor(leaf)} shares storage with "
                                                f"ModelNew's parameter/buffer '{name}'; outputs must own fresh storage")
    return None


def call_locally(model: torch.nn.Module, inputs: list, device: torch.device, workdir: Path, extension: Any,
                 extra_allowed: frozenset[str], history: OutputHistory,
                 names: list[str] | None) -> tuple[Any, list[AuditedOp], tuple[str, str] | None]:
    """One call of ModelNew under poisoned memory and the op audit: (output, violations, unfresh_output's finding)."""
    audit = OpAudit(workdir, extension, extra_allowed)
    with torch.no_grad(), poisoned_memory(device), audit:
        output = model(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return output, audit.violations(), unfresh_output(output, inputs, model, history.alive(), names)


@contextlib.contextmanager
def poisoned_memory(device: torch.device | str) -> Iterator[None]:
    """For the duration, memory torch allocates without initialising (torch.empty, torch::empty) is
    filled with NaN (integers: their maximum), and on CUDA the caching allocator's free memory first:
    an output element the candidate never writes reads as NaN, not as a stale copy of the answer."""
    import torch.utils.deterministic as det

    device = torch.device(device)
    if device.type == "cuda":
        _poison_cuda_cache(device)
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warn_only: non-deterministic ops would only warn
        _deterministic(True, warn_only=True)
        det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            det.fill_uninitialized_memory = was_fill
            _deterministic(was_on, warn_only=was_warn)


def _deterministic(mode: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms without its import of torch._inductor (seconds, for a flag
    no eager call reads); where Inductor is loaded already, its flag follows as torch sets it."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def poison_plan(snapshot: list[dict], device_index: int) -> list[int]:
    """Sizes of one device's inactive blocks in torch.cuda.memory_snapshot(), largest first: asking the
    caching allocator for exactly these sizes hands those very blocks back (best fit)."""
    sizes = [block["size"] for segment in snapshot if segment.get("device") == device_index
             for block in segment.get("blocks", ()) if block.get("state") == "inactive" and block.get("size", 0) > 0]
    return sorted(sizes, reverse=True)


def _poison_cuda_cache(device: torch.device) -> None:
    """Fill every inactive caching-allocator block with 0xFF (NaN), all held till the last so none comes twice."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    held = []
    try:
        for size in poison_plan(torch.cuda.memory_snapshot(), index):
            block = torch.empty(size, dtype=torch.uint8, device=device)
            block.fill_(0xFF)
            held.append(block)
    except torch.OutOfMemoryError:
        pass
    finally:
        del held


# The tracer's ranges on the calling stream (perf/trace.py reads them back): the lead and the L2
# flush, a one-element fill where the stream reaches the call, the call, a fill after it.
LEAD, BEGIN, CALL, END = "cudaopt::lead", "cudaopt::begin", "cudaopt::call", "cudaopt::end"


class GpuLead:
    """Keeps the host ahead of the GPU: `enqueue(seconds)` puts a kernel that spins for about that
    long on the current stream, calibrated with CUDA events (the SM clock varies). Nothing on the CPU."""

    def __init__(self, device: Any):
        self.device = torch.device(device)
        self.cycles_per_second = 0.0

    def calibrate(self, cycles: int = 1_000_000) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        values = []
        for _ in range(3):
            torch.cuda.synchronize()
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            values.append(start.elapsed_time(end) / 1e3)
        self.cycles_per_second = cycles / max(sorted(values)[1], 1e-9)

    def enqueue(self, seconds: float) -> None:
        if self.device.type != "cuda":
            return
        if not self.cycles_per_second:
            self.calibrate()
        torch.cuda._sleep(max(1, int(seconds * self.cycles_per_second)))


def profiled_call(model: Any, inputs: list, lead: GpuLead, lead_s: float, flush: torch.Tensor) -> tuple[list, bool]:
    """One call of `model` under torch's profiler behind a spin of `lead_s` and the L2 flush, between the
    BEGIN and END fills: the Chrome-trace events, and whether the host enqueued it before the spin ended."""
    device = lead.device
    marker = torch.zeros(1, dtype=torch.int32, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    with _profile(use_kineto=True, use_cpu=True, use_device=None if device.type == "cpu" else device.type) as prof:
        with _record_function(LEAD):
            lead.enqueue(lead_s)
            flush.zero_()
        with _record_function(BEGIN):
            marker.fill_(1)
        started = time.perf_counter()
        with torch.no_grad(), _record_function(CALL):
            output = model(*inputs)
        host = time.perf_counter() - started
        with _record_function(END):
            marker.fill_(2)
        sync()
    del output
    return export_events(prof), host < lead_s


def export_events(prof: Any) -> list[dict[str, Any]]:
    """The Chrome-trace events of a finished torch profiler session."""
    fd, path = tempfile.mkstemp(prefix="cudaopt-trace-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            doc = json.load(f)
    finally:
        os.unlink(path)
    return doc.get("traceEvents", []) if isinstance(doc, dict) else list(doc)
