"""Every cudaopt setting in one table, resolved in one order: command line, environment, ini, default."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping


class SettingError(ValueError):
    """A setting has a value that cannot be used; the message names where it came from."""


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}; got {text!r}")
        return text

    return parse


def _number(kind: Callable[[str], Any], what: str,
            ok: Callable[[Any], bool] = lambda value: True) -> Callable[[str], Any]:
    """A parser of `kind` whose complaint is in the setting's words, not Python's."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
            good = ok(value)
        except (TypeError, ValueError):
            good = False
        if not good:
            raise ValueError(f"expected {what}, got {text!r}") from None
        return value

    return parse


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    return _number(kind, "a positive integer" if kind is int else "a positive number",
                   lambda value: math.isfinite(value) and value > 0)


_integer = _number(int, "an integer")
_non_negative = _number(float, "a finite number >= 0", lambda value: math.isfinite(value) and value >= 0)


def _families(text: str) -> str:
    """The `values` setting, checked (correctness/values.py names the families) and kept as text."""
    from pytest_cudaopt.correctness.values import parse

    parse(text)
    return str(text).strip().lower()


@dataclass(frozen=True)
class Option:
    """One setting: `--cudaopt-<name>`, `CUDAOPT_<NAME>`, `cudaopt_<name>` in the ini file."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    cli: bool = True
    ini: bool = True

    @property
    def flag(self) -> str:
        return "--cudaopt-" + self.name.replace("_", "-")

    @property
    def is_flag(self) -> bool:
        """A true/false setting: a flag on the command line, turned off with `--cudaopt-no-<name>`."""
        return self.parse is _bool

    @property
    def off_flag(self) -> str:
        return "--cudaopt-no-" + self.name.replace("_", "-")

    @property
    def ini_key(self) -> str:
        return "cudaopt_" + self.name

    @property
    def env_var(self) -> str:
        return "CUDAOPT_" + self.name.upper()

    @property
    def full_help(self) -> str:
        return f"{self.help} (env {self.env_var}; default: {self.default})"


OPTIONS: tuple[Option, ...] = (
    # where and how the workdir runs
    Option("device", _choice("cuda", "cpu"), "cuda",
           "device the workdir's inputs live on; 'cpu' for workdirs whose kernels are C++ CPU code"),
    Option("timeout", _positive(float), 600.0,
           "seconds one generated test may run before it is reported as hung"),
    # correctness
    Option("atol", _non_negative, 1e-2,
           "absolute tolerance of the correctness comparison (0: none; integer/bool outputs are always exact)"),
    Option("rtol", _non_negative, 1e-2, "relative tolerance of the correctness comparison (0: none)"),
    Option("max_rel_error", _positive(float), 1e-2,
           "most relative L2 error vs a float64 run of the reference a candidate may have, whatever atol allows"),
    Option("seeds", _positive(int), 3, "number of secret seeds for the canonical inputs of get_inputs()"),
    Option("seed", _integer, None,
           "replay: use this seed instead of a secret one (printed by every failure)", ini=False),
    Option("profile", _choice("ci", "thorough"), "ci",
           "Hypothesis profile for the drawn shapes: 'ci' (explicit cases past the defaults, then a modest count drawn from the session seed) or 'thorough'"),
    Option("max_examples", _positive(int), None,
           "override the number of Hypothesis-drawn shapes of the chosen profile"),
    Option("max_elements", _positive(int), None,
           "most input elements a drawn shape may hold (None: twice the canonical inputs', at least 4096)"),
    Option("case", str, None,
           "replay one drawn shape instead of drawing, e.g. 'batch_size=3,dim=17' (printed by every failure)",
           ini=False),
    Option("values", _families, "all",
           "the value families judged besides model.py's own values: 'all', 'none', or some of "
           "spikes,heavy,large,shifted,small, comma separated (fewer is a relaxation: for inputs bounded "
           "by construction)"),
    Option("nondeterministic", _bool, False,
           "compare two candidate runs within the tolerance instead of bit for bit (kernels with atomics); "
           "model_new.py can say so with CUDAOPT_NONDETERMINISTIC = True"),
    Option("scratch_limit", _positive(float), 8.0,
           "GiB ModelNew's process may write to its scratch folder, the one it may write (temporary files and "
           "printed output together); past it the process is killed and its test fails"),
    Option("allow_ops", str, "",
           "ATen ops ModelNew.forward may run besides allocation, creation, views and metadata, "
           "comma separated, e.g. 'aten::copy_,aten::as_strided'"),
    # memory safety
    Option("memsafety_timeout", _positive(float), 300.0,
           "seconds the memory-safety item's compute-sanitizer runs may take together (memcheck first; "
           "racecheck and initcheck while time is left), within cudaopt_timeout"),
    Option("memsafety_case", str, None,
           "the case the memory-safety item runs, e.g. 'batch_size=1,seq_len=130' (default: the smallest "
           "of the canonical and the explicit cases)"),
    Option("compute_sanitizer", str, None,
           "path of compute-sanitizer (default: PATH, then the CUDA toolkit's bin/)"),
    # speed
    Option("min_speedup", _positive(float), 1.05,
           "the perf gate: median(custom) <= median(torch.compile) / min_speedup"),
    Option("gate", _choice("compile", "precision-matched"), "compile",
           "baseline the perf gate compares with; 'precision-matched' is torch.compile with TF32 allowed"),
    Option("compile_mode", str, "default",
           "torch.compile mode of the baseline, e.g. max-autotune-no-cudagraphs"),
    Option("compile_backend", str, "inductor",
           "torch.compile backend of the baselines; 'eager' (Dynamo only, no code generation) keeps CPU self-tests fast"),
    Option("warmup", _positive(float), 1.0, "seconds of warm-up per contender before timing"),
    Option("far_slower", _non_negative, 10.0,
           "the custom path fails untimed when its fastest warm-up call (of the second half) is more than this many "
           "times the gate baseline's slowest: its gate cannot pass (0: always timed in full)"),
    Option("max_time", _positive(float), 20.0, "seconds of timing per perf test before it stops"),
    Option("target_rse", _positive(float), 0.005,
           "stop timing once the relative standard error of every median is below this"),
    Option("cuda_graph", _bool, False, "time each contender as CUDA-graph replays (for tiny kernels)"),
    Option("clock", _choice("device", "latency"), "device",
           "the figure the perf gate compares: 'device' (CUDA events with the host ahead of the GPU) or "
           "'latency' (each call from an idle device, launches included); both are reported"),
    Option("trace", _bool, True,
           "profile one call of each contender (torch.profiler, CUDA activity): kernels, summed kernel "
           "time, and stream escapes at any duration"),
    Option("min_runs", _positive(int), 50,
           "timed runs per contender before the stop rule may end the timing (utils.profiling --iters sets it)"),
    Option("report", str, None, "write the verdicts as JSON to this path", ini=False),
    Option("baseline_workdir", str, None,
           "a checkout of the target branch's workdir: its ModelNew is timed as one more contender and "
           "the candidate fails when slower than it by more than regression_margin", ini=False),
    Option("regression_margin", _positive(float), 0.03,
           "how much slower than the baseline workdir's ModelNew the candidate may be, as a fraction (0.03 is 3 percent)"),
    Option("correctness_report", str, None,
           "the JSON report of an earlier correctness run of this workdir: its precision tiers count toward the perf "
           "item's workdir tier as the session's own do (`cudaopt judge` names its check stage's)", ini=False),
    Option("ci_gate", _bool, False,
           "the CI gate: items run policy, correctness, perf; a GPU item that would be skipped fails",
           ini=False),
    Option("sandbox", _choice("require", "auto", "off"), "auto",
           "the OS sandbox of the candidate's worker process (Landlock, seccomp, no capabilities): 'auto' applies "
           "what the kernel offers and reports what held, 'require' refuses to run a candidate that Landlock cannot "
           "confine, 'off' runs it unconfined (a relaxation)"),
    # build
    Option("build_dir", str, None,
           "root of the extension build folders, relative to the workdir; unset: <workdir>/build/cudaopt"),
    Option("cxx_flags", str, "", "extra host compiler flags for the extension, space separated"),
    Option("nvcc_flags", str, "", "extra nvcc flags for the extension, space separated"),
    Option("object_cache", str, "user",
           "a folder of compiled objects shared by workdirs: a source compiled before with the same "
           "command, toolchain, source bytes and headers is copied from there instead of compiled "
           "(build/objcache.py), so a new workdir's binding.cpp is not compiled again; 'user': the per-user "
           "cache $XDG_CACHE_HOME/cudaopt/objects (else ~/.cache/cudaopt/objects); 'off': no cache"),
    # trust
    Option("self_test", _bool, False,
           "let a conftest.py implement the hooks that decide a verdict (pytest_cudaopt_perf_clock), for the "
           "plugin's own tests; never read from an ini file, and the environment variable only as it "
           "was before any conftest.py ran", ini=False),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def user_cache_dir() -> Path:
    """Where this user's shared caches live: $XDG_CACHE_HOME/cudaopt, else ~/.cache/cudaopt."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudaopt"


