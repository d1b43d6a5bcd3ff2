"""Compile a workdir's `cuda_extension` with ninja and torch's build paths, once per state of its tree."""

# Sources: `binding.cpp` and every `kernels/*.cu` and `kernels/*.cpp`. The build folder is
# `<workdir>/build/cudaopt/<key>/` (root: `--cudaopt-build-dir`, env CUDAOPT_BUILD_DIR or ini
# cudaopt_build_dir, relative to the workdir), where the key hashes what every object
# depends on besides the sources: torch, Python and CUDA versions, the arch, the extra
# flags. ninja recompiles only the sources that changed (headers included, via depfiles);
# an unchanged tree costs well under a second in-process. The folder holds build.ninja,
# build.log (the last build's full output), objs/ and cuda_extension.so, and names the
# workdir's files by relative paths, so a copied workdir keeps its build.
#
# Flags:
#   TORCH_CUDA_ARCH_LIST   "9.0", "9.0a", "8.0;9.0+PTX", "Hopper"; else the visible GPU's
#                          capability, else 9.0 (`resolve_arch()` says which and why).
#   extra flags            settings cxx_flags / nvcc_flags: --cudaopt-cxx-flags,
#                          --cudaopt-nvcc-flags, env CUDAOPT_CXX_FLAGS / CUDAOPT_NVCC_FLAGS,
#                          ini cudaopt_cxx_flags / cudaopt_nvcc_flags; space separated,
#                          after the defaults (host: -O3 -std=c++20 -fPIC, the standard
#                          torch builds extensions with; nvcc: the same plus
#                          --expt-relaxed-constexpr -lineinfo and the -gencode flags).
#   CUDA_HOME, CUDA_PATH   the toolkit; else /usr/local/cuda, else the nvcc on PATH
#                          (symlinks and wrapper scripts followed).
#   CXX, MAX_JOBS          host compiler (default c++) and ninja's parallelism.
#
# A workdir without .cu files whose sources include no CUDA header builds as a CPU-only C++
# extension (no nvcc, no CUDA libraries). cuBLAS/cuBLASLt and cuDNN headers and libraries
# are taken from the nvidia-* wheels next to torch (what a torch process loads) or the
# toolkit, and linked, with an rpath, when a source includes their headers.

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

MODULE_NAME = "cuda_extension"
DEFAULT_ARCH = "9.0"
LOCK_TIMEOUT_S = 3600.0
# Shown in a BuildError report; the rest is in build.log.
MAX_REPORTED_ERRORS = 20

# Named architectures accepted in TORCH_CUDA_ARCH_LIST, as torch's cpp_extension reads them.
NAMED_ARCHES = {
    "Volta": "7.0", "Turing": "7.5", "Ampere": "8.0;8.6", "Ada": "8.9",
    "Hopper": "9.0", "Blackwell": "10.0",
}
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
_STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")


class BuildError(Exception):
    """The extension did not build or load. `report()` is what a user should see: the
    compiler's own `file:line: error` lines and a one-line summary, no traceback."""

    def __init__(self, summary: str, diagnostics: list[str] | None = None,
                 log_path: Path | None = None):
        super().__init__(summary)
        self.summary = summary
        self.diagnostics = list(diagnostics or [])
        self.log_path = log_path

    def report(self) -> str:
        return "\n".join([*self.diagnostics, self.summary])

    def __str__(self) -> str:
        return self.report()


@dataclass
class BuildResult:
    """What one build did. `compiled` lists the sources ninja compiled (workdir-relative);
    empty and `linked` False means the tree was up to date."""

    workdir: Path
    build_dir: Path
    so_path: Path
    seconds: float
    compiled: list[str]
    objects: int
    linked: bool
    waited_s: float
    cuda: bool
    arch: str
    log_path: Path
    module: Any = field(default=None, repr=False)

    @property
    def up_to_date(self) -> bool:
        return not self.compiled and not self.linked


