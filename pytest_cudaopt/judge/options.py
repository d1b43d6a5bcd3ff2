"""The judge's options, with their defaults, and the fingerprint that goes into every result key."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pytest_cudaopt.suite.settings import user_cache_dir


@dataclass
class Options:
    """How `judge` runs (the options of `cudaopt judge`, docs/judge.md). None: gpus every visible GPU; jobs
    `cpu_jobs`, each Ray node's own; seed drawn by each child; cache_dir no cache; scratch a temporary folder."""

    gpus: list[str] | None = None
    cpu_slots: int = 2
    jobs: int | None = None
    share: int = 4
    timeout: float = 600.0
    build_timeout: float = 1800.0
    pytest_args: list[str] = field(default_factory=list)
    all_stages: bool = False
    seed: int | None = None
    cache_dir: Path | None = field(default_factory=user_cache_dir)
    scratch: Path | None = None
    keep: bool = False
    keep_env: list[str] = field(default_factory=list)
    grace: float = 10.0
    fork: bool = True
    backstop: float | None = None
    zygote: str | None = None  # the zygote this host's pool forks its children and their workers from (set by LocalPool)
    bytecode: Path | None = None  # the folder of bytecode that zygote writes, its children read (LocalPool)
    recorded_device: str | None = None  # the device every workdir records (cudaopt_device in its ini; set by Judge)
    environment_retries: int = 2  # judge a workdir again, up to this many times, while the environment is to blame
    turns: bool = True  # perf starts beside checks, its GPU alone from its turn (run/turn.py); else from its start
    pause: bool = True  # a turn pauses the checks beside it between their items; else it waits for them to end
    ahead: int | None = None  # device stages started per device beyond its places, without one yet (None: see below)

    @property
    def cpu(self) -> bool:
        """CPU workdirs: the pytest arguments set --cudaopt-device, else every workdir records it, as cpu."""
        args = self.pytest_args
        named = [args[i + 1] if a == "--cudaopt-device" and i + 1 < len(args) else a.split("=", 1)[1]
                 for i, a in enumerate(args) if a == "--cudaopt-device" or a.startswith("--cudaopt-device=")]
        return (named[-1] if named else self.recorded_device) == "cpu"

    @property
    def cpu_jobs(self) -> int:
        """Builds and policy checks at once on this host: `jobs`, else half its cores (each build's ninja gets two)."""
        return max(1, (os.cpu_count() or 2) // 2) if self.jobs is None else self.jobs

    @property
    def stages_ahead(self) -> int:
        """Check and perf children that start up on the CPU per device while `share` hold their places there:
        `ahead`, else `share` on GPUs and none for CPU workdirs (whose slots are the CPUs they would start up on)."""
        if self.ahead is not None:
            return self.ahead
        return 0 if self.cpu else self.share

    @property
    def backstop_s(self) -> float:
        """Seconds a service gives one workdir from its first stage's start to its line: `backstop`,
        else the build's limit and five other stages' (a check may run twice, a perf turn's wait adds one), and 60 s."""
        if self.backstop is not None:
            return self.backstop
        return self.build_timeout + self.grace + 5 * (self.timeout + self.grace) + 60.0

    def judge_again(self, line: dict, attempts: int) -> bool:
        """Whether a workdir whose `attempts`-th line is `line` is judged again: the line blames the environment
        and `environment_retries` are left."""
        return line.get("blame") == "environment" and attempts <= self.environment_retries

    def fingerprint(self) -> str:
        """What changes a verdict (pytest arguments, seed, stages, the judge itself): part of every result key."""
        wanted = {"pytest_args": self.pytest_args, "seed": self.seed, "all_stages": self.all_stages,
                  "judge": judge_digest()}
        return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict) -> "Options":
        paths = {k: None if data.get(k) is None else Path(data[k]) for k in ("cache_dir", "scratch", "bytecode")}
        return cls(**{**data, **paths})


@functools.cache
def judge_digest() -> str:
    """The judge's own code and torch's version, digested: a line judged by another cudaopt (a verdict's hole fixed
    since) or another torch is not kept by `--resume`, nor taken for this judge's by a consumer of keys."""
    import importlib.metadata

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    return code_digest(Path(__file__).resolve().parents[1], torch)


def code_digest(package: Path, *extra: str | None) -> str:
    """A digest of the files under `package`, as a workdir's content is digested (copies.digest), and of `extra`."""
    from pytest_cudaopt.judge import copies

    files = copies.digest(copies.workdir_files(package))
    return hashlib.sha256(json.dumps([files, *extra]).encode()).hexdigest()[:16]


def result_key(workdir: str, content: str, options: Options) -> str:
    """The idempotent key of one workdir's result: its path, its content and the options."""
    text = json.dumps([workdir, content, options.fingerprint()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]
