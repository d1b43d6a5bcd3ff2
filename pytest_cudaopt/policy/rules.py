"""The rule table, one finding (`Violation`), the `[tool.cudaopt]` config (CF001) and `cudaopt check` output."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

LOCK_NAME = "cudaopt.lock"

# One line per rule: the README's table and the title of each `pytest -m policy` item.
RULES: dict[str, str] = {
    "MN001": "model_new.py parses and defines `class ModelNew(nn.Module)` with a `forward` (no `__call__` override)",
    "MN002": "`ModelNew.__init__` takes the same parameters (names, order, kinds, defaults) as `Model.__init__`",
    "MN003": "the forward path calls only `cuda_extension` ops, tensor creation and its own helpers "
             "(no other torch, torch.nn.functional or library function)",
    "MN004": "the forward path calls no tensor method other than properties and creation (`x.view`, "
             "`x.contiguous()`, `.T`), no nn.Module (`self.linear(x)`, `super().forward`), no hook",
    "MN005": "the forward path applies no Python operator to a tensor (`x @ w`, `x + 1`, `-x`, `x[0]`,"
             " `x > 0`, `x += y`): each dispatches a torch op",
    "MN006": "model_new.py imports only torch, cuda_extension and the standard library (not model.py, another workdir, "
             "importlib, ctypes, subprocess, torch.utils.cpp_extension) and reads no interpreter frames and walks no "
             "object graph (`sys._getframe`, `.f_back`, `.tb_frame`, `__subclasses__`, `__globals__`, `__code__`)",
    "MN007": "model_new.py has no `try`/`except` (or `contextlib.suppress`): the custom path fails "
             "loudly instead of falling back",
    "MN008": "model_new.py reads no files and no environment variables (`open`, `os.environ`, "
             "`os.getenv`, `Path.read_text`, `torch.load`, `np.load`)",
    "MN009": "model_new.py changes no torch global state (`torch.backends.*` flags, `torch.set_*`, "
             "seeds, monkeypatching torch, `register_module_*` hooks on every nn.Module)",
    "MN010": "model_new.py imports and `ModelNew(*get_init_inputs())` constructs on the CPU, with no GPU "
             "and no build (the constructor may store `cuda_extension` functions, not call them), and its "
             "state_dict has Model's keys and shapes",
    "KC001": "kernels/ C++ calls no torch/ATen operator: only `torch::empty*`, metadata, the current-"
             "stream getters (`x.sum()`, `at::matmul`, unqualified `matmul(x, y)` are violations)",
    "KC002": "kernels/ includes only CUDA runtime/math, C/C++ standard, torch binding, pybind11, "
             "cuBLAS/cuBLASLt, cuDNN and the workdir's own headers (followed recursively)",
    "KC003": "file roles: `.cu` files hold kernels and launchers (no torch or pybind11 headers, no "
             "REGISTER_BINDING); REGISTER_BINDING only in `*_binding.cpp`",
    "KC004": "no `__global__` function in a `.cpp` file (bindings and cuBLAS/cuDNN callers); kernels "
             "live in `.cu` files",
    "KC005": "a `.cpp` file that is not a `*_binding.cpp` calls cuBLAS or cuDNN",
    "KC006": "kernels/ runs no Python: no `pybind11::exec`/`eval`/`eval_file`/`globals`, no module import, no "
             "`.attr(...)` of a Python object, no CPython API (`PyRun_*`, `PyImport_*`, `PyObject_SetAttr*`)",
    "KC007": "kernels/ registers no operator kernels: no `TORCH_LIBRARY`, `TORCH_LIBRARY_IMPL`, "
             "`TORCH_LIBRARY_FRAGMENT`, `torch::Library`, `c10::RegisterOperators`, `c10::Dispatcher`",
    "KC008": "kernels/ reads no environment and no files and runs no program (`getenv`, `secure_getenv`, "
             "`environ`, `fopen`, `open`, `std::ifstream`, `popen`, `system`, `dlopen`, `exec*`, `fork`)",
    "KC009": "kernels/ starts no threads (`std::thread`, `std::async`, `pthread_create`, `#pragma omp`, "
             "host callbacks: `cudaLaunchHostFunc`, `cudaStreamAddCallback`)",
    "CV001": "when model.py uses a convolution (nn.Conv*/ConvTranspose*, F.conv*) and kernels/ has sources, they "
             "include cudnn.h and call cudnnConvolutionForward / cudnnConvolutionBackwardData",
    "PF001": "binding.cpp and binding_registry.h are the copies shipped in pytest_cudaopt or the "
             "published agent-workdir versions",
    "PF002": f"the workdir has a valid lock file `{LOCK_NAME}` (written by `cudaopt init` or `cudaopt adopt`)",
    "PF003": f"model.py, conftest.py, peers.py, utils/ and the cudaopt settings of pyproject.toml/pytest.ini "
             f"are identical to what `{LOCK_NAME}` recorded",
    "KD001": "kernels/ holds no intermediate versions (`*_v2*`, `*_old*`, `*_test*`, `*_backup*`, "
             "`*.bak`, `*.orig`, `*.rej`, `*.tmp`, `*~`)",
    "KD002": "every kernels/<op>_binding.cpp has its <op>.cu or <op>.cpp, and every <op>.cu / <op>.cpp"
             " its <op>_binding.cpp",
    "KD003": "every file in kernels/ is compiled: only .cu/.cpp sources and headers that a source "
             "includes (plus .gitkeep)",
    "CF001": "the `[tool.cudaopt]` table of the workdir's pyproject.toml is valid"}
RULE_IDS: tuple[str, ...] = tuple(RULES)
# The rules that run the workdir's code; every other rule only reads files, and never imports them.
IMPORTS_WORKDIR = frozenset({"MN010"})
# The rule that needs the built extension: in `cudaopt check` only once a build exists.
BUILD_RULES = {"EX001": "every cuda_extension function that model_new.py calls is defined by the built extension"}


def rule_count(built: bool = True) -> int:
    """How many rules a check runs: the static ones, and those of BUILD_RULES when `built`."""
    return len(RULES) + (len(BUILD_RULES) if built else 0)


@dataclass(frozen=True, order=True)
class Violation:
    """One finding: `path` is relative to the workdir (posix), `line` 1-based (1 for a whole file)."""

    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


CONFIG_KEYS = {
    "disable": "rule ids to skip, e.g. [\"KC005\"]",
    "allow-python-calls": "more functions the forward path may call (dotted, aliases resolved: "
                          "\"torch.nn.functional.pad\")",
    "allow-tensor-methods": "more tensor methods the forward path may call (\"view\")",
    "allow-imports": "more modules model_new.py may import (\"numpy\")",
    "allow-cpp-calls": "more torch::/at::/c10:: functions kernels/ may call (\"at::zeros\")",
    "allow-cpp-methods": "more tensor methods kernels/ may call (\"contiguous\")",
    "allow-includes": "more include prefixes kernels/ may use (\"cub/\", \"cutlass/\")"}


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


def load_toml(path: Path) -> dict | None:
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
        data = load_toml(path)
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
    return Config(**{key.replace("-", "_"): value if key == "allow-includes" else frozenset(value)
                     for key, value in values.items()},
                  problems=tuple(Violation("pyproject.toml", line, "CF001", p) for p in problems))


def format_violation(violation: Violation, workdir: Path) -> str:
    """`path:line: RULE-ID: what was found`, the path shown relative to the current folder."""
    full = Path(workdir).resolve() / violation.path
    try:
        shown = os.path.relpath(full)
    except ValueError:  # another drive on Windows
        shown = ".."
    return f"{full if shown.startswith('..') else shown}:{violation.line}: {violation.rule}: {violation.message}"


def render(violations: list[Violation], workdir: Path, as_json: bool = False, built: bool = True,
           unbuilt: str = "no build yet (`cudaopt build`)") -> str:
    """The output of `cudaopt check`: one line per violation and a summary, or JSON; `built`: the rules of
    BUILD_RULES were checked; `unbuilt`: why not."""
    workdir = Path(workdir).resolve()
    disabled = sorted(load_config(workdir).disable)
    if as_json:
        return json.dumps({
            "workdir": str(workdir), "passed": not violations, "rules": {**RULES, **BUILD_RULES} if built else RULES,
            "disabled": disabled,
            "violations": [{"rule": v.rule, "path": v.path, "line": v.line, "message": v.message} for v in violations],
        }, indent=2)
    lines = [format_violation(v, workdir) for v in violations]
    note = f"; disabled in pyproject.toml: {', '.join(disabled)}" if disabled else ""
    if not built:
        note += f"; {', '.join(BUILD_RULES)} not checked: {unbuilt}"
    if violations:
        rules = sorted({v.rule for v in violations})
        lines.append(f"cudaopt check: {len(violations)} violation(s) of {', '.join(rules)} in {workdir}{note}")
    else:
        lines.append(f"cudaopt check: {workdir} follows all {rule_count(built) - len(disabled)} rules{note}")
    return "\n".join(lines)


def iter_rule_lines(violations: Iterable[Violation], rule: str, workdir: Path) -> Iterator[str]:
    """The `path:line: RULE-ID: what` lines of one rule (what a `pytest -m policy` item prints)."""
    return (format_violation(v, workdir) for v in violations if v.rule == rule)
