"""C++ checks of kernels/: torch operators (KC001), includes (KC002), file roles (KC003-KC005), reaching Python, the dispatcher, the environment or threads (KC006-KC009, cpp_reach.py), cuDNN (CV001)."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pytest_cudaopt.policy.allowlists import (
    ALLOWED_CPP_CALLS, ALLOWED_CPP_METHODS, C_MATH_NAMES, CUBLAS_HEADERS, CUDA_HEADER_PREFIXES, CUDA_HEADERS,
    CUDNN_HEADER, FORBIDDEN_LIBRARIES, PYBIND11_PREFIX, STD_HEADERS, TORCH_BINDING_HEADERS, TORCH_HEADER_PREFIXES,
    TORCH_OP_NAMESPACES, TORCH_ROOTS)
from pytest_cudaopt.policy.cpp_lexer import Include, Token, is_call, lex_cpp, qualified_name
from pytest_cudaopt.policy.cpp_reach import reach_violations
from pytest_cudaopt.policy.files import HEADER_SUFFIXES, SOURCE_SUFFIXES, kernel_files
from pytest_cudaopt.policy.rules import Config, Violation


def _is_torch_header(name: str) -> bool:
    return name.startswith(TORCH_HEADER_PREFIXES)


def _is_binding_header(name: str) -> bool:
    return _is_torch_header(name) or name.startswith(PYBIND11_PREFIX) or Path(name).name == "binding_registry.h"


def _include_allowed(name: str, config: Config) -> tuple[bool, str]:
    """(allowed, why not) for a header that is not one of the workdir's own files."""
    if any(name.startswith(prefix) for prefix in config.allow_includes):
        return True, ""
    for prefix, library in FORBIDDEN_LIBRARIES:
        if name.lower().startswith(prefix):
            return False, f"{library} is not allowed"
    if (name in STD_HEADERS or name in CUDA_HEADERS or name.startswith(CUDA_HEADER_PREFIXES)
            or name in CUBLAS_HEADERS or CUDNN_HEADER.fullmatch(name) or name in TORCH_BINDING_HEADERS
            or name.startswith(PYBIND11_PREFIX) or name == "binding_registry.h"):
        return True, ""
    if _is_torch_header(name):
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


@dataclass
class _Unit:
    """One lexed file: a kernels/ source or header, or a local header one of them includes."""

    path: Path
    rel: str
    tokens: list[Token]
    includes: list[Include]
    local: dict[int, Path] = field(default_factory=dict)  # include line -> resolved local file
    chain: str = ""  # how a header was first reached from a kernels/ source


class KernelScan:
    """Lexes kernels/ and every local header it reaches; collects KC001-KC009 and facts for other rules."""

    def __init__(self, workdir: Path, config: Config):
        self.workdir, self.config = workdir, config
        self.kernels = workdir / "kernels"
        self.units: dict[Path, _Unit] = {}
        self.violations: list[Violation] = []
        self.reached: set[Path] = set()  # files included (transitively) from a kernels/ source
        files = [p.resolve() for p in kernel_files(workdir) if p.suffix in SOURCE_SUFFIXES + HEADER_SUFFIXES]
        for path in files:
            self._unit(path)
        self._follow([p for p in files if p.suffix in SOURCE_SUFFIXES])
        self._defined = self._definitions()
        for unit in self.units.values():
            self._check_unit(unit)

    def _rel(self, path: Path) -> str:
        try:
            return path.relative_to(self.workdir).as_posix()
        except ValueError:
            return str(path)

    def _unit(self, path: Path) -> _Unit:
        if path not in self.units:
            tokens, includes = lex_cpp(path.read_text(encoding="utf-8", errors="replace"))
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
        for base in ([self.workdir, self.kernels] if inc.angled else [origin.parent, self.workdir, self.kernels]):
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
            shown = f"#include {inc.spelled}"
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

    def _add(self, unit: _Unit, line: int, rule: str, message: str) -> None:
        if unit.chain:
            message += f" (reached through {unit.chain})"
        self.violations.append(Violation(unit.rel, line, rule, message))

    def _check_unit(self, unit: _Unit) -> None:
        suffix, stem = unit.path.suffix, unit.path.stem
        is_binding = suffix == ".cpp" and stem.endswith("_binding")
        for inc in unit.includes:
            target = unit.local.get(inc.line)
            shown = inc.spelled
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
        if unit.rel != "binding_registry.h":  # the fixed registry reads the module it defines (PF001 guards it)
            for line, rule, message in reach_violations(unit.tokens):
                self._add(unit, line, rule, message)
        if torch_reach is not None:
            for line, op, name in _tensor_operators(unit.tokens):
                self._add(unit, line, "KC001", f"operator `{op}` on the tensor {name} dispatches an ATen op")
        # A workdir without any .cu file is a CPU workdir: its .cpp files are the kernels.
        if suffix == ".cpp" and not is_binding and self.kernels in unit.path.parents \
                and any(self.kernels.rglob("*.cu")):
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
                name, end = qualified_name(toks, k + 3)
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
                if has_torch and text in methods and text not in allowed_methods and is_call(toks, k + 1):
                    self._add(unit, tok.line, "KC001", f"tensor method .{text}() is a torch operator "
                                                       "(allowed on tensors: metadata, data_ptr, options)")
                k += 1
                continue
            if prev == "::" and k >= 2 and toks[k - 2].kind == "id":
                k += 1  # the tail of a qualified name that was already read
                continue
            name, end = qualified_name(toks, k)
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
                  and not name.startswith("empty") and prev not in _NOT_CALLERS and is_call(toks, end)):
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
            if qualified_name(toks, k + 3)[0].rsplit("::", 1)[-1].startswith("empty"):
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


_CONV_NAME = re.compile(r"(Lazy)?Conv(Transpose)?[123]d|conv(_transpose)?[123]d")


def model_convolutions(path: Path) -> dict[str, int]:
    """The convolutions a model.py names: "forward" / "transposed" -> the first line (CV001)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    uses: dict[str, int] = {}
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name and _CONV_NAME.fullmatch(name):
            kind = "transposed" if "ranspose" in name else "forward"
            uses[kind] = min(uses.get(kind, node.lineno), node.lineno)
    return uses


def check_convolution(workdir: Path, scan: KernelScan) -> list[Violation]:
    """CV001: a convolution in model.py is done with cuDNN in kernels/."""
    uses = model_convolutions(workdir / "model.py")
    # An empty kernels/ (a workdir fresh from `cudaopt init`) has nothing to judge yet.
    if not uses or not any(p.suffix in SOURCE_SUFFIXES for p in kernel_files(workdir)):
        return []
    has_cudnn = any(CUDNN_HEADER.fullmatch(inc.name) for u in scan.units.values() for inc in u.includes)
    called = {t.text for u in scan.units.values() for k, t in enumerate(u.tokens)
              if t.kind == "id" and t.text.startswith("cudnn") and is_call(u.tokens, k + 1)}
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
