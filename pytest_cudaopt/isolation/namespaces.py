"""The Python road: identities of the attributes of torch's namespaces, torch's classes, the import system and builtins."""

from __future__ import annotations

import gc
import inspect
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any, Iterator, Sequence

from pytest_cudaopt.isolation.changes import ATTRIBUTE, IMPORT, Change, origin_of, short

# The modules whose attributes the reference and the baselines reach (torch.nn.modules.*
# are added as loaded: their globals, `F` included, are what nn.Linear.forward calls).
MODULES = (
    "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.nn.parameter", "torch.cuda",
    "torch.linalg", "torch.fft", "torch.special", "torch.functional", "torch.autograd", "torch.backends",
    "torch.backends.cuda", "torch.backends.cudnn", "torch.backends.mkldnn", "torch.library", "torch._C._nn",
    "torch._C._linalg", "torch._C._special", "torch._C._fft", "torch.overrides", "torch.utils.deterministic",
    "math", "builtins",
)
# Values that are data, not behaviour: torch updates some as it runs (torch.cuda._initialized).
DATA = (bool, int, float, complex, str, bytes, type(None), tuple, list, dict, set, frozenset)
# Lists of hooks the import system and the garbage collector call: code placed there runs later.
# The process's tracing and profiling functions (sys.settrace, sys.setprofile): one installed
# by the workdir's code sees every frame the reference and the harness run.
TRACERS = ("sys.gettrace()", "sys.getprofile()")
HOOK_LISTS = {"sys.meta_path": lambda: sys.meta_path, "sys.path_hooks": lambda: sys.path_hooks,
              "gc.callbacks": lambda: gc.callbacks}


def _references(references: Sequence[types.ModuleType]) -> Iterator[tuple[str, Any]]:
    """Each workdir's model.py (the reference) and the classes it defines: what the reference
    and the baselines call (`Model.forward`, a helper module's forward, a module-level function)."""
    for index, module in enumerate(references):
        label = "model" if index == 0 else f"model#{index + 1}"
        yield label, module
        for name, value in sorted(vars(module).items()):
            if inspect.isclass(value) and value.__module__ == module.__name__:
                yield f"{label}.{value.__qualname__}", value


def _watched(references: Sequence[types.ModuleType] = ()) -> Iterator[tuple[str, Any]]:
    """(label, namespace object): the modules above, torch.Tensor, nn.Module and every
    nn.Module subclass that torch.nn offers (their own class dictionaries), and the references."""
    import torch

    for name in MODULES:
        module = sys.modules.get(name)
        if module is not None:
            yield name, module
    for name in sorted(sys.modules):
        if name.startswith("torch.nn.modules."):
            yield name, sys.modules[name]
    classes = [torch.Tensor, torch.nn.Parameter, torch.nn.Module]
    classes += [value for _, value in sorted(vars(torch.nn).items())
                if inspect.isclass(value) and issubclass(value, torch.nn.Module) and value not in classes]
    for cls in classes:
        yield f"{cls.__module__}.{cls.__qualname__}", cls
    yield from _references(references)


# What a Python function runs besides its identity: assigning one of these changes its behaviour
# while every reference to it stays the same object.
FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__")


def _function(value: Any) -> types.FunctionType | None:
    """A plain Python function, also inside a staticmethod or classmethod (type checks only:
    an arbitrary object's attribute lookup can run code, torch.backends.cuda's initialises CUDA)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return value if isinstance(value, types.FunctionType) else None


def _parts(value: Any) -> tuple | None:
    """A plain Python function's code and defaults."""
    function = _function(value)
    return None if function is None else tuple(getattr(function, part) for part in FUNCTION_PARTS)


def take(references: Sequence[types.ModuleType] = ()) -> dict[str, tuple[Any, dict[str, Any], frozenset[str], dict]]:
    """label -> (namespace, {attribute: value} with data left out, every attribute name,
    {attribute: its function's code and defaults})."""
    found = {}
    for label, owner in _watched(references):
        names = vars(owner)
        values = {k: v for k, v in names.items() if not isinstance(v, DATA)}
        parts = {k: p for k, p in ((k, _parts(v)) for k, v in values.items()) if p is not None}
        found[label] = (owner, values, frozenset(names), parts)
    return found


def _parts_setter(value: Any, parts: tuple):
    def undo() -> None:
        function = _function(value)
        for name, part in zip(FUNCTION_PARTS, parts):
            setattr(function, name, part)
    return undo


def _part_change(label: str, name: str, value: Any, parts: tuple) -> Change | None:
    """The same function object whose code or defaults were replaced."""
    now = _parts(value)
    if now is None or all(a is b for a, b in zip(now, parts)):
        return None
    changed = [part for part, a, b in zip(FUNCTION_PARTS, now, parts) if a is not b]
    origin = origin_of(value) if changed[0] == "__code__" else ""
    return Change(ATTRIBUTE, f"{label}.{name}", f"the same function, its {' and '.join(changed)} replaced",
                  origin, _parts_setter(value, parts))


def _setter(owner: Any, name: str, value: Any, present: bool):
    def undo() -> None:
        if present:
            setattr(owner, name, value)
        elif name in vars(owner):
            delattr(owner, name)
    return undo


def _new_entry_counts(owner: Any, name: str, value: Any) -> bool:
    """Whether an attribute that appeared since the snapshot can change behaviour: in a
    class dictionary anything but data (it shadows a base class's method); in a module, a
    new callable that is not a submodule (torch imports its submodules lazily)."""
    if isinstance(value, DATA):
        return False
    if isinstance(owner, type):
        return True
    return not isinstance(value, types.ModuleType) and callable(value) and not (
        name.startswith("__") and name.endswith("__"))


