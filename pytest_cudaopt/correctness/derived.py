"""Constants that model.py computes from its other constants (`bias_shape = (out_features,)`): found with ast, recomputed from the drawn values."""

from __future__ import annotations

import ast
import collections
import operator
import os
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

# What a derived constant's expression may use: numbers, names of earlier constants, tuples and
# lists (with *unpacking), a constant index, these operators and these builtins. Anything else
# (an attribute, true division, a function of model.py) leaves the constant drawn on its own.
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
          ast.Mod: operator.mod}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
CALLS = {"int": int, "min": min, "max": max, "abs": abs}
LONGEST = 1024  # elements of a tuple or list an expression may build (`(1,) * dim`)


class Unsafe(ValueError):
    """The expression uses something outside what `evaluate` accepts."""


@dataclass(frozen=True)
class Derived:
    """`name = expression` at model.py's top level, where the expression reads `sources`."""

    name: str
    expression: ast.expr
    text: str
    sources: frozenset[str]


def _plain(value: Any) -> bool:
    return type(value) in (int, float) or (isinstance(value, (tuple, list)) and len(value) <= LONGEST
                                           and all(_plain(v) for v in value))


def evaluate(node: ast.expr, namespace: Mapping[str, Any]) -> Any:
    """The value of `node` with names from `namespace`; Unsafe for anything but the forms above."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name):
        value = namespace.get(node.id)
        if not _plain(value):
            raise Unsafe(f"{node.id} is not a number, tuple or list")
        return value
    if isinstance(node, (ast.Tuple, ast.List)):
        items: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                inner = evaluate(element.value, namespace)
                if not isinstance(inner, (tuple, list)):
                    raise Unsafe("* of a number")
                items.extend(inner)
            else:
                items.append(evaluate(element, namespace))
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        value = BINARY[type(node.op)](evaluate(node.left, namespace), evaluate(node.right, namespace))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        value = UNARY[type(node.op)](evaluate(node.operand, namespace))
    elif isinstance(node, ast.Subscript):
        sequence, index = evaluate(node.value, namespace), evaluate(node.slice, namespace)
        if not isinstance(sequence, (tuple, list)) or type(index) is not int:
            raise Unsafe("an index other than an int into a tuple or list")
        value = sequence[index]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLS
          and node.func.id not in namespace and not node.keywords):
        value = CALLS[node.func.id](*(evaluate(a, namespace) for a in node.args))
    else:
        raise Unsafe(f"{type(node).__name__} is not accepted")
    if not _plain(value):
        raise Unsafe("the value is not a number, tuple or list")
    return value


def _names_read(node: ast.expr) -> set[str]:
    """Names the expression reads, the builtins it calls left out."""
    calls = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in calls}


def _assignments(tree: ast.Module) -> list[tuple[str, ast.expr | None, bool]]:
    """(name, value, assigned) of every top-level binding of a name, in order: value None for
    bindings other than `name = value`; `assigned` for assignments of any form."""
    found: list[tuple[str, ast.expr | None, bool]] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            found += [(t.id, node.value, True) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.value, True))
        else:
            assigned = isinstance(node, (ast.Assign, ast.AnnAssign))
            found += [(name, None, assigned) for name in sorted(_bound(node))]
    return found


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


@lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[Derived, ...]:
    """Every top-level `name = expression` of the file whose expression reads constants assigned
    above it, where `name` is bound nowhere else at the top level (the file's stat is the cache key)."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError:
        return ()
    bindings = _assignments(tree)
    counts = collections.Counter(name for name, _, _ in bindings)
    above: set[str] = set()  # the constants assigned so far
    found = []
    for name, value, assigned in bindings:
        if value is not None:
            read = _names_read(value)
            if read and read <= above and counts[name] == 1:
                text = ast.get_source_segment(source, value) or ast.unparse(value)
                found.append(Derived(name, value, text, frozenset(read)))
        if assigned:
            above.add(name)
    return tuple(found)


def candidates(module: types.ModuleType) -> tuple[Derived, ...]:
    """Every top-level constant written in terms of those above it, whatever value it holds now."""
    path = getattr(module, "__file__", None)
    try:
        stat = os.stat(path) if path else None
        return _parsed(os.path.realpath(path), stat.st_mtime_ns, stat.st_size) if stat else ()
    except (OSError, UnicodeDecodeError):
        return ()


def definitions(module: types.ModuleType) -> list[Derived]:
    """The derived constants of `module`, in source order, whose expression gives the value it holds now."""
    found = []
    namespace = module.__dict__
    for item in candidates(module):
        try:
            value = evaluate(item.expression, namespace)
        except (Unsafe, ArithmeticError, IndexError, TypeError, ValueError):
            continue
        current = namespace.get(item.name)
        if type(value) is type(current) and value == current:
            found.append(item)
    return found


def recompute(module: types.ModuleType, values: Mapping[str, Any]) -> dict[str, Any]:
    """The derived constants' new values once `values` are set; those set in `values`, and those
    the new values make uncomputable (a zero divisor), keep their own."""
    namespace = {**module.__dict__, **values}
    changed: dict[str, Any] = {}
    for item in definitions(module):
        if item.name in values or not item.sources & (set(values) | set(changed)):
            continue
        try:
            value = evaluate(item.expression, namespace)
        except (Unsafe, ArithmeticError, IndexError, TypeError, ValueError):
            continue
        namespace[item.name] = changed[item.name] = value
    return changed