def object_cache_dir(value: str | None) -> Path | None:
    """The folder the `object_cache` setting names: 'user' the per-user one, 'off' (or empty) none."""
    if not value or str(value).strip().lower() == "off":
        return None
    if value == "user":
        return (user_cache_dir() / "objects").resolve()
    return Path(value).expanduser().resolve()


# Settings that change what a correctness case computes or how it is judged: a replay command
# carries the ones that differ from their defaults, so that it judges the case the same way.
REPLAYED = ("device", "atol", "rtol", "max_rel_error", "nondeterministic", "allow_ops", "max_elements", "values")


def replay_args(settings: Any) -> str:
    """` --cudaopt-device=cpu ...`: the REPLAYED settings that differ from their defaults."""
    import shlex

    parts = []
    for name in REPLAYED:
        option, value = BY_NAME[name], getattr(settings, name)
        if value == option.default or value in (None, ""):
            continue
        if option.is_flag:
            parts.append(option.flag if value else option.off_flag)
        else:
            parts.append(f"{option.flag}={shlex.quote(f'{value:g}' if isinstance(value, float) else str(value))}")
    return "".join(f" {p}" for p in parts)


def closest(name: str, known: Iterable[str], prefix: str = "") -> str:
    """" (did you mean X?)" for the known name closest to a misspelled one (without `prefix`), or ""."""
    stems = {k.removeprefix(prefix): k for k in known}
    found = difflib.get_close_matches(name.removeprefix(prefix), list(stems), n=1, cutoff=0.6)
    return f" (did you mean {stems[found[0]]}?)" if found else ""


