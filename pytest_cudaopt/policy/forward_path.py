"""MN003-MN005: the forward path of ModelNew, walked with a small type inference (tensor or not)."""

from __future__ import annotations

import ast
import functools
import re
from typing import Callable

from pytest_cudaopt.policy.allowlists import (
    ALLOWED_TENSOR_ATTRIBUTES, ALLOWED_TENSOR_METHODS, ALLOWED_TORCH_CREATION, ALLOWED_TORCH_OTHER, DYNAMIC_BUILTINS,
    FILE_READ_CALLS, FILE_READ_METHODS, GLOBAL_STATE_CALLS, HOOK_METHODS, REDUCING_BUILTINS, SAFE_CALL_MODULES,
    TENSOR_DISPATCHING_BUILTINS, TENSOR_OP_ATTRIBUTES, TORCH_SETTER,
)
from pytest_cudaopt.policy.python_ast import (
    EXT, MODULE, NON, SHAPE, SUPER, TENSOR, TENSORS, TRY_NODES, UNKNOWN, const_str,
)
from pytest_cudaopt.policy.rules import Config
from pytest_cudaopt.policy.symbols import Symbols, method

# The allowed tensor methods that return a new tensor.
_TENSOR_CREATING_METHODS = frozenset({"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"})
# Methods of Python containers and strings: fine on a receiver whose type is unknown.
_CONTAINER_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "copy", "count", "index", "reverse", "items",
    "keys", "values", "get", "setdefault", "update", "format", "join", "split", "strip", "lower", "upper",
    "startswith", "endswith", "replace", "add", "discard", "bit_length", "is_integer",
})
# Builtins that, on values that are not tensors, return no tensor.
_SCALAR_BUILTINS = frozenset({
    "len", "range", "int", "float", "bool", "str", "abs", "min", "max", "round", "divmod", "pow", "sum",
    "sorted", "any", "all", "list", "tuple", "dict", "set", "frozenset", "enumerate", "zip", "isinstance",
    "issubclass", "print", "repr", "format", "hash", "id", "type", "iter", "next", "reversed", "slice",
    "callable", "complex", "hex", "oct", "bin", "chr", "ord", "map", "filter",
})
# Parameter annotations that say the argument is not a tensor.
_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "tuple", "list", "dict", "Sequence",
                                 "Tuple", "List", "Optional", "Union", "Callable"})


def _tensorish(kind: object) -> bool:
    return kind in (TENSOR, EXT)


def _join(*types: object) -> object:
    """The kind of a value computed from values of these kinds."""
    if any(map(_tensorish, types)):
        return TENSOR
    if types and all(t in (NON, SHAPE) for t in types):
        return NON
    return UNKNOWN


class ForwardPath:
    """The functions that ModelNew.forward reaches, each walked once per kinds of its arguments."""

    def __init__(self, symbols: Symbols, config: Config, report: Callable[[ast.AST, str, str], None]):
        self.symbols, self.config, self.report = symbols, config, report
        self.analyzed: dict[tuple, object] = {}

    def analyze(self, name: tuple, fn: ast.FunctionDef, owner: str | None, arg_types: list | None) -> object:
        """Check one function of the forward path; returns the type of what it returns."""
        key = (*name, None if arg_types is None else tuple(map(str, arg_types)))
        if key in self.analyzed:
            return self.analyzed[key]
        self.analyzed[key] = UNKNOWN  # recursion guard
        result = ForwardChecker(self, fn, owner, arg_types).run()
        self.analyzed[key] = result
        return result


