"""The child that the memory-safety item runs under compute-sanitizer: one call of ModelNew, its kernels the built extension.

The judging side draws the case (model.py's init arguments, Model's state, the inputs) and saves it as --scratch/CASE;
this child builds ModelNew as a worker does (candidate/serve.py's `make` and `load_state`), calls it once under the op
audit and saves the output to --scratch/OUTPUT. It imports nothing of the judging side, and model.py's Model is not run
here: only the candidate's kernels are under judgement. It confines itself first, as a worker does
(candidate/sandbox.py): what decides the item is compute-sanitizer's exit status and log, written by its own process,
which a confined child can neither ptrace nor write; the parent checks the call's word, audit and output.

Exit status 0 when the call completed (its last line DONE and the audit as JSON), 2 when the
workdir, the extension or the case cannot be loaded (or, with --sandbox require, the process cannot
be confined), 3 when ModelNew raised (the message on stderr)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Sequence

DONE = "cudaopt-memsafety-call:"  # the last line of a call that completed, then its facts as JSON
CASE = "memsafety-case.pt"         # {"init", "seed", "state", "buffers", "inputs"}: CPU tensors, from the parent
OUTPUT = "memsafety-output.pt"     # the call's output (CPU tensors)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_cudaopt.candidate.sanitized",
                                description="One call of a workdir's ModelNew, for compute-sanitizer.")
    p.add_argument("workdir")
    p.add_argument("--extension", required=True, help="the built cuda_extension .so")
    p.add_argument("--scratch", required=True, help="the folder of CASE and OUTPUT, all a confined child may write")
    p.add_argument("--device", default="cuda")
    p.add_argument("--sandbox", default="off", choices=("require", "auto", "off"), help="cudaopt_sandbox")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the case (started before it is drawn)")
    return p


def _await(case: Path, seconds: float, parent: int) -> bool:
    """The case is there, or comes within `seconds` while the process that started this one (`parent`) lives."""
    import time

    deadline = time.monotonic() + seconds
    while not case.exists():
        if time.monotonic() > deadline or os.getppid() != parent:
            return False
        time.sleep(0.005)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()
    args = _parser().parse_args(argv)
    from pytest_cudaopt.candidate.sandbox import confine

    # compute-sanitizer's injection has started a thread of its own by now; the candidate's code
    # runs on this one (and on what it starts), which Landlock confines.
    extension_so, scratch = Path(args.extension), Path(args.scratch)
    held = confine(args.sandbox, args.workdir, str(extension_so.parent), str(scratch), started_by="compute-sanitizer")
    if args.sandbox == "require" and "files" in held.get("missing", {}):
        print(f"cudaopt memsafety: cudaopt_sandbox=require: the child could not be confined: {held['missing']}",
              file=sys.stderr)
        return 2
    import torch

    from pytest_cudaopt.candidate.load import (WorkdirError, import_candidate, import_extension, load_state,
                                               private_rng)
    from pytest_cudaopt.candidate.observe import OpAudit, leaves

    # Started ahead (torch imported meanwhile): nothing of the workdir's loads before its case comes.
    if not _await(scratch / CASE, args.wait, parent):
        print(f"cudaopt memsafety: no case came within {args.wait:g} s", file=sys.stderr)
        return 2
    try:
        with torch.serialization.safe_globals([frozenset]):   # what the wire carries (wire._PLAIN_ALLOWED), no less
            case = torch.load(scratch / CASE, weights_only=True)
        extension = import_extension(extension_so, extension_so.parent)
        _, candidate = import_candidate(Path(args.workdir), extension)
    except (WorkdirError, ImportError, OSError, RuntimeError, pickle.UnpicklingError) as exc:
        print(f"cudaopt memsafety: cannot load {args.workdir} or its case: {exc}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    try:
        with private_rng(int(case["seed"])):
            model_new = candidate.ModelNew(*case["init"])
        model_new = model_new.eval().to(device)
        load_state(model_new, case["state"], case["buffers"])
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in case["inputs"]]
        audit = OpAudit(Path(args.workdir), extension)
        with torch.no_grad(), audit:   # no poisoned memory: initcheck must see what the kernels leave unwritten
            output = model_new(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        torch.save([leaf.detach().cpu() for _, leaf in leaves(output) if isinstance(leaf, torch.Tensor)],
                   scratch / OUTPUT)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which shows it
        text = str(exc).strip().splitlines()
        print(f"cudaopt memsafety: the case raised {type(exc).__name__}: {text[0] if text else ''}", file=sys.stderr)
        return 3
    print(DONE, json.dumps({"audit": [op.describe() for op in audit.violations()]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