def describe(result: BuildResult) -> str:
    """The last line of `cudaopt build`."""
    if result.up_to_date:
        return f"{MODULE_NAME} up to date ({result.seconds:.1f} s): {result.so_path}"
    return (f"built {MODULE_NAME} in {result.seconds:.1f} s ({len(result.compiled)} of "
            f"{result.objects} objects compiled): {result.so_path}")


# --------------------------------------------------------------------------- toolkit

def _nvcc_behind(path: Path, depth: int = 0) -> Path | None:
    """The real nvcc behind `path`: symlinks resolved, and a wrapper script followed to the
    nvcc it execs (e.g. `exec /usr/local/cuda-13.0/bin/nvcc "$@"`)."""
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
    """The CUDA toolkit: $CUDA_HOME or $CUDA_PATH, else /usr/local/cuda when it has
    bin/nvcc, else the toolkit of the nvcc on PATH (through symlinks and wrapper scripts)."""
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


def _cpp_extension():
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

    # Imported earlier by other code, it may hold a wrong guess (e.g. /usr/local).
    guessed = cpp_extension.CUDA_HOME
    if home is not None and not (guessed and (Path(guessed) / "bin" / "nvcc").is_file()):
        cpp_extension.CUDA_HOME = str(home)
    return cpp_extension


def _cuda_version(home: Path) -> str:
    """`13.0` from `nvcc --version` (in the build key: a new toolkit is a new build)."""
    try:
        out = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


def _cuda_lib_dirs(home: Path) -> list[Path]:
    dirs = [home / "lib64", home / "lib", *sorted((home / "targets").glob("*/lib"))]
    return [d for d in dirs if d.is_dir()]


# ------------------------------------------------------------------ libraries (cuBLAS...)

@dataclass(frozen=True)
class Library:
    """A CUDA library found for the build: its include dir and the shared objects to link."""

    name: str
    include: Path
    libs: tuple[Path, ...]

    @property
    def lib_dirs(self) -> list[Path]:
        return list(dict.fromkeys(lib.parent for lib in self.libs))


def _wheel_roots() -> list[Path]:
    """The `nvidia/` folders of the wheels torch depends on: next to torch first."""
    roots: list[Path] = []
    try:
        import torch

        roots.append(Path(torch.__file__).resolve().parent.parent / "nvidia")
    except ImportError:
        pass
    roots += [Path(p) / "nvidia" for p in sys.path if p]
    seen, found = set(), []
    for root in roots:
        if root.is_dir() and root.resolve() not in seen:
            seen.add(root.resolve())
            found.append(root)
    return found


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


def find_library(name: str, header: str, stems: tuple[str, ...],
                 cuda_home: Path | None = None) -> Library | None:
    """Headers and shared objects of a CUDA library (`cublas_v2.h`, `libcublas.so*`): in the
    nvidia-* wheels next to torch (what a torch process loads at run time), then the toolkit."""
    places: list[tuple[Path, list[Path]]] = []
    for root in _wheel_roots():
        for include in sorted(root.glob("*/include")):
            places.append((include, [include.parent / "lib", include.parent / "lib64"]))
    if cuda_home is not None:
        places.append((cuda_home / "include", _cuda_lib_dirs(cuda_home)))
        for include in sorted((cuda_home / "targets").glob("*/include")):
            places.append((include, [include.parent / "lib"]))
    for include, lib_dirs in places:
        if not (include / header).is_file():
            continue
        libs = [_shared_object([d for d in lib_dirs if d.is_dir()], stem) for stem in stems]
        if all(libs):
            return Library(name, include, tuple(libs))  # type: ignore[arg-type]
    return None


# ----------------------------------------------------------------------------- arch

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


def _arch() -> tuple[list[tuple[str, bool]], str]:
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return _parse_arch_list(env), f"from TORCH_CUDA_ARCH_LIST={env}"
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return [(f"{major}{minor}", False)], f"visible GPU {torch.cuda.get_device_name()}"
    except Exception:  # a broken driver is no reason not to build
        pass
    return _parse_arch_list(DEFAULT_ARCH), "default: no TORCH_CUDA_ARCH_LIST and no visible GPU"


