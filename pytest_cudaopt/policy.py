"""Static checks of the workdir rules: model_new.py's AST, kernels/ tokens, protected files, a clean kernels/."""

from __future__ import annotations

import ast
import builtins
import fnmatch
import functools
import hashlib
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

TEMPLATES = Path(__file__).resolve().parent / "templates"
LOCK_NAME = "cudaopt.lock"
PROTECTED_TEMPLATES = ("binding.cpp", "binding_registry.h")
LOCK_COMMAND = "cudaopt init --lock-only {workdir}"

# One line per rule: the README's table and the title of each `pytest -m policy` item.
RULES: dict[str, str] = {
    "MN001": "model_new.py parses and defines `class ModelNew(nn.Module)` with a `forward` (no "
             "`__call__` override)",
    "MN002": "`ModelNew.__init__` takes the same parameters (names, order, kinds, defaults) as "
             "`Model.__init__`",
    "MN003": "the forward path calls only `cuda_extension` ops, tensor creation and its own helpers "
             "(no other torch, torch.nn.functional or library function)",
    "MN004": "the forward path calls no tensor method other than properties and creation (`x.view`, "
             "`x.contiguous()`, `.T`), no nn.Module (`self.linear(x)`, `super().forward`), no hook",
    "MN005": "the forward path applies no Python operator to a tensor (`x @ w`, `x + 1`, `-x`, `x[0]`,"
             " `x > 0`, `x += y`): each dispatches a torch op",
    "MN006": "model_new.py imports only torch, cuda_extension and the standard library (not model.py, "
             "another workdir, importlib, ctypes, subprocess, torch.utils.cpp_extension)",
    "MN007": "model_new.py has no `try`/`except` (or `contextlib.suppress`): the custom path fails "
             "loudly instead of falling back",
    "MN008": "model_new.py reads no files and no environment variables (`open`, `os.environ`, "
             "`os.getenv`, `Path.read_text`, `torch.load`, `np.load`)",
    "MN009": "model_new.py changes no torch global state (`torch.backends.*` flags, `torch.set_*`, "
             "seeds, monkeypatching torch)",
    "KC001": "kernels/ C++ calls no torch/ATen operator: only `torch::empty*`, metadata, the current-"
             "stream getters (`x.sum()`, `at::matmul`, unqualified `matmul(x, y)` are violations)",
    "KC002": "kernels/ includes only CUDA runtime/math, C/C++ standard, torch binding, pybind11, "
             "cuBLAS/cuBLASLt, cuDNN and the workdir's own headers (followed recursively)",
    "KC003": "file roles: `.cu` files hold kernels and launchers (no torch or pybind11 headers, no "
             "REGISTER_BINDING); REGISTER_BINDING only in `*_binding.cpp`",
    "KC004": "no `__global__` function in a `.cpp` file (bindings and cuBLAS/cuDNN callers); kernels "
             "live in `.cu` files",
    "KC005": "a `.cpp` file that is not a `*_binding.cpp` calls cuBLAS or cuDNN",
    "CV001": "when model.py uses a convolution (nn.Conv*/ConvTranspose*, F.conv*) and kernels/ has "
             "sources, they include cudnn.h and call cudnnConvolutionForward / "
             "cudnnConvolutionBackwardData",
    "PF001": "binding.cpp and binding_registry.h are byte-identical to the copies shipped in "
             "pytest_cudaopt",
    "PF002": f"the workdir has a valid lock file `{LOCK_NAME}` (written by `cudaopt init`)",
    "PF003": f"model.py and utils/ are identical to what `{LOCK_NAME}` recorded",
    "KD001": "kernels/ holds no intermediate versions (`*_v2*`, `*_old*`, `*_test*`, `*_backup*`, "
             "`*.bak`, `*.orig`, `*.rej`, `*.tmp`, `*~`)",
    "KD002": "every kernels/<op>_binding.cpp has its <op>.cu or <op>.cpp, and every <op>.cu / <op>.cpp"
             " its <op>_binding.cpp",
    "KD003": "every file in kernels/ is compiled: only .cu/.cpp sources and headers that a source "
             "includes (plus .gitkeep)",
    "CF001": "the `[tool.cudaopt]` table of the workdir's pyproject.toml is valid",
}
RULE_IDS: tuple[str, ...] = tuple(RULES)


@dataclass(frozen=True, order=True)
class Violation:
    """One finding: `path` is relative to the workdir (posix), `line` 1-based (1 for a whole file)."""

    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"

    def to_json(self) -> dict:
        return {"rule": self.rule, "path": self.path, "line": self.line, "message": self.message}


# --------------------------------------------------------------------------- configuration

CONFIG_KEYS = {
    "disable": "rule ids to skip, e.g. [\"KC005\"]",
    "allow-python-calls": "more functions the forward path may call (dotted, aliases resolved: "
                          "\"torch.nn.functional.pad\")",
    "allow-tensor-methods": "more tensor methods the forward path may call (\"view\")",
    "allow-imports": "more modules model_new.py may import (\"numpy\")",
    "allow-cpp-calls": "more torch::/at::/c10:: functions kernels/ may call (\"at::zeros\")",
    "allow-cpp-methods": "more tensor methods kernels/ may call (\"contiguous\")",
    "allow-includes": "more include prefixes kernels/ may use (\"cub/\", \"cutlass/\")",
}


@dataclass(frozen=True)
class Config:
    """The `[tool.cudaopt]` table of the workdir's pyproject.toml; empty means the strict defaults."""

    disable: frozenset = frozenset()
    allow_python_calls: frozenset = frozenset()
    allow_tensor_methods: frozenset = frozenset()
    allow_imports: frozenset = frozenset()
    allow_cpp_calls: frozenset = frozenset()
    allow_cpp_methods: frozenset = frozenset()
    allow_includes: tuple = ()
    problems: tuple = ()


def _load_toml(path: Path) -> dict | None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return None
    with path.open("rb") as handle:
        return tomllib.load(handle)


def load_config(workdir: Path) -> Config:
    """Read `[tool.cudaopt]` from `<workdir>/pyproject.toml`; problems become CF001 violations."""
    path = Path(workdir) / "pyproject.toml"
    if not path.is_file():
        return Config()
    text = path.read_text(encoding="utf-8", errors="replace")
    if "tool.cudaopt" not in text:
        return Config()
    line = next((i for i, t in enumerate(text.splitlines(), 1) if "tool.cudaopt" in t), 1)

    def problem(message: str) -> Config:
        return Config(problems=(Violation("pyproject.toml", line, "CF001", message),))

    try:
        data = _load_toml(path)
    except Exception as exc:  # tomllib.TOMLDecodeError, read errors
        return problem(f"pyproject.toml cannot be parsed: {exc}")
    if data is None:
        warnings.warn(f"cudaopt: {path} has a [tool.cudaopt] table but neither tomllib (Python >= 3.11) "
                      "nor tomli is available to read it; the strict default rules apply", stacklevel=2)
        return Config()
    table = data.get("tool", {}).get("cudaopt", {})
    if not isinstance(table, dict):
        return problem("[tool.cudaopt] must be a table")
    values: dict[str, tuple[str, ...]] = {}
    problems = []
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            problems.append(f"unknown key {key!r} in [tool.cudaopt] (known: {', '.join(CONFIG_KEYS)})")
        elif not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"[tool.cudaopt] {key} must be a list of strings, got {value!r}")
        else:
            values[key] = tuple(value)
    unknown_rules = [r for r in values.get("disable", ()) if r not in RULES]
    if unknown_rules:
        problems.append(f"[tool.cudaopt] disable names unknown rule ids {unknown_rules} (known: {', '.join(RULE_IDS)})")
    return Config(
        disable=frozenset(values.get("disable", ())),
        allow_python_calls=frozenset(values.get("allow-python-calls", ())),
        allow_tensor_methods=frozenset(values.get("allow-tensor-methods", ())),
        allow_imports=frozenset(values.get("allow-imports", ())),
        allow_cpp_calls=frozenset(values.get("allow-cpp-calls", ())),
        allow_cpp_methods=frozenset(values.get("allow-cpp-methods", ())),
        allow_includes=values.get("allow-includes", ()),
        problems=tuple(Violation("pyproject.toml", line, "CF001", p) for p in problems),
    )


# --------------------------------------------------------------------------- entry points

def check_workdir(workdir: Path, config: Config | None = None) -> list[Violation]:
    """Every violation of the workdir rules in `workdir`, sorted; rules disabled by the config are left out."""
    workdir = Path(workdir).resolve()
    config = load_config(workdir) if config is None else config
    found: list[Violation] = list(config.problems)
    found += _check_model_new(workdir, config)
    scan = _KernelScan(workdir, config)
    found += scan.violations
    found += _check_convolution(workdir, scan)
    found += _check_protected(workdir)
    found += _check_kernels_dir(workdir, scan)
    return sorted({v for v in found if v.rule not in config.disable},
                  key=lambda v: (v.path, v.line, v.rule, v.message))


def _display_path(workdir: Path, relative: str) -> str:
    full = Path(workdir).resolve() / relative
    try:
        shown = os.path.relpath(full)
    except ValueError:  # another drive on Windows
        return str(full)
    return str(full) if shown.startswith("..") else shown


def format_violation(violation: Violation, workdir: Path) -> str:
    """`path:line: RULE-ID: what was found`, the path shown relative to the current folder."""
    return f"{_display_path(workdir, violation.path)}:{violation.line}: {violation.rule}: {violation.message}"


