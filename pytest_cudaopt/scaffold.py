"""`cudaopt init`: a new workdir around a user's model.py, with a ModelNew that mirrors Model's constructor."""

from __future__ import annotations

import ast
import builtins
import re
import shutil
import sys
import textwrap
from pathlib import Path

from pytest_cudaopt import policy

NOT_IMPLEMENTED = ("ModelNew.forward is not implemented yet: write kernels in kernels/ and call them "
                   "through cuda_extension")

PYPROJECT = '''\
# A cudaopt workdir: `pytest` here runs the verdicts of model_new.py
# (pytest -m correctness | -m perf | -m policy), `cudaopt check` the rules.
[tool.pytest.ini_options]
testpaths = ["model_new.py"]
addopts = "-ra"

# The workdir rules are strict by default; a team with other rules relaxes them here
# (see the README of pytest-cudaopt for the rule ids).
[tool.cudaopt]
# disable = ["KC005"]
# allow-python-calls = ["torch.nn.functional.pad"]
# allow-tensor-methods = ["view"]
# allow-imports = ["numpy"]
# allow-cpp-calls = ["at::zeros"]
# allow-cpp-methods = ["contiguous"]
# allow-includes = ["cub/"]
'''

CONFTEST = '''\
# Load the cudaopt plugin when pytest_cudaopt is importable but not pip-installed. When it is
# installed, its pytest11 entry point has loaded the plugin already.
from pytest_cudaopt.launch import conftest_plugins

pytest_plugins = conftest_plugins()
'''


class ScaffoldError(Exception):
    """`cudaopt init` cannot create the workdir; the message says why."""


