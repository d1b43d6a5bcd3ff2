"""Load a workdir: model.py and model_new.py as distinct modules, Model/ModelNew pairs, seeded inputs."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import random
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

MODULE_PREFIX = "cudaopt_workdir_"
NONDETERMINISTIC = "CUDAOPT_NONDETERMINISTIC"  # model_new.py: kernels use atomics, results vary in the last bits


class WorkdirError(Exception):
    """The workdir cannot be loaded or its models built; the message names the file and
    shows the workdir's own traceback lines. `file` is that file's name, when known."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


def module_prefix(path: Path) -> str:
    """`cudaopt_workdir_<hash>`: the package name under which a workdir's files are imported,
    distinct for every workdir folder."""
    digest = hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:12]
    return MODULE_PREFIX + digest


def user_traceback(exc: BaseException, roots: list[Path]) -> str:
    """The exception with only the traceback frames inside `roots` (the workdir's files):
    `  model.py:12 in get_inputs: return torch.randn(n)` lines, then `Type: message`."""
    roots = [Path(r).resolve() for r in roots]
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        try:
            resolved = path.resolve()
        except OSError:
            continue
        if any(resolved == r or r in resolved.parents for r in roots):
            rel = _short(resolved, roots)
            code = f": {frame.line.strip()}" if frame.line else ""
            lines.append(f"  {rel}:{frame.lineno} in {frame.name}{code}")
    message = str(exc).strip()
    # C++ exceptions carry a long native backtrace after the message; keep the message.
    kept = [ln for ln in message.splitlines() if ln.strip()]
    cut = next((i for i, ln in enumerate(kept) if ln.startswith(("Exception raised from", "frame #"))), len(kept))
    kept = kept[:min(cut, 12)]
    lines.append(f"{type(exc).__name__}: " + "\n".join(kept))
    return "\n".join(lines)


def _short(path: Path, roots: list[Path]) -> str:
    for root in roots:
        if root.is_dir() and root in path.parents:
            return str(path.relative_to(root))
    return path.name


