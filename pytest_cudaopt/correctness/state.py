"""Model state away from its default initialisation: parameters and running statistics moved, structural buffers left alone, and which moved tensor a candidate ignores.

At its default initialisation much of a model's state is trivial (LayerNorm's weight 1, its bias 0): a kernel
that drops such a tensor is exact there. Other buffers (a causal mask, `num_batches_tracked`) are structure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pytest_cudaopt.correctness import compare, shapes
from pytest_cudaopt.correctness.faults import CudaFault, context_lost
from pytest_cudaopt.correctness.guards import derive_seed
from pytest_cudaopt.primitives.tensors import clone_inputs
from pytest_cudaopt.run.watchdog import harness_step

RUNNING_STATS = ("running_mean", "running_var")
CONSTANT_SPREAD = 0.3   # a constant c != 0 becomes c * U(1 - 0.3, 1 + 0.3), element by element
ZERO_SPREAD = 0.3       # a constant 0 becomes U(-0.3, 0.3)
SHUFFLE_JITTER = 0.2    # any other tensor: its own values shuffled, each times U(0.8, 1.2)
SHUFFLE_LIMIT = 1 << 22  # a larger tensor is rotated, not shuffled: a full shuffle of 2**28 values took minutes
JITTER_CHUNK = 1 << 24   # the jitter of a large tensor is drawn and applied in place, this many values at a time
DIAGNOSED = 10          # tensors tried one at a time after a failure, at most


@dataclass(frozen=True)
class Moved:
    """One tensor `perturb` moves: its state-dict name and what it is."""

    name: str
    constant: bool      # initialised to one value (the likeliest to be dropped by a kernel)


def movable(model: torch.nn.Module) -> list[tuple[Moved, torch.Tensor]]:
    """The non-empty floating-point parameters (tied ones once) and running statistics of
    `model`, in state-dict order, parameters first."""
    named = [*model.named_parameters(), *((n, t) for n, t in model.named_buffers()
                                          if n.rsplit(".", 1)[-1] in RUNNING_STATS)]
    return [(Moved(name, bool((t.detach() == t.detach().reshape(-1)[0]).all())), t)
            for name, t in named if t is not None and t.is_floating_point() and t.numel()]


def moved(tensor: torch.Tensor, constant: bool, seed: int) -> torch.Tensor:
    """A new value for `tensor`, drawn from `seed` on its device, with its scale and signs kept
    (a variance stays positive) so that a realistic model stays well conditioned."""
    generator = torch.Generator(device=tensor.device).manual_seed(seed)
    if not constant and tensor.numel() > SHUFFLE_LIMIT:
        return _rotated(tensor, generator)
    flat = tensor.detach().reshape(-1).float()

    def uniform(low: float, high: float) -> torch.Tensor:
        u = torch.rand(flat.shape, generator=generator, device=tensor.device, dtype=torch.float32)
        return low + (high - low) * u

    if constant and float(flat[0]) == 0.0:
        new = uniform(-ZERO_SPREAD, ZERO_SPREAD)
    elif constant:
        new = flat * uniform(1 - CONSTANT_SPREAD, 1 + CONSTANT_SPREAD)
    else:
        order = torch.randperm(flat.numel(), generator=generator, device=tensor.device)
        new = flat[order] * uniform(1 - SHUFFLE_JITTER, 1 + SHUFFLE_JITTER)
    return new.to(tensor.dtype).reshape(tensor.shape)


def _rotated(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A large tensor's values rotated by a random offset (one copy, no index tensor), then
    jittered in place a chunk at a time."""
    flat = tensor.detach().reshape(-1)
    new = torch.roll(flat, int(torch.randint(1, flat.numel(), (1,), generator=generator, device=tensor.device)))
    for start in range(0, new.numel(), JITTER_CHUNK):
        part = new[start:start + JITTER_CHUNK]
        u = torch.rand(part.shape, generator=generator, device=tensor.device, dtype=torch.float32)
        part.mul_(u.mul_(2 * SHUFFLE_JITTER).add_(1 - SHUFFLE_JITTER).to(part.dtype))
    return new.reshape(tensor.shape)


