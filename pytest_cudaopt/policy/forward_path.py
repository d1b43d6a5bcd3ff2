"""MN003-MN005: the forward path of ModelNew, walked with a small type inference (tensor or not)."""

from __future__ import annotations

import ast
from typing import Callable

from pytest_cudaopt.policy.forward_calls import (
    attribute, builtin_call, method_call, passed_function, qualified_call, tensorish)
from pytest_cudaopt.policy.rules import Config
from pytest_cudaopt.policy.symbols import (EXT, MODULE, NON, SHAPE, TENSOR, TENSORS, UNKNOWN, Symbols, attribute_chain,
                                           const_str, is_module_class, method, param_kinds)


def _join(*types: object) -> object:
    """The kind of a value computed from values of these kinds."""
    if any(map(tensorish, types)):
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
        self.analyzed[key] = ForwardChecker(self, fn, owner, arg_types).run()
        return self.analyzed[key]


class ForwardChecker(ast.NodeVisitor):
    """Walks one function on the forward path with a small type inference (tensor or not)."""

    def __init__(self, path: ForwardPath, fn: ast.FunctionDef, owner: str | None, arg_types: list | None):
        self.path, self.symbols, self.fn = path, path.symbols, fn
        self.env: dict[str, object] = param_kinds(fn, owner, arg_types)
        self.returns: list[object] = []
        self.where = f"{owner}.{fn.name}" if owner else fn.name

    def add(self, node: ast.AST, rule: str, message: str) -> None:
        self.path.report(node, rule, f"{message} (in {self.where})")

    def run(self) -> object:
        for decorator in self.fn.decorator_list:  # @torch.compile, @torch.jit.script wrap the function
            self.check_passed(decorator, self.expr(decorator))
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
        current, value = self.expr(node.target), self.expr(node.value)
        if tensorish(current) or tensorish(value):
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
        is_range = isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range"
        return NON if is_range or kind == SHAPE else UNKNOWN

    def test(self, node: ast.expr) -> None:
        if tensorish(self.expr(node)):
            self.add(node, "MN005", "the truth value of a tensor dispatches a torch op (and synchronises)")

    def bind(self, target: ast.AST, value: object, source: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = source.elts if isinstance(source, (ast.Tuple, ast.List)) and \
                len(source.elts) == len(target.elts) else None
            for index, element in enumerate(target.elts):
                if items is not None:
                    item = items[index]
                    element_type = self.env.get(item.id, UNKNOWN) if isinstance(item, ast.Name) \
                        else NON if isinstance(item, ast.Constant) else UNKNOWN
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
            if tensorish(container):
                self.add(target, "MN005", "assigning into a tensor (`x[...] = ...`) dispatches a torch op")
        elif isinstance(target, ast.Attribute):
            self.expr(target.value)

    # -- expressions: visit_* return the kind of the value
    def expr(self, node: ast.AST | None) -> object:
        return NON if node is None else self.visit(node)

    def lookup(self, name: str) -> object:
        return self.env[name] if name in self.env else self.symbols.lookup(name)

    def qualified(self, node: ast.AST) -> str | None:
        """Dotted name of a module attribute chain, resolving import aliases and local aliases."""
        node, parts = attribute_chain(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and const_str(node.args[1]):
            base = self.qualified(node.args[0])
            return None if base is None else ".".join([base, node.args[1].value, *parts])
        if isinstance(node, ast.Name):
            kind = self.lookup(node.id)
            if isinstance(kind, tuple) and kind[0] == "alias":
                return ".".join([kind[1], *parts])
        return None

    def visit_Constant(self, node: ast.Constant) -> object:
        return NON

    def visit_Name(self, node: ast.Name) -> object:
        return self.lookup(node.id)

    def visit_BinOp(self, node: ast.BinOp) -> object:
        left, right = self.expr(node.left), self.expr(node.right)
        if tensorish(left) or tensorish(right):
            self.add(node, "MN005", f"operator `{_OPS.get(type(node.op), '?')}` on a tensor dispatches a "
                                    "torch op; compute it in a kernel")
            return TENSOR
        return _join(left, right)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> object:
        operand = self.expr(node.operand)
        if tensorish(operand):
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
        if any(map(tensorish, types)) and not identity:
            self.add(node, "MN005", "comparing a tensor dispatches a torch op")
            return TENSOR
        return NON

    def visit_Subscript(self, node: ast.Subscript) -> object:
        value = self.expr(node.value)
        self.expr(node.slice)
        if value == EXT and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            return TENSOR  # out[0] of an op that returns a tuple
        if tensorish(value):
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
        return TENSORS if any(tensorish(e) or e == TENSORS for e in elements) else NON

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
        return TENSORS if any(tensorish(p) for p in parts) else NON

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
        if isinstance(receiver, tuple) and receiver[0] == "obj":
            return self.symbols.class_attr_types(receiver[1]).get(node.attr, ("bound", receiver[1], node.attr))
        if isinstance(receiver, tuple) and receiver[0] == "class":
            return ("bound", receiver[1], node.attr)
        return self.judge(node, attribute(receiver, node.attr, self.path.config))

    def visit_Call(self, node: ast.Call) -> object:
        arg_types = [self.expr(a) for a in node.args]
        for value, value_type in [*zip(node.args, arg_types), *((k.value, self.expr(k.value)) for k in node.keywords)]:
            self.check_passed(value, value_type)
        func = node.func
        name = self.qualified(func)
        if isinstance(func, ast.Name) and name is None:
            return self.call_kind(node, self.lookup(func.id), func.id, arg_types)
        if name is not None:
            return self.judge(node, qualified_call(name, self.path.config))
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" \
                and len(func.args) >= 2 and const_str(func.args[1]):
            receiver = self.expr(func.args[0])
            return self.call_method(node, receiver, func.args[1].value, ast.unparse(func.args[0]), arg_types)
        if isinstance(func, ast.Attribute):
            return self.call_method(node, self.expr(func.value), func.attr, ast.unparse(func.value), arg_types)
        return self.call_kind(node, self.expr(func), ast.unparse(func), arg_types)

    def judge(self, node: ast.AST, verdict: tuple) -> object:
        """Report the problem of a forward_calls verdict, if any; the kind it gives."""
        kind, problem = verdict
        if problem is not None:
            self.add(node, *problem)
        return kind

    def check_passed(self, node: ast.AST, kind: object) -> None:
        self.judge(node, (None, passed_function(kind, self.path.config)))

    def call_kind(self, node: ast.Call, kind: object, text: str, arg_types: list) -> object:
        if isinstance(kind, tuple):
            if kind[0] == "alias":
                return self.judge(node, qualified_call(kind[1], self.path.config))
            if kind[0] == "func":
                return self.path.analyze(("func", kind[1]), self.symbols.functions[kind[1]], None, arg_types)
            if kind[0] == "local":
                return UNKNOWN
            if kind[0] == "class":
                cls = self.symbols.classes[kind[1]]
                return MODULE if is_module_class(cls, self.symbols.aliases) else ("obj", kind[1])
            if kind[0] == "bound":
                return self.call_method(node, ("obj", kind[1]), kind[2], kind[1], arg_types)
            if kind[0] == "builtin":
                if kind[1] == "getattr" and len(node.args) >= 2 and const_str(node.args[1]):
                    return self.visit_Attribute(ast.Attribute(value=node.args[0], attr=node.args[1].value,
                                                              ctx=ast.Load(), lineno=node.lineno))
                return self.judge(node, builtin_call(kind[1], node.args, arg_types))
        if kind == MODULE:
            self.add(node, "MN004", f"calling the nn.Module {text} runs torch ops; call a cuda_extension op")
            return TENSOR
        self.add(node, "MN003", f"calls {text}, which the checker cannot resolve to a cuda_extension op")
        return UNKNOWN

    def call_method(self, node: ast.Call, receiver: object, attr: str, text: str, arg_types: list) -> object:
        verdict = method_call(receiver, attr, text, bool(node.args), self.path.config)
        if verdict is not None:
            return self.judge(node, verdict)
        if isinstance(receiver, tuple) and receiver[0] == "alias":
            return self.judge(node, qualified_call(f"{receiver[1]}.{attr}", self.path.config))
        if isinstance(receiver, tuple) and receiver[0] in ("obj", "class"):
            cls_name = receiver[1]
            member = self.symbols.class_attr_types(cls_name).get(attr)
            if member == MODULE:
                self.add(node, "MN004", f"calling the submodule {text}.{attr} runs torch ops; keep it for its "
                                        "parameters and pass them to a cuda_extension op")
                return TENSOR
            if isinstance(member, tuple) and member[0] == "alias":
                return self.judge(node, qualified_call(member[1], self.path.config))
            found = method(self.symbols.classes.get(cls_name), attr)
            if found is not None:
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in found.decorator_list)
                return self.path.analyze((cls_name, attr), found, None if static else cls_name, arg_types)
            self.add(node, "MN004", f"{text}.{attr}() is neither a method of {cls_name} nor a cuda_extension op")
            return UNKNOWN
        if receiver in (NON, SHAPE, TENSORS):
            if attr in ("append", "extend", "insert") and any(tensorish(t) or t == TENSORS for t in arg_types) \
                    and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                self.env[node.func.value.id] = TENSORS  # outs.append(y): outs now holds tensors
            return NON
        return UNKNOWN


_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
        ast.BitAnd: "&", ast.USub: "-", ast.UAdd: "+", ast.Invert: "~", ast.Not: "not"}
