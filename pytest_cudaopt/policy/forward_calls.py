"""MN003/MN004 by name: what a call or attribute on the forward path gives, and which rule it breaks.
Each returns a verdict `(kind, problem)`, problem being `(rule, message)` or None; forward_path reports it."""

from __future__ import annotations

import ast
import functools
import importlib
import re

from pytest_cudaopt.policy.allowlists import (
    ALLOWED_TENSOR_ATTRIBUTES, ALLOWED_TENSOR_METHODS, ALLOWED_TORCH_CREATION, ALLOWED_TORCH_OTHER, DYNAMIC_BUILTINS,
    FILE_READ_CALLS, FILE_READ_METHODS, GLOBAL_STATE_CALLS, HOOK_METHODS, REDUCING_BUILTINS, SAFE_CALL_MODULES,
    TENSOR_CREATING_METHODS, TENSOR_DISPATCHING_BUILTINS, TENSOR_OP_ATTRIBUTES, TORCH_SETTER)
from pytest_cudaopt.policy.symbols import EXT, MODULE, NON, SHAPE, SUPER, TENSOR, TENSORS, UNKNOWN, const_str
from pytest_cudaopt.policy.rules import Config

Verdict = tuple[object, "tuple[str, str] | None"]

# Methods of Python containers and strings: fine on a receiver whose type is unknown.
_CONTAINER_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "copy", "count", "index", "reverse", "items",
    "keys", "values", "get", "setdefault", "update", "format", "join", "split", "strip", "lower", "upper",
    "startswith", "endswith", "replace", "add", "discard", "bit_length", "is_integer"})


def tensorish(kind: object) -> bool:
    return kind in (TENSOR, EXT)


def qualified_call(name: str, config: Config) -> Verdict:
    """A call of the dotted name `name` (`torch.relu`, `cuda_extension.op`, `math.ceil`)."""
    root = name.split(".")[0]
    if root == "cuda_extension":
        return EXT, None
    if name in FILE_READ_CALLS:
        return NON, None  # MN008 reports it wherever it is
    if name in GLOBAL_STATE_CALLS or name == "contextlib.suppress" \
            or name.startswith(("torch.backends.", "importlib.")) or TORCH_SETTER.fullmatch(name):
        return UNKNOWN, None  # MN006, MN007 and MN009 report these wherever they are
    if name in ALLOWED_TORCH_CREATION or name in config.allow_python_calls:
        return TENSOR, None
    if name in ALLOWED_TORCH_OTHER or root in SAFE_CALL_MODULES:
        return NON, None
    if root == "torch":
        return UNKNOWN, ("MN003", f"{name}() is a torch op; the forward path may call only cuda_extension ops, "
                                  "tensor creation (torch.empty*, zeros*, ones*, full*) and tensor properties")
    return UNKNOWN, ("MN003", f"{name}() is not a cuda_extension op (other libraries do not belong in the "
                              "forward path)")


def passed_function(kind: object, config: Config) -> tuple[str, str] | None:
    """A torch function handed to something else (`map(torch.relu, xs)`, `partial(F.gelu)`) runs as an op."""
    if isinstance(kind, tuple) and kind[0] == "alias" and kind[1].split(".")[0] == "torch" \
            and kind[1] not in ALLOWED_TORCH_CREATION | ALLOWED_TORCH_OTHER | config.allow_python_calls \
            and _is_torch_function(kind[1]):
        return "MN003", f"{kind[1]} is passed as a function; it runs torch ops when called"
    return None


def builtin_call(name: str, args: list[ast.expr], arg_types: list) -> Verdict:
    """A call of the builtin `name`; getattr with a constant name is resolved as an attribute by the caller."""
    if name == "open":
        return NON, None  # MN008 reports it
    if name in ("__import__", "getattr", "hasattr"):
        if name == "getattr" and len(args) >= 2 and const_str(args[1]) is None \
                and (tensorish(arg_types[0]) or (isinstance(arg_types[0], tuple) and arg_types[0][0] == "alias")):
            return UNKNOWN, ("MN003", "getattr with a computed name hides which op is called")
        return UNKNOWN, None
    if name == "setattr":
        return UNKNOWN, None  # MN009 reports setattr on torch wherever it is
    if name in DYNAMIC_BUILTINS:
        return UNKNOWN, ("MN003", f"{name}() runs or reaches code the checker cannot see")
    if name == "super":
        return SUPER, None
    if name == "type" and arg_types and tensorish(arg_types[0]):
        return ("alias", "torch.Tensor"), None
    if (name in TENSOR_DISPATCHING_BUILTINS and any(map(tensorish, arg_types))) \
            or (name in REDUCING_BUILTINS and TENSORS in arg_types):
        return TENSOR, ("MN005", f"{name}() on tensors dispatches torch ops")
    if name in ("enumerate", "zip", "map", "filter", "iter", "next", "reversed"):
        return UNKNOWN, None  # what they yield is not known here
    return NON, None  # len, range, int, ..., exceptions (raise ValueError(...)) and other harmless builtins


def method_call(receiver: object, attr: str, text: str, has_args: bool, config: Config) -> Verdict | None:
    """`text.attr(...)` on a receiver of kind `receiver`; None where the kind alone does not say."""
    if HOOK_METHODS.fullmatch(attr):
        return NON, ("MN004", f"{text}.{attr}() installs a hook that runs outside forward")
    if receiver == SUPER:
        return UNKNOWN, ("MN004", f"super().{attr}() runs the base class's torch path")
    if receiver == MODULE:
        return TENSOR, ("MN004", f"{text}.{attr}() calls into an nn.Module: a torch op")
    allowed = attr in ALLOWED_TENSOR_METHODS | config.allow_tensor_methods
    if tensorish(receiver) or (receiver == UNKNOWN and allowed):
        if not allowed:
            return TENSOR, ("MN004", f"tensor method {text}.{attr}() is a torch op; the forward path may use "
                                     "tensor properties (.shape, .size(), .stride(), ...) and creation only")
        if attr in TENSOR_CREATING_METHODS:
            return TENSOR, None
        return (SHAPE if tensorish(receiver) and attr in ("size", "stride") and not has_args else NON), None
    if receiver == UNKNOWN:
        if attr in _CONTAINER_METHODS or attr in FILE_READ_METHODS:
            return UNKNOWN, None
        return TENSOR, ("MN004", f"{text}.{attr}() looks like a tensor method, which is a torch op")
    return None


def attribute(receiver: object, attr: str, config: Config) -> Verdict:
    """`.attr` read from a receiver of kind `receiver` that is neither a module alias nor an object of a class."""
    if tensorish(receiver):
        if attr in ALLOWED_TENSOR_ATTRIBUTES | ALLOWED_TENSOR_METHODS | config.allow_tensor_methods:
            return (SHAPE if attr == "shape" else NON), None
        return TENSOR, ("MN004", f"tensor attribute .{attr} is a torch op")
    if receiver == UNKNOWN and attr in TENSOR_OP_ATTRIBUTES:
        return TENSOR, ("MN004", f"tensor attribute .{attr} is a torch op")
    if receiver == MODULE:
        return (TENSOR if re.search(r"weight|bias|running_", attr) else UNKNOWN), None
    return (NON if receiver in (NON, SHAPE) else UNKNOWN), None


@functools.lru_cache(maxsize=None)
def _is_torch_function(name: str) -> bool:
    """`torch.relu` is a function; `torch.float32` and `torch.contiguous_format` are values."""
    parts = name.split(".")
    try:
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return parts[-1][:1].islower()
    return callable(obj) and not isinstance(obj, type)