def resolve_arch() -> str:
    """The arch the build targets and why, e.g. "sm_90 (from TORCH_CUDA_ARCH_LIST=9.0)"."""
    arches, why = _arch()
    names = ", ".join(f"sm_{a}" + ("+PTX" if ptx else "") for a, ptx in arches)
    return f"{names} ({why})"


def _gencode_flags(arches: list[tuple[str, bool]]) -> list[str]:
    flags = []
    for arch, ptx in arches:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


# -------------------------------------------------------------------------- sources

def discover_sources(workdir: Path) -> list[Path]:
    """binding.cpp and kernels/*.cu, kernels/*.cpp (workdir-relative, sorted)."""
    if not (workdir / "binding.cpp").is_file():
        raise BuildError(f"cudaopt build: {workdir} has no binding.cpp (copy it from "
                         f"pytest_cudaopt/templates/ or run `cudaopt init`)")
    kernels = workdir / "kernels"
    found = sorted(p.relative_to(workdir) for ext in ("*.cu", "*.cpp") for p in kernels.glob(ext)
                   if p.is_file()) if kernels.is_dir() else []
    return [Path("binding.cpp"), *found]


def _includes(workdir: Path, sources: list[Path]) -> set[str]:
    """Every header named by an #include in the sources and in kernels/ headers."""
    files = [workdir / s for s in sources]
    if (workdir / "kernels").is_dir():
        files += [p for ext in ("*.h", "*.hpp", "*.cuh") for p in (workdir / "kernels").glob(ext)]
    names: set[str] = set()
    for path in files:
        try:
            names.update(_INCLUDE.findall(path.read_text(errors="replace")))
        except OSError:
            pass
    return names


def _needs_cuda(sources: list[Path], includes: set[str]) -> bool:
    return any(s.suffix == ".cu" for s in sources) or any(
        re.search(r"cuda|cublas|cudnn|cufft|curand|cusparse|nvtx", name, re.IGNORECASE)
        for name in includes)


# --------------------------------------------------------------------------- config

@dataclass
class _Config:
    workdir: Path
    build_dir: Path
    sources: list[Path]
    cuda: bool
    arch: str
    cxx: str
    nvcc: str | None
    cflags: list[str]
    cuda_cflags: list[str]
    ldflags: list[str]
    key_parts: dict[str, Any]


def _settings(settings) -> Any:
    if settings is not None:
        return settings
    from pytest_cudaopt.settings import Settings

    return Settings.resolve_all()