def render(violations: list[Violation], workdir: Path, as_json: bool = False) -> str:
    """The output of `cudaopt check`: one line per violation and a summary, or JSON."""
    workdir = Path(workdir).resolve()
    disabled = sorted(load_config(workdir).disable)
    if as_json:
        return json.dumps({
            "workdir": str(workdir),
            "passed": not violations,
            "rules": RULES,
            "disabled": disabled,
            "violations": [v.to_json() for v in violations],
        }, indent=2)
    lines = [format_violation(v, workdir) for v in violations]
    note = f"; disabled in pyproject.toml: {', '.join(disabled)}" if disabled else ""
    if violations:
        rules = sorted({v.rule for v in violations})
        lines.append(f"cudaopt check: {len(violations)} violation(s) of {', '.join(rules)} in {workdir}{note}")
    else:
        lines.append(f"cudaopt check: {workdir} follows all {len(RULES) - len(disabled)} rules{note}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- lock file (PF002, PF003)

def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _locked_files(workdir: Path) -> list[str]:
    names = ["model.py"]
    utils = workdir / "utils"
    if utils.is_dir():
        names += sorted(p.relative_to(workdir).as_posix() for p in utils.rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return names


def write_lock(workdir: Path) -> Path:
    """Record the sha256 of model.py and every file of utils/ in `<workdir>/cudaopt.lock`."""
    workdir = Path(workdir).resolve()
    if not (workdir / "model.py").is_file():
        raise FileNotFoundError(f"{workdir} has no model.py to lock")
    files = {name: _sha256(workdir / name) for name in _locked_files(workdir)}
    lock = workdir / LOCK_NAME
    lock.write_text(json.dumps({
        "about": "sha256 of the files the optimiser must not change; checked by `cudaopt check` (PF003)",
        "files": files,
    }, indent=2) + "\n", encoding="utf-8")
    return lock


def _check_protected(workdir: Path) -> list[Violation]:
    found = []
    for name in PROTECTED_TEMPLATES:
        path, master = workdir / name, TEMPLATES / name
        if not path.is_file():
            found.append(Violation(name, 1, "PF001", f"{name} is missing; copy it from {master}"))
            continue
        mine, theirs = path.read_bytes(), master.read_bytes()
        if mine != theirs:
            line = next((i for i, (a, b) in enumerate(
                zip(mine.splitlines(), theirs.splitlines()), 1) if a != b),
                min(len(mine.splitlines()), len(theirs.splitlines())) + 1)
            found.append(Violation(name, line, "PF001",
                                   f"{name} differs from the copy shipped in pytest_cudaopt (first difference "
                                   f"at line {line}); restore it: cp {master} {name}"))
    lock_path = workdir / LOCK_NAME
    hint = f"record the current files with `{LOCK_COMMAND.format(workdir=workdir)}`"
    if not lock_path.is_file():
        return found + [Violation(LOCK_NAME, 1, "PF002",
                                  f"no lock file: model.py and utils/ cannot be proven unchanged; {hint}")]
    try:
        recorded = json.loads(lock_path.read_text(encoding="utf-8"))["files"]
        if not isinstance(recorded, dict):
            raise TypeError("files is not a table")
    except (ValueError, KeyError, TypeError) as exc:
        return found + [Violation(LOCK_NAME, 1, "PF002", f"lock file is not valid ({exc}); {hint}")]
    if "model.py" not in recorded:
        found.append(Violation(LOCK_NAME, 1, "PF002", f"lock file records no model.py; {hint}"))
    current = _locked_files(workdir)
    for name in sorted(set(recorded) | set(current)):
        path = workdir / name
        if name not in recorded:
            found.append(Violation(name, 1, "PF003", f"{name} was added after the workdir was locked"))
        elif not path.is_file():
            found.append(Violation(LOCK_NAME, 1, "PF003", f"{name} was recorded in {LOCK_NAME} but is missing"))
        elif _sha256(path) != recorded[name]:
            found.append(Violation(name, 1, "PF003", f"{name} changed since it was recorded in {LOCK_NAME} "
                                                     f"(sha256 differs); restore it from version control"))
    return found


# --------------------------------------------------------------------------- kernels/ clean (KD001-KD003)

INTERMEDIATE_PATTERNS = ("*_v[0-9]*", "*_old*", "*_test*", "*_backup*", "*.bak", "*.orig", "*.rej", "*.tmp", "*~")
SOURCE_SUFFIXES = (".cu", ".cpp")
HEADER_SUFFIXES = (".h", ".cuh", ".hpp")


def _kernel_files(workdir: Path) -> list[Path]:
    kernels = workdir / "kernels"
    if not kernels.is_dir():
        return []
    return sorted(p for p in kernels.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def _is_intermediate(path: Path) -> bool:
    return any(fnmatch.fnmatchcase(path.name, pattern) for pattern in INTERMEDIATE_PATTERNS)


def _check_kernels_dir(workdir: Path, scan: "_KernelScan") -> list[Violation]:
    found, final = [], []
    for path in _kernel_files(workdir):
        rel = path.relative_to(workdir).as_posix()
        if _is_intermediate(path):
            found.append(Violation(rel, 1, "KD001", f"{path.name} looks like an intermediate version; "
                                                    "kernels/ holds only the final one (delete it, git keeps history)"))
        else:
            final.append(path)
    stems = {(p.parent, p.stem) for p in final if p.suffix in SOURCE_SUFFIXES and not p.stem.endswith("_binding")}
    for path in final:
        rel = path.relative_to(workdir).as_posix()
        if path.suffix == ".cpp" and path.stem.endswith("_binding"):
            op = path.stem[: -len("_binding")]
            if (path.parent, op) not in stems:
                found.append(Violation(rel, 1, "KD002", f"binding without a launcher: no {op}.cu or {op}.cpp "
                                                        f"next to {path.name}"))
        elif path.suffix in SOURCE_SUFFIXES:
            if not (path.parent / f"{path.stem}_binding.cpp").is_file():
                found.append(Violation(rel, 1, "KD002", f"launcher without a binding: no {path.stem}_binding.cpp "
                                                        f"registers {path.name}'s functions"))
        elif path.suffix in HEADER_SUFFIXES:
            if path.resolve() not in scan.reached:
                found.append(Violation(rel, 1, "KD003", f"header {path.name} is included by no source in kernels/, "
                                                        "so it is never compiled"))
        elif path.name != ".gitkeep":
            found.append(Violation(rel, 1, "KD003", f"{path.name} is not compiled (kernels/ holds .cu/.cpp sources "
                                                    "and their headers only)"))
    return found


# --------------------------------------------------------------------------- C++ tokens

@dataclass(frozen=True)
class Token:
    kind: str  # "id", "num", "str", "punct"
    text: str
    line: int


@dataclass(frozen=True)
class Include:
    name: str
    angled: bool
    line: int


_PUNCT2 = ("::", "->")
_ID_START = re.compile(r"[A-Za-z_$]")
_ID = re.compile(r"[A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(?:\d|\.\d)(?:[eEpP][+-]|[A-Za-z0-9_.'])*")
_STRING_PREFIX = re.compile(r"(?:u8|u|U|L)?R?\"|(?:u8|u|U|L)?'")
_INCLUDE = re.compile(r"\s*(<[^>\n]*>|\"[^\"\n]*\")")
_DIRECTIVE_INCLUDE = re.compile(r"#\s*(include_next|include|import)\b")


def lex_cpp(text: str) -> tuple[list[Token], list[Include]]:
    """Tokens of C/C++/CUDA source without comments and string contents, and its #include lines.

    Preprocessor lines are tokenized like code (a macro body can hide an operator call);
    #include targets are returned separately, computed includes with an empty name."""
    tokens: list[Token] = []
    includes: list[Include] = []
    i, line, n = 0, 1, len(text)
    line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            line, line_start, i = line + 1, True, i + 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "\\" and text.startswith("\n", i + 1):  # line splice
            line, i = line + 1, i + 2
            continue
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        if c == "#" and line_start:
            line_start = False
            match = _DIRECTIVE_INCLUDE.match(text, i)
            if match:
                target = _INCLUDE.match(text, match.end())
                if target:
                    name = target.group(1)
                    includes.append(Include(name[1:-1].strip(), name[0] == "<", line))
                    i = target.end()
                else:
                    includes.append(Include("", False, line))
                    i = match.end()
                continue
            i += 1
            continue
        line_start = False
        prefix = _STRING_PREFIX.match(text, i)
        if prefix and (prefix.start() == i) and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            opener = prefix.group(0)
            if opener.endswith('R"'):
                paren = text.find("(", prefix.end())
                delim = text[prefix.end():paren]
                end = text.find(")" + delim + '"', paren)
                end = n if end < 0 else end + len(delim) + 2
            else:
                quote = opener[-1]
                end = prefix.end()
                while end < n and text[end] != quote and text[end] != "\n":
                    end += 2 if text[end] == "\\" else 1
                end = min(end + 1, n)
            tokens.append(Token("str", "", line))
            line += text.count("\n", i, end)
            i = end
            continue
        if _ID_START.match(c):
            end = _ID.match(text, i + 1).end()
            tokens.append(Token("id", text[i:end], line))
            i = end
            continue
        number = _NUMBER.match(text, i)
        if number:
            tokens.append(Token("num", number.group(0), line))
            i = number.end()
            continue
        two = text[i:i + 2]
        if two in _PUNCT2:
            tokens.append(Token("punct", two, line))
            i += 2
            continue
        tokens.append(Token("punct", c, line))
        i += 1
    return tokens, includes


# --------------------------------------------------------------------------- C++ allow-lists (one place)

TORCH_ROOTS = frozenset({"torch", "at", "c10", "caffe2", "aten"})
# torch::/at::/c10:: names that are not operators. Types (CamelCase) and constants (kFloat) are
# allowed by their spelling; functions and lower-case types must be listed here.
ALLOWED_CPP_CALLS = frozenset({
    # allocation
    "torch::empty", "torch::empty_like", "torch::empty_strided",
    "at::empty", "at::empty_like", "at::empty_strided",
    # tensor options builders
    "torch::dtype", "torch::device", "torch::layout", "at::dtype", "at::device", "at::layout",
    # the current stream and handles bound to it, device properties
    "at::cuda::getCurrentCUDAStream", "c10::cuda::getCurrentCUDAStream",
    "at::cuda::getCurrentCUDABlasHandle", "at::cuda::getCurrentCUDABlasLtHandle",
    "at::cuda::getCurrentDeviceProperties", "at::cuda::getDeviceProperties",
    "at::cuda::current_device", "c10::cuda::current_device",
    # metadata helpers and lower-case types
    "c10::toString", "at::toString", "c10::elementSize", "at::elementSize",
    "c10::isFloatingType", "at::isFloatingType", "c10::isReducedFloatingType", "at::isReducedFloatingType",
    "c10::optional", "c10::nullopt", "c10::irange", "c10::complex", "c10::string_view",
    "at::opmath_type", "at::acc_type",
})
# Tensor methods that read metadata or allocate (everything else on a tensor is an operator).
ALLOWED_CPP_METHODS = frozenset({
    "size", "sizes", "stride", "strides", "dim", "ndimension", "numel", "nelement", "element_size",
    "nbytes", "itemsize", "is_contiguous", "is_cuda", "is_cpu", "scalar_type", "dtype", "device",
    "get_device", "layout", "options", "defined", "storage_offset", "is_floating_point", "is_complex",
    "data_ptr", "const_data_ptr", "mutable_data_ptr", "accessor", "packed_accessor32",
    "packed_accessor64", "generic_packed_accessor", "requires_grad", "new_empty", "new_empty_strided",
    "is_pinned", "is_signed",
    # std::vector::resize shares its name with the deprecated Tensor.resize
    "resize",
})
# Namespaces whose CamelCase names are modules or operators, not value types.
TORCH_OP_NAMESPACES = frozenset({"nn", "jit", "autograd", "native", "_ops", "functional", "indexing", "ops"})
# C/C++ math and std algorithm names that torch also has: an unqualified call is not ATen.
C_MATH_NAMES = frozenset("""abs fabs ceil floor round trunc exp exp2 expm1 log log2 log10 log1p pow sqrt
rsqrt cbrt sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc lgamma tgamma fmod
remainder fmax fmin hypot copysign ldexp frexp min max sort swap fill clamp isnan isinf isfinite signbit
nextafter lerp""".split())

STD_HEADERS = frozenset("""algorithm any array atomic barrier bit bitset cassert ccomplex cctype cerrno cfenv
cfloat charconv chrono cinttypes ciso646 climits clocale cmath codecvt compare complex concepts
condition_variable coroutine csetjmp csignal cstdalign cstdarg cstdbool cstddef cstdint cstdio cstdlib
cstring ctgmath ctime cuchar cwchar cwctype deque exception execution expected format forward_list
functional initializer_list iomanip ios iosfwd iostream istream iterator latch limits list locale map
mdspan memory memory_resource mutex new numbers numeric optional ostream print queue random ranges ratio
regex scoped_allocator semaphore set shared_mutex source_location span sstream stack stdexcept stdfloat
stop_token streambuf string string_view syncstream system_error thread tuple type_traits typeindex
typeinfo unordered_map unordered_set utility valarray variant vector version
assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h setjmp.h
signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h stdnoreturn.h string.h tgmath.h
time.h uchar.h wchar.h wctype.h""".split())
CUDA_HEADERS = frozenset("""cuda.h cuda_runtime.h cuda_runtime_api.h cudaTypedefs.h device_launch_parameters.h
device_functions.h device_types.h driver_types.h driver_functions.h host_defines.h builtin_types.h
vector_types.h vector_functions.h cuda_fp16.h cuda_fp16.hpp cuda_bf16.h cuda_bf16.hpp cuda_fp8.h
cuda_fp8.hpp cuda_fp6.h cuda_fp6.hpp cuda_fp4.h cuda_fp4.hpp cuda_pipeline.h cuda_pipeline_primitives.h
cuda_awbarrier.h cuda_awbarrier_primitives.h cuda_texture_types.h texture_types.h surface_types.h
surface_functions.h texture_fetch_functions.h math_constants.h math_functions.h mma.h
cooperative_groups.h cuComplex.h library_types.h cuda_occupancy.h cuda_device_runtime_api.h
nvToolsExt.h""".split())
CUDA_HEADER_PREFIXES = ("cooperative_groups/", "cuda/", "crt/", "sm_", "nvtx3/")
CUBLAS_HEADERS = frozenset({"cublas.h", "cublas_v2.h", "cublas_api.h", "cublasLt.h"})
CUDNN_HEADER = re.compile(r"cudnn(_(?!frontend)[A-Za-z0-9_]+)?\.h")
TORCH_BINDING_HEADERS = frozenset("""torch/extension.h torch/python.h torch/types.h ATen/ATen.h ATen/Tensor.h
ATen/core/Tensor.h ATen/Dispatch.h ATen/TensorUtils.h ATen/cuda/CUDAContext.h ATen/cuda/CUDAContextLight.h
ATen/cuda/Exceptions.h c10/cuda/CUDAStream.h c10/cuda/CUDAGuard.h c10/cuda/CUDAException.h
c10/cuda/CUDAFunctions.h c10/core/ScalarType.h c10/core/DeviceGuard.h c10/util/Half.h c10/util/BFloat16.h
c10/util/Exception.h c10/util/Optional.h c10/util/irange.h c10/macros/Macros.h
torch/csrc/autograd/generated/variable_factories.h torch/csrc/utils/pybind.h""".split())
TORCH_HEADER_PREFIXES = ("torch/", "ATen/", "c10/", "caffe2/")
PYBIND11_PREFIX = "pybind11/"
# Why a known library is refused (for the message); anything unknown is refused too.
FORBIDDEN_LIBRARIES = (
    ("cutlass/", "CUTLASS"), ("cute/", "CuTe"), ("cub/", "CUB (enable with allow-includes = [\"cub/\"])"),
    ("thrust/", "Thrust (enable with allow-includes = [\"thrust/\"])"), ("triton", "Triton"),
    ("flash", "flash-attention"), ("kittens", "ThunderKittens"), ("cudnn_frontend", "the cuDNN frontend"),
    ("cutensor", "cuTENSOR"), ("cusparse", "cuSPARSE"), ("cufft", "cuFFT"), ("curand", "cuRAND"),
    ("cusolver", "cuSOLVER"), ("nccl", "NCCL"), ("nvshmem", "NVSHMEM"), ("fstream", "file I/O"),
    ("filesystem", "file I/O"),
)


def _include_allowed(name: str, config: Config) -> tuple[bool, str]:
    if any(name.startswith(prefix) for prefix in config.allow_includes):
        return True, ""
    for prefix, library in FORBIDDEN_LIBRARIES:
        if name.lower().startswith(prefix):
            return False, f"{library} is not allowed"
    if (name in STD_HEADERS or name in CUDA_HEADERS or name.startswith(CUDA_HEADER_PREFIXES)
            or name in CUBLAS_HEADERS or CUDNN_HEADER.fullmatch(name) or name in TORCH_BINDING_HEADERS
            or name.startswith(PYBIND11_PREFIX) or name == "binding_registry.h"):
        return True, ""
    if name.startswith(TORCH_HEADER_PREFIXES):
        return False, "only torch's binding headers are allowed (torch/extension.h, ATen/cuda/CUDAContext.h, ...)"
    return False, "not an allowed header"


@functools.lru_cache(maxsize=1)
def _torch_names() -> tuple[frozenset, frozenset]:
    """(tensor method names, torch function names): what an operator call can be spelled as."""
    import torch

    methods = frozenset(n for n in dir(torch.Tensor)
                        if not n.startswith("_") and callable(getattr(torch.Tensor, n, None)))
    methods |= {"expect_contiguous"}  # C++ only: copies a tensor that is not contiguous
    functions = frozenset(n for n in dir(torch) if not n.startswith("_") and n[:1].islower()
                          and callable(getattr(torch, n, None)))
    return methods, functions


# --------------------------------------------------------------------------- kernels/ scan (KC001-KC005)

def _is_torch_header(name: str) -> bool:
    return name.startswith(TORCH_HEADER_PREFIXES)


def _is_binding_header(name: str) -> bool:
    return _is_torch_header(name) or name.startswith(PYBIND11_PREFIX) or Path(name).name == "binding_registry.h"


@dataclass
class _Unit:
    path: Path
    rel: str
    tokens: list[Token]
    includes: list[Include]
    local: dict[int, Path] = field(default_factory=dict)  # include line -> resolved local file
    chain: str = ""  # how a header was first reached from a kernels/ source


class _KernelScan:
    """Lexes kernels/ and every local header it reaches; collects KC001-KC005 and facts for other rules."""

    def __init__(self, workdir: Path, config: Config):
        self.workdir, self.config = workdir, config
        self.kernels = workdir / "kernels"
        self.units: dict[Path, _Unit] = {}
        self.violations: list[Violation] = []
        self.reached: set[Path] = set()  # files included (transitively) from a kernels/ source
        files = [p.resolve() for p in _kernel_files(workdir)
                 if p.suffix in SOURCE_SUFFIXES + HEADER_SUFFIXES]
        for path in files:
            self._unit(path)
        sources = [p for p in files if p.suffix in SOURCE_SUFFIXES]
        self._follow(sources)
        self._defined = self._definitions()
        for unit in self.units.values():
            self._check_unit(unit)

    # -- discovery
    def _rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.workdir).as_posix()
        except ValueError:
            return str(path)

    def _unit(self, path: Path) -> _Unit:
        if path not in self.units:
            text = path.read_text(encoding="utf-8", errors="replace")
            tokens, includes = lex_cpp(text)
            unit = _Unit(path, self._rel(path), tokens, includes)
            self.units[path] = unit
            for inc in includes:
                target = self._resolve(path, inc)
                if target is not None:
                    unit.local[inc.line] = target
        return self.units[path]

    def _resolve(self, origin: Path, inc: Include) -> Path | None:
        if not inc.name:
            return None
        bases = [self.workdir, self.kernels] if inc.angled else [origin.parent, self.workdir, self.kernels]
        for base in bases:
            candidate = base / inc.name
            if candidate.is_file():
                return candidate.resolve()
        return None

    def _inside(self, path: Path) -> bool:
        return path == self.workdir or self.workdir in path.parents

    def _follow(self, sources: list[Path]) -> None:
        queue = list(sources)
        while queue:
            unit = self._unit(queue.pop(0))
            for line, target in sorted(unit.local.items()):
                if target in self.reached or not self._inside(target):
                    continue
                self.reached.add(target)
                child = self._unit(target)
                if not child.chain and target.suffix not in SOURCE_SUFFIXES:
                    via = f"{unit.chain} -> " if unit.chain else ""
                    child.chain = f"{via}{unit.rel}:{line}"
                queue.append(target)

    def _reaches(self, path: Path, predicate, seen: frozenset = frozenset()) -> tuple[int, str] | None:
        """(include line in `path`, chain text) of the first include that names a header matching
        `predicate`, directly or through local headers; None when none does."""
        unit = self.units.get(path)
        if unit is None:
            return None
        for inc in unit.includes:
            target = unit.local.get(inc.line)
            shown = f"#include <{inc.name}>" if inc.angled else f'#include "{inc.name}"'
            if predicate(inc.name):
                return inc.line, shown
            if target is not None and target not in seen and self._inside(target):
                deeper = self._reaches(target, predicate, seen | {path})
                if deeper is not None:
                    return inc.line, f"{shown} -> {self.units[target].rel}:{deeper[0]}: {deeper[1]}"
        return None

    def _definitions(self) -> frozenset:
        """Names the scanned sources define or declare themselves (exempt from the ADL check)."""
        names = set()
        for unit in self.units.values():
            toks = unit.tokens
            for k in range(1, len(toks) - 1):
                tok = toks[k]
                if tok.kind == "id" and toks[k + 1].text == "(":
                    prev = toks[k - 1]
                    if (prev.kind == "id" and prev.text not in _NOT_TYPES) or prev.text in ("*", "&", ">"):
                        names.add(tok.text)
        return frozenset(names)

    # -- checks
    def _add(self, unit: _Unit, line: int, rule: str, message: str) -> None:
        if unit.chain:
            message += f" (reached through {unit.chain})"
        self.violations.append(Violation(unit.rel, line, rule, message))

    def _check_unit(self, unit: _Unit) -> None:
        suffix, stem = unit.path.suffix, unit.path.stem
        is_binding = suffix == ".cpp" and stem.endswith("_binding")
        for inc in unit.includes:
            target = unit.local.get(inc.line)
            shown = f"<{inc.name}>" if inc.angled else f'"{inc.name}"'
            if not inc.name:
                self._add(unit, inc.line, "KC002", "computed #include: the checker cannot see which header it names")
            elif target is not None:
                if not self._inside(target):
                    self._add(unit, inc.line, "KC002", f"#include {shown} resolves outside the workdir ({target})")
            else:
                ok, why = _include_allowed(inc.name, self.config)
                if not ok:
                    self._add(unit, inc.line, "KC002", f"forbidden #include {shown}: {why}")
        torch_reach = self._reaches(unit.path, _is_torch_header)
        if suffix == ".cu":
            hit = self._reaches(unit.path, _is_binding_header)
            if hit is not None:
                self._add(unit, hit[0], "KC003", f"a .cu file includes torch or pybind11 headers ({hit[1]}); "
                                                 "keep them in the *_binding.cpp file and pass raw pointers "
                                                 "and a cudaStream_t to the launcher")
        self._check_tokens(unit, torch_reach is not None, suffix, is_binding)
        if torch_reach is not None:
            for line, op, name in _tensor_operators(unit.tokens):
                self._add(unit, line, "KC001", f"operator `{op}` on the tensor {name} dispatches an ATen op")
        if suffix == ".cpp" and not is_binding and self.kernels in unit.path.parents:
            calls = any(t.kind == "id" and t.text.startswith(("cublas", "cudnn")) and k + 1 < len(unit.tokens)
                        and unit.tokens[k + 1].text == "(" for k, t in enumerate(unit.tokens))
            if not calls:
                self._add(unit, 1, "KC005", f"{unit.path.name} calls neither cuBLAS nor cuDNN: a .cpp file that "
                                            "is not a binding exists for library calls; kernels go in a .cu file")

    def _check_tokens(self, unit: _Unit, has_torch: bool, suffix: str, is_binding: bool) -> None:
        config, toks = self.config, unit.tokens
        methods, functions = _torch_names() if has_torch else (frozenset(), frozenset())
        allowed_methods = ALLOWED_CPP_METHODS | config.allow_cpp_methods
        allowed_calls = ALLOWED_CPP_CALLS | config.allow_cpp_calls
        aliases: dict[str, str] = {}
        k, n = 0, len(toks)
        while k < n:
            tok = toks[k]
            text = tok.text
            if tok.kind != "id":
                k += 1
                continue
            prev = toks[k - 1].text if k else ""
            if text == "namespace" and k + 3 < n and toks[k + 2].text == "=":  # namespace T = torch;
                name, end = _qualified(toks, k + 3)
                aliases[toks[k + 1].text] = name
                k = end
                continue
            if text == "__global__" and suffix == ".cpp":
                self._add(unit, tok.line, "KC004",
                          f"__global__ function in {unit.path.name}: kernels belong in a .cu file")
            if text in ("REGISTER_BINDING", "PYBIND11_MODULE") and not is_binding and unit.rel != "binding_registry.h":
                self._add(unit, tok.line, "KC003",
                          f"{text} in {unit.path.name}: only *_binding.cpp files register bindings")
            if prev in (".", "->"):
                if has_torch and text in methods and text not in allowed_methods and _is_call(toks, k + 1):
                    self._add(unit, tok.line, "KC001", f"tensor method .{text}() is a torch operator "
                                                       "(allowed on tensors: metadata, data_ptr, options)")
                k += 1
                continue
            if prev == "::" and k >= 2 and toks[k - 2].kind == "id":
                k += 1  # the tail of a qualified name that was already read
                continue
            name, end = _qualified(toks, k)
            head, _, rest = name.partition("::")
            if head in aliases:
                name = aliases[head] + ("::" + rest if rest else "")
            parts = [p for p in name.split("::") if p]
            if parts and parts[0] in TORCH_ROOTS and len(parts) > 1:
                last = parts[-1]
                constant = re.fullmatch(r"k[A-Z0-9]\w*", last) is not None
                if "::".join(parts) in allowed_calls or constant:
                    pass
                elif last[:1].isupper():
                    if TORCH_OP_NAMESPACES & set(parts[1:-1]):
                        self._add(unit, tok.line, "KC001", f"{'::'.join(parts)} is a torch module or op")
                elif prev != "namespace":
                    self._add(unit, tok.line, "KC001", f"{'::'.join(parts)} is a torch/ATen operator (allowed: "
                                                       "torch::empty*, metadata, the current-stream getters)")
            elif (has_torch and len(parts) == 1 and name in functions and name not in C_MATH_NAMES
                  and name not in self._defined and name not in allowed_methods
                  and not name.startswith("empty") and prev not in _NOT_CALLERS and _is_call(toks, end)):
                self._add(unit, tok.line, "KC001", f"unqualified call {name}(...) reaches the ATen operator "
                                                   f"at::{name} (argument-dependent lookup on a tensor)")
            k = max(end, k + 1)


_NOT_TYPES = frozenset({"return", "case", "else", "do", "throw", "co_return", "co_yield", "new", "delete",
                        "sizeof", "typeid", "decltype", "alignof", "noexcept", "if", "while", "for", "switch"})
_NOT_CALLERS = frozenset({".", "->", "::", "~"})


_BINARY_OPS = frozenset("+-*/%^|<>[")  # after a tensor: x + y, x[0], x < y
_PREFIX_OPS = frozenset("+-*/%^|~")


def _tensor_operators(toks: list[Token]) -> Iterator[tuple[int, str, str]]:
    """(line, operator, variable) for C++ operators applied to a variable declared as a tensor in
    the same function (`torch::Tensor x` parameters and locals, `auto y = torch::empty(...)`)."""
    tensors: set[str] = set()
    depth = 0
    text_at = lambda j: toks[j].text if 0 <= j < len(toks) else ""  # noqa: E731
    for k, tok in enumerate(toks):
        text = tok.text
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
            if depth == 0:
                tensors.clear()  # the end of a function: its names go out of scope
        elif tok.kind != "id":
            continue
        elif text == "Tensor" and text_at(k - 1) == "::" and text_at(k - 2) in TORCH_ROOTS:
            j = k + 1
            while text_at(j) in ("const", "&"):
                j += 1
            if j < len(toks) and toks[j].kind == "id":
                tensors.add(toks[j].text)
        elif text == "auto" and text_at(k + 2) == "=" and text_at(k + 3) in TORCH_ROOTS and text_at(k + 4) == "::":
            if _qualified(toks, k + 3)[0].rsplit("::", 1)[-1].startswith("empty"):
                tensors.add(text_at(k + 1))
        elif text in tensors and text_at(k - 1) not in (".", "->", "::"):
            after, before = text_at(k + 1), text_at(k - 1)
            if after in (".", "->"):
                continue  # y.size(0) * 2: the operand is what the member returns
            if after in ("=", "!") and text_at(k + 2) == "=":
                yield tok.line, after + "=", text
            elif after in _BINARY_OPS:
                yield tok.line, after, text
            elif before in _PREFIX_OPS:
                yield tok.line, before, text
            elif before == "=" and text_at(k - 2) in ("=", "!"):
                yield tok.line, text_at(k - 2) + "=", text


def _qualified(toks: list[Token], k: int) -> tuple[str, int]:
    """The qualified name starting at toks[k] (`at::cuda::getCurrentCUDAStream`) and the index after it."""
    parts = [toks[k].text]
    end = k + 1
    while end + 1 < len(toks) and toks[end].text == "::" and toks[end + 1].kind == "id":
        parts.append(toks[end + 1].text)
        end += 2
    return "::".join(parts), end


def _is_call(toks: list[Token], k: int) -> bool:
    """toks[k] opens a call: `(`, or a template argument list `<...>` followed by `(`."""
    if k >= len(toks):
        return False
    if toks[k].text == "(":
        return True
    if toks[k].text != "<":
        return False
    depth = 0
    for j in range(k, min(k + 40, len(toks))):
        if toks[j].text == "<":
            depth += 1
        elif toks[j].text == ">":
            depth -= 1
            if depth == 0:
                return j + 1 < len(toks) and toks[j + 1].text == "("
        elif toks[j].text in (";", "{", "}"):
            return False
    return False


# --------------------------------------------------------------------------- convolution (CV001)

_CONV_NAME = re.compile(r"(Lazy)?Conv(Transpose)?[123]d|conv(_transpose)?[123]d")


def _check_convolution(workdir: Path, scan: _KernelScan) -> list[Violation]:
    path = workdir / "model.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return []
    uses: dict[str, int] = {}  # "forward" / "transposed" -> first line
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name and _CONV_NAME.fullmatch(name):
            kind = "transposed" if "ranspose" in name else "forward"
            uses[kind] = min(uses.get(kind, node.lineno), node.lineno)
    # An empty kernels/ (a workdir fresh from `cudaopt init`) has nothing to judge yet.
    if not uses or not any(p.suffix in SOURCE_SUFFIXES for p in _kernel_files(workdir)):
        return []
    has_cudnn = any(CUDNN_HEADER.fullmatch(inc.name) for u in scan.units.values() for inc in u.includes)
    called = {t.text for u in scan.units.values() for k, t in enumerate(u.tokens)
              if t.kind == "id" and t.text.startswith("cudnn") and _is_call(u.tokens, k + 1)}
    found = []
    for kind, needed in (("forward", "cudnnConvolutionForward"), ("transposed", "cudnnConvolutionBackwardData")):
        if kind not in uses:
            continue
        missing = []
        if not has_cudnn:
            missing.append("no kernels/ file includes cudnn.h")
        if needed not in called and "cudnnBackendExecute" not in called:
            missing.append(f"none calls {needed} (or cudnnBackendExecute)")
        if missing:
            what = "a transposed convolution" if kind == "transposed" else "a convolution"
            found.append(Violation("model.py", uses[kind], "CV001",
                                   f"model.py uses {what}, which kernels/ must implement with cuDNN: "
                                   + " and ".join(missing)))
    return found


# --------------------------------------------------------------------------- model_new.py (MN001-MN009)

ALLOWED_TORCH_CREATION = frozenset({
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like",
    "torch.ones", "torch.ones_like", "torch.full", "torch.full_like",
})
# torch callables that are neither operators nor creation: metadata objects and grad-mode contexts.
ALLOWED_TORCH_OTHER = frozenset({
    "torch.device", "torch.Size", "torch.finfo", "torch.iinfo", "torch.is_tensor", "torch.is_floating_point",
    "torch.no_grad", "torch.inference_mode",
})
ALLOWED_TENSOR_METHODS = frozenset({
    "size", "stride", "numel", "nelement", "dim", "ndimension", "element_size", "is_contiguous",
    "data_ptr", "get_device", "storage_offset", "is_floating_point", "is_complex",
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full",
})
ALLOWED_TENSOR_ATTRIBUTES = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "itemsize", "nbytes", "is_meta",
})
_TENSOR_CREATING_METHODS = frozenset({"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"})
# Tensor properties that compute something (a view or a copy).
_TENSOR_OP_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})
# Methods of Python containers and strings: fine on a receiver whose type is unknown.
_CONTAINER_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "copy", "count", "index", "reverse", "items",
    "keys", "values", "get", "setdefault", "update", "format", "join", "split", "strip", "lower", "upper",
    "startswith", "endswith", "replace", "add", "discard", "bit_length", "is_integer",
})
SAFE_CALL_MODULES = frozenset({"math", "typing"})
FORBIDDEN_STDLIB = frozenset({
    "importlib", "ctypes", "subprocess", "multiprocessing", "runpy", "builtins", "gc", "inspect", "pickle",
    "marshal", "shelve", "socket", "threading", "concurrent", "sqlite3", "urllib", "http",
})
_FILE_READ_CALLS = frozenset({
    "open", "io.open", "os.open", "os.read", "os.fdopen", "os.getenv", "os.getenvb", "os.popen",
    "torch.load", "torch.from_file", "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt",
    "numpy.memmap", "pickle.load", "json.load", "shelve.open", "builtins.open",
})
_FILE_READ_ATTRIBUTES = frozenset({"os.environ", "os.environb"})
_FILE_READ_METHODS = frozenset({"read_text", "read_bytes"})
_GLOBAL_STATE_CALLS = frozenset({
    "torch.manual_seed", "torch.seed", "torch.use_deterministic_algorithms", "torch.cuda.manual_seed",
    "torch.cuda.manual_seed_all", "torch.random.manual_seed",
})
_SCALAR_BUILTINS = frozenset({
    "len", "range", "int", "float", "bool", "str", "abs", "min", "max", "round", "divmod", "pow", "sum",
    "sorted", "any", "all", "list", "tuple", "dict", "set", "frozenset", "enumerate", "zip", "isinstance",
    "issubclass", "print", "repr", "format", "hash", "id", "type", "iter", "next", "reversed", "slice",
    "callable", "complex", "hex", "oct", "bin", "chr", "ord", "map", "filter",
})
# Builtins that, given a tensor, call its operators (__abs__, __gt__, __iter__, item(), ...).
_TENSOR_DISPATCHING_BUILTINS = frozenset({
    "int", "float", "bool", "complex", "abs", "min", "max", "round", "divmod", "pow", "sum", "sorted", "any",
    "all", "iter", "next", "reversed", "list", "tuple", "map", "filter", "enumerate", "zip", "set", "frozenset",
})
# Builtins that combine the items of a container: on a list of tensors they run tensor operators.
_REDUCING_BUILTINS = frozenset({"sum", "min", "max", "sorted", "any", "all"})
_DYNAMIC_BUILTINS = frozenset({"eval", "exec", "compile", "globals", "vars", "locals", "setattr", "delattr"})
_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "tuple", "list", "dict", "Sequence",
                                 "Tuple", "List", "Optional", "Union", "Callable"})
