"""The `cuda_extension` functions that model_new.py calls exist in the built module (needs a build)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from pytest_cudaopt.policy.rules import BUILD_RULES, Violation

RULE = "EX001"
RULE_TEXT = BUILD_RULES[RULE]


def called_functions(model_new: Path) -> list[tuple[int, str]]:
    """(line, name) of every `cuda_extension.<name>` in model_new.py (import aliases followed)."""
    tree = ast.parse(model_new.read_text(encoding="utf-8"), str(model_new))
    aliases = {"cuda_extension"}
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name == "cuda_extension"}
        elif isinstance(node, ast.ImportFrom) and node.module == "cuda_extension":
            imported.update({a.asname or a.name: a.name for a in node.names})
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append((node.lineno, node.attr))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "cuda_extension":
            found += [(node.lineno, a.name) for a in node.names]
    return sorted(set(found))


def check_extension_names(workdir: Path, module: Any) -> list[Violation]:
    """EX001 for every function that model_new.py calls and the built `module` lacks."""
    from pytest_cudaopt.build import missing_function_message

    path = Path(workdir) / "model_new.py"
    if not path.is_file():
        return []
    try:
        calls = called_functions(path)
    except SyntaxError:
        return []  # MN rules report it
    return [Violation("model_new.py", line, RULE, missing_function_message(module, name))
            for line, name in calls if name not in vars(module)]
