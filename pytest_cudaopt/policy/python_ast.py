"""Name resolution shared by the model_new.py checks: import aliases, dotted names, the kinds of value inferred."""

from __future__ import annotations

import ast

# Types of the inference: EXT is what a cuda_extension op returns (a tensor or a tuple of them),
# TENSORS a Python container holding tensors.
TENSOR, EXT, TENSORS = "tensor", "extension result", "tensors"
NON, SHAPE, UNKNOWN, MODULE, SUPER = "non-tensor", "shape", "unknown", "module", "super"

# try/except nodes (`except*` is ast.TryStar from Python 3.11).
TRY_NODES = (ast.Try, getattr(ast, "TryStar", ast.Try))


def is_module_class(node: ast.ClassDef, aliases: dict[str, str]) -> bool:
    """The class subclasses torch.nn.Module directly."""
    return any((dotted(b, aliases) or "") in ("torch.nn.Module", "torch.nn.modules.module.Module")
               for b in node.bases)


def dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`F.relu` -> "torch.nn.functional.relu" when `F` is an import alias; None otherwise."""
    node, parts = attribute_chain(node)
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([aliases[node.id], *parts])
    return None


def attribute_chain(node: ast.AST) -> tuple[ast.AST, list[str]]:
    """`a.b.c` -> (the node of `a`, ["b", "c"])."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return node, parts[::-1]


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted path, from the imports (`F` -> "torch.nn.functional") and module-level aliases."""
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
            target = dotted(node.value, aliases)
            if target is not None:
                aliases[node.targets[0].id] = target
    return aliases


def const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
