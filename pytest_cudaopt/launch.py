"""How to start pytest with the plugin: through the installed package's pytest11 entry point, or `-p` from a checkout."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Sequence

PLUGIN = "pytest_cudaopt.plugin"


@lru_cache(maxsize=None)
def entry_point_installed() -> bool:
    """True when the installed package's pytest11 entry point loads the plugin by itself."""
    from importlib.metadata import entry_points

    return any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))


def plugin_args() -> list[str]:
    """`-p pytest_cudaopt.plugin`, unless the entry point loads it (naming it both ways registers it twice)."""
    return [] if entry_point_installed() else ["-p", PLUGIN]


def conftest_plugins() -> list[str]:
    """`pytest_plugins` of a workdir's conftest.py: the plugin, unless something imported it already."""
    return [] if PLUGIN in sys.modules else [PLUGIN]


def run_pytest(args: Sequence[str], plugins: Sequence[object] = ()) -> int:
    """`pytest.main` in this process with the plugin loaded; returns pytest's exit status."""
    import pytest

    return int(pytest.main([*plugin_args(), *args], plugins=list(plugins)))


def pytest_command(args: Sequence[str], python: str | None = None) -> list[str]:
    """The command line of a pytest process with the plugin loaded."""
    return [python or sys.executable, "-m", "pytest", *plugin_args(), *args]


def strict_sandbox(pytest_args: Sequence[str], env: dict | None = None, ini: dict | None = None) -> list[str]:
    """`--cudaopt-sandbox=require` for a run on a GPU runner (`cudaopt gate`, `cudaopt judge`) where neither its
    pytest arguments, `env` nor the workdir's ini (`ini`) set the sandbox or put the workdir on the CPU."""
    import os

    env = os.environ if env is None else env
    ini = ini or {}
    args = list(pytest_args)
    named = any(a.startswith("--cudaopt-sandbox") for a in args) or env.get("CUDAOPT_SANDBOX") \
        or ini.get("cudaopt_sandbox")
    cpu = any(a == "--cudaopt-device=cpu" or (a == "--cudaopt-device" and args[i + 1:i + 2] == ["cpu"])
              for i, a in enumerate(args)) or env.get("CUDAOPT_DEVICE") == "cpu" or ini.get("cudaopt_device") == "cpu"
    return [] if named or cpu else ["--cudaopt-sandbox=require"]