class ForwardChecker(ast.NodeVisitor):
    """Walks one function on the forward path with a small type inference (tensor or not)."""

    def __init__(self, path: ForwardPath, fn: ast.FunctionDef, owner: str | None, arg_types: list | None):
        self.path, self.symbols, self.fn, self.owner = path, path.symbols, fn, owner
        self.env: dict[str, object] = {}
        self.returns: list[object] = []
        self.where = f"{owner}.{fn.name}" if owner else fn.name
        params = [*fn.args.posonlyargs, *fn.args.args]
        defaults = [None] * (len(params) - len(fn.args.defaults)) + list(fn.args.defaults)
        for index, (param, default) in enumerate(zip(params, defaults)):
            if index == 0 and owner is not None and param.arg in ("self", "cls"):
                self.env[param.arg] = ("obj", owner) if param.arg == "self" else ("class", owner)
                continue
            position = index - (1 if owner is not None else 0)
            if arg_types is not None and 0 <= position < len(arg_types):
                self.env[param.arg] = arg_types[position]
            else:
                self.env[param.arg] = self.param_type(param, default)
        for param in fn.args.kwonlyargs:
            self.env[param.arg] = self.param_type(param, None)
        for param in (fn.args.vararg, fn.args.kwarg):
            if param is not None:
                self.env[param.arg] = NON

    @staticmethod
    def param_type(param: ast.arg, default: ast.AST | None) -> object:
        if param.annotation is not None:
            text = ast.unparse(param.annotation)
            if "Tensor" in text:
                return TENSOR
            if re.match(r"(typing\.)?(\w+)", text).group(2) in _SCALAR_ANNOTATIONS:
                return NON
        if isinstance(default, ast.Constant) and default.value is not None:
            return NON
        return TENSOR

    def add(self, node: ast.AST, rule: str, message: str) -> None:
        self.path.report(node, rule, f"{message} (in {self.where})")

    def run(self) -> object:
        for decorator in self.fn.decorator_list:  # @torch.compile, @torch.jit.script wrap the function
            self.check_function_value(decorator, self.expr(decorator))
        self.block(self.fn.body)
        return _join(*self.returns) if self.returns else NON

    # -- statements: visit_* return nothing; the kinds are bound in self.env
    def visit_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for target in node.targets:
            self.bind(target, value, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.bind(node.target, self.expr(node.value) if node.value is not None else UNKNOWN, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        current, value = self.expr(_as_load(node.target)), self.expr(node.value)
        if _tensorish(current) or _tensorish(value):
            self.add(node, "MN005", f"in-place `{_OPS.get(type(node.op), '?')}=` on a tensor dispatches a torch op")
        self.bind(node.target, _join(current, value), None)

    def visit_Return(self, node: ast.Return) -> None:
        self.returns.append(self.expr(node.value))

    def visit_If(self, node: ast.If | ast.While) -> None:
        self.test(node.test)
        self.block(node.body + node.orelse)

    visit_While = visit_If

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.bind(node.target, self.iteration(node.iter), None)
        self.block(node.body + node.orelse)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.expr(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, UNKNOWN, None)
        self.block(node.body)

    visit_AsyncWith = visit_With

    def visit_Try(self, node: ast.Try) -> None:
        self.block(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])

    visit_TryStar = visit_Try

    def visit_Assert(self, node: ast.Assert) -> None:
        self.test(node.test)
        self.expr(node.msg)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        nested = ForwardChecker(self.path, node, None, None)
        nested.env = {**self.env, **nested.env}
        nested.where = self.where
        nested.run()
        self.env[node.name] = ("local", node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            self.env[bound] = ("alias", self.symbols.aliases.get(bound, bound))

    visit_ImportFrom = visit_Import

    def generic_visit(self, node: ast.AST) -> object:
        """Any other statement or expression: its parts are checked; an expression's kind is unknown."""
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.expr, ast.stmt)):
                self.visit(child)
        return UNKNOWN

    def block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.visit(stmt)

    def iteration(self, iterable: ast.expr) -> object:
        """The type of the loop variable over `iterable`."""
        kind = self.expr(iterable)
        if kind == TENSOR:
            self.add(iterable, "MN005", "iterating over a tensor dispatches torch ops (unbind/select)")
        if kind in (TENSOR, EXT, TENSORS):
            return TENSOR
        return NON if _is_range(iterable) or kind == SHAPE else UNKNOWN

    def test(self, node: ast.expr) -> None:
        if _tensorish(self.expr(node)):
            self.add(node, "MN005", "the truth value of a tensor dispatches a torch op (and synchronises)")

    def bind(self, target: ast.AST, value: object, source: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = source.elts if isinstance(source, (ast.Tuple, ast.List)) and \
                len(source.elts) == len(target.elts) else None
            for index, element in enumerate(target.elts):
                if items is not None:
                    element_type = self.env_type_of(items[index])
                elif value == SHAPE:
                    element_type = NON
                elif value in (EXT, TENSORS):
                    element_type = TENSOR  # `a, b = cuda_extension.op(x)`
                else:
                    element_type = UNKNOWN
                self.bind(element, element_type, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, UNKNOWN, None)
        elif isinstance(target, ast.Subscript):
            container = self.expr(target.value)
            self.expr(target.slice)
            if _tensorish(container):
                self.add(target, "MN005", "assigning into a tensor (`x[...] = ...`) dispatches a torch op")
        elif isinstance(target, ast.Attribute):
            self.expr(target.value)

    def env_type_of(self, node: ast.AST) -> object:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.Constant):
            return NON
        return UNKNOWN

    # -- expressions: visit_* return the kind of the value
    def expr(self, node: ast.AST | None) -> object:
        return NON if node is None else self.visit(node)

    def lookup(self, name: str) -> object:
        return self.env[name] if name in self.env else self.symbols.lookup(name)

    def qualified(self, node: ast.AST) -> str | None:
        """Dotted name of a module attribute chain, resolving import aliases and local aliases."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and const_str(node.args[1]):
            base = self.qualified(node.args[0])
            return None if base is None else ".".join([base, node.args[1].value, *reversed(parts)])
        if isinstance(node, ast.Name):
            kind = self.lookup(node.id)
            if isinstance(kind, tuple) and kind[0] == "alias":
                return ".".join([kind[1], *reversed(parts)])
        return None

    def visit_Constant(self, node: ast.Constant) -> object:
        return NON

    def visit_Name(self, node: ast.Name) -> object:
        return self.lookup(node.id)

    def visit_BinOp(self, node: ast.BinOp) -> object:
        left, right = self.expr(node.left), self.expr(node.right)
        if _tensorish(left) or _tensorish(right):
            self.add(node, "MN005", f"operator `{_OPS.get(type(node.op), '?')}` on a tensor dispatches a "
                                    "torch op; compute it in a kernel")
            return TENSOR
        return _join(left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> object:
        operand = self.expr(node.operand)
        if _tensorish(operand):
            self.add(node, "MN005", f"unary `{_OPS.get(type(node.op), '?')}` on a tensor dispatches a torch op")
            return TENSOR
        return NON if operand in (NON, SHAPE) else UNKNOWN

    def visit_BoolOp(self, node: ast.BoolOp) -> object:
        for value in node.values:
            self.test(value)
        return NON

    def visit_Compare(self, node: ast.Compare) -> object:
        types = [self.expr(node.left), *(self.expr(c) for c in node.comparators)]
        identity = all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
        if any(map(_tensorish, types)) and not identity:
            self.add(node, "MN005", "comparing a tensor dispatches a torch op")
            return TENSOR
        return NON

    def visit_Subscript(self, node: ast.Subscript) -> object:
        value = self.expr(node.value)
        self.expr(node.slice)
        if value == EXT and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            return TENSOR  # out[0] of an op that returns a tuple
        if _tensorish(value):
            self.add(node, "MN005", "indexing a tensor (`x[...]`) dispatches a torch op (select/slice/index)")
            return TENSOR
        if value == TENSORS:
            return TENSOR
        if value == SHAPE:
            return NON
        return MODULE if value == MODULE else UNKNOWN

    def visit_IfExp(self, node: ast.IfExp) -> object:
        self.test(node.test)
        return _join(self.expr(node.body), self.expr(node.orelse))

    def visit_Tuple(self, node: ast.Tuple | ast.List | ast.Set) -> object:
        elements = [self.expr(element) for element in node.elts]
        return TENSORS if any(_tensorish(e) or e == TENSORS for e in elements) else NON

    visit_List = visit_Set = visit_Tuple

    def visit_Dict(self, node: ast.Dict) -> object:
        for part in [*node.keys, *node.values]:
            self.expr(part)
        return NON

    def visit_ListComp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> object:
        for gen in node.generators:
            self.bind(gen.target, self.iteration(gen.iter), None)
            for cond in gen.ifs:
                self.test(cond)
        parts = [self.expr(p) for p in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])]
        return TENSORS if any(_tensorish(p) for p in parts) else NON

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    def visit_Lambda(self, node: ast.Lambda) -> object:
        saved = dict(self.env)
        for param in node.args.args:
            self.env[param.arg] = UNKNOWN
        self.expr(node.body)
        self.env = saved
        return NON

    def visit_NamedExpr(self, node: ast.NamedExpr) -> object:
        value = self.expr(node.value)
        self.bind(node.target, value, node.value)
        return value

    def visit_JoinedStr(self, node: ast.JoinedStr) -> object:
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                self.expr(value.value)
        return NON

    def visit_Attribute(self, node: ast.Attribute) -> object:
        name = self.qualified(node)
        if name is not None:
            return ("alias", name)
        receiver = self.expr(node.value)
        attr = node.attr
        if _tensorish(receiver):
            if attr in ALLOWED_TENSOR_ATTRIBUTES | ALLOWED_TENSOR_METHODS | self.path.config.allow_tensor_methods:
                return SHAPE if attr == "shape" else NON
            self.add(node, "MN004", f"tensor attribute .{attr} is a torch op")
            return TENSOR
        if receiver == UNKNOWN and attr in TENSOR_OP_ATTRIBUTES:
            self.add(node, "MN004", f"tensor attribute .{attr} is a torch op")
            return TENSOR
        if isinstance(receiver, tuple) and receiver[0] == "obj":
            types = self.symbols.class_attr_types(receiver[1])
            if attr in types:
                return types[attr]
            return ("bound", receiver[1], attr)
        if isinstance(receiver, tuple) and receiver[0] == "class":
            return ("bound", receiver[1], attr)
        if receiver == MODULE:
            return TENSOR if re.search(r"weight|bias|running_", attr) else UNKNOWN
        if receiver in (NON, SHAPE):
            return NON
        return UNKNOWN

    def visit_Call(self, node: ast.Call) -> object:
        arg_types = [self.expr(a) for a in node.args]
        for value, value_type in [*zip(node.args, arg_types), *((k.value, self.expr(k.value)) for k in node.keywords)]:
            self.check_function_value(value, value_type)
        func = node.func
        name = self.qualified(func)
        if isinstance(func, ast.Name) and name is None:
            kind = self.lookup(func.id)
            return self.call_kind(node, kind, func.id, arg_types)
        if name is not None:
            return self.call_qualified(node, name)
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" \
                and len(func.args) >= 2 and const_str(func.args[1]):
            receiver = self.expr(func.args[0])
            return self.call_method(node, receiver, func.args[1].value, ast.unparse(func.args[0]), arg_types)
        if isinstance(func, ast.Attribute):
            receiver = self.expr(func.value)
            return self.call_method(node, receiver, func.attr, ast.unparse(func.value), arg_types)
        kind = self.expr(func)
        return self.call_kind(node, kind, ast.unparse(func), arg_types)

    def check_function_value(self, node: ast.AST, kind: object) -> None:
        """A torch function handed to something else (`map(torch.relu, xs)`, `partial(F.gelu)`) runs as an op."""
        if isinstance(kind, tuple) and kind[0] == "alias" and kind[1].split(".")[0] == "torch" \
                and kind[1] not in ALLOWED_TORCH_CREATION | ALLOWED_TORCH_OTHER | self.path.config.allow_python_calls \
                and _is_torch_function(kind[1]):
            self.add(node, "MN003", f"{kind[1]} is passed as a function; it runs torch ops when called")

    def call_kind(self, node: ast.Call, kind: object, text: str, arg_types: list) -> object:
        if isinstance(kind, tuple):
            if kind[0] == "alias":
                return self.call_qualified(node, kind[1])
            if kind[0] == "func":
                return self.path.analyze(("func", kind[1]), self.symbols.functions[kind[1]], None, arg_types)
            if kind[0] == "local":
                return UNKNOWN
            if kind[0] == "class":
                return MODULE if self.symbols.is_module(self.symbols.classes[kind[1]]) else ("obj", kind[1])
            if kind[0] == "bound":
                return self.call_method(node, ("obj", kind[1]), kind[2], kind[1], arg_types)
            if kind[0] == "builtin":
                return self.call_builtin(node, kind[1], arg_types)
        if kind == MODULE:
            self.add(node, "MN004", f"calling the nn.Module {text} runs torch ops; call a cuda_extension op")
            return TENSOR
        self.add(node, "MN003", f"calls {text}, which the checker cannot resolve to a cuda_extension op")
        return UNKNOWN

    def call_qualified(self, node: ast.Call, name: str) -> object:
        root = name.split(".")[0]
        config = self.path.config
        if root == "cuda_extension":
            return EXT
        if name in FILE_READ_CALLS:
            return NON  # MN008 reports it wherever it is
        if name in GLOBAL_STATE_CALLS or name == "contextlib.suppress" \
                or name.startswith(("torch.backends.", "importlib.")) or TORCH_SETTER.fullmatch(name):
            return UNKNOWN  # MN006, MN007 and MN009 report these wherever they are
        if name in ALLOWED_TORCH_CREATION or name in config.allow_python_calls:
            return TENSOR
        if name in ALLOWED_TORCH_OTHER:
            return NON
        if root in SAFE_CALL_MODULES:
            return NON
        if root == "torch":
            self.add(node, "MN003", f"{name}() is a torch op; the forward path may call only cuda_extension ops, "
                                    "tensor creation (torch.empty*, zeros*, ones*, full*) and tensor properties")
        else:
            self.add(node, "MN003", f"{name}() is not a cuda_extension op (other libraries do not belong in "
                                    "the forward path)")
        return UNKNOWN

    def call_builtin(self, node: ast.Call, name: str, arg_types: list) -> object:
        if name == "open":
            return NON  # MN008 reports it
        if name in ("__import__", "getattr", "hasattr"):
            if name == "getattr" and len(node.args) >= 2 and const_str(node.args[1]) is None:
                receiver = arg_types[0]
                if _tensorish(receiver) or (isinstance(receiver, tuple) and receiver[0] == "alias"):
                    self.add(node, "MN003", "getattr with a computed name hides which op is called")
            if name == "getattr" and len(node.args) >= 2 and const_str(node.args[1]):
                return self.visit_Attribute(ast.Attribute(value=node.args[0], attr=node.args[1].value,
                                                    ctx=ast.Load(), lineno=node.lineno))
            return UNKNOWN
        if name in DYNAMIC_BUILTINS:
            if name != "setattr":
                self.add(node, "MN003", f"{name}() runs or reaches code the checker cannot see")
            return UNKNOWN
        if name == "super":
            return SUPER
        if name == "type" and arg_types and _tensorish(arg_types[0]):
            return ("alias", "torch.Tensor")
        if (name in TENSOR_DISPATCHING_BUILTINS and any(map(_tensorish, arg_types))) \
                or (name in REDUCING_BUILTINS and TENSORS in arg_types):
            self.add(node, "MN005", f"{name}() on tensors dispatches torch ops")
            return TENSOR
        if name in _SCALAR_BUILTINS:
            return NON if name not in ("enumerate", "zip", "map", "filter", "iter", "next", "reversed") else UNKNOWN
        return NON  # exceptions (raise ValueError(...)) and other harmless builtins

    def call_method(self, node: ast.Call, receiver: object, attr: str, text: str, arg_types: list) -> object:
        config = self.path.config
        allowed = ALLOWED_TENSOR_METHODS | config.allow_tensor_methods
        if HOOK_METHODS.fullmatch(attr):
            self.add(node, "MN004", f"{text}.{attr}() installs a hook that runs outside forward")
            return NON
        if receiver == SUPER:
            self.add(node, "MN004", f"super().{attr}() runs the base class's torch path")
            return UNKNOWN
        if isinstance(receiver, tuple) and receiver[0] == "alias":
            return self.call_qualified(node, f"{receiver[1]}.{attr}")
        if isinstance(receiver, tuple) and receiver[0] in ("obj", "class"):
            cls_name = receiver[1]
            types = self.symbols.class_attr_types(cls_name)
            member = types.get(attr)
            if member == MODULE:
                self.add(node, "MN004", f"calling the submodule {text}.{attr} runs torch ops; keep it for its "
                                        "parameters and pass them to a cuda_extension op")
                return TENSOR
            if isinstance(member, tuple) and member[0] == "alias":
                return self.call_qualified(node, member[1])
            found = method(self.symbols.classes.get(cls_name), attr)
            if found is not None:
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in found.decorator_list)
                return self.path.analyze((cls_name, attr), found, None if static else cls_name, arg_types)
            self.add(node, "MN004", f"{text}.{attr}() is neither a method of {cls_name} nor a cuda_extension op")
            return UNKNOWN
        if receiver == MODULE:
            self.add(node, "MN004", f"{text}.{attr}() calls into an nn.Module: a torch op")
            return TENSOR
        if _tensorish(receiver):
            if attr in allowed:
                if attr in _TENSOR_CREATING_METHODS:
                    return TENSOR
                return SHAPE if attr in ("size", "stride") and not node.args else NON
            self.add(node, "MN004", f"tensor method {text}.{attr}() is a torch op; the forward path may use "
                                    "tensor properties (.shape, .size(), .stride(), ...) and creation only")
            return TENSOR
        if receiver in (NON, SHAPE, TENSORS):
            if attr in ("append", "extend", "insert") and any(_tensorish(t) or t == TENSORS for t in arg_types) \
                    and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                self.env[node.func.value.id] = TENSORS  # outs.append(y): outs now holds tensors
            return NON
        if receiver == UNKNOWN:
            if attr in allowed:
                return TENSOR if attr in _TENSOR_CREATING_METHODS else NON
            if attr in _CONTAINER_METHODS or attr in FILE_READ_METHODS:
                return UNKNOWN
            self.add(node, "MN004", f"{text}.{attr}() looks like a tensor method, which is a torch op")
            return TENSOR
        return UNKNOWN


@functools.lru_cache(maxsize=None)
def _is_torch_function(name: str) -> bool:
    """`torch.relu` is a function; `torch.float32` and `torch.contiguous_format` are values."""
    import importlib

    parts = name.split(".")
    try:
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return parts[-1][:1].islower()
    return callable(obj) and not isinstance(obj, type)


def _as_load(node: ast.AST) -> ast.AST:
    if isinstance(node, ast.Name):
        return ast.Name(id=node.id, ctx=ast.Load(), lineno=node.lineno)
    return node


def _is_range(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
        ast.BitAnd: "&", ast.USub: "-", ast.UAdd: "+", ast.Invert: "~", ast.Not: "not"}
