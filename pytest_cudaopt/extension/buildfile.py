"""The build's configuration (sources, flags, keyed build folder) and the build.ninja written from it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_cudaopt.extension import objcache
from pytest_cudaopt.extension.diagnostics import BuildError
from pytest_cudaopt.extension.toolchain import arch_list, cpp_extension_module, cuda_lib_dirs, cuda_version, find_cuda_home, find_library, gencode_flags, resolve_arch

MODULE_NAME = "cuda_extension"
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


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
        with contextlib.suppress(OSError):
            names.update(_INCLUDE.findall(path.read_text(errors="replace")))
    return names


@dataclass
class Config:
    """What a build needs: the sources, compilers and flags, and the keyed build folder."""

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
    inside: bool = True   # the build folder sits in the workdir: commands name its files relatively
    object_cache: Path | None = None   # build/objcache.py wraps every compile when set

    def ref(self, path: Path) -> str:
        """How commands in build_dir name `path`: relative when both sit in the workdir (a copy keeps its build)."""
        path = Path(path)
        if self.inside and (path == self.workdir or self.workdir in path.parents):
            return os.path.relpath(path, self.build_dir)
        return str(path)


def settings_or_default(settings, workdir: Path) -> Any:
    """`settings`, else those pytest would resolve for `workdir` without command-line options."""
    if settings is not None:
        return settings
    from pytest_cudaopt.suite.settings import workdir_settings

    return workdir_settings(workdir)


@dataclass
class _Toolchain:
    """The include and library paths, libraries and CUDA flags of one configuration."""

    include_dirs: list[Path]
    lib_dirs: list[Path]
    libs: list[str]
    link_objects: list[Path] = field(default_factory=list)
    nvcc: str | None = None
    arch: str = "cpu"
    gencode: list[str] = field(default_factory=list)
    key_parts: dict[str, Any] = field(default_factory=dict)


def _add_cuda(tools: _Toolchain, includes: set[str], extra_nvcc: list[str]) -> None:
    """The CUDA toolkit, the arch flags, and cuBLAS/cuDNN where a source includes them."""
    home = find_cuda_home()
    if home is None:
        raise BuildError("cudaopt build: the kernels need CUDA but no toolkit was found "
                         "(set CUDA_HOME, or put nvcc on PATH)")
    tools.nvcc = str(home / "bin" / "nvcc")
    arches, _ = arch_list()
    tools.arch, tools.gencode = resolve_arch(), gencode_flags(arches)
    tools.include_dirs.insert(0, home / "include")
    tools.lib_dirs += cuda_lib_dirs(home)
    tools.libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
    wanted = [("cuBLAS", "cublas_v2.h", ("cublas", "cublasLt"), "cublas"), ("cuDNN", "cudnn.h", ("cudnn",), "cudnn")]
    for name, header, stems, marker in wanted:
        used = any(marker in inc.lower() for inc in includes)
        found = find_library(name, header, stems, home)
        if found is None and used:
            raise BuildError(f"cudaopt build: a source includes {name} ({header}) but neither the CUDA "
                             f"toolkit {home} nor the nvidia-* wheels next to torch have it")
        if found is None:
            continue
        # The wheel's include folder also has the headers ATen/cuda/CUDAContext.h needs
        # (cusparse.h, ...) that a toolkit without those libraries lacks; after the toolkit's.
        if found.include != home / "include" and (used or name == "cuBLAS"):
            tools.include_dirs.append(found.include)
        if used:
            tools.link_objects += list(found.libs)
    tools.key_parts.update(cuda_version=cuda_version(home), arch=tools.gencode, nvcc_flags=extra_nvcc)


def build_root(workdir: Path, settings) -> Path:
    """Where the keyed build folders go: cudaopt_build_dir (relative to the workdir), else <workdir>/build/cudaopt."""
    root = settings.build_dir
    if not root:
        return (workdir / "build" / "cudaopt").resolve()
    path = Path(root).expanduser()
    return (path if path.is_absolute() else workdir / path).resolve()


def configure(workdir: Path, settings) -> Config:
    """The build of `workdir` under `settings`, its folder keyed by all the objects depend on besides the sources."""
    import torch

    cpp_extension = cpp_extension_module()
    sources = discover_sources(workdir)
    includes = _includes(workdir, sources)
    cuda = any(s.suffix == ".cu" for s in sources) or any(
        re.search(r"cuda|cublas|cudnn|cufft|curand|cusparse|nvtx", name, re.IGNORECASE) for name in includes)
    cxx = os.environ.get("CXX") or "c++"
    extra_cxx = shlex.split(settings.cxx_flags or "")
    extra_nvcc = shlex.split(settings.nvcc_flags or "")
    tools = _Toolchain([*map(Path, cpp_extension.include_paths("cpu")), Path(sysconfig.get_paths()["include"])],
                       [Path(p) for p in cpp_extension.library_paths("cpu")],
                       ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"])
    if cuda:
        _add_cuda(tools, includes, extra_nvcc)
    key_parts: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0],
                                 "cxx": cxx, "cxx_flags": extra_cxx, "cuda": cuda, **tools.key_parts}
    root = build_root(workdir, settings)
    inside = root == workdir or workdir in root.parents
    if not inside:
        key_parts["workdir"] = str(workdir)
    digest = hashlib.sha256(json.dumps(key_parts, sort_keys=True, default=str).encode()).hexdigest()[:12]
    prefix = "cpu" if not cuda else "sm" + "-".join(a for a, _ in arch_list()[0])
    cfg = Config(workdir, root / f"{prefix}-{digest}", sources, cuda, tools.arch, cxx, tools.nvcc,
                 [], [], [], key_parts, inside)
    _set_flags(cfg, tools, cpp_extension, extra_cxx, extra_nvcc)
    from pytest_cudaopt.suite.settings import object_cache_dir

    cfg.object_cache = object_cache_dir(settings.object_cache)
    return cfg


def _set_flags(cfg: Config, tools: _Toolchain, cpp_extension, extra_cxx: list[str], extra_nvcc: list[str]) -> None:
    import torch

    std = _cxx_standard(cpp_extension)
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    defines = [f"-DTORCH_EXTENSION_NAME={MODULE_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    incs = [f"-I{cfg.ref(cfg.workdir)}", f"-I{cfg.ref(cfg.workdir / 'kernels')}"]
    incs += [f"-I{d}" for d in dict.fromkeys(str(d) for d in tools.include_dirs)]
    # -fno-gnu-unique: the binding registry's list is a static in an inline function; as a GNU-unique symbol it
    # would be one list for every extension in the process, and a second workdir would see the first one's bindings.
    cfg.cflags = [*incs, *defines, "-O3", f"-std={std}", "-fPIC", "-fno-gnu-unique", *extra_cxx]
    cfg.cuda_cflags = [*incs, *defines, "-O3", f"-std={std}", "--expt-relaxed-constexpr", "-lineinfo",
                       "-Xcompiler", "-fPIC", "-Xcompiler", "-fno-gnu-unique", *tools.gencode, *extra_nvcc]
    if cfg.cuda and os.environ.get("CXX"):
        cfg.cuda_cflags += ["-ccbin", cfg.cxx]
    rpath_dirs = list(dict.fromkeys(str(d) for d in [*tools.lib_dirs, *(p.parent for p in tools.link_objects)]))
    cfg.ldflags = ["-shared", *[f"-L{d}" for d in dict.fromkeys(str(d) for d in tools.lib_dirs)], *tools.libs,
                   *[str(p) for p in tools.link_objects], *[f"-Wl,-rpath,{d}" for d in rpath_dirs]]


def _cxx_standard(cpp_extension) -> str:
    """The C++ standard torch builds its own extensions with (its headers need C++20 since 2.10)."""
    try:
        text = Path(cpp_extension.__file__).read_text(errors="replace")
    except OSError:
        return "c++17"
    return "c++20" if "-std=c++20" in text else "c++17"


def _ninja_path(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _ninja_value(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args).replace("$", "$$")


def object_name(source: Path) -> str:
    return f"objs/{source.as_posix()}.o"


def _wrapped(cfg: Config, command: str) -> str:
    """A compile rule's command, through the object cache when the configuration has one."""
    if cfg.object_cache is None:
        return command
    return "$objcache --source $in --out $out --depfile $out.d -- " + command