def _configure(workdir: Path, settings) -> _Config:
    import torch

    cpp_extension = _cpp_extension()
    sources = discover_sources(workdir)
    includes = _includes(workdir, sources)
    cuda = _needs_cuda(sources, includes)
    cxx = os.environ.get("CXX") or "c++"
    extra_cxx = shlex.split(settings.cxx_flags or "")
    extra_nvcc = shlex.split(settings.nvcc_flags or "")

    include_dirs = [Path(p) for p in cpp_extension.include_paths("cpu")]
    include_dirs.append(Path(sysconfig.get_paths()["include"]))
    lib_dirs = [Path(p) for p in cpp_extension.library_paths("cpu")]
    libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    link_objects: list[Path] = []
    key_parts: dict[str, Any] = {
        "torch": torch.__version__, "python": sys.version.split()[0],
        "cxx": cxx, "cxx_flags": extra_cxx, "cuda": cuda,
    }
    nvcc = None
    arch_text = "cpu"
    gencode: list[str] = []
    if cuda:
        home = find_cuda_home()
        if home is None:
            raise BuildError("cudaopt build: the kernels need CUDA but no toolkit was found "
                             "(set CUDA_HOME, or put nvcc on PATH)")
        nvcc = str(home / "bin" / "nvcc")
        arches, _ = _arch()
        arch_text = resolve_arch()
        gencode = _gencode_flags(arches)
        include_dirs.insert(0, home / "include")
        lib_dirs += _cuda_lib_dirs(home)
        libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
        wanted = [("cuBLAS", "cublas_v2.h", ("cublas", "cublasLt"), "cublas"),
                  ("cuDNN", "cudnn.h", ("cudnn",), "cudnn")]
        for name, header, stems, marker in wanted:
            used = any(marker in inc.lower() for inc in includes)
            found = find_library(name, header, stems, home)
            if found is None and used:
                raise BuildError(f"cudaopt build: a source includes {name} ({header}) but neither "
                                 f"the CUDA toolkit {home} nor the nvidia-* wheels next to torch "
                                 f"have it")
            if found is None:
                continue
            # The wheel's include folder also has the headers ATen/cuda/CUDAContext.h needs
            # (cusparse.h, ...) that a toolkit without those libraries lacks; after the toolkit's.
            if found.include != home / "include" and (used or name == "cuBLAS"):
                include_dirs.append(found.include)
            if used:
                link_objects += list(found.libs)
        key_parts.update(cuda_version=_cuda_version(home), arch=gencode, nvcc_flags=extra_nvcc)

    # Relative paths inside the workdir keep the build folder valid when the workdir is copied.
    root = settings.build_dir
    if root:
        root_path = Path(root).expanduser()
        root_path = root_path if root_path.is_absolute() else workdir / root_path
    else:
        root_path = workdir / "build" / "cudaopt"
    root_path = root_path.resolve()
    inside = root_path == workdir or workdir in root_path.parents
    if not inside:
        key_parts["workdir"] = str(workdir)
    digest = hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
    prefix = "cpu" if not cuda else "sm" + "-".join(a for a, _ in _arch()[0])
    build_dir = root_path / f"{prefix}-{digest}"

    def ref(path: Path) -> str:
        """How commands in build_dir name `path`: relative when both sit in the workdir."""
        path = Path(path)
        if inside and (path == workdir or workdir in path.parents):
            return os.path.relpath(path, build_dir)
        return str(path)

    std = _cxx_standard(cpp_extension)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    defines = [f"-DTORCH_EXTENSION_NAME={MODULE_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    incs = [f"-I{ref(workdir)}", f"-I{ref(workdir / 'kernels')}"]
    incs += [f"-I{d}" for d in dict.fromkeys(str(d) for d in include_dirs)]
    # -fno-gnu-unique: the binding registry's list is a static in an inline function; as a
    # GNU-unique symbol it would be one list for every extension in the process, and a
    # second workdir would see the first one's bindings.
    cflags = [*incs, *defines, "-O3", f"-std={std}", "-fPIC", "-fno-gnu-unique", *extra_cxx]
    cuda_cflags = [*incs, *defines, "-O3", f"-std={std}", "--expt-relaxed-constexpr", "-lineinfo",
                   "-Xcompiler", "-fPIC", "-Xcompiler", "-fno-gnu-unique", *gencode, *extra_nvcc]
    if cuda and os.environ.get("CXX"):
        cuda_cflags += ["-ccbin", cxx]
    rpath_dirs = list(dict.fromkeys(str(d) for d in [*lib_dirs, *(p.parent for p in link_objects)]))
    ldflags = ["-shared", *[f"-L{d}" for d in dict.fromkeys(str(d) for d in lib_dirs)], *libs,
               *[str(p) for p in link_objects], *[f"-Wl,-rpath,{d}" for d in rpath_dirs]]
    cfg = _Config(workdir, build_dir, sources, cuda, arch_text, cxx, nvcc, cflags, cuda_cflags,
                  ldflags, key_parts)
    cfg.ref = ref  # type: ignore[attr-defined]
    return cfg


def _cxx_standard(cpp_extension) -> str:
    """The C++ standard torch builds its own extensions with (its headers need C++20 since
    2.10; older ones build with C++17)."""
    try:
        text = Path(cpp_extension.__file__).read_text(errors="replace")
    except OSError:
        return "c++17"
    return "c++20" if "-std=c++20" in text else "c++17"


def _ninja_path(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_value(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args).replace("$", "$$")


def _object_name(source: Path) -> str:
    return f"objs/{source.as_posix()}.o"


def _ninja_file(cfg: _Config) -> str:
    ref = cfg.ref  # type: ignore[attr-defined]
    lines = [
        "# Written by pytest_cudaopt.build; regenerated on every build.",
        "ninja_required_version = 1.3",
        f"cxx = {shlex.quote(cfg.cxx)}",
        f"cflags = {_ninja_value(cfg.cflags)}",
        f"ldflags = {_ninja_value(cfg.ldflags)}",
        "",
        "rule cxx",
        "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = c++ $src",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "  description = link $out",
        "",
    ]
    if cfg.cuda:
        lines[4:4] = [f"nvcc = {shlex.quote(cfg.nvcc or 'nvcc')}",
                      f"cuda_cflags = {_ninja_value(cfg.cuda_cflags)}"]
        lines += [
            "rule nvcc",
            "  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d "
            "$cuda_cflags -c $in -o $out",
            "  depfile = $out.d",
            "  deps = gcc",
            "  description = nvcc $src",
            "",
        ]
    objects = []
    for source in cfg.sources:
        obj = _object_name(source)
        objects.append(obj)
        rule = "nvcc" if source.suffix == ".cu" else "cxx"
        lines.append(f"build {_ninja_path(obj)}: {rule} {_ninja_path(ref(cfg.workdir / source))}")
        lines.append(f"  src = {source.as_posix().replace('$', '$$')}")
    lines.append(f"build {MODULE_NAME}.so: link {' '.join(_ninja_path(o) for o in objects)}")
    lines.append(f"default {MODULE_NAME}.so")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- errors

_GCC_DIAG = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*"
                       r"(?P<kind>fatal error|error|warning|note):\s*(?P<msg>.*)$")
_NVCC_DIAG = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*"
                        r"(?P<kind>catastrophic error|error|warning|remark)(?:\s*#[\w-]+)?:\s*(?P<msg>.*)$")
