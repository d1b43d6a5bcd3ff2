"""The line-up of the speed verdict: eager Model, torch.compile(Model), peers, the target branch, ModelNew, and the TF32 scope of the precision-matched baseline."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from pytest_cudaopt.perf.clocks import host_time, synchronize_device
from pytest_cudaopt.perf.engine import Contender
from pytest_cudaopt.remote.candidate import Candidate
from pytest_cudaopt.run import signals

# Contender keys; the line-up, the gate, tables and reports refer to contenders by these.
EAGER, COMPILE, CUSTOM, PRECISION_MATCHED = "eager", "compile", "custom", "precision-matched"
TARGET = "target"  # the target branch's ModelNew (--cudaopt-baseline-workdir), for the regression check
PEER_PREFIX = "peer:"
PEERS_FILE = "peers.py"


class PeerError(Exception):
    """peers.py cannot be loaded or one of its peers cannot be built (message names which)."""


# torch's structured-trace logger: an empty DEBUG record for each step of a compile, which
# pytest's log capture (attached to it, though it does not propagate) shows under a failed item.
TRACE_LOGGER = "torch.__trace"


@contextmanager
def quiet_compile_log() -> Iterator[None]:
    """torch's structured-trace logger silenced inside the block, unless TORCH_TRACE asks for the trace."""
    log = logging.getLogger(TRACE_LOGGER)
    if os.environ.get("TORCH_TRACE"):
        yield
        return
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)


@contextmanager
def tf32(allowed: bool) -> Iterator[None]:
    """TF32 for float32 matmuls (cuBLAS) and convolutions (cuDNN) on or off inside the block only."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32 = cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


tf32_allowed = partial(tf32, True)   # the precision-matched baseline is compiled and timed so
fp32_strict = partial(tf32, False)   # the fp32 baselines are compiled and timed so


def synchronize(device: Any) -> None:
    if torch.device(device).type == "cuda":
        synchronize_device()


def fresh_caller(model: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A new function `name(*args) -> model(*args)` with a code object of its own: Dynamo caches per code
    object, guarded on the TF32 flags too, so each baseline gets its own cache and never recompiles the other's."""
    namespace: dict[str, Any] = {"model": model}
    code = compile(f"def {name}(*args):\n    return model(*args)\n", f"<cudaopt {name}>", "exec")
    exec(code, namespace)
    return namespace[name]


def compile_model(model: Callable[..., Any], example_inputs: Sequence[Any], device: Any, *,
                  mode: str = "default", backend: str = "inductor", name: str = "compiled",
                  scope: Callable[[], Any] = fp32_strict) -> tuple[Callable[..., Any], float]:
    """torch.compile(model) under `scope`, compiled by one call: (the callable, that call's seconds)."""
    kwargs: dict[str, Any] = {"backend": backend}
    if mode and mode != "default":
        kwargs["mode"] = mode
    compiled = torch.compile(fresh_caller(model, name.replace("-", "_")), **kwargs)
    with scope():
        synchronize(device)
        start = host_time()
        compiled(*example_inputs)
        synchronize(device)
        seconds = host_time() - start
    signals.raise_lost()
    return compiled, seconds


def load_peer_factories(workdir: Path, reference_module: Any = None) -> dict[str, Callable[..., Any]]:
    """`PEERS` of the workdir's peers.py ({} when there is no peers.py; its format: docs/workdir.md)."""
    path = Path(workdir) / PEERS_FILE
    if not path.is_file():
        return {}
    from pytest_cudaopt.workdir import WorkdirError, import_file, module_prefix

    aliases = {"model": reference_module} if reference_module is not None else {}
    try:
        module = import_file(f"{module_prefix(path.parent)}.peers", path, path.parent, aliases)
    except WorkdirError as exc:
        raise PeerError(str(exc)) from exc
    peers = getattr(module, "PEERS", None)
    if not isinstance(peers, dict) or not all(isinstance(k, str) and callable(v) for k, v in peers.items()):
        raise PeerError(f"{path}: expected a module-level PEERS = {{'name': factory, ...}} "
                        f"mapping names to classes or functions; got {type(peers).__name__}")
    return dict(peers)


