"""The global-flag road: torch's process-wide settings (backends, default dtype, matmul precision, modes) as values."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

from pytest_cudaopt.isolation.changes import FLAG, Change, short


@dataclass(frozen=True)
class Flag:
    """A setting read by `read()`; `write(value)` puts a value back, where torch can."""

    name: str
    read: Callable[[], Any]
    write: Callable[[Any], None] | None = None
    lazy: bool = False   # read() is None until torch loads it by itself: not compared before that


def _attribute(path: str) -> Flag:
    """A flag that is an attribute: `torch.backends.cudnn.allow_tf32`."""
    owner_path, _, attr = path.rpartition(".")

    def owner():
        import torch  # noqa: F401

        return operator.attrgetter(owner_path.removeprefix("torch."))(__import__("torch"))

    return Flag(path, lambda: getattr(owner(), attr), lambda value: setattr(owner(), attr, value))


def _call(name: str, read: Callable[[Any], Any], write: Callable[[Any, Any], None] | None = None) -> Flag:
    def reader():
        import torch

        return read(torch)

    def writer(value):
        import torch

        write(torch, value)

    return Flag(name, reader, writer if write is not None else None)


def _autocast(device: str) -> Flag:
    def read(torch):
        return (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    return _call(f"torch.is_autocast_enabled({device!r})", read)


def _current_stream(torch) -> str:
    """`default` while the current CUDA stream is the device's default one (CUDA untouched counts)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return "default"
    current, default = torch.cuda.current_stream(), torch.cuda.default_stream()
    return "default" if current.cuda_stream == default.cuda_stream else f"stream {current.cuda_stream:#x}"


@dataclass(frozen=True)
class Hooks:
    """The module hooks that torch.nn.modules.module keeps for every nn.Module (a forward hook
    there rewrites the reference's output): (dictionary name, its items) for each non-empty one."""

    entries: tuple

    def __repr__(self) -> str:
        if not self.entries:
            return "none"
        return "; ".join(f"{name}: {', '.join(getattr(h, '__qualname__', type(h).__name__) for _, h in items)}"
                         for name, items in self.entries)


def _global_hooks(torch) -> Hooks:
    module = torch.nn.modules.module
    return Hooks(tuple((name, tuple(value.items())) for name, value in sorted(vars(module).items())
                       if name.startswith("_global_") and isinstance(value, dict) and value))


def _put_back_hooks(torch, saved: Hooks) -> None:
    module = torch.nn.modules.module
    kept = dict(saved.entries)
    for name, value in vars(module).items():
        if name.startswith("_global_") and isinstance(value, dict):
            value.clear()
            value.update(kept.get(name, ()))


def _compiler_config(module_name: str) -> Flag:
    """Every setting of torch._dynamo.config or torch._inductor.config (a smaller
    max_fusion_size or no fusion makes the torch.compile baseline slower), once torch loaded it."""
    import sys

    def read():
        module = sys.modules.get(module_name)
        return None if module is None else module.get_config_copy()

    def write(value):
        module = sys.modules[module_name]
        now = module.get_config_copy()
        for key in [k for k in value if now.get(k, ...) != value[k]]:   # only those (others may warn)
            setattr(module, key, value[key])

    return Flag(module_name, read, write, lazy=True)