def init_workdir(dest: Path, model_path: Path, notes: list[str] | None = None) -> Path:
    """Create the workdir `dest` around `model_path` and return its resolved path.

    Writes the fixed binding files, utils/, model.py (a byte copy), model_new.py, an empty
    kernels/, pyproject.toml, conftest.py and the lock file. Refuses an existing non-empty
    `dest`; nothing is written when the model cannot be read. Warnings (names model.py
    reads but never defines) are appended to `notes`."""
    dest, model_path = Path(dest).resolve(), Path(model_path).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ScaffoldError(f"{dest} already exists and is not an empty folder; cudaopt init never "
                            "overwrites a workdir")
    if not model_path.is_file():
        what = "is a folder, not a model.py file" if model_path.is_dir() else "does not exist"
        raise ScaffoldError(f"model file {model_path} {what}")
    source = model_path.read_text(encoding="utf-8")
    model_new = render_model_new(source, model_path, notes)
    third_party = third_party_imports(model_new)
    dest.mkdir(parents=True, exist_ok=True)
    for name in policy.PROTECTED_TEMPLATES:
        shutil.copyfile(policy.TEMPLATES / name, dest / name)
    shutil.copytree(policy.TEMPLATES / "utils", dest / "utils",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(model_path, dest / "model.py")
    (dest / "model_new.py").write_text(model_new, encoding="utf-8")
    (dest / "kernels").mkdir()
    (dest / "kernels" / ".gitkeep").write_text("", encoding="utf-8")
    pyproject = PYPROJECT
    if third_party:
        # model_new.py carries model.py's imports that the constructor needs; allow them so
        # that the new workdir passes its own `cudaopt check`.
        listed = ", ".join(f'"{name}"' for name in third_party)
        pyproject = pyproject.replace('# allow-imports = ["numpy"]\n',
                                      f"# model.py's constructor needs these (copied into model_new.py)\n"
                                      f"allow-imports = [{listed}]\n")
    (dest / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    (dest / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    policy.write_lock(dest)
    return dest


def lock_workdir(workdir: Path) -> Path:
    """(Re)write the lock file of an existing workdir; returns its path."""
    workdir = Path(workdir).resolve()
    if not (workdir / "model.py").is_file():
        raise ScaffoldError(f"{workdir} is not a workdir: it has no model.py")
    return policy.write_lock(workdir)


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a module-level statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
    return names


def _free_names(node: ast.AST) -> set[str]:
    """Names `node` reads but does not bind itself (parameters, assignments, nested definitions)."""
    loads, local = set(), set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            (loads if isinstance(child.ctx, ast.Load) else local).add(child.id)
        elif isinstance(child, ast.arg):
            local.add(child.arg)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child is not node:
            local.add(child.name)
    return loads - local


def _segment(lines: list[str], node: ast.stmt) -> str:
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "".join(lines[start - 1:node.end_lineno])


def third_party_imports(source: str) -> list[str]:
    """Top-level modules `source` imports that are neither torch nor the standard library."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    ignored = set(sys.stdlib_module_names) | {"torch", "cuda_extension", "__future__"}
    return sorted(roots - ignored)


def render_model_new(source: str, model_path: Path, notes: list[str] | None = None) -> str:
    """model_new.py for the model in `source`: ModelNew.__init__ is Model.__init__'s source (so the
    constructor and the state dict match), with what it needs from model.py copied along
    (helper classes, functions, constants, imports); forward raises NotImplementedError."""
    try:
        tree = ast.parse(source, filename=str(model_path))
    except SyntaxError as exc:
        raise ScaffoldError(f"{model_path}:{exc.lineno}: does not parse: {exc.msg}") from None
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        raise ScaffoldError(f"{model_path} defines no class Model (KernelBench format: class Model(nn.Module), "
                            "get_inputs(), get_init_inputs())")
    missing = [f for f in ("get_inputs", "get_init_inputs")
               if not any(isinstance(n, ast.FunctionDef) and n.name == f for n in tree.body)]
    if missing:
        raise ScaffoldError(f"{model_path} defines no {' and no '.join(missing)}() (KernelBench format)")
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods:
        raise ScaffoldError(f"{model_path}: class Model has no forward method")
    init, forward = methods.get("__init__"), methods["forward"]
    lines = source.splitlines(keepends=True)

    # Module-level statements that the constructor (and the class bases) need, transitively.
    definitions: dict[str, ast.stmt] = {}
    for node in tree.body:
        if node is model or (isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs")):
            continue
        for name in _bound_names(node):
            definitions.setdefault(name, node)
    needed: list[ast.stmt] = []
    todo = _free_names(init) if init else set()
    for base in model.bases:
        todo |= _free_names(base)
    seen: set[str] = set()
    unresolved: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in definitions:
            if not hasattr(builtins, name) and name != "Model":
                unresolved.add(name)
            continue
        if name in seen:
            continue
        seen.add(name)
        node = definitions[name]
        if node not in needed:
            needed.append(node)
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                todo |= _free_names(node)
    # A star import may define anything the constructor reads: keep it.
    stars = [n for n in tree.body if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    needed += [n for n in stars if n not in needed]
    needed.sort(key=lambda n: n.lineno)
    imports = [n for n in needed if isinstance(n, (ast.Import, ast.ImportFrom))]
    others = [n for n in needed if n not in imports]
    bound = set().union(*(_bound_names(n) for n in imports)) if imports else set()

    header = [f'"""ModelNew for {model_path.name}: Model\'s constructor and state dict; forward runs the '
              'kernels of kernels/ through cuda_extension."""\n', "\n"]
    import_lines = [_segment(lines, n) for n in imports]
    if "torch" not in bound:
        import_lines.insert(0, "import torch\n")
    if "nn" not in bound:
        import_lines.append("import torch.nn as nn\n")
    body = header + import_lines + ["\n", "import cuda_extension  # noqa: F401  (built from kernels/)\n"]
    for node in others:
        body += ["\n\n", _segment(lines, node)]
    bases = ", ".join(ast.get_source_segment(source, b) for b in model.bases) or "nn.Module"
    body += ["\n\n", f"class ModelNew({bases}):\n"]
    if init is not None:
        text = re.sub(r"super\(\s*Model\s*,\s*self\s*\)", "super()", textwrap.dedent(_segment(lines, init)))
        body += [textwrap.indent(text, "    "), "\n"]
    returns = f" -> {ast.unparse(forward.returns)}" if forward.returns is not None else ""
    body += [f"    def forward({ast.unparse(forward.args)}){returns}:\n",
             f'        raise NotImplementedError(\n            "{NOT_IMPLEMENTED}"\n        )\n']
    text = "".join(body)
    try:
        ast.parse(text)
    except SyntaxError as exc:  # e.g. a constructor whose source cannot be moved as is
        raise ScaffoldError(f"could not generate model_new.py from {model_path}: line {exc.lineno}: "
                            f"{exc.msg}") from None
    if unresolved and not stars and notes is not None:
        # Only a warning: the name may sit in a branch that never runs (Python fails only
        # when the line is executed), and the verdict imports model.py for real anyway.
        notes.append(f"{model_path.name}: Model.__init__ may use {', '.join(sorted(unresolved))} (directly or "
                     "through what it calls), which model.py does not define at module level; "
                     "model_new.py fails the same way if that code runs")
    return text



# --------------------------------------------------------------------------- cudaopt adopt

def find_registrations(workdir: Path) -> list[tuple[str, int, str, str]]:
    """(file, line, name, form) of every REGISTER_BINDING under kernels/: form "contract" for
    `REGISTER_BINDING(name, register_fn)` where the file defines `register_fn(pybind11::module&)`,
    "short" for `REGISTER_BINDING(py_name, cpp_fn, ...)`."""
    found = []
    kernels = Path(workdir) / "kernels"
    for path in sorted(kernels.rglob("*.c*")) if kernels.is_dir() else []:
        if path.suffix not in (".cpp", ".cu", ".cc") or not path.is_file():
            continue
        tokens, _ = policy.lex_cpp(path.read_text(encoding="utf-8", errors="replace"))
        texts = [t.text for t in tokens]
        for k, tok in enumerate(tokens):
            if tok.text != "REGISTER_BINDING" or texts[k + 1:k + 2] != ["("]:
                continue
            depth, args, j = 0, [[]], k + 2
            while j < len(tokens) and not (depth == 0 and texts[j] == ")"):
                depth += (texts[j] in ("(", "[", "{")) - (texts[j] in (")", "]", "}"))
                if depth == 0 and texts[j] == ",":
                    args.append([])
                else:
                    args[-1].append(texts[j])
                j += 1
            name = "".join(args[0])
            fn = "".join(args[1]) if len(args) > 1 else ""
            takes_module = any(texts[i] == fn and texts[i + 1:i + 2] == ["("] and "module" in texts[i + 2:i + 6]
                               for i in range(len(texts) - 2))
            form = "contract" if len(args) == 2 and takes_module else "short"
            found.append((path.relative_to(workdir).as_posix(), tok.line, name, form))
    return found


def adopt_workdir(workdir: Path) -> tuple[Path, str]:
    """Record the lock of a workdir that `cudaopt init` did not make, leaving its files alone.
    Returns the lock's path and a summary: where each fixed file comes from (shipped,
    upstream agent-workdir, modified, missing) and the bindings found, with their form."""
    from pytest_cudaopt.policy.files import UPSTREAM_SHA256, fixed_file_origin

    workdir = Path(workdir).resolve()
    if not (workdir / "model.py").is_file():
        raise ScaffoldError(f"{workdir} is not a workdir: it has no model.py")
    lock = policy.write_lock(workdir)
    lines = [f"adopted {workdir}: recorded model.py and utils/ in {lock.name}", "fixed files:"]
    fixed = [*policy.PROTECTED_TEMPLATES,
             *sorted(n for n in UPSTREAM_SHA256 if n.startswith("utils/") and (workdir / n).is_file())]
    for name in fixed:
        origin = fixed_file_origin(workdir, name)
        if name.startswith("utils/") and origin == "modified":
            origin = "own version (recorded in the lock)"
        lines.append(f"  {name}: {origin}")
    regs = find_registrations(workdir)
    lines.append(f"bindings: {len(regs)}" + ("" if regs else " (no REGISTER_BINDING under kernels/)"))
    for rel, line, name, form in regs:
        how = ("REGISTER_BINDING(name, register_fn), register_fn calls m.def" if form == "contract"
               else "REGISTER_BINDING(py_name, cpp_fn, ...), short form")
        lines.append(f"  {rel}:{line}: {name}: {form} form: {how}")
    if any(form == "short" for *_, form in regs) and "upstream" in {
            fixed_file_origin(workdir, n) for n in policy.PROTECTED_TEMPLATES}:
        lines.append("  note: the agent-workdir binding_registry.h knows only the contract form; "
                     "the short form needs the shipped one")
    return lock, "\n".join(lines)
