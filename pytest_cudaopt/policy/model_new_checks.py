"""model_new.py's checks: the class (MN001), __init__ (MN002), imports, fallbacks, reads, torch state (MN006-MN009)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from pytest_cudaopt.policy.allowlists import (
    FILE_READ_ATTRIBUTES, FILE_READ_CALLS, FILE_READ_METHODS, FORBIDDEN_METHODS_OF_SELF, FORBIDDEN_STDLIB,
    FRAME_ATTRIBUTES, FRAME_CALLS, GLOBAL_STATE_CALLS, OBJECT_GRAPH_ATTRIBUTES, TORCH_SETTER)
from pytest_cudaopt.policy.forward_path import ForwardPath
from pytest_cudaopt.policy.rules import Config, Violation
from pytest_cudaopt.policy.symbols import TRY_NODES, Symbols, dotted, is_module_class


class ModelNewCheck:
    """The MN rules on one parsed model_new.py."""

    def __init__(self, tree: ast.Module, model_tree: ast.Module | None, config: Config):
        self.tree, self.model_tree, self.config = tree, model_tree, config
        self.found: list[Violation] = []
        self.symbols = Symbols(tree)

    def add(self, node: ast.AST | int, rule: str, message: str) -> None:
        line = node if isinstance(node, int) else getattr(node, "lineno", 1)
        self.found.append(Violation("model_new.py", line, rule, message))

    def run(self) -> list[Violation]:
        self.check_imports()
        self.check_global()
        cls = self.symbols.classes.get("ModelNew")
        if cls is None:
            self.add(1, "MN001", "model_new.py defines no class ModelNew")
            return self.found
        if not is_module_class(cls, self.symbols.aliases):
            self.add(cls, "MN001", "ModelNew must subclass torch.nn.Module directly, got "
                                   f"({', '.join(ast.unparse(b) for b in cls.bases)})")
        methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in cls.body:
            names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and {"forward", "__call__"} & set(names):
                self.add(node, "MN001", "ModelNew assigns forward/__call__ in its class body; define `def forward`")
        for name in FORBIDDEN_METHODS_OF_SELF & set(methods):
            self.add(methods[name], "MN001", f"ModelNew defines {name}, which bypasses forward")
        for node in ast.walk(cls):
            for target in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]):
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self" and target.attr in ("forward", "__call__"):
                    self.add(node, "MN001", f"self.{target.attr} is replaced, so forward is not what runs")
        self.check_signature(cls, methods.get("__init__"))
        forward = methods.get("forward")
        if forward is None:
            self.add(cls, "MN001", "ModelNew defines no forward method")
        else:
            ForwardPath(self.symbols, config=self.config, report=self.add).analyze(
                ("ModelNew", "forward"), forward, "ModelNew", None)
        return self.found

    def check_signature(self, cls: ast.ClassDef, init: ast.FunctionDef | None) -> None:
        if self.model_tree is None:
            return
        model = next((n for n in self.model_tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is None:
            self.add(cls, "MN002", "model.py defines no class Model to compare ModelNew.__init__ with")
            return
        ref = next((n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)

        def signature(fn: ast.FunctionDef | None) -> tuple[str, str]:
            args = (fn or ast.parse("def __init__(self): pass").body[0]).args
            shape = ast.arguments(posonlyargs=[ast.arg(a.arg) for a in args.posonlyargs],
                                  args=[ast.arg(a.arg) for a in args.args],
                                  vararg=args.vararg and ast.arg(args.vararg.arg),
                                  kwonlyargs=[ast.arg(a.arg) for a in args.kwonlyargs], kw_defaults=args.kw_defaults,
                                  kwarg=args.kwarg and ast.arg(args.kwarg.arg), defaults=args.defaults)
            return f"({ast.unparse(shape)})", ast.dump(shape, annotate_fields=False)

        mine, theirs = signature(init), signature(ref)
        if mine[1] != theirs[1]:
            self.add(init or cls, "MN002", f"ModelNew.__init__{mine[0]} does not take the same parameters as "
                                           f"Model.__init__{theirs[0]} in model.py")

    # -- MN006-MN009, anywhere in the file
    def check_imports(self) -> None:
        stdlib = set(sys.stdlib_module_names)
        for node in ast.walk(self.tree):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    self.add(node, "MN006", f"relative import `{ast.unparse(node)}`: model_new.py may import only "
                                            "torch, cuda_extension and the standard library")
                    continue
                modules = [node.module or ""]
                if node.module in ("model", "model_new") or any(a.name == "Model" for a in node.names):
                    self.add(node, "MN006", f"`{ast.unparse(node)}` imports model.py's Model: ModelNew must not "
                                            "delegate to the reference")
                    continue
            for module in modules:
                root = module.split(".")[0]
                if module.startswith("torch.utils.cpp_extension"):
                    why = "builds another extension outside kernels/"
                elif root in ("torch", "cuda_extension", "__future__") or module in self.config.allow_imports \
                        or root in self.config.allow_imports:
                    continue
                elif root == "model":
                    why = "imports model.py: ModelNew must not delegate to the reference"
                elif root in FORBIDDEN_STDLIB:
                    why = "reaches code outside the custom path"
                elif root in stdlib:
                    continue
                else:
                    why = ("is neither torch, cuda_extension nor the standard library (another workdir's "
                           "code or a third-party library); allow it with [tool.cudaopt] allow-imports")
                self.add(node, "MN006", f"import of {module} {why}")

    def check_global(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, TRY_NODES):
                self.add(node, "MN007", "try/except in model_new.py: the custom path must fail loudly, not fall back")
            elif isinstance(node, ast.Call):
                name = self.callee(node.func)
                if name == "contextlib.suppress":
                    self.add(node, "MN007", "contextlib.suppress hides failures of the custom path")
                elif name in FILE_READ_CALLS or (isinstance(node.func, ast.Attribute)
                                                 and node.func.attr in FILE_READ_METHODS):
                    what = name or f".{node.func.attr}()"
                    self.add(node, "MN008", f"{what} reads a file or the environment")
                elif name in ("__import__", "importlib.import_module"):
                    self.add(node, "MN006", f"{name}() imports code dynamically")
                elif name in FRAME_CALLS:
                    self.add(node, "MN006", f"{name}() reaches interpreter frames (the harness's state)")
                elif name in GLOBAL_STATE_CALLS or TORCH_SETTER.fullmatch(name or "") \
                        or (name or "").startswith(("torch.backends.", "torch._dynamo.", "torch._inductor.")):
                    self.add(node, "MN009", f"{name}() changes torch's global state")
                elif (name or "").startswith("torch.") and name.rpartition(".")[2].startswith("register_module_"):
                    self.add(node, "MN009", f"{name}() registers a hook on every nn.Module, the reference's too")
                elif name == "setattr" and node.args and (self.callee(node.args[0]) or "").startswith("torch"):
                    self.add(node, "MN009", f"setattr on {self.callee(node.args[0])} patches torch")
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                name = dotted(node, self.symbols.aliases)
                if name in FILE_READ_ATTRIBUTES:
                    self.add(node, "MN008", f"{name} reads the environment")
                elif name in ("sys.modules", "sys.path"):
                    self.add(node, "MN006", f"{name} reaches other modules' code")
                elif node.attr in FRAME_ATTRIBUTES:
                    self.add(node, "MN006", f".{node.attr} reads an interpreter frame (the harness's state)")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                for target in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                    name = dotted(target, self.symbols.aliases) if isinstance(target, ast.Attribute) else None
                    if name and name.split(".")[0] == "torch":
                        self.add(node, "MN009", f"assignment to {name} changes torch's global state")
                    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id in self.symbols.classes and target.attr in ("forward", "__call__"):
                        self.add(node, "MN001", f"{target.value.id}.{target.attr} is replaced after the class")
            self.check_object_graph(node)

    def check_object_graph(self, node: ast.AST) -> None:
        """MN006: an attribute that walks to other code or replaces a function's insides, also spelled as a string."""
        if isinstance(node, ast.Attribute) and node.attr in OBJECT_GRAPH_ATTRIBUTES:
            self.add(node, "MN006", f".{node.attr} reaches code that is not the candidate's (torch's, the "
                                    "reference's, the harness's) or replaces a function's insides")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in FRAME_ATTRIBUTES | OBJECT_GRAPH_ATTRIBUTES:
            self.add(node, "MN006", f"the name {node.value!r} (getattr, vars()[...]) reads an interpreter frame or "
                                    "reaches code that is not the candidate's")

    def callee(self, func: ast.AST) -> str | None:
        name = dotted(func, self.symbols.aliases)
        if name is None and isinstance(func, ast.Name) and self.symbols.lookup(func.id) == ("builtin", func.id):
            return func.id
        return name


def _parse(path: Path) -> tuple[ast.Module | None, Violation | None]:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), None
    except FileNotFoundError:
        return None, Violation(path.name, 1, "MN001", f"{path.name} is missing")
    except SyntaxError as exc:
        return None, Violation(path.name, exc.lineno or 1, "MN001", f"{path.name} does not parse: {exc.msg}")
    except (OSError, ValueError) as exc:
        return None, Violation(path.name, 1, "MN001", f"{path.name} cannot be read: {exc}")


def check_model_new(workdir: Path, config: Config) -> list[Violation]:
    """MN001-MN009 on `<workdir>/model_new.py`; model.py gives MN002 the signature to match."""
    tree, problem = _parse(workdir / "model_new.py")
    if tree is None:
        return [problem]
    model_tree, model_problem = _parse(workdir / "model.py")
    found = ModelNewCheck(tree, model_tree, config).run()
    if model_problem is not None:
        found.append(Violation("model.py", model_problem.line, "MN002",
                               f"{model_problem.message}: ModelNew.__init__ cannot be compared with Model's"))
    return found