_LINK_ERR = re.compile(r"(undefined reference to|ld returned|cannot find -l|ld: error)")


def _workdir_path(cfg: _Config, raw: str) -> str:
    path = Path(raw)
    full = (cfg.build_dir / path).resolve() if not path.is_absolute() else path.resolve()
    try:
        return full.relative_to(cfg.workdir).as_posix()
    except ValueError:
        return str(full)


_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<target>\S+)")
_INCLUDED_FROM = re.compile(r"^(?:In file included from|\s+from) (?P<file>[^:]+):(?P<line>\d+)[:,]")


def _inside(cfg: _Config, rel: str) -> bool:
    return not Path(rel).is_absolute()


def _diagnostics(cfg: _Config, output: str) -> tuple[list[str], dict[str, int]]:
    """The error lines of a failed ninja run as `file:line: error: msg` (paths relative to
    the workdir), each with the source snippet the compiler printed under it; an error in a
    header outside the workdir names the workdir line that included it. Also the number
    of errors per failed source (`kernels/x.cu`, or `link`)."""
    sources = {_object_name(s): s.as_posix() for s in cfg.sources}
    lines = output.splitlines()
    shown: list[str] = []
    per_source: dict[str, int] = {}
    current = "?"
    included_from: str | None = None
    link_errors: list[str] = []
    for i, line in enumerate(lines):
        failed = _FAILED.match(line)
        if failed:
            current = sources.get(failed.group("target"), failed.group("target"))
            included_from = None
            continue
        inc = _INCLUDED_FROM.match(line)
        if inc:
            rel = _workdir_path(cfg, inc.group("file"))
            if _inside(cfg, rel):
                included_from = f"{rel}:{inc.group('line')}"
            continue
        match = _GCC_DIAG.match(line) or _NVCC_DIAG.match(line)
        if match is None:
            if _LINK_ERR.search(line):
                link_errors.append(line.strip())
            continue
        if "error" not in match.group("kind"):
            if match.group("kind") != "note":
                included_from = None
            continue
        per_source[current] = per_source.get(current, 0) + 1
        if per_source[current] > MAX_REPORTED_ERRORS:
            continue
        rel = _workdir_path(cfg, match.group("file"))
        col = f"{match.group('col')}:" if match.groupdict().get("col") else ""
        text = f"{rel}:{match.group('line')}:{col} {match.group('kind')}: {match.group('msg')}"
        if not _inside(cfg, rel) and included_from:
            text += f"  [included from {included_from}]"
        shown.append(text)
        # The compiler's snippet and caret (gcc: "  5 |   foo();", nvcc: indented lines).
        for follow in lines[i + 1:i + 4]:
            if not follow.startswith(" ") or not follow.strip() or _INCLUDED_FROM.match(follow) \
                    or _GCC_DIAG.match(follow) or _NVCC_DIAG.match(follow):
                break
            shown.append(follow)
    if link_errors and not per_source:
        shown = link_errors[:MAX_REPORTED_ERRORS]
    return shown, per_source