def ini_table(path: Path) -> dict[str, Any] | None:
    """The pytest options of an ini file, None when the file holds no pytest section."""
    import configparser

    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10: pytest reads it with tomli; so may we
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError:
                return None
        with path.open("rb") as handle:
            table = tomllib.load(handle).get("tool", {}).get("pytest")
        if not isinstance(table, dict):
            return None
        return dict(table.get("ini_options", table))
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    for section in ("pytest", "tool:pytest"):
        if parser.has_section(section):
            return dict(parser[section])
    return {} if path.name in ("pytest.ini", ".pytest.ini") else None


def ini_keys(inipath: Any, overrides: Iterable[str] = ()) -> list[str]:
    """The keys of pytest's ini file and of `-o key=value` overrides."""
    keys = [str(o).split("=", 1)[0] for o in overrides]
    path = None if inipath is None else Path(inipath)
    table = ini_table(path) if path is not None and path.is_file() else None
    return keys + list(table or {})


# In the order pytest looks for them in each folder, from the workdir up.
_INI_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def workdir_ini(workdir: Path) -> tuple[Path | None, dict[str, Any]]:
    """The ini file `pytest WORKDIR/model_new.py` reads, and its options."""
    for folder in (Path(workdir).resolve(), *Path(workdir).resolve().parents):
        for name in _INI_NAMES:
            path = folder / name
            table = ini_table(path) if path.is_file() else None
            if table is not None:
                return path, table
    return None, {}


def workdir_settings(workdir: Path) -> "Settings":
    """The settings a command outside pytest (`cudaopt build`) uses for `workdir`."""
    path, table = workdir_ini(workdir)
    unknown = unknown_ini_keys(table)
    if unknown:
        raise SettingError(f"unknown ini option {'; '.join(unknown)} in {path}")
    return Settings.resolve_all(ini=lambda name: table.get(BY_NAME[name].ini_key))


def unknown_ini_keys(keys: Iterable[str]) -> list[str]:
    """The `cudaopt_*` keys of an ini file that name no setting, each with the closest one."""
    known = [option.ini_key for option in OPTIONS if option.ini]
    return [f"{key}{closest(key, known, 'cudaopt_')}" for key in keys
            if key.startswith("cudaopt_") and key not in known]


def unknown_flags(args: Iterable[str]) -> list[str]:
    """The `--cudaopt-*` arguments that name no option, each with the closest one."""
    known = [option.flag for option in OPTIONS if option.cli]
    known += [option.off_flag for option in OPTIONS if option.cli and option.is_flag]
    flags = (str(arg).split("=", 1)[0] for arg in args)
    return [f"{flag}{closest(flag, known, '--cudaopt-')}" for flag in flags
            if flag.startswith("--cudaopt-") and flag not in known]


def resolve(name: str, *, cli: Any = None, ini: Any = None, env: Mapping[str, str] | None = None) -> Any:
    """The value of setting `name`: command line, then environment, then ini, then default."""
    option = BY_NAME[name]
    env = os.environ if env is None else env
    for source, raw in (
        (option.flag, cli),
        (f"environment variable {option.env_var}", env.get(option.env_var)),
        (f"ini option {option.ini_key}", ini),
    ):
        if raw is None or raw == "":
            continue
        if not isinstance(raw, str):
            return raw
        try:
            return option.parse(raw)
        except ValueError as exc:
            raise SettingError(f"{source}={raw!r}: {exc}") from None
    return option.default


class Settings:
    """Resolved settings, read as attributes (`settings.atol`)."""

    def __init__(self, values: Mapping[str, Any]):
        unknown = set(values) - set(BY_NAME)
        if unknown:
            raise SettingError(f"unknown cudaopt settings: {', '.join(sorted(unknown))}")
        self._values = {name: values.get(name, BY_NAME[name].default) for name in BY_NAME}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @classmethod
    def resolve_all(cls, cli: Callable[[str], Any] = lambda name: None, ini: Callable[[str], Any] = lambda name: None,
                    env: Mapping[str, str] | None = None) -> "Settings":
        return cls({option.name: resolve(option.name, cli=cli(option.name) if option.cli else None,
                                         ini=ini(option.name) if option.ini else None, env=env)
                    for option in OPTIONS})