def make_peer(name: str, factory: Callable[..., Any], init_inputs: Sequence[Any],
              state_dict: dict[str, Any], device: Any) -> Callable[..., Any]:
    """Build peer `name` from Model's init arguments, load Model's state dict into it."""
    try:
        peer = factory(*init_inputs)
    except Exception as exc:
        raise PeerError(f"peers.py: PEERS[{name!r}] failed to build with Model's init arguments "
                        f"{list(init_inputs)!r}: {type(exc).__name__}: {exc}") from exc
    if isinstance(peer, torch.nn.Module):
        try:
            peer.load_state_dict(state_dict, strict=True)
        except RuntimeError as exc:
            raise PeerError(f"peers.py: PEERS[{name!r}] does not take Model's state dict: {exc}") from exc
        peer = peer.to(device).eval()
    elif not callable(peer):
        raise PeerError(f"peers.py: PEERS[{name!r}] returned {type(peer).__name__}, not a module or callable")
    return peer


@dataclass
class Lineup:
    """The contenders of one perf test, plus what happened while preparing them."""

    contenders: list[Contender] = field(default_factory=list)
    compile_seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)   # key -> why it is not in the lineup


def lineup(
    model: torch.nn.Module,
    model_new: Candidate,
    example_inputs: Sequence[Any],
    device: Any,
    *,
    compile_mode: str = "default",
    compile_backend: str = "inductor",
    precision_matched: bool = False,
    workdir: Path | None = None,
    reference_module: Any = None,
    init_inputs: Sequence[Any] = (),
    target: Candidate | str | None = None,
    compiled: dict[str, tuple[Callable[..., Any], float]] | None = None,   # key -> compile_model's result
) -> Lineup:
    """Eager Model, torch.compile(Model) (and its TF32 twin), the peers, `target` and ModelNew; failures to `errors`."""
    out = Lineup()
    out.contenders.append(Contender(EAGER, model, "Model (eager)", scope=fp32_strict))
    extra = [] if compile_mode in ("", "default") else [compile_mode]
    extra += [f"backend={compile_backend}"] if compile_backend != "inductor" else []
    label = "torch.compile" + (f" ({', '.join(extra)})" if extra else "")
    compiles = [(COMPILE, "compiled_fp32", fp32_strict, "")]
    compiles += [(PRECISION_MATCHED, "compiled_tf32", tf32_allowed, " + TF32")] if precision_matched else []
    for key, name, scope, suffix in compiles:
        try:
            fn, seconds = (compiled or {}).get(key) or compile_model(
                model, example_inputs, device, mode=compile_mode, backend=compile_backend, name=name, scope=scope)
            out.contenders.append(Contender(key, fn, label + suffix, scope=scope))
            out.compile_seconds[key] = seconds
        except Exception as exc:
            out.errors[key] = f"{label}{suffix} failed: {type(exc).__name__}: {exc}"
    if workdir is not None:
        try:
            factories = load_peer_factories(workdir, reference_module)
        except PeerError as exc:
            out.errors[PEER_PREFIX + "*"] = str(exc)
            factories = {}
        state = model.state_dict()
        for name, factory in factories.items():
            key = PEER_PREFIX + name
            try:
                peer = make_peer(name, factory, init_inputs, state, device)
            except PeerError as exc:
                out.errors[key] = str(exc)
                continue
            out.contenders.append(Contender(key, peer, f"peer: {name}"))
    if isinstance(target, str):
        out.errors[TARGET] = target
    elif target is not None:
        out.contenders.append(Contender(TARGET, target, "ModelNew (target branch)", candidate=target))
    out.contenders.append(Contender(CUSTOM, model_new, "ModelNew (custom)", every_call=True, candidate=model_new))
    return out
