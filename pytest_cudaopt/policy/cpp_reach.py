"""C++ in kernels/ reaching past its kernels: running Python (KC006), registering operator kernels (KC007), reading the environment or files (KC008), starting threads (KC009)."""

from __future__ import annotations

import re
from typing import Iterator

from pytest_cudaopt.policy.cpp_lexer import Token, is_call, qualified_name

# pybind11 functions that run Python or reach Python objects other than the module being defined.
PYBIND11_REACH = frozenset({"exec", "eval", "eval_file", "globals", "import", "setattr", "delattr", "getattr",
                            "hasattr", "builtins"})
# Unqualified (after `using namespace pybind11;`): only the names no C or C++ library shares.
PYTHON_RUNNERS = frozenset({"exec", "eval", "eval_file"})
# The CPython API: PyRun_SimpleString, PyImport_ImportModule, PyObject_SetAttrString, Py_CompileString...
CPYTHON_CALL = re.compile(r"_?Py[A-Za-z]*_\w+")
REGISTRATION_MACRO = re.compile(r"TORCH_LIBRARY(_IMPL|_FRAGMENT)?(_EXPAND)?")
REGISTRATION_TYPES = frozenset({"RegisterOperators", "Library", "Dispatcher", "CppFunction"})
ENVIRONMENT_CALLS = frozenset({
    "getenv", "secure_getenv", "_dupenv_s", "setenv", "putenv", "unsetenv", "fopen", "fopen64", "freopen",
    "fdopen", "open", "open64", "openat", "creat", "opendir", "popen", "system", "dlopen", "dlsym", "dlmopen",
    "execl", "execlp", "execle", "execv", "execvp", "execvpe", "execve", "fork", "vfork", "posix_spawn",
    "posix_spawnp", "readlink", "access"})
ENVIRONMENT_NAMES = frozenset({"environ", "__environ", "_environ", "ifstream", "ofstream", "fstream", "filebuf",
                               "basic_ifstream", "basic_ofstream", "basic_fstream", "filesystem"})
THREAD_TYPES = frozenset({"thread", "jthread"})
THREAD_CALLS = frozenset({"async", "pthread_create", "thrd_create", "cudaLaunchHostFunc", "cudaStreamAddCallback",
                          "omp_set_num_threads"})
_MEMBER = frozenset({".", "->"})
# Before a name, these do not make it a declaration (`return open(...)` calls open).
_NOT_TYPES = frozenset({"return", "case", "else", "do", "throw", "new", "delete", "sizeof", "co_return", "co_yield"})


def _aliases(toks: list[Token]) -> dict[str, str]:
    """`namespace py = pybind11;` -> {"py": "pybind11"}."""
    found = {}
    for k in range(len(toks) - 3):
        if toks[k].text == "namespace" and toks[k + 2].text == "=" and toks[k + 1].kind == "id":
            found[toks[k + 1].text] = qualified_name(toks, k + 3)[0]
    return found


def _resolve(name: str, aliases: dict[str, str]) -> list[str]:
    head, _, rest = name.lstrip(":").partition("::")
    if head in aliases:
        head = aliases[head]
    return [p for p in f"{head}::{rest}".split("::") if p] if rest else [head]


def _python(parts: list[str], call: bool, prev: str) -> str:
    """Why a name runs Python (KC006), or ""."""
    name = "::".join(parts)
    if parts[0] == "pybind11" and parts[-1] in PYBIND11_REACH:
        return f"{name} runs Python or reaches a Python object from C++"
    if len(parts) == 1 and call and prev not in _MEMBER:
        if name in PYTHON_RUNNERS:
            return f"{name}(...) runs Python from C++ (pybind11's {name})"
        if CPYTHON_CALL.fullmatch(name):
            return f"{name}(...) calls the CPython API"
    if len(parts) == 1 and call and prev in _MEMBER and name == "attr":
        return ".attr(...) reaches an attribute of a Python object (torch's, through an imported module)"
    return ""


def _registration(parts: list[str]) -> str:
    """Why a name registers operator kernels with the dispatcher (KC007), or ""."""
    name = "::".join(parts)
    if (len(parts) == 1 and REGISTRATION_MACRO.fullmatch(name)) or parts[-1] == "RegisterOperators" \
            or (len(parts) > 1 and parts[0] in ("torch", "c10", "at") and REGISTRATION_TYPES & set(parts[1:])):
        return f"{name} registers operator kernels with the dispatcher"
    return ""


def _environment(parts: list[str], call: bool, prev: str) -> str:
    """Why a name reads the environment or files, or runs a program (KC008), or ""."""
    last = parts[-1]
    if prev in _MEMBER:
        return ""
    if call and last in ENVIRONMENT_CALLS and (len(parts) == 1 or parts[0] == "std"):
        return f"{'::'.join(parts)}(...) reads the environment or files, or runs a program"
    if last in ENVIRONMENT_NAMES or (len(parts) > 1 and "filesystem" in parts):
        return f"{'::'.join(parts)} reads the environment or files"
    return ""


def _thread(toks: list[Token], parts: list[str], end: int, call: bool, prev: str) -> str:
    """Why a name starts a thread (KC009), or ""."""
    last = parts[-1]
    following = toks[end] if end < len(toks) else None
    if prev in _MEMBER:
        return ""
    if last in THREAD_TYPES and (parts[0] == "std" or (len(parts) == 1 and following is not None
                                                       and (following.kind == "id" or following.text == "("))):
        return f"{'::'.join(parts)} starts a thread"
    if call and last in THREAD_CALLS and (len(parts) == 1 or parts[0] == "std"):
        return f"{'::'.join(parts)}(...) runs code on another thread"
    if last == "omp" and prev == "pragma":
        return "#pragma omp starts a team of threads"
    return ""


def reach_violations(toks: list[Token]) -> Iterator[tuple[int, str, str]]:
    """(line, rule, message) for every KC006-KC009 finding in one file's tokens."""
    aliases = _aliases(toks)
    k, n = 0, len(toks)
    while k < n:
        tok = toks[k]
        prev = toks[k - 1].text if k else ""
        if tok.kind != "id" or (prev == "::" and k >= 2 and toks[k - 2].kind == "id"):
            k += 1
            continue
        name, end = qualified_name(toks, k)
        if prev == "namespace":
            k = end
            continue
        parts = _resolve(name, aliases)
        declared = k > 0 and (toks[k - 1].kind == "id" and prev not in _NOT_TYPES or prev in ("*", "&"))
        call = is_call(toks, end) and not declared  # `void open(...)` declares a function of the workdir
        for rule, why in (("KC006", _python(parts, call, prev)), ("KC007", _registration(parts)),
                          ("KC008", _environment(parts, call, prev)), ("KC009", _thread(toks, parts, end, call, prev))):
            if why:
                yield tok.line, rule, why
        k = max(end, k + 1)
