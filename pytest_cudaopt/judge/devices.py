"""The devices a judge runs on: the visible GPUs (nvidia-smi, else torch), their memory and arch, or CPU slots."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field


@dataclass
class DeviceSet:
    """What the judge schedules on: GPU indices (or cpu0, cpu1, ... slots), their memory, the arch list."""

    names: list[str]
    cpu: bool = False
    memory: dict[str, int] = field(default_factory=dict)
    arch_list: str | None = None   # TORCH_CUDA_ARCH_LIST for every child: builds and judges agree


def _smi(query: str) -> list[list[str]] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in out.stdout.splitlines() if line.strip()]


def gpus(requested: list[str] | None = None) -> DeviceSet:
    """The GPUs to use: `requested`, else CUDA_VISIBLE_DEVICES, else nvidia-smi's, else torch's count."""
    rows = _smi("index,memory.total,compute_cap") or []
    by_index = {r[0]: r for r in rows if len(r) >= 3}
    if requested:
        names = [str(n).strip() for n in requested if str(n).strip()]
    elif os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        names = [n.strip() for n in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if n.strip()]
    elif by_index:
        names = list(by_index)
    else:
        names = [str(i) for i in range(_torch_count())]
    memory = {n: int(float(by_index[n][1])) << 20 for n in names if n in by_index and by_index[n][1].replace(".", "", 1).isdigit()}
    caps = sorted({by_index[n][2] for n in names if n in by_index and by_index[n][2].replace(".", "", 1).isdigit()})
    return DeviceSet(names, memory=memory, arch_list=";".join(caps) or None)


def cpu_slots(count: int) -> DeviceSet:
    return DeviceSet([f"cpu{i}" for i in range(max(1, count))], cpu=True)


def _torch_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch CUDA runtime, a broken driver: no GPUs
        return 0
