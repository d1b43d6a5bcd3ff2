"""The one loader of the candidate's code: the built extension (its .so) and the workdir's model.py and model_new.py, each under a name of its own; ModelNew's state from Model's."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import random
import re
import shutil
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Iterator

# torch is imported where it is used: the judging process imports this module before it may import torch.

EXTENSION = "cuda_extension"   # the name model_new.py imports the extension by

MODULE_PREFIX = "cudaopt_workdir_"
NONDETERMINISTIC = "CUDAOPT_NONDETERMINISTIC"  # model_new.py: kernels use atomics, results vary in the last bits


class WorkdirError(Exception):
    """The workdir cannot be loaded or its models built; `file` names the file, when known."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(message)
        self.file = file


def module_prefix(path: Path) -> str:
    """`cudaopt_workdir_<hash>`: the package name of a workdir's files, distinct for every folder."""
    return MODULE_PREFIX + hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:12]


def user_traceback(exc: BaseException, roots: list[Path]) -> str:
    """The exception with only its frames inside `roots`: `  model.py:12 in get_inputs: return ...`, `Type: message`."""
    roots = [Path(r).resolve() for r in roots]
    lines = []
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        try:
            resolved = path.resolve()
        except OSError:
            continue
        if any(resolved == r or r in resolved.parents for r in roots):
            rel = next((resolved.relative_to(r) for r in roots if r.is_dir() and r in resolved.parents), resolved.name)
            code = f": {frame.line.strip()}" if frame.line else ""
            lines.append(f"  {rel}:{frame.lineno} in {frame.name}{code}")
    message = str(exc).strip()
    # C++ exceptions carry a long native backtrace after the message; keep the message.
    kept = [ln for ln in message.splitlines() if ln.strip()]
    cut = next((i for i, ln in enumerate(kept) if ln.startswith(("Exception raised from", "frame #"))), len(kept))
    kept = kept[:min(cut, 12)]
    lines.append(f"{type(exc).__name__}: " + "\n".join(kept))
    return "\n".join(lines)


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
    """Import `file` as module `name`, `workdir` first on sys.path and `aliases` in sys.modules; else a WorkdirError."""
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
    """`model.py:3: SyntaxError: invalid syntax`, the offending line and a caret; no import frames."""
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


@contextlib.contextmanager
def saved_rng() -> Iterator[None]:
    """The global generators (torch's, Python `random`, NumPy) as they were before the block."""
    import torch

    # is_initialized first: is_available asks the driver (0.2 ms on an H100; a perf item draws inputs 1,000 times)
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
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


def seed_all(seed: int) -> None:
    """Torch's, Python's and NumPy's generators seeded with `seed`. torch.manual_seed queues CUDA's seed with
    its caller's stack (0.4 ms under pytest, a perf item's every draw) where CUDA may still start."""
    import torch

    if torch.cuda.is_initialized():
        torch.default_generator.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
    elif torch.cuda.is_available():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


@contextlib.contextmanager
def private_rng(seed: int) -> Iterator[None]:
    """Torch, Python `random` and NumPy seeded with `seed` for the duration, then as they were."""
    with saved_rng():
        seed_all(seed)
        yield


def load_state(model_new: torch.nn.Module, state: dict, buffers: dict[str, torch.Tensor],
               model_file: str = "model.py") -> None:
    """Model's `state` into ModelNew, strict (a WorkdirError names differing keys), then its `buffers`."""
    expected, present = set(state), set(model_new.state_dict())
    parts = [f"{what}: {', '.join(names)}" for what, names in (
        ("missing (in Model, not in ModelNew)", sorted(expected - present)),
        ("unexpected (in ModelNew, not in Model)", sorted(present - expected))) if names]
    if parts:
        raise WorkdirError(f"model_new.py: ModelNew's state_dict keys differ from Model's ({model_file}): "
                           + "; ".join(parts))
    try:
        model_new.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise WorkdirError(f"model_new.py: loading Model's state_dict into ModelNew failed: {exc}") from exc
    copy_buffers(buffers, model_new, model_file)


