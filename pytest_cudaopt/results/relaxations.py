"""The relaxations in force: every setting or workdir rule looser than the strict defaults, for the header and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from pytest_cudaopt.suite.settings import BY_NAME

# Settings whose higher value loosens a verdict (1), and those whose lower value does (-1).
_LOOSER = {"atol": 1, "rtol": 1, "min_speedup": -1, "seeds": -1}


def setting_relaxations(settings: Any) -> list[str]:
    """Settings in force that are looser than their defaults, each as one line."""
    found = []
    for name, sign in _LOOSER.items():
        value, default = getattr(settings, name), BY_NAME[name].default
        if (value - default) * sign > 0:
            found.append(f"{name} {value:g} (default {default:g})")
    if settings.allow_ops:
        found.append(f"allow_ops {settings.allow_ops} (ATen ops the op audit lets through)")
    families = getattr(settings, "values", "all")
    if families not in (None, "", "all"):
        from pytest_cudaopt.correctness.values import FAMILIES, parse

        judged = parse(families)
        left = [name for name in FAMILIES if name not in judged]
        found.append(f"values {families} (value families not judged: {', '.join(left)})")
    if settings.nondeterministic:
        found.append("nondeterministic (the two candidate runs compared within tolerance, not bit for bit)")
    if settings.gate != BY_NAME["gate"].default:
        found.append(f"gate {settings.gate} (default {BY_NAME['gate'].default})")
    if getattr(settings, "sandbox", "auto") == "off":
        found.append("sandbox off (the candidate's worker runs without an OS sandbox: it can reach every file, "
                     "process and cache of the user's)")
    if settings.self_test:
        found.append("self_test (a conftest.py may override the fixtures that decide a verdict)")
    margin = getattr(settings, "regression_margin", None)
    if margin is not None and "regression_margin" in BY_NAME and margin > BY_NAME["regression_margin"].default:
        found.append(f"regression_margin {margin:g} (default {BY_NAME['regression_margin'].default:g})")
    return found


def workdir_relaxations(workdir: Path) -> list[str]:
    """The `[tool.cudaopt]` relaxations of one workdir and its non-determinism declaration."""
    from pytest_cudaopt import policy

    config = policy.load_config(Path(workdir))
    found = []
    if config.disable:
        found.append(f"disabled rules {', '.join(sorted(config.disable))}")
    for key in policy.CONFIG_KEYS:
        if key == "disable":
            continue
        values = getattr(config, key.replace("-", "_"), ())
        if values:
            found.append(f"{key} {', '.join(sorted(values))}")
    source = Path(workdir) / "model_new.py"
    if source.is_file() and "CUDAOPT_NONDETERMINISTIC" in source.read_text(encoding="utf-8", errors="replace"):
        found.append("model_new.py declares CUDAOPT_NONDETERMINISTIC")
    return found


def relaxations(settings: Any, workdirs: Iterable[Path]) -> list[str]:
    """Every relaxation in force: settings first, then each workdir's, named by its folder."""
    found = [f"setting {line}" for line in setting_relaxations(settings)]
    for workdir in dict.fromkeys(Path(w).resolve() for w in workdirs):
        found += [f"{workdir}: {line}" for line in workdir_relaxations(workdir)]
    return found