def _failure(cfg: _Config, output: str, log_path: Path) -> BuildError:
    shown, per_source = _diagnostics(cfg, output)
    if per_source:
        total = sum(per_source.values())
        where = ", ".join(per_source)
        many = max(per_source.values()) > MAX_REPORTED_ERRORS
        more = f" (first {MAX_REPORTED_ERRORS} per file shown)" if many else ""
        summary = (f"cudaopt build: {total} error{'s' if total != 1 else ''} in {where}{more}; "
                   f"build log: {log_path}")
    elif shown:
        summary = f"cudaopt build: linking {MODULE_NAME} failed; build log: {log_path}"
    else:
        # Neither compiler nor linker said why: show the end of what ninja printed.
        shown = [ln for ln in output.splitlines() if ln.strip()][-15:]
        summary = f"cudaopt build: failed; build log: {log_path}"
    return BuildError(summary, shown, log_path)


# ----------------------------------------------------------------------------- build

def _ninja() -> str:
    try:
        import ninja  # the wheel's binary matches the declared dependency

        candidate = Path(ninja.BIN_DIR) / "ninja"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("ninja")
    if found is None:
        raise BuildError("cudaopt build: ninja not found (pip install ninja)")
    return found


def _write_if_changed(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _run_ninja(cfg: _Config, emit: Callable[[str], None], start: float) -> tuple[list[str], int]:
    """Run ninja in the build folder; return the step descriptions it reported and its exit code."""
    cmd = [_ninja(), "-C", str(cfg.build_dir)]
    jobs = os.environ.get("MAX_JOBS")
    if jobs and jobs.isdigit():
        cmd += ["-j", jobs]
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ")
    steps: list[str] = []
    log_lines: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env, preexec_fn=_die_with_parent)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        log_lines.append(line)
        match = _STATUS.match(line)
        if match:
            steps.append(match.group(3))
            emit(f"{line}  ({time.monotonic() - start:.1f} s)")
    code = proc.wait()
    # A no-op build ("ninja: no work to do") keeps the log of the last build that did work.
    log = cfg.build_dir / "build.log"
    if steps or code != 0 or not log.is_file():
        log.write_text("\n".join(log_lines) + "\n")
    return steps, code


