"""Load a workdir: model.py and model_new.py as distinct modules, Model/ModelNew pairs, seeded inputs."""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from pytest_cudaopt.candidate.load import NONDETERMINISTIC, WorkdirError, import_candidate, import_file, import_reference, load_state, module_prefix, private_rng, saved_rng, seed_all, temporary_modules, user_traceback

def _to_device(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The generators seeded with `seed`, their earlier state not kept (the caller keeps it with
    `saved_rng` around many draws)."""
    seed_all(seed)
    yield


def _as_list(values: Any, file: Path, function: str, role: str) -> list:
    """A KernelBench helper's result as a list; anything else is model.py's mistake, said in one line."""
    if isinstance(values, (list, tuple)):
        return list(values)
    if isinstance(values, torch.Tensor):
        what = f"a bare tensor {str(values.dtype).removeprefix('torch.')}[{', '.join(map(str, values.shape))}]"
    else:
        text = repr(values)
        what = f"{type(values).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
    raise WorkdirError(f"{file.name}: {function} returned {what}; it must return a list "
                       f"of {role}, e.g. `return [x]`", file.name)


@dataclass
class Workdir:
    """A loaded workdir: `reference` is model.py; the candidate is `worker` (worker.Worker) in the judging
    process, else `candidate` and `extension` (model_new.py and the extension, in this process). Each file is
    imported under a module name of its own, so that several workdirs can share a process."""

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
        """model_new.py declares `CUDAOPT_NONDETERMINISTIC = True`: two runs may differ within the tolerance."""
        if self.worker is not None:
            return bool(self.worker.facts.get("nondeterministic"))
        return bool(getattr(self.candidate, NONDETERMINISTIC, False))

    def _call(self, file: Path, what: str, func, *args):
        try:
            return func(*args)
        except WorkdirError:
            raise
        except Exception as exc:
            raise WorkdirError(f"{file.name}: {what} raised:\n{user_traceback(exc, [self.path])}", file.name) from exc

    def init_inputs(self) -> list:
        """model.py's get_init_inputs(), as a list."""
        values = self._call(self.model_file, "get_init_inputs()", self.reference.get_init_inputs)
        return _as_list(values, self.model_file, "get_init_inputs()", "the arguments of Model(...)")

    def inputs(self, seed: int, device: torch.device | str = "cpu", isolated: bool = True) -> list:
        """model.py's get_inputs() under a private RNG seeded by `seed`, drawn on `device` when it is CUDA;
        `isolated=False` seeds the global generators without saving their state (`saved_rng`)."""
        on_device = torch.device(device).type == "cuda"
        rng = private_rng(seed) if isolated else _seeded(seed)
        with rng, (torch.device(device) if on_device else contextlib.nullcontext()):
            values = self._call(self.model_file, "get_inputs()", self.reference.get_inputs)
        values = _as_list(values, self.model_file, "get_inputs()", "the arguments of forward(...)")
        return [_to_device(v, device) for v in values]

    def make_reference(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[list, torch.nn.Module]:
        """(get_init_inputs(), Model built from them) in eval mode on `device`, its parameters drawn under a private
        RNG seeded by `seed`."""
        init = self.init_inputs()
        with private_rng(seed):
            model = self._call(self.model_file, "Model(*get_init_inputs())", self.reference.Model, *init)
        return init, model.eval().to(device)

    def make_models(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.nn.Module, Any]:
        """(Model, ModelNew) from get_init_inputs(), in eval mode on `device`: Model as `make_reference` builds it,
        its state copied into ModelNew (a worker.RemoteModel where the workdir has a worker), built under the
        same seed."""
        init, model = self.make_reference(device, seed)
        return model, self.make_candidate(model, init, device, seed)

    def make_candidate(self, model: torch.nn.Module, init: list, device: torch.device | str, seed: int) -> Any:
        """ModelNew from `init` on `device`, built under `seed`, with `model`'s state copied into it."""
        if self.worker is not None:
            from pytest_cudaopt.remote.model import RemoteModel

            reply = self._remote(lambda: self.worker.request(
                {"op": "make", "init": init, "seed": seed, "device": str(device),
                 "what": "ModelNew(*get_init_inputs())"}, what="constructing ModelNew"))
            model_new = RemoteModel(self.worker, reply["id"], str(device), list(reply["keys"]))
        else:
            with private_rng(seed):
                model_new = self._call(self.model_new_file, "ModelNew(*get_init_inputs())", self.candidate.ModelNew,
                                       *init).eval().to(device)
        self.copy_state(model, model_new)
        return model_new

    def _remote(self, func: Callable[[], Any]) -> Any:
        """`func()`, a worker's error turned into a WorkdirError (of model_new.py unless it names a file)."""
        from pytest_cudaopt.remote.worker import WorkerError

        try:
            return func()
        except WorkerError as exc:
            raise WorkdirError(str(exc), exc.file or self.model_new_file.name) from exc

    def copy_state(self, model: torch.nn.Module, model_new: Any) -> None:
        """Load Model's state dict and non-persistent buffers into ModelNew, strict: the same keys and shapes."""
        state, buffers = model.state_dict(), non_persistent_buffers(model)
        if self.worker is None:
            load_state(model_new, state, buffers)
        else:
            self._remote(lambda: model_new.load_state(state, buffers, self.model_file.name))


def non_persistent_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The buffers that state_dict() leaves out (register_buffer(..., persistent=False))."""
    found = {}
    for prefix, sub in module.named_modules():
        for name in getattr(sub, "_non_persistent_buffers_set", ()):
            buffer = sub._buffers.get(name)
            if buffer is not None:
                found[f"{prefix}.{name}" if prefix else name] = buffer
    return found


def load_reference(path: Path, worker: Any = None) -> Workdir:
    """The judging process's view of a workdir: model.py, the candidate in `worker` (model_new.py not imported)."""
    path, _, reference = import_reference(path)
    return Workdir(path=path, reference=reference, worker=worker)


def load_workdir(path: Path, extension: Any) -> Workdir:
    """A workdir with model.py and model_new.py imported in this process (`classic` mode, tests)."""
    reference, candidate = import_candidate(path, extension)
    return Workdir(path=Path(path).resolve(), reference=reference, candidate=candidate, extension=extension)