def same_module(new: Any, old: Any) -> bool:
    """A module imported again (its entry left sys.modules and came back: pytester's in-process
    runs do that) is the same module: same name, same file."""
    return (isinstance(new, types.ModuleType) and isinstance(old, types.ModuleType)
            and new.__name__ == old.__name__ and getattr(new, "__file__", None) is not None
            and getattr(new, "__file__", None) == getattr(old, "__file__", None))


def torch_wrapper(new: Any, old: Any) -> bool:
    """torch's own wrapping of one of its functions after the snapshot (torch._dynamo wraps
    torch.manual_seed and nn.Module.__init__ when first imported): `new` is a function
    defined in torch's package that holds `old` (its `__wrapped__` or a closure cell)."""
    import torch

    code = getattr(new, "__code__", None)
    if code is None:
        return False
    root = Path(torch.__file__).resolve().parent
    try:
        inside = root in Path(code.co_filename).resolve().parents
    except OSError:
        return False
    cells = [cell.cell_contents for cell in (getattr(new, "__closure__", None) or ()) if _filled(cell)]
    return inside and (getattr(new, "__wrapped__", None) is old or any(value is old for value in cells))


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def changes(before: dict[str, tuple[Any, dict[str, Any], frozenset[str], dict]]) -> list[Change]:
    """Attributes replaced, removed or added since `before` (see `_new_entry_counts`), and
    functions whose code or defaults were replaced in place."""
    found = []
    for label, (owner, values, names, parts) in before.items():
        now = vars(owner)
        for name, value in values.items():
            if name in parts and now.get(name) is value:
                part = _part_change(label, name, value, parts[name])
                if part is not None:
                    found.append(part)
            if name not in now:
                found.append(Change(ATTRIBUTE, f"{label}.{name}", f"was {short(value)}, now removed",
                                    undo=_setter(owner, name, value, True)))
            elif now[name] is not value and not torch_wrapper(now[name], value) \
                    and not same_module(now[name], value):
                new = now[name]
                found.append(Change(ATTRIBUTE, f"{label}.{name}", f"was {short(value)}, now {short(new)}",
                                    origin_of(new), _setter(owner, name, value, True)))
        for name in [n for n in now if n not in names]:
            new = now[name]
            if _new_entry_counts(owner, name, new):
                found.append(Change(ATTRIBUTE, f"{label}.{name}", f"added: {short(new)}", origin_of(new),
                                    _setter(owner, name, None, False)))
    return found


def take_imports() -> dict[str, Any]:
    """The torch modules in sys.modules (an `import torch.nn.functional` finds these), the
    hook lists and the tracing functions."""
    found: dict[str, Any] = {f"sys.modules[{name!r}]": module for name, module in sys.modules.items()
                             if name == "torch" or name.startswith("torch.")}
    found.update({name: tuple(get()) for name, get in HOOK_LISTS.items()})
    found[TRACERS[0]] = sys.gettrace()
    found[TRACERS[1]] = sys.getprofile()
    return found


def import_changes(before: dict[str, Any]) -> list[Change]:
    now = take_imports()
    found = []
    for name, value in before.items():
        new = now.get(name)
        if name.endswith("]") and name not in now:
            found.append(Change(IMPORT, name, "removed from sys.modules", undo=_module_undo(name, value)))
        elif name in HOOK_LISTS:
            added = [h for h in new if not any(h is old for old in value) and not installed(origin_of(h))]
            if added:
                found.append(Change(IMPORT, name, f"added {', '.join(short(h) for h in added)}",
                                    origin_of(added[0]), _hooks_undo(name, value)))
        elif name in TRACERS and (new is value or new is None or installed_tracer(new)):
            continue  # Hypothesis's explain phase, a debugger, coverage: not the workdir's code
        elif new is not value and not (new == value and isinstance(value, DATA)) \
                and not same_module(new, value):
            found.append(Change(IMPORT, name, f"was {short(value)}, now {short(new)}", origin_of(new),
                                _module_undo(name, value) if name.endswith("]") else None))
    return found


def installed_tracer(tracer: Any) -> bool:
    """A tracing or profiling function (a plain function or a bound method: not a partial or
    another wrapper, which could call anything) whose code is in an installed package or the
    standard library (see `installed`)."""
    function = tracer.__func__ if isinstance(tracer, types.MethodType) else tracer
    return isinstance(function, types.FunctionType) and installed(function.__code__.co_filename)


def installed(origin: str) -> bool:
    """Code of the standard library or of an installed package (pytest's, Hypothesis's own
    hooks), not of a workdir: a file under the interpreter's library folders."""
    path = origin.rpartition(":")[0] if origin.rpartition(":")[2].isdigit() else origin
    if not path or path.startswith(("<", "module ")):
        return False
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        resolved = Path(path).resolve()
    except OSError:
        return False
    return any(Path(root).resolve() in resolved.parents for root in roots)


def _module_undo(label: str, module: Any):
    name = label[len("sys.modules['"):-2]
    return lambda: sys.modules.__setitem__(name, module)


def _hooks_undo(label: str, hooks: tuple):
    def undo() -> None:
        target = HOOK_LISTS[label]()
        target[:] = [h for h in target if any(h is old for old in hooks)]
    return undo