def _die_with_parent() -> None:
    """In the ninja child, before exec: SIGTERM when the building process dies (even by
    SIGKILL), so that ninja (which stops its compilers on SIGTERM) never outlives the lock."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    PR_SET_DEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _announce(cfg: _Config, emit: Callable[[str], None]) -> None:
    """What is about to compile (ninja prints a step only when it finishes)."""
    out = subprocess.run([_ninja(), "-C", str(cfg.build_dir), "-n"], capture_output=True,
                         text=True, errors="replace", env=dict(os.environ, NINJA_STATUS="[%f/%t] "))
    planned = [m.group(3) for m in map(_STATUS.match, out.stdout.splitlines()) if m]
    compiles = [p.split(" ", 1)[1] for p in planned if p.startswith(("c++ ", "nvcc "))]
    if compiles:
        emit(f"compiling {len(compiles)} of {len(cfg.sources)} sources for {cfg.arch}: "
             f"{', '.join(compiles)}")


def compile_extension(workdir: Path, *, settings=None, verbose: bool = False,
                      emit: Callable[[str], None] | None = None) -> BuildResult:
    """Bring the workdir's build up to date (without importing it). Parallel callers on
    the same workdir build once: one holds the lock, the others wait, then find it up to date."""
    from filelock import FileLock, Timeout

    announce = verbose or emit is not None
    if emit is None:
        emit = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    start = time.monotonic()
    workdir = Path(workdir).resolve()
    cfg = _configure(workdir, _settings(settings))
    cfg.build_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(cfg.build_dir / "lock"))
    waited = 0.0
    try:
        lock.acquire(timeout=0)
    except Timeout:
        emit(f"waiting for another build of {workdir} (lock {cfg.build_dir / 'lock'})")
        t = time.monotonic()
        try:
            lock.acquire(timeout=LOCK_TIMEOUT_S)
        except Timeout:
            raise BuildError(f"cudaopt build: gave up after {LOCK_TIMEOUT_S:.0f} s waiting for the "
                             f"lock {cfg.build_dir / 'lock'}") from None
        waited = time.monotonic() - t
    try:
        _write_if_changed(cfg.build_dir / "build.ninja", _ninja_file(cfg))
        _write_if_changed(cfg.build_dir / "config.json",
                          json.dumps(cfg.key_parts, indent=2, sort_keys=True, default=str) + "\n")
        if announce:
            _announce(cfg, emit)
        steps, code = _run_ninja(cfg, emit, start)
        log_path = cfg.build_dir / "build.log"
        if code != 0:
            raise _failure(cfg, log_path.read_text(errors="replace"), log_path)
    finally:
        lock.release()
    compiled = [s.split(" ", 1)[1] for s in steps if s.startswith(("c++ ", "nvcc "))]
    return BuildResult(
        workdir=workdir, build_dir=cfg.build_dir, so_path=cfg.build_dir / f"{MODULE_NAME}.so",
        seconds=time.monotonic() - start, compiled=compiled, objects=len(cfg.sources),
        linked=any(s.startswith("link ") for s in steps), waited_s=waited, cuda=cfg.cuda,
        arch=cfg.arch, log_path=log_path)


# ------------------------------------------------------------------------------ load

# so path → ((mtime, size, inode), module): an unchanged build is not imported twice.
_LOADED: dict[Path, tuple[tuple[int, int, int], Any]] = {}
_load_count = 0


def _demangle(text: str) -> str:
    names = re.findall(r"_Z\w+", text)
    if not names or not shutil.which("c++filt"):
        return text
    out = subprocess.run(["c++filt", *names], capture_output=True, text=True).stdout.split("\n")
    for raw, nice in zip(names, out):
        text = text.replace(raw, f"{nice} ({raw})" if nice and nice != raw else raw)
    return text


def load_extension(result: BuildResult):
    """Import the built `cuda_extension` under a name unique to this build (several
    workdirs can be loaded in one process). A rebuilt .so is loaded from a fresh copy,
    since the dynamic loader would hand back the already loaded file of the same path."""
    global _load_count
    import torch  # noqa: F401  (loads libtorch, which the extension links against)

    so = result.so_path
    stat = so.stat()
    ident = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _LOADED.get(so)
    if cached is not None and cached[0] == ident:
        result.module = cached[1]
        return cached[1]
    _load_count += 1
    path = so
    if cached is not None:
        fresh = result.build_dir / "loaded"
        fresh.mkdir(exist_ok=True)
        path = fresh / f"{MODULE_NAME}.{os.getpid()}.{_load_count}.so"
        shutil.copy2(so, path)
    tag = hashlib.sha256(str(so).encode()).hexdigest()[:12]
    name = f"cudaopt_ext_{tag}_{_load_count}.{MODULE_NAME}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise BuildError(f"cudaopt build: {MODULE_NAME} of {result.workdir} was built but does "
                         f"not import: {_demangle(str(exc))}", [], result.log_path) from None
    module.__getattr__ = _missing_function(module)  # PEP 562: only for names the module lacks
    sys.modules[name] = module
    _LOADED[so] = (ident, module)
    result.module = module
    return module


def defined_functions(module) -> list[str]:
    """The functions a loaded `cuda_extension` defines, sorted."""
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))


def takes_module(func) -> bool:
    """True for a binding whose pybind11 signature takes a module: a registration function
    (`void register_op(pybind11::module&)`) that was bound as if it were the op."""
    first = (getattr(func, "__doc__", None) or "").split("\n", 1)[0]
    return re.search(r"\((?:\w+: )?(?:module|types\.ModuleType)\)", first) is not None


def missing_function_message(module, name: str) -> str:
    """Why `cuda_extension.<name>` is missing, in the workdir's own terms."""
    defined = defined_functions(module)
    text = f"cuda_extension has no function '{name}'; "
    if not defined:
        return text + ("it defines none: no kernels/*_binding.cpp registers a function with "
                       "REGISTER_BINDING(op, register_op), where register_op calls m.def")
    text += f"it defines {', '.join(defined)}"
    wrong = [n for n in defined if takes_module(getattr(module, n))]
    if wrong:
        text += (f". {', '.join(wrong)} takes a pybind11 module: that looks like a registration function "
                 "passed in the wrong form (the contract is REGISTER_BINDING(op, register_op); with the "
                 "published agent-workdir binding_registry.h or the shipped one, register_op(pybind11::module& m) "
                 f"calls m.def(\"{name}\", ...))")
    return text