@contextlib.contextmanager
def temporary_modules(replacements: dict[str, types.ModuleType | None], path: Path) -> Iterator[None]:
    """sys.modules entries (and the workdir first on sys.path) for the duration of an import."""
    saved = {name: sys.modules.get(name) for name in replacements}
    saved_path = list(sys.path)
    for name, module in replacements.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def import_file(name: str, file: Path, workdir: Path,
                aliases: dict[str, types.ModuleType | None] | None = None) -> types.ModuleType:
    """Import `file` as module `name`, with `workdir` first on sys.path and `aliases` (e.g.
    `model` -> the workdir's reference module) in sys.modules for the duration. A file that
    does not parse or raises is a WorkdirError naming the file, with the workdir's frames."""
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise WorkdirError(f"{file}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with temporary_modules(aliases or {}, workdir):
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise WorkdirError(_syntax_error(exc, file), file.name) from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise WorkdirError(f"importing {file} failed:\n{user_traceback(exc, [workdir])}", file.name) from exc
    except BaseException:  # the watchdog's timeout or an interrupt: no half-made module stays
        sys.modules.pop(name, None)
        raise
    return module


def _syntax_error(exc: SyntaxError, file: Path) -> str:
    """`model.py:3: SyntaxError: invalid syntax`, the offending line and a caret; no
    import-machinery frames (the error is in the file, not in the loader)."""
    where = Path(exc.filename).name if exc.filename else file.name
    lines = [f"{where}:{exc.lineno}: {type(exc).__name__}: {exc.msg}"]
    if exc.text:
        text = exc.text.rstrip("\n")
        stripped = text.lstrip()
        lines.append(f"    {stripped}")
        if exc.offset:
            col = max(exc.offset - 1 - (len(text) - len(stripped)), 0)
            lines.append("    " + " " * col + "^")
    return "\n".join(lines)


def _to_device(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


@contextlib.contextmanager
def saved_rng() -> Iterator[None]:
    """The global generators (torch's CPU one and the current CUDA device's, Python `random`,
    NumPy) as they were before the block, whatever it seeds or draws."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


@contextlib.contextmanager
def private_rng(seed: int) -> Iterator[None]:
    """Torch (CPU and the current CUDA device), Python `random` and NumPy seeded with `seed`
    for the duration; the global generators are left as they were."""
    with saved_rng():
        _seed_all(seed)
        yield


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The generators seeded with `seed`, their earlier state not kept (cheap: no state is
    saved or restored; the caller keeps it with `saved_rng` around many draws). With CUDA
    initialised only the CPU and CUDA generators are seeded directly, not through
    torch.manual_seed's other backends."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
        random.seed(seed)
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed(seed % 2**32)
    else:
        _seed_all(seed)
    yield


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a bare tensor {dtype}[{', '.join(map(str, value.shape))}]"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _as_list(values: Any, file: Path, function: str, role: str) -> list:
    """A KernelBench helper's result as a list; anything but a list or tuple is model.py's
    mistake, reported in one line that names the file and the function."""
    if isinstance(values, (list, tuple)):
        return list(values)
    raise WorkdirError(f"{file.name}: {function} returned {_describe(values)}; it must return a list "
                       f"of {role}, e.g. `return [x]`", file.name)


@dataclass
class Workdir:
    """A loaded workdir. `reference` is model.py. In the judging process the candidate is
    `worker` (worker.Worker: model_new.py and the extension loaded in a process of their own)
    and `candidate`/`extension` are None; in that worker they are model_new.py and the
    extension. Each file is imported under its own module name, so that several workdirs can
    share a process."""

    path: Path
    reference: types.ModuleType
    candidate: types.ModuleType | None = None
    extension: Any = None
    worker: Any = None

    @property
    def model_file(self) -> Path:
        return self.path / "model.py"

    @property
    def model_new_file(self) -> Path:
        return self.path / "model_new.py"

    @property
    def nondeterministic(self) -> bool:
        """model_new.py declares `CUDAOPT_NONDETERMINISTIC = True`: two runs on the same
        inputs may differ within the tolerance (atomics) instead of bit for bit."""
        if self.worker is not None:
            return bool(self.worker.facts.get("nondeterministic"))
        return bool(getattr(self.candidate, NONDETERMINISTIC, False))

    def _call(self, file: Path, what: str, func, *args):
        try:
            return func(*args)
        except WorkdirError:
            raise
        except Exception as exc:
            raise WorkdirError(f"{file.name}: {what} raised:\n{user_traceback(exc, [self.path])}",
                               file.name) from exc

    def init_inputs(self) -> list:
        """model.py's get_init_inputs(), as a list."""
        values = self._call(self.model_file, "get_init_inputs()", self.reference.get_init_inputs)
        return _as_list(values, self.model_file, "get_init_inputs()", "the arguments of Model(...)")

    def inputs(self, seed: int, device: torch.device | str = "cpu", isolated: bool = True) -> list:
        """model.py's get_inputs() under a private RNG seeded by `seed`, moved to `device`.
        On CUDA, get_inputs() runs with that device as the default, so that torch.rand(...)
        draws there: a 6 GiB input takes milliseconds, not seconds on the CPU and a copy.
        `isolated=False` seeds the global generators without saving their state (a draw per
        timed call: the caller keeps the state once, with `saved_rng`)."""
        on_device = torch.device(device).type == "cuda"
        rng = private_rng(seed) if isolated else _seeded(seed)
        with rng, (torch.device(device) if on_device else contextlib.nullcontext()):
            values = self._call(self.model_file, "get_inputs()", self.reference.get_inputs)
        values = _as_list(values, self.model_file, "get_inputs()", "the arguments of forward(...)")
        return [_to_device(v, device) for v in values]

    def construct_candidate(self, init: list) -> torch.nn.Module:
        """ModelNew(*init), in the worker."""
        return self._call(self.model_new_file, "ModelNew(*get_init_inputs())", self.candidate.ModelNew, *init)

    def make_models(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.nn.Module, Any]:
        """(Model, ModelNew) built from get_init_inputs(); Model's parameters initialised
        under a private RNG seeded by `seed` and copied into ModelNew (strict); both in eval
        mode on `device`. ModelNew is a worker.RemoteModel where the workdir has a worker."""
        init = self.init_inputs()
        with private_rng(seed):
            model = self._call(self.model_file, "Model(*get_init_inputs())", self.reference.Model, *init)
            model_new = self.make_candidate(init, device, seed) if self.worker is not None else \
                self.construct_candidate(init)
        model = model.eval().to(device)
        if self.worker is None:
            model_new = model_new.eval().to(device)
        self.copy_state(model, model_new)
        return model, model_new

    def make_candidate(self, init: list, device: torch.device | str, seed: int) -> Any:
        """ModelNew(*init) in the worker, on `device`: a worker.RemoteModel."""
        from pytest_cudaopt.worker import RemoteModel, WorkerError

        try:
            reply = self.worker.request({"op": "make", "init": init, "seed": seed, "device": str(device),
                                         "what": "ModelNew(*get_init_inputs())"},
                                        what="constructing ModelNew")
        except WorkerError as exc:
            raise WorkdirError(str(exc), exc.file or self.model_new_file.name) from exc
        return RemoteModel(self.worker, reply["id"], str(device), list(reply["keys"]))

    def copy_state(self, model: torch.nn.Module, model_new: Any) -> None:
        """Load Model's state dict into ModelNew, strict: the same keys, the same shapes; its
        non-persistent buffers too."""
        if self.worker is not None:  # ModelNew is a worker.RemoteModel: checked and loaded there
            from pytest_cudaopt.worker import WorkerError

            try:
                model_new.load_state(model.state_dict(), _non_persistent(model), self.model_file.name)
            except WorkerError as exc:
                raise WorkdirError(str(exc), exc.file or self.model_new_file.name) from exc
            return
        load_state(model_new, model.state_dict(), _non_persistent(model), self.model_file.name,
                   self.model_new_file.name)


def load_state(model_new: torch.nn.Module, state: dict, buffers: dict[str, torch.Tensor],
               model_file: str = "model.py", model_new_file: str = "model_new.py") -> None:
    """Model's `state` into ModelNew, strict (keys named in a WorkdirError when they differ),
    then Model's non-persistent `buffers` into ModelNew's buffers of the same names."""
    expected = set(state)
    present = set(model_new.state_dict())
    missing, unexpected = sorted(expected - present), sorted(present - expected)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing (in Model, not in ModelNew): {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected (in ModelNew, not in Model): {', '.join(unexpected)}")
        raise WorkdirError(f"{model_new_file}: ModelNew's state_dict keys differ from Model's "
                           f"({model_file}): " + "; ".join(parts))
    try:
        model_new.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise WorkdirError(f"{model_new_file}: loading Model's state_dict into ModelNew failed: {exc}") from exc
    copy_buffers(buffers, model_new, model_file, model_new_file)


def _non_persistent(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers that state_dict() leaves out (register_buffer(..., persistent=False))."""
    found = {}
    for prefix, sub in module.named_modules():
        for name in getattr(sub, "_non_persistent_buffers_set", ()):
            buffer = sub._buffers.get(name)
            if buffer is not None:
                found[f"{prefix}.{name}" if prefix else name] = buffer
    return found


def copy_buffers(ours: dict[str, torch.Tensor], model_new: torch.nn.Module,
                 model_file: str = "model.py", model_new_file: str = "model_new.py") -> None:
    """Copy Model's non-persistent buffers (`ours`) into ModelNew's buffers of the same name, so
    both start from the same state; a buffer one has and the other lacks, or of another shape,
    is named in a WorkdirError."""
    if not ours:
        return
    theirs = dict(model_new.named_buffers())
    for name, buffer in ours.items():
        target = theirs.get(name)
        if target is None:
            raise WorkdirError(f"{model_new_file}: Model ({model_file}) has the non-persistent buffer "
                               f"'{name}' {tuple(buffer.shape)}, ModelNew has no buffer of that name; "
                               f"register it in ModelNew too so both start from the same values")
        if target.shape != buffer.shape:
            raise WorkdirError(f"{model_new_file}: non-persistent buffer '{name}': Model ({model_file}) has "
                               f"shape {tuple(buffer.shape)}, ModelNew {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(buffer)


def _import_reference(path: Path) -> tuple[Path, types.ModuleType, types.ModuleType]:
    """model.py of the workdir at `path`, checked for the KernelBench names, under the
    workdir's package name; (resolved path, package, module)."""
    path = Path(path).resolve()
    for name in ("model.py", "model_new.py"):
        if not (path / name).is_file():
            raise WorkdirError(f"{path} is not a workdir: it has no {name}")
    prefix = module_prefix(path)
    package = types.ModuleType(prefix, f"cudaopt workdir {path}")
    package.__path__ = []  # a namespace for the two modules; nothing is imported through it
    sys.modules[prefix] = package
    reference = import_file(f"{prefix}.model", path / "model.py", path, {"cuda_extension": None, "model": None})
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(reference, required):
            raise WorkdirError(f"{path / 'model.py'} defines no {required} (KernelBench format: "
                               f"class Model, get_inputs(), get_init_inputs())")
    package.model = reference
    return path, package, reference


def load_reference(path: Path, worker: Any = None) -> Workdir:
    """The judging process's view of a workdir: model.py imported as
    `cudaopt_workdir_<hash>.model`, the candidate in `worker` (worker.Worker, started by the
    caller); model_new.py is not imported here."""
    path, _, reference = _import_reference(path)
    return Workdir(path=path, reference=reference, worker=worker)


def load_workdir(path: Path, extension: Any, after_reference: Callable[[Any], Any] | None = None) -> Workdir:
    """The worker's view of a workdir (and a tool's that runs the candidate in-process, such as
    the memory-safety child): import `path`/model.py and `path`/model_new.py as `cudaopt_workdir_<hash>.model` and
    `.model_new`. While model_new.py is imported, `import cuda_extension` finds `extension`
    and `import model` finds this workdir's model.py; both names are restored afterwards.
    `after_reference(reference_module)` is called between the two imports (the session trusts
    what model.py did, and watches its classes from then on)."""
    path, package, reference = _import_reference(path)
    if after_reference is not None:
        after_reference(reference)
    candidate = import_file(f"{package.__name__}.model_new", path / "model_new.py", path,
                            {"cuda_extension": extension, "model": reference})
    if not hasattr(candidate, "ModelNew"):
        raise WorkdirError(f"{path / 'model_new.py'} defines no class ModelNew")
    package.model, package.model_new = reference, candidate
    return Workdir(path=path, reference=reference, candidate=candidate, extension=extension)