def ninja_file(cfg: Config) -> str:
    ref = cfg.ref
    # -I: the script's folder is not put on sys.path (it imports only the standard library).
    wrapper = [sys.executable, "-I", objcache.__file__, "--cache", str(cfg.object_cache), "--workdir", ref(cfg.workdir)]
    objcache_line = [] if cfg.object_cache is None else [f"objcache = {_ninja_value(wrapper)}"]
    lines = [
        "# Written by pytest_cudaopt.extension; regenerated on every build.", "ninja_required_version = 1.3",
        f"cxx = {shlex.quote(cfg.cxx)}", f"cflags = {_ninja_value(cfg.cflags)}",
        f"ldflags = {_ninja_value(cfg.ldflags)}", *objcache_line, "",
        "rule cxx", "  command = " + _wrapped(cfg, "$cxx -MMD -MF $out.d $cflags -c $in -o $out"),
        "  depfile = $out.d", "  deps = gcc", "  description = c++ $src", "",
        "rule link", "  command = $cxx $in $ldflags -o $out", "  description = link $out", ""]
    if cfg.cuda:
        lines[4:4] = [f"nvcc = {shlex.quote(cfg.nvcc or 'nvcc')}", f"cuda_cflags = {_ninja_value(cfg.cuda_cflags)}"]
        lines += [
            "rule nvcc",
            "  command = " + _wrapped(cfg, "$nvcc --generate-dependencies-with-compile --dependency-output $out.d "
                                      "$cuda_cflags -c $in -o $out"),
            "  depfile = $out.d", "  deps = gcc", "  description = nvcc $src", ""]
    objects = []
    for source in cfg.sources:
        obj = object_name(source)
        objects.append(obj)
        rule = "nvcc" if source.suffix == ".cu" else "cxx"
        lines.append(f"build {_ninja_path(obj)}: {rule} {_ninja_path(ref(cfg.workdir / source))}")
        lines.append(f"  src = {source.as_posix().replace('$', '$$')}")
    lines.append(f"build {MODULE_NAME}.so: link {' '.join(_ninja_path(o) for o in objects)}")
    lines.append(f"default {MODULE_NAME}.so")
    return "\n".join(lines) + "\n"
