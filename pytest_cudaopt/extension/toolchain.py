"""The toolchain of a build: the CUDA toolkit, cuBLAS/cuDNN (nvidia-* wheels or toolkit) and the target arch."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pytest_cudaopt.extension.diagnostics import BuildError

DEFAULT_ARCH = "9.0"
# Named architectures accepted in TORCH_CUDA_ARCH_LIST, as torch's cpp_extension reads them.
NAMED_ARCHES = {"Volta": "7.0", "Turing": "7.5", "Ampere": "8.0;8.6", "Ada": "8.9", "Hopper": "9.0",
                "Blackwell": "10.0"}


def _nvcc_behind(path: Path, depth: int = 0) -> Path | None:
    """The real nvcc behind `path`: symlinks resolved, a wrapper script followed to the nvcc it execs."""
    path = path.resolve()
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return path
    if depth > 3:
        return None
    for match in re.finditer(rb"(/[^\s\"'$;|&]*/bin/nvcc)\b", head):
        candidate = Path(match.group(1).decode())
        if candidate.is_file() and candidate.resolve() != path:
            return _nvcc_behind(candidate, depth + 1)
    return None


def find_cuda_home(default: Path = Path("/usr/local/cuda")) -> Path | None:
    """The CUDA toolkit: $CUDA_HOME or $CUDA_PATH, else /usr/local/cuda, else the toolkit of the nvcc on PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and (Path(value) / "bin" / "nvcc").is_file():
            return Path(value)
    if (default / "bin" / "nvcc").is_file():
        return default
    on_path = shutil.which("nvcc")
    if on_path:
        real = _nvcc_behind(Path(on_path))
        if real is not None and real.parent.name == "bin":
            return real.parent.parent
    return None


def cpp_extension_module():
    """torch.utils.cpp_extension, imported after CUDA_HOME is set (it reads it at import)."""
    home = find_cuda_home()
    if home is not None and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = str(home)
    import logging

    # Without a GPU torch warns at import that it found no CUDA runtime; not news to a build.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)

    guessed = cpp_extension.CUDA_HOME  # imported earlier by other code, it may hold a wrong guess (e.g. /usr/local)
    if home is not None and not (guessed and (Path(guessed) / "bin" / "nvcc").is_file()):
        cpp_extension.CUDA_HOME = str(home)
    return cpp_extension


def cuda_version(home: Path) -> str:
    """`13.0` from `nvcc --version` (in the build key: a new toolkit is a new build)."""
    try:
        out = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


def cuda_lib_dirs(home: Path) -> list[Path]:
    dirs = [home / "lib64", home / "lib", *sorted((home / "targets").glob("*/lib"))]
    return [d for d in dirs if d.is_dir()]


@dataclass(frozen=True)
class Library:
    """A CUDA library found for the build: its include dir and the shared objects to link."""

    name: str
    include: Path
    libs: tuple[Path, ...]


def _wheel_roots() -> list[Path]:
    """The `nvidia/` folders of the wheels torch depends on: next to torch first."""
    roots: list[Path] = []
    with contextlib.suppress(ImportError):
        import torch

        roots.append(Path(torch.__file__).resolve().parent.parent / "nvidia")
    roots += [Path(p) / "nvidia" for p in sys.path if p]
    found: dict[Path, Path] = {}
    for root in roots:
        if root.is_dir():
            found.setdefault(root.resolve(), root)
    return list(found.values())


def _so_version(path: Path) -> list[int]:
    return [int(x) if x.isdigit() else 0 for x in path.name.split(".so.")[1].split(".")]


def _shared_object(dirs: list[Path], stem: str) -> Path | None:
    """`lib<stem>.so`, else the highest `lib<stem>.so.<N>` (wheels ship only versioned ones)."""
    for folder in dirs:
        plain = folder / f"lib{stem}.so"
        if plain.exists():
            return plain
        versioned = sorted(folder.glob(f"lib{stem}.so.*"), key=_so_version)
        if versioned:
            return versioned[-1]
    return None


def find_library(name: str, header: str, stems: tuple[str, ...], cuda_home: Path | None = None) -> Library | None:
    """Headers and shared objects of a CUDA library: in the nvidia-* wheels next to torch (what a torch process
    loads at run time), then the toolkit."""
    places: list[tuple[Path, list[Path]]] = []
    for root in _wheel_roots():
        for include in sorted(root.glob("*/include")):
            places.append((include, [include.parent / "lib", include.parent / "lib64"]))
    if cuda_home is not None:
        places.append((cuda_home / "include", cuda_lib_dirs(cuda_home)))
        for include in sorted((cuda_home / "targets").glob("*/include")):
            places.append((include, [include.parent / "lib"]))
    for include, lib_dirs in places:
        if not (include / header).is_file():
            continue
        libs = [_shared_object([d for d in lib_dirs if d.is_dir()], stem) for stem in stems]
        if all(libs):
            return Library(name, include, tuple(libs))  # type: ignore[arg-type]
    return None


def _parse_arch_list(text: str) -> list[tuple[str, bool]]:
    """TORCH_CUDA_ARCH_LIST → [("90a", with_ptx)], e.g. "8.0;9.0a+PTX" or "Hopper"."""
    for named, value in NAMED_ARCHES.items():
        text = text.replace(named, value)
    arches = []
    for entry in re.split(r"[;,\s]+", text.strip()):
        if not entry:
            continue
        match = re.fullmatch(r"(\d+)\.?(\d)([a-z]?)(\+PTX)?", entry, flags=re.IGNORECASE)
        if not match:
            raise BuildError(f"cudaopt build: TORCH_CUDA_ARCH_LIST entry {entry!r} is not an "
                             f"arch like 9.0, 9.0a, 9.0+PTX or Hopper")
        major, minor, suffix, ptx = match.groups()
        arches.append((f"{major}{minor}{suffix.lower()}", bool(ptx)))
    if not arches:
        raise BuildError("cudaopt build: TORCH_CUDA_ARCH_LIST is set but names no arch")
    return arches


def arch_list() -> tuple[list[tuple[str, bool]], str]:
    """The arches to build for, [("90", with_ptx)], and why: TORCH_CUDA_ARCH_LIST, else the GPU, else DEFAULT_ARCH."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return _parse_arch_list(env), f"from TORCH_CUDA_ARCH_LIST={env}"
    with contextlib.suppress(Exception):  # a broken driver is no reason not to build
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return [(f"{major}{minor}", False)], f"visible GPU {torch.cuda.get_device_name()}"
    return _parse_arch_list(DEFAULT_ARCH), "default: no TORCH_CUDA_ARCH_LIST and no visible GPU"


# Arches whose cubin is built for the arch-specific variant: every sm_90 GPU runs an sm_90a cubin (wgmma,
# setmaxnreg, TMA multicast). PTX stays compute_90 (arch-specific PTX runs on no later arch).
CUBIN_VARIANT = {"90": "90a"}


def resolve_arch() -> str:
    """The arch the build targets and why, e.g. "sm_90a (from TORCH_CUDA_ARCH_LIST=9.0)"."""
    arches, why = arch_list()
    names = ", ".join(f"sm_{CUBIN_VARIANT.get(a, a)}" + ("+PTX" if ptx else "") for a, ptx in arches)
    return f"{names} ({why})"


def gencode_flags(arches: list[tuple[str, bool]]) -> list[str]:
    flags = []
    for arch, ptx in arches:
        cubin = CUBIN_VARIANT.get(arch, arch)
        flags.append(f"-gencode=arch=compute_{cubin},code=sm_{cubin}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags
