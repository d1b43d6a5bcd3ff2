"""One object per pytest session: settings, built extensions, loaded workdirs, faults and results."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from pytest_cudaopt.settings import Settings


def cuda_device_name() -> str | None:
    """Name of the visible CUDA device, or None when there is none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def device_summary() -> str:
    """Report-header line: torch, CUDA, GPU name and compute capability, build arch."""
    import torch

    from pytest_cudaopt import build

    parts = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda or 'none'}"]
    name = cuda_device_name()
    if name is None:
        parts.append("no CUDA device")
    else:
        major, minor = torch.cuda.get_device_capability()
        parts.append(f"GPU {name} (sm_{major}{minor})")
    parts.append(f"arch {build.resolve_arch()}")
    return "cudaopt: " + ", ".join(parts)


def pin_worker_to_gpu(worker_id: str) -> int | None:
    """One GPU per pytest-xdist worker (`pytest -n <gpus>`): worker gwN uses device N modulo
    the visible devices. Returns the device index, or None with fewer than two devices."""
    import torch

    if not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    index = int(worker_id[2:]) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return index


class CudaoptSession:
    def __init__(self, settings: Settings, rootpath: Path):
        self.settings = settings
        self.rootpath = Path(rootpath)
        # The seed from which every trial's secret seed is derived; a replay fixes it.
        self.seed: int = settings.seed if settings.seed is not None else secrets.randbits(32)
        self.results: list[Any] = []
        self._extensions: dict[Path, Any] = {}
        self._workdirs: dict[Path, Any] = {}
        # Set by the first CUDA fault: (item id, message). Later GPU items report it.
        self.fault: tuple[str, str] | None = None

    def reproduce_line(self) -> str:
        return (f"cudaopt: seed {self.seed} (replay with --cudaopt-seed={self.seed}), "
                f"device {self.settings.device}, hypothesis profile {self.settings.profile}")

    def gpu_unavailable_reason(self) -> str | None:
        """Why a `gpu` item cannot run here, or None. Workdir items carry the marker only
        when `cudaopt_device` is cuda; the plugin's own GPU tests carry it always."""
        if cuda_device_name() is None:
            return "no CUDA device visible (torch.cuda.is_available() is False)"
        return None

    def extension(self, workdir: Path):
        """The workdir's `cuda_extension`, built at most once per session."""
        from pytest_cudaopt import build

        workdir = Path(workdir).resolve()
        if workdir not in self._extensions:
            try:
                self._extensions[workdir] = build.build_extension(workdir, settings=self.settings)
            except build.BuildError as exc:
                # Every later item of this workdir reports the same failure without rebuilding.
                self._extensions[workdir] = exc
        found = self._extensions[workdir]
        if isinstance(found, BaseException):
            raise found
        return found

    def loaded_extension(self, workdir: Path):
        """The workdir's extension if this session has built it already, else None."""
        found = self._extensions.get(Path(workdir).resolve())
        return None if found is None or isinstance(found, BaseException) else found

    def workdir(self, path: Path):
        """The loaded workdir (`workdir.Workdir`: model.py, model_new.py, its extension),
        loaded at most once per session. Raises build.BuildError or workdir.WorkdirError."""
        from pytest_cudaopt.workdir import load_workdir

        path = Path(path).resolve()
        if path not in self._workdirs:
            self._workdirs[path] = load_workdir(path, self.extension(path))
        return self._workdirs[path]

    def terminal_summary(self, terminalreporter) -> None:
        if not self.results:
            return
        from pytest_cudaopt import report

        report.terminal_summary(terminalreporter, self)

    def records(self) -> list[dict]:
        """The results as plain data (sent from pytest-xdist workers to the controller)."""
        from pytest_cudaopt import report

        return [report.record(r) for r in self.results]

    def add_records(self, records: list[dict]) -> None:
        from pytest_cudaopt import report

        self.results.extend(report.RecordedResult(r) for r in records)

    def write_report(self) -> None:
        """Write the JSON report to `--cudaopt-report` (if given)."""
        if not self.settings.report:
            return
        from pytest_cudaopt import report

        report.write_json(self.settings.report, self.results, seed=self.seed,
                          settings=self.settings.as_dict())
