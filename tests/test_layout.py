"""The package's layout is its architecture: no import cycles (imports inside functions counted),
no private names reached across modules, no `_pytest` imports, the correctness verdict never
imports the speed verdict, and no module or function too long to hold in one's head."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_cudaopt"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "templates" in path.relative_to(PACKAGE).parts:
            continue
        parts = ["pytest_cudaopt", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import statement of a module,
    at any depth; relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, names, _ in _imports(name, path):
            # `from P import m` of a module m is an edge to P.m; of a name, to P (its __init__)
            targets = [f"{module}.{n}" if f"{module}.{n}" in MODULES else module for n in names] or [module]
            for target in targets:
                if target in MODULES and target != name:
                    graph[name].add(target)
    return graph


def test_the_package_has_no_import_cycle_even_through_imports_inside_functions():
    graph = _graph()
    # Every edge counts, a package's __init__ too (lazy imports in a module __getattr__ included):
    # a module that takes a name from its own package's __init__, which imports that module, is a
    # cycle.
    edges = graph
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    found = []
    for name, path in MODULES.items():
        for module, names, line in _imports(name, path):
            if module.startswith("pytest_cudaopt") and module != name:
                found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}.{n}" for n in names
                          if n.startswith("_") and not n.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_nothing_imports_pytests_private_modules():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}" for name, path in MODULES.items()
             for module, _, line in _imports(name, path) if module.split(".")[0] == "_pytest"]
    assert not found, "\n".join(found)


def test_the_correctness_verdict_never_imports_the_speed_verdict():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}" for name, path in MODULES.items()
             if name.startswith("pytest_cudaopt.correctness")
             for module, _, line in _imports(name, path) if module.startswith("pytest_cudaopt.perf")]
    assert not found, "\n".join(found)


JUDGING = ("pytest_cudaopt.correctness", "pytest_cudaopt.perf", "pytest_cudaopt.policy", "pytest_cudaopt.judge")
# What hasattr/getattr may look into in the judging packages: modules, functions, exceptions, syntax
# nodes, settings; never ModelNew, its worker, a contender's callable, a run or a clock (those are
# typed: worker.candidate.Candidate, perf.clocks.Clock).
ATTRIBUTE_PROBES = frozenset({
    "module", "func", "builtin", "owner", "obj", "torch", "torch._C", "torch.cuda", "torch.Tensor", "builtins",
    "ast", "exc", "node", "comparison", "settings", "self.stream", "_device_properties(self.device)",
    "torch.cuda.get_device_properties(self.device)"})
# The judging packages reach remote/ (the judging side of the wire) through the Candidate Protocol
# and the timing rule only; the rest of remote/ is the worker's life and the timed window.
REMOTE_IMPORTS = {"pytest_cudaopt.remote.candidate", "pytest_cudaopt.remote.timing"}


def _attribute_probes(path: Path) -> list[tuple[int, str]]:
    """(line, first argument) of every hasattr/getattr call in a module."""
    return [(node.lineno, ast.unparse(node.args[0])) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr") and node.args]


def test_the_verdicts_probe_no_candidate_object_with_hasattr_or_getattr():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: getattr/hasattr on {target}"
             for name, path in MODULES.items() if name.startswith(JUDGING)
             for line, target in _attribute_probes(path) if target not in ATTRIBUTE_PROBES]
    assert not found, "\n".join(found)


def test_the_attribute_probe_scan_finds_a_seam_on_a_candidate(tmp_path):
    seam = tmp_path / "seam.py"
    seam.write_text("def f(trial, module):\n    getattr(module, '__file__', None)\n"
                    "    return hasattr(trial.model_new, 'checked_call') or getattr(run, 'dropped', None)\n")
    assert [t for _, t in _attribute_probes(seam) if t not in ATTRIBUTE_PROBES] == ["trial.model_new", "run"]


def _remote_imports(name: str, path: Path) -> set[str]:
    found = set()
    for module, names, _ in _imports(name, path):
        targets = [f"{module}.{n}" for n in names] if module == "pytest_cudaopt.remote" else [module]
        found.update(t for t in targets if t == "pytest_cudaopt.remote" or t.startswith("pytest_cudaopt.remote."))
    return found


def test_the_judging_packages_reach_remote_only_through_the_candidate_protocol_and_the_timing_rule():
    found = sorted(f"{name} imports {module}" for name, path in MODULES.items()
                   if name.startswith((*JUDGING, "pytest_cudaopt.memsafety"))
                   for module in _remote_imports(name, path) if module not in REMOTE_IMPORTS)
    assert not found, "\n".join(found)


def test_at_most_six_modules_sit_loose_at_the_top_of_the_package():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 6, loose


def test_the_candidates_process_imports_only_the_standard_library_torch_wire_and_its_own_package():
    """candidate/ is what runs beside model_new.py: whatever it imports, the candidate can patch."""
    import sys

    allowed = {"torch", "pytest_cudaopt"}
    found = []
    for name, path in MODULES.items():
        if not (name == "pytest_cudaopt.candidate" or name.startswith("pytest_cudaopt.candidate.")
                or name == "pytest_cudaopt.wire"):
            continue
        for module, names, line in _imports(name, path):
            targets = [f"{module}.{n}" for n in names] if module == "pytest_cudaopt" else [module]
            for target in targets:
                top = target.split(".")[0]
                ours_ok = target == "pytest_cudaopt.wire" or target.startswith("pytest_cudaopt.candidate") \
                    or target == "pytest_cudaopt"
                if top == "pytest_cudaopt" and not ours_ok or top not in allowed and top not in sys.stdlib_module_names \
                        and top != "__future__":
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {target}")
    assert not found, "\n".join(found)


def test_how_it_works_names_every_module_and_folder_at_the_top_of_the_package_and_no_other():
    text = (PACKAGE.parent / "docs" / "how-it-works.md").read_text()
    table = text.split("## The package", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = {name for cell in first_cells for name in re.findall(r"`([a-z_]+(?:\.py|/))`", cell)}
    present = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"} | {
        f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert named == present, f"named but absent: {sorted(named - present)}; present but not named: {sorted(present - named)}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_stay_short(name):
    path = MODULES[name]
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.relative_to(PACKAGE.parent)}: " + ", ".join(long)


def test_setuptools_finds_every_subpackage():
    from setuptools import find_packages

    found = set(find_packages(str(PACKAGE.parent), include=["pytest_cudaopt*"], exclude=["pytest_cudaopt.templates*"]))
    wanted = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert wanted <= found, f"not found by setuptools: {sorted(wanted - found)}"


GPU_SKIP = re.compile(r'@pytest\.mark\.skipif\(not (torch\.cuda\.is_available\(\)|os\.path\.exists\("/dev/nvidiactl"\))')


def test_every_test_that_needs_a_gpu_is_marked_gpu_so_that_minus_m_gpu_selects_it():
    unmarked = []
    tests = PACKAGE.parent / "tests"
    for path in sorted([*tests.glob("test_*.py"), *tests.glob("exploits/*.py")]):
        lines = path.read_text().splitlines()
        if any(line.startswith("pytestmark") and "mark.gpu" in line for line in lines):
            continue
        for number, line in enumerate(lines):
            if GPU_SKIP.match(line.strip()) and not any("pytest.mark.gpu" in previous
                                                        for previous in lines[max(0, number - 3):number]):
                unmarked.append(f"{path.name}:{number + 1}")
    assert not unmarked, f"skipped without a GPU but not marked gpu: {unmarked}"


def test_the_docs_stay_short_enough_to_read():
    docs = sum(len(p.read_text().splitlines()) for p in (PACKAGE.parent / "docs").glob("*.md"))
    readme = len((PACKAGE.parent / "README.md").read_text().splitlines())
    assert docs <= 1200 and readme <= 120, f"docs/ {docs} lines (at most 1,200), README {readme} (at most 120)"
