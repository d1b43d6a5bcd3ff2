"""The symbol table of one model_new.py: import aliases, functions, classes, the kinds of attributes and parameters."""

from __future__ import annotations

import ast
import builtins
import re

# Types of the inference: EXT is what a cuda_extension op returns (a tensor or a tuple of them),
# TENSORS a Python container holding tensors.
TENSOR, EXT, TENSORS = "tensor", "extension result", "tensors"
NON, SHAPE, UNKNOWN, MODULE, SUPER = "non-tensor", "shape", "unknown", "module", "super"

TRY_NODES = (ast.Try, getattr(ast, "TryStar", ast.Try))  # try/except nodes (`except*` is ast.TryStar from Python 3.11)


def is_module_class(node: ast.ClassDef, aliases: dict[str, str]) -> bool:
    """The class subclasses torch.nn.Module directly."""
    return any((dotted(b, aliases) or "") in ("torch.nn.Module", "torch.nn.modules.module.Module") for b in node.bases)


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


# Parameter annotations that say the argument is not a tensor.
_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "tuple", "list", "dict", "Sequence",
                                 "Tuple", "List", "Optional", "Union", "Callable"})


def method(cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The first method `name` defined in the body of `cls`, or None."""
    body = cls.body if cls is not None else []
    return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)


class Symbols:
    """What the names of one module refer to, as the model_new.py checks resolve them."""

    def __init__(self, tree: ast.Module):
        self.aliases = import_aliases(tree)
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.attr_types: dict[str, dict[str, object]] = {}

    def lookup(self, name: str) -> object:
        """The kind of a module-level name: a function, a class, an import alias, a builtin, or unknown."""
        if name in self.functions:
            return ("func", name)
        if name in self.classes:
            return ("class", name)
        if name in self.aliases:
            return ("alias", self.aliases[name])
        if hasattr(builtins, name):
            return ("builtin", name)
        return UNKNOWN

    def class_attr_types(self, cls_name: str) -> dict[str, object]:
        """Types of `self.<attr>` from the class's __init__: submodules, parameters/buffers, other values."""
        if cls_name in self.attr_types:
            return self.attr_types[cls_name]
        types: dict[str, object] = {}
        self.attr_types[cls_name] = types
        init = method(self.classes.get(cls_name), "__init__")
        for node in ast.walk(init) if isinstance(init, ast.FunctionDef) else ():
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self":
                        types[target.attr] = self.init_value_type(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("register_buffer", "register_parameter") and node.args:
                name = const_str(node.args[0])
                if name:
                    types[name] = TENSOR
        return types

    def init_value_type(self, value: ast.AST) -> object:
        if isinstance(value, ast.Call):
            name = dotted(value.func, self.aliases) or ""
            if name.startswith("cuda_extension"):
                return TENSOR
            if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.Tensor") \
                    or (name.startswith("torch.") and name.split(".")[-1][:1].islower()):
                return TENSOR
            if name.startswith("torch.nn.") and name.split(".")[-1][:1].isupper():
                return MODULE
            if isinstance(value.func, ast.Name) and value.func.id in self.classes:
                cls = self.classes[value.func.id]
                return MODULE if is_module_class(cls, self.aliases) else ("obj", cls.name)
            return UNKNOWN
        name = dotted(value, self.aliases)
        if name is not None:
            return ("alias", name)
        return NON


def param_kinds(fn: ast.FunctionDef, owner: str | None, arg_types: list | None) -> dict[str, object]:
    """The kinds of `fn`'s parameters: from the call's arguments where known, else from annotations and defaults;
    `self`/`cls` of a method of `owner` are its object/class."""
    kinds: dict[str, object] = {}
    params = [*fn.args.posonlyargs, *fn.args.args]
    defaults = [None] * (len(params) - len(fn.args.defaults)) + list(fn.args.defaults)
    for index, (param, default) in enumerate(zip(params, defaults)):
        if index == 0 and owner is not None and param.arg in ("self", "cls"):
            kinds[param.arg] = ("obj", owner) if param.arg == "self" else ("class", owner)
            continue
        position = index - (1 if owner is not None else 0)
        if arg_types is not None and 0 <= position < len(arg_types):
            kinds[param.arg] = arg_types[position]
        else:
            kinds[param.arg] = _param_kind(param, default)
    for param in fn.args.kwonlyargs:
        kinds[param.arg] = _param_kind(param, None)
    for param in (fn.args.vararg, fn.args.kwarg):
        if param is not None:
            kinds[param.arg] = NON
    return kinds


def _param_kind(param: ast.arg, default: ast.AST | None) -> object:
    if param.annotation is not None:
        text = ast.unparse(param.annotation)
        if "Tensor" in text:
            return TENSOR
        name = re.match(r"(typing\.)?(\w+)", text)  # None for a quoted annotation: judged as none
        if name is not None and name.group(2) in _SCALAR_ANNOTATIONS:
            return NON
    if isinstance(default, ast.Constant) and default.value is not None:
        return NON
    return TENSOR