def perturb(model: torch.nn.Module, seed: int, only: set[str] | None = None) -> list[Moved]:
    """Move `model`'s parameters and running statistics (all, or those in `only`) in place; a tensor's new
    value depends on `seed` and its name alone: moved by itself, it gets the value it had when all moved."""
    done = []
    with torch.no_grad():
        for info, tensor in movable(model):
            if only is not None and info.name not in only:
                continue
            tensor.copy_(moved(tensor, info.constant, derive_seed(seed, "state", info.name)))
            done.append(info)
    return done


def perturb_pair(workdir: Any, model: torch.nn.Module, model_new: torch.nn.Module, seed: int,
                 only: set[str] | None = None) -> list[Moved]:
    """`perturb` Model, then load its state into ModelNew (`Workdir.copy_state`)."""
    done = perturb(model, seed, only)
    workdir.copy_state(model, model_new)
    return done


def describe(done: list[Moved]) -> str:
    """`state: 3 tensors moved from their defaults (ln.weight, ln.bias, ...)`."""
    if not done:
        return "state: as initialised (Model has no parameter or running statistic to move)"
    names = ", ".join(m.name for m in done[:6]) + (", ..." if len(done) > 6 else "")
    return f"state: Model's parameters and running statistics moved from their defaults ({len(done)}: {names})"


def _call(module: torch.nn.Module, inputs: list) -> Any:
    with torch.no_grad():
        return module(*clone_inputs(inputs))


def _same(a: Any, b: Any, atol: float, rtol: float) -> bool:
    return compare.compare_outputs(a, b, atol=atol, rtol=rtol).passed


def diagnose(workdir: Any, device: torch.device, constants: dict[str, int], seed: int,
             atol: float, rtol: float, cap: int = DIAGNOSED) -> str:
    """After a case with moved state failed: the lines naming the tensors the candidate ignores ("" if
    none can be told), from the case at the default state and with one tensor moved at a time."""
    try:
        with shapes.applied(workdir.reference, constants), harness_step("naming the state ModelNew ignores"):
            return _diagnose(workdir, device, seed, atol, rtol, cap)
    except Exception as exc:  # noqa: BLE001 - a diagnosis that cannot run says nothing
        if context_lost(exc):
            raise CudaFault(f"while naming the ignored state: {exc}") from exc
        return ""


def _diagnose(workdir: Any, device: torch.device, seed: int, atol: float, rtol: float, cap: int) -> str:
    model, model_new = workdir.make_models(device, seed=derive_seed(seed, "weights"))
    inputs = workdir.inputs(seed, device)
    default = {k: v.detach().clone() for k, v in model.state_dict().items()}
    reference, candidate = _call(model, inputs), _call(model_new, inputs)
    at_default = ("at the default state this case passes" if _same(candidate, reference, atol, rtol)
                  else "at the default state this case fails too")
    # Tried either way: a tensor ModelNew ignores leaves its output unchanged when it moves
    # alone, even where the default state fails already (a dropped bias, random at init).
    tried = sorted((info for info, _ in movable(model)), key=lambda m: not m.constant)
    ignored, wrong = [], []
    for info in tried[:cap]:
        model.load_state_dict(default)
        perturb_pair(workdir, model, model_new, seed, only={info.name})
        ref_one, new_one = _call(model, inputs), _call(model_new, inputs)
        if _same(new_one, ref_one, atol, rtol) or _same(ref_one, reference, atol, rtol):
            continue  # right with it moved, or the reference does not see it at this case
        if _same(new_one, candidate, atol, rtol):
            ignored.append(f"`{info.name}`")
        elif at_default.endswith("passes"):  # wrong only when it moves: it is read, and read wrong
            wrong.append(f"`{info.name}`")
    lines = [at_default]
    if ignored:
        lines.append("ModelNew ignores state the reference uses: "
                     + "; ".join(f"output unchanged when {name} changes" for name in ignored))
    if wrong:
        lines.append(f"ModelNew's output is wrong when only {' or '.join(wrong)} changes")
    if len(tried) > cap:
        lines.append(f"({len(tried) - cap} more tensors not tried one at a time)")
    return "\n".join(lines)