FLAGS: tuple[Flag, ...] = (
    _call("torch.get_default_dtype()", lambda t: t.get_default_dtype(), lambda t, v: t.set_default_dtype(v)),
    _call("torch.get_default_device()", lambda t: str(t.get_default_device()), lambda t, v: t.set_default_device(v)),
    _call("torch.get_float32_matmul_precision()", lambda t: t.get_float32_matmul_precision(),
          lambda t, v: t.set_float32_matmul_precision(v)),
    _call("torch.are_deterministic_algorithms_enabled()",
          lambda t: (t.are_deterministic_algorithms_enabled(), t.is_deterministic_algorithms_warn_only_enabled()),
          lambda t, v: t.use_deterministic_algorithms(v[0], warn_only=v[1])),
    _attribute("torch.utils.deterministic.fill_uninitialized_memory"),
    _call("torch.is_grad_enabled()", lambda t: t.is_grad_enabled(), lambda t, v: t.set_grad_enabled(v)),
    _call("torch.is_inference_mode_enabled()", lambda t: t.is_inference_mode_enabled()),
    _call("torch.is_anomaly_enabled()", lambda t: t.is_anomaly_enabled(), lambda t, v: t.set_anomaly_enabled(v)),
    _call("torch.get_num_threads()", lambda t: t.get_num_threads(), lambda t, v: t.set_num_threads(v)),
    _attribute("torch.backends.cuda.matmul.allow_tf32"),
    _attribute("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
    _attribute("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
    _attribute("torch.backends.cuda.matmul.allow_fp16_accumulation"),
    _attribute("torch.backends.fp32_precision"),
    _call("torch.backends.cuda.preferred_blas_library()", lambda t: str(t.backends.cuda.preferred_blas_library()),
          None),
    _call("torch.backends.cuda.flash_sdp_enabled()", lambda t: t.backends.cuda.flash_sdp_enabled(),
          lambda t, v: t.backends.cuda.enable_flash_sdp(v)),
    _call("torch.backends.cuda.mem_efficient_sdp_enabled()", lambda t: t.backends.cuda.mem_efficient_sdp_enabled(),
          lambda t, v: t.backends.cuda.enable_mem_efficient_sdp(v)),
    _call("torch.backends.cuda.math_sdp_enabled()", lambda t: t.backends.cuda.math_sdp_enabled(),
          lambda t, v: t.backends.cuda.enable_math_sdp(v)),
    _call("torch.backends.cuda.cudnn_sdp_enabled()", lambda t: t.backends.cuda.cudnn_sdp_enabled(),
          lambda t, v: t.backends.cuda.enable_cudnn_sdp(v)),
    _attribute("torch.backends.cudnn.enabled"),
    _attribute("torch.backends.cudnn.benchmark"),
    _attribute("torch.backends.cudnn.deterministic"),
    _attribute("torch.backends.cudnn.allow_tf32"),
    _attribute("torch.backends.cudnn.benchmark_limit"),
    _attribute("torch.backends.mkldnn.enabled"),
    _attribute("torch.backends.mkldnn.deterministic"),
    _autocast("cpu"),
    _autocast("cuda"),
    _call("torch.cuda.current_stream()", _current_stream),
    _call("the torch function mode stack", lambda t: t._C._len_torch_function_stack()),
    _call("the torch dispatch mode stack", lambda t: t._C._len_torch_dispatch_stack()),
    _call("torch._C._is_torch_function_enabled()", lambda t: t._C._is_torch_function_enabled()),
    _call("the thread's included dispatch keys", lambda t: str(t._C._dispatch_tls_local_include_set())),
    _call("the thread's excluded dispatch keys", lambda t: str(t._C._dispatch_tls_local_exclude_set())),
    _call("the global nn.Module hooks", _global_hooks, _put_back_hooks),
    _compiler_config("torch._dynamo.config"),
    _compiler_config("torch._inductor.config"),
)


def take() -> tuple[dict[str, Any], list[str]]:
    """({flag: value}, names of the flags this torch does not have)."""
    values, missing = {}, []
    for flag in FLAGS:
        try:
            values[flag.name] = flag.read()
        except (AttributeError, TypeError, RuntimeError):
            missing.append(flag.name)
    return values, missing


def changes(before: dict[str, Any]) -> list[Change]:
    found = []
    by_name = {flag.name: flag for flag in FLAGS}
    for name, value in before.items():
        flag = by_name[name]
        if flag.lazy and value is None:
            continue
        try:
            now = flag.read()
        except Exception as exc:  # noqa: BLE001 - a flag that can no longer be read has changed
            now = f"unreadable ({type(exc).__name__}: {exc})"
        if now != value:
            undo = (lambda f=flag, v=value: f.write(v)) if flag.write is not None else None
            found.append(Change(FLAG, name, _difference(value, now), undo=undo))
    return found


def _difference(value: Any, now: Any) -> str:
    """What changed: the keys of a settings table that differ, else both values."""
    if isinstance(value, dict) and isinstance(now, dict):
        keys = sorted(k for k in {*value, *now} if value.get(k, ...) != now.get(k, ...))
        shown = ", ".join(f"{k} was {short(value.get(k))}, now {short(now.get(k))}" for k in keys[:3])
        return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return f"was {short(value)}, now {short(now)}"
