"""Hypothesis strategies for a workdir's input shapes: declared in model.py, else inferred from its constants."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch
from hypothesis import HealthCheck, Phase, settings as hsettings, strategies as st
from hypothesis.strategies import SearchStrategy

from pytest_cudaopt.correctness import derived
from pytest_cudaopt.primitives import memory

DECLARATION = "CUDAOPT_SHAPES"
ENTRY_POINTS = ("get_inputs", "get_init_inputs")
# Edge sizes mixed into every inferred constant: 1, primes, sizes just off multiples of 32 and 128.
EDGE_SIZES = (1, 2, 3, 5, 7, 13, 17, 31, 33, 61, 67, 97, 127, 129, 191, 251, 257, 509, 1021)
GROWTH = 2  # a drawn case may hold this many times the canonical inputs' elements (see max_elements)
SMALL = 4  # a constant this small only get_init_inputs reads may be a dimension (`dim = 1`): 0, -1, ... too

# model.py is the owner's (locked): where the shapes must be declared, who does it, and how.
OWNER_DECLARES = (f"the workdir's owner declares the shapes with {DECLARATION} in model.py (see docs/verdicts.md) "
                  f"and records the change with `cudaopt init --lock-only`")
HANDFUL = 5  # fewer distinct valid drawn shapes than this: the item says so instead of passing quietly

SUPPRESSED = (HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
              HealthCheck.large_base_example)
PROFILES = {"ci": 25, "thorough": 300}  # name -> drawn shapes
for _name, _count in PROFILES.items():
    hsettings.register_profile(f"cudaopt-{_name}", max_examples=_count, derandomize=False, deadline=None, database=None,
                               suppress_health_check=SUPPRESSED, report_multiple_bugs=False, print_blob=False)


class ShapeError(ValueError):
    """model.py declares shapes in a form that cannot be used; the message says why."""


# Profiles Hypothesis loads by itself: "default", and "ci" wherever a CI variable is set (its derandomised draws would
# make every workdir's shapes known in advance). Choosing them with --hypothesis-profile is not told apart from that.
_AUTOMATIC_PROFILES = ("default", "ci")


def hypothesis_settings(profile: str, max_examples: int | None = None) -> hsettings:
    """A cudaopt profile's Hypothesis settings; --hypothesis-profile wins over it, `max_examples` over both."""
    parent = hsettings.get_profile(f"cudaopt-{profile}")
    if hsettings.get_current_profile_name() not in _AUTOMATIC_PROFILES:  # --hypothesis-profile=NAME
        parent = hsettings.default
    # No explain phase: it traces the item's own code, which says nothing about a kernel, and costs a run.
    phases = tuple(phase for phase in parent.phases if phase is not Phase.explain)
    return hsettings(parent, phases=phases, **({} if max_examples is None else {"max_examples": max_examples}))


def _names_read(func: Callable, module: types.ModuleType, seen: set[int]) -> set[str]:
    """Global names read by `func`, its nested code and the module-level functions it calls."""
    code = getattr(func, "__code__", None)
    if code is None or id(code) in seen:
        return set()
    seen.add(id(code))
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    for name in list(names):
        value = module.__dict__.get(name)
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            names |= _names_read(value, module, seen)
    return names


def infer_constants(module: types.ModuleType, follow_derived: bool = True) -> dict[str, int]:
    """The module-level positive int constants (and tuples of them) that get_inputs/get_init_inputs
    read, in the module's order; a derived constant is not drawn: reading it reads its sources."""
    read: set[str] = set()
    seen: set[int] = set()
    for entry in ENTRY_POINTS:
        func = module.__dict__.get(entry)
        if callable(func):
            read |= _names_read(func, module, seen)
    following = derived.definitions(module) if follow_derived else []
    for item in reversed(following):  # `hidden = 4 * dim` read means dim is read
        if item.name in read:
            read |= item.sources
    read -= {item.name for item in following}
    found: dict[str, int] = {}
    for name, value in module.__dict__.items():
        if name not in read:
            continue
        if type(value) is int and value > 0:
            found[name] = value
        elif isinstance(value, tuple) and value and all(type(v) is int and v > 0 for v in value):
            # input_shape = (4096, 8192): each element varies on its own, as input_shape[0] ...
            found.update({f"{name}[{i}]": v for i, v in enumerate(value)})
    return found


def _element(key: str) -> tuple[str, int | None]:
    """'input_shape[1]' -> ('input_shape', 1); 'dim' -> ('dim', None)."""
    if key.endswith("]") and "[" in key:
        name, _, index = key[:-1].partition("[")
        if index.isdigit():
            return name, int(index)
    return key, None