def _missing_function(module):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module 'cuda_extension' has no attribute '{name}'")
        raise AttributeError(missing_function_message(module, name))
    return __getattr__


def existing_extension(workdir: Path, *, settings=None):
    """The loaded extension of the workdir's last build for the current configuration, or
    None when there is none. Compiles nothing (the build may predate the latest edits)."""
    workdir = Path(workdir).resolve()
    try:
        cfg = _configure(workdir, _settings(settings))
    except BuildError:
        return None
    so = cfg.build_dir / f"{MODULE_NAME}.so"
    if not so.is_file():
        return None
    result = BuildResult(workdir=workdir, build_dir=cfg.build_dir, so_path=so, seconds=0.0, compiled=[],
                         objects=len(cfg.sources), linked=False, waited_s=0.0, cuda=cfg.cuda, arch=cfg.arch,
                         log_path=cfg.build_dir / "build.log")
    return load_extension(result)


def build(workdir: Path, *, settings=None, verbose: bool = False,
          emit: Callable[[str], None] | None = None) -> BuildResult:
    """Build and import; the result's `module` is the loaded extension. `emit` receives the
    progress lines (steps with the elapsed time, waiting for another process's lock)."""
    result = compile_extension(workdir, settings=settings, verbose=verbose, emit=emit)
    load_extension(result)
    return result


def build_extension(workdir: Path, *, settings=None, verbose: bool = False,
                    emit: Callable[[str], None] | None = None):
    """The workdir's loaded `cuda_extension` module, rebuilt only where its tree changed."""
    return build(workdir, settings=settings, verbose=verbose, emit=emit).module