def copy_buffers(ours: dict[str, torch.Tensor], model_new: torch.nn.Module, model_file: str = "model.py") -> None:
    """Model's non-persistent buffers (`ours`) into ModelNew's of the same name, else a WorkdirError."""
    import torch

    theirs = dict(model_new.named_buffers())
    for name, buffer in ours.items():
        target = theirs.get(name)
        if target is None:
            raise WorkdirError(f"model_new.py: Model ({model_file}) has the non-persistent buffer "
                               f"'{name}' {tuple(buffer.shape)}, ModelNew has no buffer of that name; "
                               f"register it in ModelNew too so both start from the same values")
        if target.shape != buffer.shape:
            raise WorkdirError(f"model_new.py: non-persistent buffer '{name}': Model ({model_file}) has "
                               f"shape {tuple(buffer.shape)}, ModelNew {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(buffer)


def import_reference(path: Path) -> tuple[Path, types.ModuleType, types.ModuleType]:
    """model.py of the workdir at `path` under its package name: (resolved path, package, module)."""
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


def import_candidate(path: Path, extension: Any) -> tuple[types.ModuleType, types.ModuleType]:
    """(model, model_new) of the workdir at `path`; model_new.py's `import cuda_extension` finds `extension`."""
    path, package, reference = import_reference(path)
    candidate = import_file(f"{package.__name__}.model_new", path / "model_new.py", path,
                            {EXTENSION: extension, "model": reference})
    if not hasattr(candidate, "ModelNew"):
        raise WorkdirError(f"{path / 'model_new.py'} defines no class ModelNew")
    package.model, package.model_new = reference, candidate
    return reference, candidate


# so path -> ((mtime, size, inode), module): an unchanged build is not imported twice.
_LOADED: dict[Path, tuple[tuple[int, int, int], Any]] = {}
_load_count = 0


def import_extension(so: Path, build_dir: Path) -> Any:
    """Import the built `cuda_extension` under a name unique to this build; a rebuilt .so from a fresh
    copy in `build_dir`/loaded (the dynamic loader would hand back the loaded file of the same path)."""
    global _load_count
    stat = so.stat()
    ident = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _LOADED.get(so)
    if cached is not None and cached[0] == ident:
        return cached[1]
    _load_count += 1
    path = so
    if cached is not None:
        fresh = build_dir / "loaded"
        fresh.mkdir(exist_ok=True)
        path = fresh / f"{EXTENSION}.{os.getpid()}.{_load_count}.so"
        shutil.copy2(so, path)
    tag = hashlib.sha256(str(so).encode()).hexdigest()[:12]
    name = f"cudaopt_ext_{tag}_{_load_count}.{EXTENSION}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def __getattr__(attribute: str):  # PEP 562: only for names the module lacks
        if attribute.startswith("__"):
            raise AttributeError(f"module 'cuda_extension' has no attribute '{attribute}'")
        raise AttributeError(missing_function_message(module, attribute))

    module.__getattr__ = __getattr__
    sys.modules[name] = module
    _LOADED[so] = (ident, module)
    return module


def defined_functions(module) -> list[str]:
    """The functions a loaded `cuda_extension` defines, sorted."""
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))


def takes_module(func) -> bool:
    """True for a binding whose pybind11 signature takes a module: a registration function bound as the op."""
    first = (getattr(func, "__doc__", None) or "").split("\n", 1)[0]
    return re.search(r"\((?:\w+: )?(?:module|types\.ModuleType)\)", first) is not None


def missing_function_message(module, name: str) -> str:
    """Why `cuda_extension.<name>` is missing, in the workdir's own terms."""
    defined = defined_functions(module)
    text = f"cuda_extension has no function '{name}'; "
    if not defined:
        return text + ("it defines none: no kernels/*_binding.cpp registers a function with "
                       "REGISTER_BINDING(op, register_op), where register_op calls m.def")
    text += f"it defines {', '.join(defined)}"
    wrong = [n for n in defined if takes_module(getattr(module, n))]
    if wrong:
        text += (f". {', '.join(wrong)} takes a pybind11 module: that looks like a registration function "
                 "passed in the wrong form (the contract is REGISTER_BINDING(op, register_op); with the "
                 "published agent-workdir binding_registry.h or the shipped one, register_op(pybind11::module& m) "
                 f"calls m.def(\"{name}\", ...))")
    return text