@contextlib.contextmanager
def applied(module: types.ModuleType, constants: Mapping[str, int]) -> Iterator[None]:
    """Set the module's constants to `constants`, and those derived from them, for the duration."""
    values: dict[str, Any] = {}
    missing = []
    for key, value in constants.items():
        name, index = _element(key)
        current = values.get(name, module.__dict__.get(name))
        if name not in module.__dict__ or (index is not None and not (
                isinstance(current, tuple) and index < len(current))):
            missing.append(key)
        elif index is None:
            values[name] = value
        else:
            values[name] = current[:index] + (value,) + current[index + 1:]
    if missing:
        raise ShapeError(f"{_file(module)} defines no constant {', '.join(missing)}")
    values.update(derived.recompute(module, values))
    saved = {name: module.__dict__[name] for name in values}
    module.__dict__.update(values)
    try:
        yield
    finally:
        module.__dict__.update(saved)


def _file(module: types.ModuleType) -> str:
    return getattr(module, "__file__", None) or module.__name__


def signed_constants(module: types.ModuleType, defaults: Mapping[str, int]) -> set[str]:
    """The inferred constants that may be dimension indices: at most SMALL, read by
    get_init_inputs and not by get_inputs (`dim = 1` handed to the constructor)."""
    init, inputs = (module.__dict__.get(entry) for entry in ENTRY_POINTS[::-1])
    init_only = (_names_read(init, module, set()) if callable(init) else set()) - (
        _names_read(inputs, module, set()) if callable(inputs) else set())
    return {name for name, value in defaults.items() if name in init_only and value <= SMALL}


