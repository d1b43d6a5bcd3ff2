"""`cudaopt init`: a new workdir around a user's model.py; its ModelNew is Model's class but for forward's body."""

from __future__ import annotations

import ast
import builtins
import re
import shutil
import sys
from pathlib import Path

from pytest_cudaopt import policy
from pytest_cudaopt.commands import starter

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


# What a workdir's runs leave behind. Not locked: editing it moves no verdict.
GITIGNORE = """\
build/
.benchmarks/
.hypothesis/
__pycache__/
.pytest_cache/
"""


class ScaffoldError(Exception):
    """`cudaopt init` cannot create the workdir; the message says why."""


def init_workdir(dest: Path, model_path: Path, notes: list[str] | None = None, device: str = "cuda") -> Path:
    """Create the workdir `dest` around `model_path` (model.py a byte copy, kernels/ a starting kernel for
    `device`); its resolved path. Warnings (names model.py reads but never defines) go to `notes`."""
    if device not in starter.DEVICES:
        raise ScaffoldError(f"unknown device {device!r}: expected one of {', '.join(starter.DEVICES)}")
    dest, model_path = Path(dest).resolve(), Path(model_path).resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ScaffoldError(f"{dest} already exists and is not an empty folder; cudaopt init never "
                            "overwrites a workdir")
    if not model_path.is_file():
        what = "is a folder, not a model.py file" if model_path.is_dir() else "does not exist"
        raise ScaffoldError(f"model file {model_path} {what}")
    model_new = render_model_new(model_path.read_text(encoding="utf-8"), model_path, notes)
    third_party = third_party_imports(model_new)
    dest.mkdir(parents=True, exist_ok=True)
    for name in policy.PROTECTED_TEMPLATES:
        shutil.copyfile(policy.TEMPLATES / name, dest / name)
    shutil.copytree(policy.TEMPLATES / "utils", dest / "utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copyfile(model_path, dest / "model.py")
    (dest / "model_new.py").write_text(model_new, encoding="utf-8")
    starter.write(dest, device, convolution=bool(policy.model_convolutions(model_path)))
    pyproject = PYPROJECT
    if device != "cuda":
        # Remembered: pytest, `cudaopt check`, `judge` and `gate` read it (a flag overrides it).
        pyproject = pyproject.replace('addopts = "-ra"\n', f'addopts = "-ra"\ncudaopt_device = "{device}"\n')
    if third_party:
        # model_new.py carries the imports the constructor needs: allowed, so the workdir passes `cudaopt check`.
        listed = ", ".join(f'"{name}"' for name in third_party)
        pyproject = pyproject.replace('# allow-imports = ["numpy"]\n',
                                      f"# model.py's constructor needs these (copied into model_new.py)\n"
                                      f"allow-imports = [{listed}]\n")
    (dest / "pyproject.toml").write_text(pyproject, encoding="utf-8")
    (dest / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (dest / ".gitignore").write_text(GITIGNORE, encoding="utf-8")
    policy.write_lock(dest)
    return dest


def _existing_workdir(workdir: Path) -> Path:
    workdir = Path(workdir).resolve()
    if not (workdir / "model.py").is_file():
        raise ScaffoldError(f"{workdir} is not a workdir: it has no model.py")
    return workdir


def lock_workdir(workdir: Path) -> Path:
    """(Re)write the lock file of an existing workdir; returns its path."""
    return policy.write_lock(_existing_workdir(workdir))


# Scopes in which a zero-argument super() would not see the method's class and first argument.
_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
                  ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a module-level statement defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store)}


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


def _first_line(node: ast.stmt) -> int:
    """The statement's first line, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _segment(lines: list[str], node: ast.stmt) -> str:
    return "".join(lines[_first_line(node) - 1:node.end_lineno])


def third_party_imports(source: str) -> list[str]:
    """Top-level modules `source` imports that are neither torch nor the standard library."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return sorted(roots - (set(sys.stdlib_module_names) | {"torch", "cuda_extension", "__future__"}))


