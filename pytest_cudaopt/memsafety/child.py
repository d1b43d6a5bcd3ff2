"""The child that the memory-safety item runs under compute-sanitizer: the workdir with its built extension, one case, one call of ModelNew.

Exit status 0 when the call completed, 2 when the workdir or the extension cannot be loaded
(or, with --sandbox require, the process cannot be confined), 3 when ModelNew or the
reference's input helpers raised (the message on stderr). The reference itself is not run:
only the candidate's kernels are under judgement. The child confines itself first, as a worker
does (candidate/sandbox.py): what decides the item is compute-sanitizer's exit status and log,
written by its own process, which a confined child can neither ptrace nor write. The call runs
under the op audit, as in a worker, and its output is saved to --scratch: the item checks that
ModelNew was called and computed its function with its own kernels (a child that skipped the
call under the sanitizer, or fell back to torch, passes nothing)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Sequence

DONE = "cudaopt-memsafety-call:"  # the last line of a call that completed, then its inputs as JSON
OUTPUT = "memsafety-output.pt"     # the call's output (CPU tensors), in --scratch


def load_extension(path: str):
    """The built module at `path` (its init function is PyInit_cuda_extension)."""
    spec = importlib.util.spec_from_file_location("cuda_extension", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_cudaopt.memsafety.child",
                                description="One call of a workdir's ModelNew, for compute-sanitizer.")
    p.add_argument("workdir")
    p.add_argument("--extension", required=True, help="the built cuda_extension .so")
    p.add_argument("--case", default="", help="constants of model.py, e.g. batch_size=1,dim=7 (default: canonical)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs and the weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sandbox", default="off", choices=("require", "auto", "off"), help="cudaopt_sandbox")
    p.add_argument("--scratch", default=None, help="the one folder the confined child may write")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pytest_cudaopt.candidate.sandbox import confine
    from pytest_cudaopt.remote.candidate import describe

    # compute-sanitizer's injection has started a thread of its own by now; the candidate's code
    # runs on this one (and on what it starts), which Landlock confines.
    held = confine(args.sandbox, args.workdir, str(Path(args.extension).parent), args.scratch or ".",
                   started_by="compute-sanitizer")
    if args.sandbox == "require" and "files" in held.get("missing", {}):
        print(f"cudaopt memsafety: cudaopt_sandbox=require: the child could not be confined: {describe(held)}",
              file=sys.stderr)
        return 2
    import torch

    from pytest_cudaopt.correctness import shapes
    from pytest_cudaopt.primitives.tensors import describe_inputs
    from pytest_cudaopt.workdir import WorkdirError, load_workdir

    try:
        workdir = load_workdir(Path(args.workdir), load_extension(args.extension))
        constants = shapes.parse_case(args.case)
    except (WorkdirError, ImportError, shapes.ShapeError) as exc:
        print(f"cudaopt memsafety: cannot load {args.workdir}: {exc}", file=sys.stderr)
        return 2
    from pytest_cudaopt.candidate.observe import OpAudit, leaves

    device = torch.device(args.device)
    try:
        with shapes.applied(workdir.reference, constants):
            _, model_new = workdir.make_models(device, seed=args.seed)
            inputs = workdir.inputs(args.seed, device)
        audit = OpAudit(Path(args.workdir), workdir.extension)
        with torch.no_grad(), audit:   # no poisoned memory: initcheck must see what the kernels leave unwritten
            output = model_new(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tensors = [leaf.detach().cpu() for _, leaf in leaves(output) if isinstance(leaf, torch.Tensor)]
        if args.scratch:
            torch.save(tensors, Path(args.scratch) / OUTPUT)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which shows it
        text = str(exc).strip().splitlines()
        print(f"cudaopt memsafety: the case raised {type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr)
        return 3
    print(DONE, json.dumps({"case": args.case, "inputs": describe_inputs(inputs, None),
                            "audit": [op.describe() for op in audit.violations()]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