def around(default: int, signed: bool = False) -> SearchStrategy[int]:
    """Sizes around a constant's default: the default (what failing cases shrink towards), edge
    sizes, and any size from 1 to the default; with `signed` (a dimension index) also -(default + 1)..0."""
    upper = max(2 * default, 8)
    edges = {e for e in EDGE_SIZES if e <= upper}
    edges |= {e for e in (default - 1, default + 1, default // 2 + 1, 2 * default - 1) if 1 <= e <= upper}
    if signed:
        edges |= set(range(-(default + 1), 1))
    edges.discard(default)
    return st.one_of(st.just(default), st.sampled_from(sorted(edges)),
                     st.integers(min_value=1, max_value=max(default, 2)))


def _declared_values(name: str, spec: Any, where: str) -> SearchStrategy[int]:
    if isinstance(spec, SearchStrategy):
        return spec
    if isinstance(spec, bool):
        raise ShapeError(f"{where}: {name!r}: expected (low, high), a list, a range or a strategy; got {spec!r}")
    if isinstance(spec, int):
        return st.just(spec)
    if isinstance(spec, range):
        if len(spec) == 0:
            raise ShapeError(f"{where}: {name!r}: {spec!r} is empty")
        return st.sampled_from(spec)
    if isinstance(spec, tuple) and len(spec) == 2 and all(type(v) is int for v in spec):
        low, high = spec
        if low > high:
            raise ShapeError(f"{where}: {name!r}: low {low} > high {high}")
        return st.integers(min_value=low, max_value=high)
    if isinstance(spec, (list, tuple)) and spec and all(type(v) is int for v in spec):
        return st.sampled_from(list(spec))
    raise ShapeError(f"{where}: {name!r}: expected (low, high) (inclusive), a list of values, a range "
                     f"or a Hypothesis strategy; got {spec!r}")


def declared_strategy(module: types.ModuleType) -> SearchStrategy[dict[str, int]] | None:
    """The strategy of dicts {constant: value} that model.py declares in CUDAOPT_SHAPES, else None."""
    if DECLARATION not in module.__dict__:
        return None
    spec = module.__dict__[DECLARATION]
    where = f"{_file(module)}: {DECLARATION}"
    if callable(spec) and not isinstance(spec, SearchStrategy):
        try:
            spec = spec()
        except Exception as exc:
            raise ShapeError(f"{where}() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(spec, SearchStrategy):
            raise ShapeError(f"{where}() must return a Hypothesis strategy of dicts, got {type(spec).__name__}")
    if isinstance(spec, SearchStrategy):
        return spec.map(lambda d: _checked(module, d, where))
    if not isinstance(spec, Mapping):
        raise ShapeError(f"{where} must be a dict {{constant: values}} or a function returning a "
                         f"strategy; got {type(spec).__name__}")
    spec = _checked(module, spec, where, "names")
    return st.fixed_dictionaries({name: _declared_values(name, values, where) for name, values in spec.items()})


def _checked(module: types.ModuleType, draw: Any, where: str, verb: str = "drew") -> dict[str, Any]:
    if not isinstance(draw, Mapping):
        raise ShapeError(f"{where} must draw dicts {{constant: value}}, drew {draw!r}")
    unknown = [name for name in draw if name not in module.__dict__]
    if unknown:
        raise ShapeError(f"{where} {verb} {', '.join(map(repr, unknown))}, which {_file(module)} does not define")
    return dict(draw)


@dataclass
class ShapeSpace:
    """Where the drawn shapes come from and how large they may be."""

    strategy: SearchStrategy[dict[str, int]] | None
    defaults: dict[str, int]
    source: str                          # one line for the report and the skip reason
    declared: bool = False
    max_elements: int | None = None      # total input elements a drawn case may hold
    canonical_elements: int = 0
    meta_usable: bool = True             # the reference runs on the meta device
    meta_note: str = ""
    canonical_bytes: int = 0             # inputs + outputs of the canonical case
    canonical_work: int = 0              # the reference's intermediates there (MetaCheck.work_bytes)
    cap_note: str = ""                   # set when the size cap shrank to fit device memory
    derived: dict[str, str] = field(default_factory=dict)  # name -> expression: follows the drawn values

    def derived_note(self) -> str:
        """'bias_shape = (out_features,) follow the drawn values', or ""."""
        derived = "; ".join(f"{k} = {v}" for k, v in self.derived.items())
        return f"{derived} follow the drawn values" if derived else ""


def shape_space(module: types.ModuleType, max_elements: int | None = None, free_bytes: int | None = None) -> ShapeSpace:
    """The drawn-shape space of a reference module; with `free_bytes` the size cap shrinks to fit one case."""
    from pytest_cudaopt.primitives.memory import cap_max_elements

    declared = declared_strategy(module)
    defaults = infer_constants(module)
    canonical = check_on_meta(module, {})
    space = ShapeSpace(strategy=None, defaults=defaults, source="",
                       meta_usable=canonical.valid, meta_note=canonical.reason, canonical_elements=canonical.elements,
                       canonical_bytes=canonical.input_bytes + canonical.output_bytes,
                       canonical_work=canonical.work_bytes)
    if canonical.valid:
        if max_elements is None:
            max_elements = max(GROWTH * canonical.elements, 4096)
        max_elements, space.cap_note = cap_max_elements(max_elements, canonical.elements,
                                                        space.canonical_bytes, free_bytes)
    space.max_elements = max_elements
    space.derived = {item.name: item.text for item in derived.definitions(module)}
    if declared is not None:
        spec = module.__dict__[DECLARATION]
        if isinstance(spec, Mapping) and not spec:
            space.source = f"{_file(module)} declares {DECLARATION} = {{}} (no drawn shapes)"
            return space
        space.strategy, space.declared = declared, True
        space.source = f"declared by {DECLARATION} in {_file(module)}"
        return space
    if not defaults:
        space.source = (f"{_file(module)}: get_inputs/get_init_inputs read no module-level int constants "
                        f"to vary; {OWNER_DECLARES}")
        return space
    signed = signed_constants(module, defaults)
    space.strategy = st.fixed_dictionaries({name: around(value, name in signed) for name, value in defaults.items()})
    space.source = "inferred from " + ", ".join(f"{k}={v}" for k, v in defaults.items())
    if space.derived:
        space.source += f" ({space.derived_note()})"
    return space


@dataclass
class MetaCheck:
    valid: bool
    reason: str = ""
    elements: int = 0                                # total elements of the tensor inputs
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    input_bytes: int = 0                             # bytes of the tensor inputs
    output_bytes: int = 0                            # bytes of the reference's tensor outputs
    work_bytes: int = 0                              # its intermediates at their peak, beyond the outputs


# check_on_meta's answers, per reference module, constants and the module's plain values as they are (a case's
# constants may be applied already): a session asks the same one again and again (each canonical case, the shape
# space, the memory allowance), and a KernelBench level-3 model takes 1.5 s or more on meta.
_meta_answers: "weakref.WeakKeyDictionary[types.ModuleType, dict[tuple, MetaCheck]]" = weakref.WeakKeyDictionary()
_PLAIN = (int, float, bool, str, tuple, type(None))


def check_on_meta(module: types.ModuleType, constants: Mapping[str, int]) -> MetaCheck:
    """`run_on_meta`, once per module, constants and module values (a copy of the answer each time)."""
    try:
        now = tuple((k, v) for k, v in vars(module).items() if not k.startswith("__") and isinstance(v, _PLAIN))
        key = (tuple(sorted(constants.items())), now)
        hash(key)
        found = _meta_answers.setdefault(module, {})
    except TypeError:   # values that cannot be a key, or a module without weak references: not kept
        return run_on_meta(module, constants)
    if key not in found:
        found[key] = run_on_meta(module, constants)
    return dataclasses.replace(found[key], shapes=list(found[key].shapes))


def run_on_meta(module: types.ModuleType, constants: Mapping[str, int]) -> MetaCheck:
    """Run the reference with `constants` applied on the meta device (no memory, no compute). torch.distributions
    checks its arguments' values (`.item()`), which meta tensors lack: off for the run (KernelBench L1-94's Pareto)."""
    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        with applied(module, constants), torch.device("meta"), torch.no_grad():
            init = module.get_init_inputs()
            model = module.Model(*init)
            inputs = module.get_inputs()
            inputs = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs]
            model.eval()
            with memory.Intermediates([*inputs, *model.parameters(), *model.buffers()]) as held:
                outputs = model(*inputs)
    except ShapeError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return MetaCheck(False, f"{type(exc).__name__}: {first}"[:300])
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
    from pytest_cudaopt.primitives.tensors import nbytes

    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    output_bytes = nbytes(outputs)
    return MetaCheck(True, "", sum(x.numel() for x in tensors), [tuple(x.shape) for x in tensors],
                     nbytes(list(inputs)), output_bytes, max(held.peak - output_bytes, 0))


@dataclass
class Explicit:
    """The cases every inferred-shape run judges before drawing (`explicit_cases`)."""

    cases: list[dict[str, int]] = field(default_factory=list)
    never_above: list[str] = field(default_factory=list)   # no valid value above the default fits
    # Constants past their defaults at once (as many as stay valid together): a kernel wrong only where two
    # sizes are off its tuning at once (an odd batch with a wide row) passes every one-at-a-time case.
    combined: list[dict[str, int]] = field(default_factory=list)


def _steps(default: int, up: bool, signed: bool = False) -> list[int]:
    """Values to try past a default: above it (`up`) or below it, smallest first."""
    steps = {1, 2, 3, 4, 5, 7, 8} | {max(1, default // k) for k in (64, 32, 16, 8, 4, 2, 1)}
    if up:
        return sorted(default + step for step in steps)
    if signed:  # a dimension index: -(default + 1) .. 0 (`dim = 1` of a 2-d input: -2 is dim 0)
        steps |= set(range(-(default + 1), 1))
    return sorted(v for v in steps if v < default)


def explicit_cases(module: types.ModuleType, space: "ShapeSpace") -> Explicit:
    """Per inferred constant, the others at their defaults: the first valid value above its default within
    `space.max_elements`, and the smallest valid value; then as many values above as stay valid together."""
    found = Explicit()
    if space.declared or not space.meta_usable or not space.defaults:
        return found

    def fits(case: dict[str, int]) -> bool:
        check = check_on_meta(module, case)
        return check.valid and (not space.max_elements or check.elements <= space.max_elements)

    def first(name: str, default: int, values: list[int]) -> dict[str, int] | None:
        # Constants with the same default are often tied (out_channels and bias_shape[0]):
        # where changing one alone is invalid, they change together.
        tied = [k for k, d in space.defaults.items() if d == default]
        for v in values:
            for change in ({name: v}, {k: v for k in tied}) if len(tied) > 1 else ({name: v},):
                case = {**space.defaults, **change}
                if fits(case):
                    return case
        return None

    together = dict(space.defaults)
    signed = signed_constants(module, space.defaults)
    for name, default in space.defaults.items():
        above = first(name, default, _steps(default, True))
        if above is None:
            found.never_above.append(name)
        else:
            if above not in found.cases:
                found.cases.append(above)
            # Joined to the others' where the result stays valid (n_head 5 would not divide n_embd 68).
            candidate = {**together, **{k: v for k, v in above.items() if v != space.defaults[k]}}
            if fits(candidate):
                together = candidate
        smallest = first(name, default, _steps(default, False, name in signed))
        if smallest is not None and smallest not in found.cases:
            found.cases.append(smallest)
    if together != space.defaults and together not in found.cases:
        found.combined.append(together)
    return found


def parse_case(text: str) -> dict[str, int]:
    """`--cudaopt-case='batch_size=3,dim=17'` -> {"batch_size": 3, "dim": 17}."""
    constants: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ShapeError(f"--cudaopt-case: expected name=value, got {part!r}")
        try:
            constants[name.strip()] = int(value)
        except ValueError:
            raise ShapeError(f"--cudaopt-case: {name.strip()}: expected an int, got {value!r}") from None
    return constants


def format_case(constants: Mapping[str, int]) -> str:
    """{"batch_size": 3, "dim": 17} -> 'batch_size=3,dim=17' (the --cudaopt-case form)."""
    return ",".join(f"{k}={v}" for k, v in constants.items())
