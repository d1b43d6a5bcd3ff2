"""What a candidate is given: a private copy of its workdir (or its bytes, for Ray) and a scrubbed environment."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Iterable, Mapping

# Never copied: earlier builds (a planted .so or object would be linked as if built from the
# sources), caches, version control, earlier judge outputs.
SKIPPED = frozenset({"build", "__pycache__", ".git", ".hg", ".pytest_cache", ".benchmarks", ".hypothesis"})
# The environment a child keeps from the judge's; everything else (CUDAOPT_*, tokens, cloud
# credentials, the judge's own settings) is dropped. The judge then sets what it means to give.
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "SHELL",
            "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT",
            "LD_LIBRARY_PATH", "CC", "CXX", "TORCH_CUDA_ARCH_LIST", "NVIDIA_DRIVER_CAPABILITIES",
            "CUDAOPT_WORKER_ZYGOTE")  # a zygote the judge's starter offers for workers (run/zygote.py)
KEPT_PREFIXES = ("LC_",)
MAX_BYTES = 256 << 20   # a workdir larger than this is not judged (its line says so)


class CopyError(Exception):
    """A workdir that cannot be copied or shipped; the message names it and why."""


# The candidate's own files: a symlink there could pull another workdir's kernels or results into the copy, so it
# is left out (the owner's files, such as a model.py shared by one problem's candidates, may be links).
CANDIDATE_FILES = ("model_new.py", "kernels")


def workdir_files(workdir: Path) -> list[tuple[str, Path]]:
    """(relative posix path, file) of every file a copy holds, sorted: symlinks followed among the
    owner's files, left out among the candidate's (CANDIDATE_FILES); dangling ones skipped."""
    workdir = Path(workdir)
    found, total = [], 0
    for root, dirs, files in os.walk(workdir, followlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
        for name in sorted(files):
            path = Path(root, name)
            rel = path.relative_to(workdir).as_posix()
            if not path.is_file() or (path.is_symlink() and (rel in CANDIDATE_FILES or rel.startswith("kernels/"))):
                continue
            total += path.stat().st_size
            if total > MAX_BYTES:
                raise CopyError(f"{workdir} holds more than {MAX_BYTES >> 20} MiB of files; not judged")
            found.append((rel, path))
    return found


def digest(files: Iterable[tuple[str, Path]]) -> str:
    """sha256 over the relative paths and bytes of a workdir's files."""
    total = hashlib.sha256()
    for rel, path in files:
        total.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


def private_copy(workdir: Path, dest: Path) -> str:
    """Copy `workdir` to `dest` (which must not exist); returns the content digest."""
    files = workdir_files(workdir)
    dest.mkdir(parents=True)
    for rel, path in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return digest(files)


def pack(workdir: Path) -> tuple[bytes, str]:
    """The workdir as tar bytes (what a Ray node's judge receives) and its content digest."""
    files = workdir_files(workdir)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel, path in files:
            info = tarfile.TarInfo(rel)
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), digest(files)


def unpack(data: bytes, dest: Path) -> None:
    """Unpack tar bytes (any tar, compressed or not) into `dest`: regular files only, none outside it."""
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if member.isdir() and (target == dest.resolve() or dest.resolve() in target.parents):
                continue
            if not member.isfile() or dest.resolve() not in target.parents:
                raise CopyError(f"refusing {member.name!r} in a shipped workdir: not a plain file inside it")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr] - a file member


def scrubbed_env(given: Mapping[str, str], keep: Iterable[str] = ()) -> dict[str, str]:
    """A child's environment: the KEPT_ENV names (and `keep`) from os.environ, then `given`."""
    names = set(KEPT_ENV) | set(keep)
    env = {k: v for k, v in os.environ.items() if k in names or k.startswith(KEPT_PREFIXES)}
    env.update(given)
    return env