_FORBIDDEN_METHODS_OF_SELF = frozenset({"__call__", "_call_impl", "_wrapped_call_impl", "__getattr__",
                                        "__getattribute__"})
_HOOK_METHODS = re.compile(r"register_(full_backward_|forward_|module_forward_)\w*hook")

# Types of the inference: EXT is what a cuda_extension op returns (a tensor or a tuple of them),
# TENSORS a Python container holding tensors.
TENSOR, EXT, TENSORS = "tensor", "extension result", "tensors"
NON, SHAPE, UNKNOWN, MODULE, SUPER = "non-tensor", "shape", "unknown", "module", "super"


def _tensorish(kind: object) -> bool:
    return kind in (TENSOR, EXT)


def _is_module_class(node: ast.ClassDef, aliases: dict[str, str]) -> bool:
    return any((_dotted(b, aliases) or "") in ("torch.nn.Module", "torch.nn.modules.module.Module")
               for b in node.bases)


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`F.relu` -> "torch.nn.functional.relu" when `F` is an import alias; None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *reversed(parts)])
    return None


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in tree.body:  # module-level aliases: `mm = torch.matmul`, `T = torch`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = _dotted(node.value, aliases)
            if target is not None:
                aliases[node.targets[0].id] = target
    return aliases


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _ModelNewCheck:
    """The MN rules on one parsed model_new.py."""

    def __init__(self, tree: ast.Module, model_tree: ast.Module | None, config: Config):
        self.tree, self.model_tree, self.config = tree, model_tree, config
        self.found: list[Violation] = []
        self.aliases = _import_aliases(tree)
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.attr_types: dict[str, dict[str, object]] = {}
        self.analyzed: dict[tuple, object] = {}

    def add(self, node: ast.AST | int, rule: str, message: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        self.found.append(Violation("model_new.py", line, rule, message))

    def run(self) -> list[Violation]:
        self.check_imports()
        self.check_global()
        cls = self.classes.get("ModelNew")
        if cls is None:
            self.add(1, "MN001", "model_new.py defines no class ModelNew")
            return self.found
        if not _is_module_class(cls, self.aliases):
            self.add(cls, "MN001", "ModelNew must subclass torch.nn.Module directly, got "
                                   f"({', '.join(ast.unparse(b) for b in cls.bases)})")
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in cls.body:
            names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and {"forward", "__call__"} & set(names):
                self.add(node, "MN001", "ModelNew assigns forward/__call__ in its class body; define `def forward`")
        for name in _FORBIDDEN_METHODS_OF_SELF & set(methods):
            self.add(methods[name], "MN001", f"ModelNew defines {name}, which bypasses forward")
        for node in ast.walk(cls):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self" and target.attr in ("forward", "__call__"):
                    self.add(node, "MN001", f"self.{target.attr} is replaced, so forward is not what runs")
        self.check_signature(cls, methods.get("__init__"))
        forward = methods.get("forward")
        if forward is None:
            self.add(cls, "MN001", "ModelNew defines no forward method")
        else:
            self.analyze(("ModelNew", "forward"), forward, "ModelNew", None)
        return self.found

    # -- MN002
    def check_signature(self, cls: ast.ClassDef, init: ast.FunctionDef | None) -> None:
        if self.model_tree is None:
            return
        model = next((n for n in self.model_tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is None:
            self.add(cls, "MN002", "model.py defines no class Model to compare ModelNew.__init__ with")
            return
        ref = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)

        def signature(fn: ast.FunctionDef | None) -> tuple[str, str]:
            args = (fn or ast.parse("def __init__(self): pass").body[0]).args
            shape = ast.arguments(posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs],
                                  args=[ast.arg(a.arg) for a in args.args],
                                  vararg=args.vararg and ast.arg(args.vararg.arg),
                                  kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs],
                                  kw_defaults=args.kw_defaults, kwarg=args.kwarg and ast.arg(args.kwarg.arg),
                                  defaults=args.defaults)
            return f"({ast.unparse(shape)})", ast.dump(shape, annotate_fields=False)

        mine, theirs = signature(init), signature(ref)
        if mine[1] != theirs[1]:
            self.add(init or cls, "MN002", f"ModelNew.__init__{mine[0]} does not take the same parameters as "
                                           f"Model.__init__{theirs[0]} in model.py")

    # -- MN006-MN009, anywhere in the file
    def check_imports(self) -> None:
        stdlib = set(sys.stdlib_module_names)
        for node in ast.walk(self.tree):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    self.add(node, "MN006", f"relative import `{ast.unparse(node)}`: model_new.py may import only "
                                            "torch, cuda_extension and the standard library")
                    continue
                modules = [node.module or ""]
                if node.module in ("model", "model_new") or any(a.name == "Model" for a in node.names):
                    self.add(node, "MN006", f"`{ast.unparse(node)}` imports model.py's Model: ModelNew must not "
                                            "delegate to the reference")
                    continue
            for module in modules:
                root = module.split(".")[0]
                if module.startswith("torch.utils.cpp_extension"):
                    why = "builds another extension outside kernels/"
                elif root in ("torch", "cuda_extension", "__future__") or module in self.config.allow_imports \
                        or root in self.config.allow_imports:
                    continue
                elif root == "model":
                    why = "imports model.py: ModelNew must not delegate to the reference"
                elif root in FORBIDDEN_STDLIB:
                    why = "reaches code outside the custom path"
                elif root in stdlib:
                    continue
                else:
                    why = ("is neither torch, cuda_extension nor the standard library (another workdir's "
                           "code or a third-party library); allow it with [tool.cudaopt] allow-imports")
                self.add(node, "MN006", f"import of {module} {why}")

    def check_global(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                self.add(node, "MN007", "try/except in model_new.py: the custom path must fail loudly, not fall back")
            elif isinstance(node, ast.Call):
                name = self.callee(node.func)
                if name in ("contextlib.suppress",):
                    self.add(node, "MN007", "contextlib.suppress hides failures of the custom path")
                elif name in _FILE_READ_CALLS or (isinstance(node.func, ast.Attribute)
                                                  and node.func.attr in _FILE_READ_METHODS):
                    what = name or f".{node.func.attr}()"
                    self.add(node, "MN008", f"{what} reads a file or the environment")
                elif name in ("__import__", "importlib.import_module"):
                    self.add(node, "MN006", f"{name}() imports code dynamically")
                elif name in _GLOBAL_STATE_CALLS or (name or "").startswith(("torch.backends.", "torch._dynamo.",
                                                                               "torch._inductor.")) \
                        or re.fullmatch(r"torch\.(\w+\.)*set_\w+", name or ""):
                    self.add(node, "MN009", f"{name}() changes torch's global state")
                elif name == "setattr" and node.args and (self.callee(node.args[0]) or "").startswith("torch"):
                    self.add(node, "MN009", f"setattr on {self.callee(node.args[0])} patches torch")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                name = _dotted(node, self.aliases)
                if name in _FILE_READ_ATTRIBUTES:
                    self.add(node, "MN008", f"{name} reads the environment")
                elif name in ("sys.modules", "sys.path"):
                    self.add(node, "MN006", f"{name} reaches other modules' code")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for target in targets:
                    name = _dotted(target, self.aliases) if isinstance(target, ast.Attribute) else None
                    if name and name.split(".")[0] == "torch":
                        self.add(node, "MN009", f"assignment to {name} changes torch's global state")
                    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id in self.classes and target.attr in ("forward", "__call__"):
                        self.add(node, "MN001", f"{target.value.id}.{target.attr} is replaced after the class")

    def callee(self, func: ast.AST) -> str | None:
        name = _dotted(func, self.aliases)
        if name is None and isinstance(func, ast.Name) and func.id not in self.functions \
                and func.id not in self.classes and hasattr(builtins, func.id):
            return func.id
        return name

    # -- MN003-MN005 on the forward path
    def class_attr_types(self, cls_name: str) -> dict[str, object]:
        """Types of `self.<attr>` from the class's __init__: submodules, parameters/buffers, other values."""
        if cls_name in self.attr_types:
            return self.attr_types[cls_name]
        types: dict[str, object] = {}
        self.attr_types[cls_name] = types
        cls = self.classes.get(cls_name)
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None) \
            if cls else None
        for node in ast.walk(init) if init else ():
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        types[target.attr] = self.init_value_type(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("register_buffer", "register_parameter") and node.args:
                name = _const_str(node.args[0])
                if name:
                    types[name] = TENSOR
        return types

    def init_value_type(self, value: ast.AST) -> object:
        if isinstance(value, ast.Call):
            name = _dotted(value.func, self.aliases) or ""
            if name.startswith("cuda_extension"):
                return TENSOR
            if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.Tensor") \
                    or (name.startswith("torch.") and name.split(".")[-1][:1].islower()):
                return TENSOR
            if name.startswith("torch.nn.") and name.split(".")[-1][:1].isupper():
                return MODULE
            if isinstance(value.func, ast.Name) and value.func.id in self.classes:
                cls = self.classes[value.func.id]
                return MODULE if _is_module_class(cls, self.aliases) else ("obj", cls.name)
            return UNKNOWN
        name = _dotted(value, self.aliases)
        if name is not None:
            return ("alias", name)
        return NON

    def analyze(self, key: tuple, fn: ast.FunctionDef, owner: str | None, arg_types: list | None) -> object:
        """Check one function of the forward path; returns the type of what it returns."""
        if key in self.analyzed:
            return self.analyzed[key]
        self.analyzed[key] = UNKNOWN  # recursion guard
        checker = _ForwardChecker(self, fn, owner, arg_types)
        result = checker.run()
        self.analyzed[key] = result
        return result


def _join(*types: object) -> object:
    if any(map(_tensorish, types)):
        return TENSOR
    if types and all(t in (NON, SHAPE) for t in types):
        return NON
    return UNKNOWN


class _ForwardChecker:
    """Walks one function on the forward path with a small type inference (tensor or not)."""

    def __init__(self, mn: _ModelNewCheck, fn: ast.FunctionDef, owner: str | None, arg_types: list | None):
        self.mn, self.fn, self.owner = mn, fn, owner
        self.env: dict[str, object] = {}
        self.returns: list[object] = []
        where = f"{owner}.{fn.name}" if owner else fn.name
        self.where = where
        params = [*fn.args.posonlyargs, *fn.args.args]
        defaults = [None] * (len(params) - len(fn.args.defaults)) + list(fn.args.defaults)
        for index, (param, default) in enumerate(zip(params, defaults)):
            if index == 0 and owner is not None and param.arg in ("self", "cls"):
                self.env[param.arg] = ("obj", owner) if param.arg == "self" else ("class", owner)
                continue
            position = index - (1 if owner is not None else 0)
            if arg_types is not None and 0 <= position < len(arg_types):
                self.env[param.arg] = arg_types[position]
            else:
                self.env[param.arg] = self.param_type(param, default)
        for param in fn.args.kwonlyargs:
            self.env[param.arg] = self.param_type(param, None)
        for param in (fn.args.vararg, fn.args.kwarg):
            if param is not None:
                self.env[param.arg] = NON

    @staticmethod
    def param_type(param: ast.arg, default: ast.AST | None) -> object:
        if param.annotation is not None:
            text = ast.unparse(param.annotation)
            if "Tensor" in text:
                return TENSOR
            if re.match(r"(typing\.)?(\w+)", text).group(2) in _SCALAR_ANNOTATIONS:
                return NON
        if isinstance(default, ast.Constant) and default.value is not None:
            return NON
        return TENSOR

    def add(self, node: ast.AST, rule: str, message: str) -> None:
        self.mn.add(node, rule, f"{message} (in {self.where})")

    def run(self) -> object:
        for decorator in self.fn.decorator_list:  # @torch.compile, @torch.jit.script wrap the function
            self.check_function_value(decorator, self.expr(decorator))
        for stmt in self.fn.body:
            self.stmt(stmt)
        return _join(*self.returns) if self.returns else NON

    # -- statements
    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            value = self.expr(node.value)
            for target in node.targets:
                self.bind(target, value, node.value)
        elif isinstance(node, ast.AnnAssign):
            value = self.expr(node.value) if node.value is not None else UNKNOWN
            self.bind(node.target, value, node.value)
        elif isinstance(node, ast.AugAssign):
            current, value = self.expr(_as_load(node.target)), self.expr(node.value)
            if _tensorish(current) or _tensorish(value):
                self.add(node, "MN005", f"in-place `{_OPS.get(type(node.op), '?')}=` on a tensor dispatches a torch op")
            self.bind(node.target, _join(current, value), None)
        elif isinstance(node, ast.Return):
            self.returns.append(self.expr(node.value) if node.value is not None else NON)
        elif isinstance(node, (ast.If, ast.While)):
            self.test(node.test)
            self.block(node.body + node.orelse)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.bind(node.target, self.iteration(node.iter), None)
            self.block(node.body + node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, UNKNOWN, None)
            self.block(node.body)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            self.block(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.Assert):
            self.test(node.test)
            if node.msg is not None:
                self.expr(node.msg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            nested = _ForwardChecker(self.mn, node, None, None)
            nested.env = {**self.env, **nested.env}
            nested.where = self.where
            nested.run()
            self.env[node.name] = ("local", node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                self.env[bound] = ("alias", self.mn.aliases.get(bound, bound))
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def iteration(self, iterable: ast.expr) -> object:
        """The type of the loop variable over `iterable`."""
        kind = self.expr(iterable)
        if kind == TENSOR:
            self.add(iterable, "MN005", "iterating over a tensor dispatches torch ops (unbind/select)")
        if kind in (TENSOR, EXT, TENSORS):
            return TENSOR
        return NON if _is_range(iterable) or kind == SHAPE else UNKNOWN

    def test(self, node: ast.expr) -> None:
        if _tensorish(self.expr(node)):
            self.add(node, "MN005", "the truth value of a tensor dispatches a torch op (and synchronises)")

    def bind(self, target: ast.AST, value: object, source: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = source.elts if isinstance(source, (ast.Tuple, ast.List)) and \
                len(source.elts) == len(target.elts) else None
            for index, element in enumerate(target.elts):
                if items is not None:
                    element_type = self.env_type_of(items[index])
                elif value == SHAPE:
                    element_type = NON
                elif value in (EXT, TENSORS):
                    element_type = TENSOR  # `a, b = cuda_extension.op(x)`
                else:
                    element_type = UNKNOWN
                self.bind(element, element_type, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, UNKNOWN, None)
        elif isinstance(target, ast.Subscript):
            container = self.expr(target.value)
            self.expr(target.slice)
            if _tensorish(container):
                self.add(target, "MN005", "assigning into a tensor (`x[...] = ...`) dispatches a torch op")
        elif isinstance(target, ast.Attribute):
            self.expr(target.value)

    def env_type_of(self, node: ast.AST) -> object:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.Constant):
            return NON
        return UNKNOWN

    # -- expressions
    def lookup(self, name: str) -> object:
        if name in self.env:
            return self.env[name]
        if name in self.mn.functions:
            return ("func", name)
        if name in self.mn.classes:
            return ("class", name)
        if name in self.mn.aliases:
            return ("alias", self.mn.aliases[name])
        if hasattr(builtins, name):
            return ("builtin", name)
        return UNKNOWN

    def qualified(self, node: ast.AST) -> str | None:
        """Dotted name of a module attribute chain, resolving import aliases and local aliases."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and _const_str(node.args[1]):
            base = self.qualified(node.args[0])
            return None if base is None else ".".join([base, node.args[1].value, *reversed(parts)])
        if isinstance(node, ast.Name):
            kind = self.lookup(node.id)
            if isinstance(kind, tuple) and kind[0] == "alias":
                return ".".join([kind[1], *reversed(parts)])
        return None

    def expr(self, node: ast.AST | None) -> object:
        if node is None:
            return NON
        if isinstance(node, ast.Constant):
            return NON
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            left, right = self.expr(node.left), self.expr(node.right)
            if _tensorish(left) or _tensorish(right):
                self.add(node, "MN005", f"operator `{_OPS.get(type(node.op), '?')}` on a tensor dispatches a "
                                        "torch op; compute it in a kernel")
                return TENSOR
            return _join(left, right)
        if isinstance(node, ast.UnaryOp):
            operand = self.expr(node.operand)
            if _tensorish(operand):
                self.add(node, "MN005", f"unary `{_OPS.get(type(node.op), '?')}` on a tensor dispatches a torch op")
                return TENSOR
            return NON if operand in (NON, SHAPE) else UNKNOWN
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                self.test(value)
            return NON
        if isinstance(node, ast.Compare):
            types = [self.expr(node.left), *(self.expr(c) for c in node.comparators)]
            identity = all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
            if any(map(_tensorish, types)) and not identity:
                self.add(node, "MN005", "comparing a tensor dispatches a torch op")
                return TENSOR
            return NON
        if isinstance(node, ast.Subscript):
            value = self.expr(node.value)
            self.expr(node.slice)
            if value == EXT and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                return TENSOR  # out[0] of an op that returns a tuple
            if _tensorish(value):
                self.add(node, "MN005", "indexing a tensor (`x[...]`) dispatches a torch op (select/slice/index)")
                return TENSOR
            if value == TENSORS:
                return TENSOR
            if value == SHAPE:
                return NON
            return MODULE if value == MODULE else UNKNOWN
        if isinstance(node, ast.IfExp):
            self.test(node.test)
            return _join(self.expr(node.body), self.expr(node.orelse))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elements = [self.expr(element) for element in node.elts]
            return TENSORS if any(_tensorish(e) or e == TENSORS for e in elements) else NON
        if isinstance(node, ast.Dict):
            for part in [*node.keys, *node.values]:
                self.expr(part)
            return NON
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in node.generators:
                self.bind(gen.target, self.iteration(gen.iter), None)
                for cond in gen.ifs:
                    self.test(cond)
            parts = [self.expr(p) for p in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])]
            return TENSORS if any(_tensorish(p) for p in parts) else NON
        if isinstance(node, ast.Lambda):
            saved = dict(self.env)
            for param in node.args.args:
                self.env[param.arg] = UNKNOWN
            self.expr(node.body)
            self.env = saved
            return NON
        if isinstance(node, ast.NamedExpr):
            value = self.expr(node.value)
            self.bind(node.target, value, node.value)
            return value
        if isinstance(node, ast.JoinedStr):
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    self.expr(value.value)
            return NON
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
        return UNKNOWN

    def attribute(self, node: ast.Attribute) -> object:
        name = self.qualified(node)
        if name is not None:
            return ("alias", name)
        receiver = self.expr(node.value)
        attr = node.attr
        if _tensorish(receiver):
            if attr in ALLOWED_TENSOR_ATTRIBUTES | ALLOWED_TENSOR_METHODS | self.mn.config.allow_tensor_methods:
                return SHAPE if attr == "shape" else NON
            self.add(node, "MN004", f"tensor attribute .{attr} is a torch op")
            return TENSOR
        if receiver == UNKNOWN and attr in _TENSOR_OP_ATTRIBUTES:
            self.add(node, "MN004", f"tensor attribute .{attr} is a torch op")
            return TENSOR
        if isinstance(receiver, tuple) and receiver[0] == "obj":
            types = self.mn.class_attr_types(receiver[1])
            if attr in types:
                return types[attr]
            return ("bound", receiver[1], attr)
        if isinstance(receiver, tuple) and receiver[0] == "class":
            return ("bound", receiver[1], attr)
        if receiver == MODULE:
            return TENSOR if re.search(r"weight|bias|running_", attr) else UNKNOWN
        if receiver in (NON, SHAPE):
            return NON
        return UNKNOWN

    def call(self, node: ast.Call) -> object:
        arg_types = [self.expr(a) for a in node.args]
        for value, value_type in [*zip(node.args, arg_types), *((k.value, self.expr(k.value)) for k in node.keywords)]:
            self.check_function_value(value, value_type)
        func = node.func
        name = self.qualified(func)
        if isinstance(func, ast.Name) and name is None:
            kind = self.lookup(func.id)
            return self.call_kind(node, kind, func.id, arg_types)
        if name is not None:
            return self.call_qualified(node, name)
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" \
                and len(func.args) >= 2 and _const_str(func.args[1]):
            receiver = self.expr(func.args[0])
            return self.call_method(node, receiver, func.args[1].value, ast.unparse(func.args[0]), arg_types)
        if isinstance(func, ast.Attribute):
            receiver = self.expr(func.value)
            return self.call_method(node, receiver, func.attr, ast.unparse(func.value), arg_types)
        kind = self.expr(func)
        return self.call_kind(node, kind, ast.unparse(func), arg_types)

    def check_function_value(self, node: ast.AST, kind: object) -> None:
        """A torch function handed to something else (`map(torch.relu, xs)`, `partial(F.gelu)`) runs as an op."""
        if isinstance(kind, tuple) and kind[0] == "alias" and kind[1].split(".")[0] == "torch" \
                and kind[1] not in ALLOWED_TORCH_CREATION | ALLOWED_TORCH_OTHER | self.mn.config.allow_python_calls \
                and _is_torch_function(kind[1]):
            self.add(node, "MN003", f"{kind[1]} is passed as a function; it runs torch ops when called")

    def call_kind(self, node: ast.Call, kind: object, text: str, arg_types: list) -> object:
        if isinstance(kind, tuple):
            if kind[0] == "alias":
                return self.call_qualified(node, kind[1])
            if kind[0] == "func":
                return self.mn.analyze(("func", kind[1], tuple(map(str, arg_types))), self.mn.functions[kind[1]],
                                       None, arg_types)
            if kind[0] == "local":
                return UNKNOWN
            if kind[0] == "class":
                cls = self.mn.classes[kind[1]]
                return MODULE if _is_module_class(cls, self.mn.aliases) else ("obj", kind[1])
            if kind[0] == "bound":
                return self.call_method(node, ("obj", kind[1]), kind[2], kind[1], arg_types)
            if kind[0] == "builtin":
                return self.call_builtin(node, kind[1], arg_types)
        if kind == MODULE:
            self.add(node, "MN004", f"calling the nn.Module {text} runs torch ops; call a cuda_extension op")
            return TENSOR
        self.add(node, "MN003", f"calls {text}, which the checker cannot resolve to a cuda_extension op")
        return UNKNOWN

    def call_qualified(self, node: ast.Call, name: str) -> object:
        root = name.split(".")[0]
        config = self.mn.config
        if root == "cuda_extension":
            return EXT
        if name in _FILE_READ_CALLS:
            return NON  # MN008 reports it wherever it is
        if name in _GLOBAL_STATE_CALLS or name == "contextlib.suppress" \
                or name.startswith(("torch.backends.", "importlib.")) or re.fullmatch(r"torch\.(\w+\.)*set_\w+", name):
            return UNKNOWN  # MN006, MN007 and MN009 report these wherever they are
        if name in ALLOWED_TORCH_CREATION or name in config.allow_python_calls:
            return TENSOR
        if name in ALLOWED_TORCH_OTHER:
            return NON
        if root in SAFE_CALL_MODULES:
            return NON
        if root == "torch":
            self.add(node, "MN003", f"{name}() is a torch op; the forward path may call only cuda_extension ops, "
                                    "tensor creation (torch.empty*, zeros*, ones*, full*) and tensor properties")
        else:
            self.add(node, "MN003", f"{name}() is not a cuda_extension op (other libraries do not belong in "
                                    "the forward path)")
        return UNKNOWN

    def call_builtin(self, node: ast.Call, name: str, arg_types: list) -> object:
        if name == "open":
            return NON  # MN008 reports it
        if name in ("__import__", "getattr", "hasattr"):
            if name == "getattr" and len(node.args) >= 2 and _const_str(node.args[1]) is None:
                receiver = arg_types[0]
                if _tensorish(receiver) or (isinstance(receiver, tuple) and receiver[0] == "alias"):
                    self.add(node, "MN003", "getattr with a computed name hides which op is called")
            if name == "getattr" and len(node.args) >= 2 and _const_str(node.args[1]):
                return self.attribute(ast.Attribute(value=node.args[0], attr=node.args[1].value,
                                                    ctx=ast.Load(), lineno=node.lineno))
            return UNKNOWN
        if name in _DYNAMIC_BUILTINS:
            if name != "setattr":
                self.add(node, "MN003", f"{name}() runs or reaches code the checker cannot see")
            return UNKNOWN
        if name == "super":
            return SUPER
        if name == "type" and arg_types and _tensorish(arg_types[0]):
            return ("alias", "torch.Tensor")
        if (name in _TENSOR_DISPATCHING_BUILTINS and any(map(_tensorish, arg_types))) \
                or (name in _REDUCING_BUILTINS and TENSORS in arg_types):
            self.add(node, "MN005", f"{name}() on tensors dispatches torch ops")
            return TENSOR
        if name in _SCALAR_BUILTINS:
            return NON if name not in ("enumerate", "zip", "map", "filter", "iter", "next", "reversed") else UNKNOWN
        return NON  # exceptions (raise ValueError(...)) and other harmless builtins

    def call_method(self, node: ast.Call, receiver: object, attr: str, text: str, arg_types: list) -> object:
        config = self.mn.config
        allowed = ALLOWED_TENSOR_METHODS | config.allow_tensor_methods
        if _HOOK_METHODS.fullmatch(attr):
            self.add(node, "MN004", f"{text}.{attr}() installs a hook that runs outside forward")
            return NON
        if receiver == SUPER:
            self.add(node, "MN004", f"super().{attr}() runs the base class's torch path")
            return UNKNOWN
        if isinstance(receiver, tuple) and receiver[0] == "alias":
            return self.call_qualified(node, f"{receiver[1]}.{attr}")
        if isinstance(receiver, tuple) and receiver[0] in ("obj", "class"):
            cls_name = receiver[1]
            types = self.mn.class_attr_types(cls_name)
            member = types.get(attr)
            if member == MODULE:
                self.add(node, "MN004", f"calling the submodule {text}.{attr} runs torch ops; keep it for its "
                                        "parameters and pass them to a cuda_extension op")
                return TENSOR
            if isinstance(member, tuple) and member[0] == "alias":
                return self.call_qualified(node, member[1])
            cls = self.mn.classes.get(cls_name)
            method = next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and n.name == attr), None) if cls else None
            if method is not None:
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in method.decorator_list)
                return self.mn.analyze((cls_name, attr, tuple(map(str, arg_types))), method,
                                       None if static else cls_name, arg_types)
            self.add(node, "MN004", f"{text}.{attr}() is neither a method of {cls_name} nor a cuda_extension op")
            return UNKNOWN
        if receiver == MODULE:
            self.add(node, "MN004", f"{text}.{attr}() calls into an nn.Module: a torch op")
            return TENSOR
        if _tensorish(receiver):
            if attr in allowed:
                if attr in _TENSOR_CREATING_METHODS:
                    return TENSOR
                return SHAPE if attr in ("size", "stride") and not node.args else NON
            self.add(node, "MN004", f"tensor method {text}.{attr}() is a torch op; the forward path may use "
                                    "tensor properties (.shape, .size(), .stride(), ...) and creation only")
            return TENSOR
        if receiver in (NON, SHAPE, TENSORS):
            if attr in ("append", "extend", "insert") and any(_tensorish(t) or t == TENSORS for t in arg_types) \
                    and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                self.env[node.func.value.id] = TENSORS  # outs.append(y): outs now holds tensors
            return NON
        if receiver == UNKNOWN:
            if attr in allowed:
                return TENSOR if attr in _TENSOR_CREATING_METHODS else NON
            if attr in _CONTAINER_METHODS or attr in _FILE_READ_METHODS:
                return UNKNOWN
            self.add(node, "MN004", f"{text}.{attr}() looks like a tensor method, which is a torch op")
            return TENSOR
        return UNKNOWN


@functools.lru_cache(maxsize=None)
def _is_torch_function(name: str) -> bool:
    """`torch.relu` is a function; `torch.float32` and `torch.contiguous_format` are values."""
    import importlib

    parts = name.split(".")
    try:
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return parts[-1][:1].islower()
    return callable(obj) and not isinstance(obj, type)


def _as_load(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Name):
        return ast.Name(id=node.id, ctx=ast.Load(), lineno=node.lineno)
    return node


def _is_range(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
        ast.BitAnd: "&", ast.USub: "-", ast.UAdd: "+", ast.Invert: "~", ast.Not: "not"}


def _parse(path: Path) -> tuple[ast.Module | None, Violation | None]:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), None
    except FileNotFoundError:
        return None, Violation(path.name, 1, "MN001", f"{path.name} is missing")
    except SyntaxError as exc:
        return None, Violation(path.name, exc.lineno or 1, "MN001", f"{path.name} does not parse: {exc.msg}")
    except (OSError, ValueError) as exc:
        return None, Violation(path.name, 1, "MN001", f"{path.name} cannot be read: {exc}")


def _check_model_new(workdir: Path, config: Config) -> list[Violation]:
    tree, problem = _parse(workdir / "model_new.py")
    if tree is None:
        return [problem]
    model_tree, model_problem = _parse(workdir / "model.py")
    found = _ModelNewCheck(tree, model_tree, config).run()
    if model_problem is not None and model_tree is None:
        found.append(Violation("model.py", model_problem.line, "MN002",
                               f"{model_problem.message}: ModelNew.__init__ cannot be compared with Model's"))
    return found


def iter_rule_lines(violations: Iterable[Violation], rule: str, workdir: Path) -> Iterator[str]:
    """The `path:line: RULE-ID: what` lines of one rule (what a `pytest -m policy` item prints)."""
    for violation in violations:
        if violation.rule == rule:
            yield format_violation(violation, workdir)
