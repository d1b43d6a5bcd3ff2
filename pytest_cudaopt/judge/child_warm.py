"""A pytest child started ahead of its turn: it imports torch and the other slow modules, waits for its device, then runs pytest.

Run as `python -m pytest_cudaopt.judge.child_warm PYTEST_ARGS...` with CUDA_VISIBLE_DEVICES=""
in its environment. It imports what every judging child imports (about half of a child's
start-up), then reads one line from stdin: the CUDA_VISIBLE_DEVICES it is given. Only then does
it run `python -m pytest PYTEST_ARGS...` in this process. So the imports overlap the workdir's
previous stage, and a perf child's device time starts with its own work.

No workdir code and none of the plugin's modules are imported before the line comes (pytest
rewrites the plugin's asserts on import, and the plugin's checks start at its configure). CUDA
is not asked for its devices before the line comes: it takes CUDA_VISIBLE_DEVICES once per
process. Should it have been asked all the same, the child starts afresh as a plain
`python -m pytest` (exec), with the device in its environment.
"""

from __future__ import annotations

import os
import sys

# The third-party modules whose import is a judging child's start-up. Nothing here touches CUDA.
# pytest plugins (hypothesis among them) are left out: pytest warns that it cannot rewrite
# the asserts of a plugin imported before it started.
PRELOAD = ("torch", "torch._dynamo", "torch._inductor", "torch.utils.cpp_extension", "numpy")
NOT_GIVEN = 3   # the judge ended before giving a device: the child exits without running anything


def preload() -> None:
    """Import PRELOAD. torch.cuda.is_available() runs during some of these imports (in
    torch.utils.cpp_extension); it is made to ask NVML, which initialises no CUDA, so that the
    device count torch caches is taken only once the device is given."""
    import importlib

    asked = "PYTORCH_NVML_BASED_CUDA_CHECK" in os.environ
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # the pytest run proper reports a broken install in its own words
                pass
    finally:
        if not asked:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]


def sees_given_devices(visible: str) -> bool:
    """Whether CUDA, asked now, sees the devices given. False when CUDA took its view of the
    devices before they were given (torch initialised, or the runtime's device count, which it
    keeps for the process, taken while none was visible)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda._is_compiled():
        return True
    if torch.cuda.is_initialized():
        return False
    if not visible or torch._C._cuda_getDeviceCount() > 0:
        return True
    # CUDA sees none: stale if NVML (which reads CUDA_VISIBLE_DEVICES at each call and
    # initialises no CUDA) sees one; -1 (no NVML) or 0: there is none to see.
    nvml = getattr(torch.cuda, "_device_count_nvml", lambda: -1)()
    return nvml <= 0


def main(argv: list[str]) -> int:
    preload()
    line = sys.stdin.readline()
    if not line.endswith("\n"):
        return NOT_GIVEN
    visible = line.strip()
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    if not sees_given_devices(visible):
        print("cudaopt judge: CUDA took its view of the devices before this child was given its own; "
              "starting afresh", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv])
    import runpy

    sys.argv = ["pytest", *argv]
    try:
        runpy.run_module("pytest", run_name="__main__", alter_sys=True)   # exactly `python -m pytest ARGS`
    except SystemExit as end:
        return end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