def _parse_model(source: str, model_path: Path) -> tuple[ast.Module, ast.ClassDef, list[ast.FunctionDef]]:
    """model.py's tree, its class Model and Model's forward definitions (the last one is the method)."""
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
    forwards = [n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    if not forwards:
        raise ScaffoldError(f"{model_path}: class Model has no forward method")
    return tree, model, forwards


def _model_patches(tree: ast.Module) -> list[ast.stmt]:
    """Module-level assignments to Model's attributes (`Model.expansion = 4`), but for a replaced forward."""
    return [node for node in tree.body if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and all(
            isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "Model"
            and t.attr not in ("forward", "__call__") for t in getattr(node, "targets", None) or [node.target])]


def _class_needs(model: ast.ClassDef, forwards: list[ast.FunctionDef]) -> set[str]:
    """Module-level names that ModelNew's class reads (of forward only the signature)."""
    names = set().union(*(_free_names(n) for n in (*model.bases, *model.keywords, *model.decorator_list)))
    in_class = set().union(*(_bound_names(s) for s in model.body))
    for stmt in model.body:
        if stmt in forwards:
            names |= _free_names(stmt.args) | (_free_names(stmt.returns) if stmt.returns else set())
        elif isinstance(stmt, (*_FUNCTIONS, ast.ClassDef)):
            names |= _free_names(stmt)  # a method does not see the class body's names
        else:
            names |= _free_names(stmt) - in_class  # `b = a * 2` after `a = 1` in the class body
    return names


def _module_statements(tree: ast.Module, skip: list[ast.stmt], todo: set[str]) -> tuple[list[ast.stmt], set[str]]:
    """The module-level statements that define the names in `todo`, transitively, and the names nothing defines."""
    definitions: dict[str, ast.stmt] = {}
    for node in tree.body:
        if node in skip or (isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs")):
            continue
        for name in _bound_names(node):
            definitions.setdefault(name, node)
    needed: list[ast.stmt] = []
    unresolved: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in definitions:
            if not hasattr(builtins, name) and name not in ("Model", "ModelNew"):
                unresolved.add(name)
            continue
        node = definitions[name]
        if node not in needed:
            needed.append(node)
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                todo |= _free_names(node)
    # A star import may define anything the class reads, and a __future__ import changes how the file compiles.
    kept = [n for n in tree.body if isinstance(n, ast.ImportFrom)
            and (n.module == "__future__" or any(a.name == "*" for a in n.names))]
    needed += [n for n in kept if n not in needed]
    return sorted(needed, key=lambda n: n.lineno), unresolved


def _direct_super_calls(model: ast.ClassDef) -> list[ast.Call]:
    """`super(Model, self)` calls in the bodies of Model's own methods, not in nested scopes (_NESTED_SCOPES)."""
    found = []
    for method in (n for n in model.body if isinstance(n, _FUNCTIONS)):
        params = [*method.args.posonlyargs, *method.args.args]
        todo: list[ast.AST] = list(method.body)
        while todo:
            node = todo.pop()
            if isinstance(node, _NESTED_SCOPES):
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super" \
                    and len(node.args) == 2 and not node.keywords and params \
                    and all(isinstance(a, ast.Name) for a in node.args) \
                    and [a.id for a in node.args] == ["Model", params[0].arg]:
                found.append(node)
            todo.extend(ast.iter_child_nodes(node))
    return found


def _renamed_lines(source: str, tree: ast.Module, model: ast.ClassDef) -> list[str]:
    """`source`'s lines for model_new.py: `super(Model, self)` in Model's methods becomes `super()`, every other
    read of the name Model becomes ModelNew. The line numbers stay those of the AST."""
    supers = _direct_super_calls(model)
    inside = {id(call.args[0]) for call in supers}
    edits: list[tuple[ast.expr, str]] = [(call, "super()") for call in supers]
    edits += [(n, "ModelNew") for n in ast.walk(tree)
              if isinstance(n, ast.Name) and n.id == "Model" and id(n) not in inside]
    lines = source.splitlines(keepends=True)
    for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        # AST columns count UTF-8 bytes.
        start = len(first.encode()[:node.col_offset].decode())
        end = len(last.encode()[:node.end_col_offset].decode())
        # A call over several lines is joined on its first; blank lines keep the line count.
        lines[node.lineno - 1:node.end_lineno] = [first[:start] + text + last[end:],
                                                  *["\n"] * (node.end_lineno - node.lineno)]
    return lines


def _model_new_class(lines: list[str], source: str, model: ast.ClassDef, forwards: list[ast.FunctionDef]) -> str:
    """class ModelNew: Model's decorators, bases and body as written, forward's body replaced by the stub."""
    decorators = "".join(lines[_first_line(model) - 1:model.lineno - 1])
    bases = ", ".join(ast.get_source_segment(source, b) for b in (*model.bases, *model.keywords)) or "nn.Module"
    body, at = [], _first_line(model.body[0])
    for forward in forwards:
        body += lines[at - 1:_first_line(forward) - 1]
        at = forward.end_lineno + 1
    last = forwards[-1]
    indent = re.match(r"[ \t]*", lines[last.lineno - 1]).group()
    # `def forward(<Model.forward's parameters>)` raising NOT_IMPLEMENTED
    returns = f" -> {ast.unparse(last.returns)}" if last.returns is not None else ""
    inner = indent * 2 if indent else "    "
    body += [f"{indent}def forward({ast.unparse(last.args)}){returns}:\n"
             f"{inner}raise NotImplementedError(\n{inner}    \"{NOT_IMPLEMENTED}\"\n{inner})\n",
             *lines[at - 1:model.end_lineno]]
    text = "".join(body)
    return f"{decorators}class ModelNew({bases}):\n{text}" + ("" if text.endswith("\n") else "\n")


def render_model_new(source: str, model_path: Path, notes: list[str] | None = None) -> str:
    """model_new.py for the model in `source`: ModelNew is Model's class (so the constructor runs and the state
    dict matches) with what it needs from model.py copied along; forward keeps its parameters and raises."""
    tree, model, forwards = _parse_model(source, model_path)
    patches = _model_patches(tree)
    needs = _class_needs(model, forwards).union(*(_free_names(p) for p in patches))
    needed, unresolved = _module_statements(tree, [model, *patches], needs)
    lines = _renamed_lines(source, tree, model)
    imports = [n for n in needed if isinstance(n, (ast.Import, ast.ImportFrom))]
    others = [n for n in needed if n not in imports]
    bound = set().union(*(_bound_names(n) for n in imports))
    # A __future__ import must come first.
    imports.sort(key=lambda n: not (isinstance(n, ast.ImportFrom) and n.module == "__future__"))
    futures = [_segment(lines, n) for n in imports if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    import_lines = [_segment(lines, n) for n in imports[len(futures):]]
    if "torch" not in bound:
        import_lines.insert(0, "import torch\n")
    if "nn" not in bound:
        import_lines.append("import torch.nn as nn\n")
    body = [f'"""ModelNew for {model_path.name}: Model\'s constructor, methods and state dict; forward runs '
            'the kernels of kernels/ through cuda_extension."""\n', "\n", *futures, *import_lines,
            "\n", "import cuda_extension  # noqa: F401  (built from kernels/)\n"]
    for node in others:
        body += ["\n\n", _segment(lines, node)]
    body += ["\n\n", _model_new_class(lines, source, model, forwards)]
    if patches:
        body += ["\n\n", *(_segment(lines, p) for p in patches)]
    text = "".join(body)
    try:
        ast.parse(text)
    except SyntaxError as exc:  # e.g. a class whose source cannot be moved as is
        raise ScaffoldError(f"could not generate model_new.py from {model_path}: line {exc.lineno}: "
                            f"{exc.msg}") from None
    if unresolved and not any(any(a.name == "*" for a in n.names) for n in imports) and notes is not None:
        # Only a warning: the name may sit in a branch that never runs, and the verdict imports model.py anyway.
        notes.append(f"{model_path.name}: Model's constructor or methods may use {', '.join(sorted(unresolved))} "
                     "(directly or through what they call), which model.py does not define at module level; "
                     "model_new.py fails the same way if that code runs")
    return text


def find_registrations(workdir: Path) -> list[tuple[str, int, str, str]]:
    """(file, line, name, form) of every REGISTER_BINDING under kernels/: "contract" for `REGISTER_BINDING(name,
    register_fn)` where the file defines `register_fn(pybind11::module&)`, else "short"."""
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
    """Record the lock of a workdir that `cudaopt init` did not make, leaving its files alone: the lock's path
    and a summary (where each fixed file comes from, the bindings found and their form)."""
    from pytest_cudaopt.policy.files import UPSTREAM_SHA256, fixed_file_origin

    workdir = _existing_workdir(workdir)
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
