"""Fixtures of the plugin's self-tests; the helpers behind them are in support.py."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
from pathlib import Path

import pytest
from filelock import FileLock

from pytest_cudaopt.run import zygote as _zygote
from support import CPU_INI, OBJECT_CACHE, PREBUILT_ROOT, copy_cheat, copy_workdir, prebuild, run_pytest, \
    subprocess_env

pytest_plugins = ["pytester"]
# The example workdirs are inputs of these tests, not workdirs of this repo's own run.
collect_ignore = ["workdirs", "policy_gallery"]
TESTS_DIR = Path(__file__).resolve().parent
# Fixtures that compile an extension: their tests get the `slow` marker.
COMPILING_FIXTURES = {"make_workdir", "prebuilt_workdir"}

# Under `pytest -n`, this process is a pytest-xdist worker, and its environment says so; the pytest
# runs the tests start are not workers (pytest-benchmark reads PYTEST_XDIST_WORKER and would turn
# itself off in them), so they must not inherit it.
for _name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
    os.environ.pop(_name, None)

# Every build of the run (the prebuilt copies, the workdirs the tests make, their pytest children)
# goes through the plugin's object cache: the example workdirs share sources (binding.cpp is in
# all of them), and each distinct compile then runs once per run, or once for good on a machine
# that keeps build/. Both or neither: a copy whose children built without it would recompile
# everything, the compile commands being different. It is the judge tests' cache folder's own
# (`--cache-dir JUDGE_CACHE` puts objects there), so a workdir the judge copies builds as its
# prebuilt copy did.
os.environ.setdefault("CUDAOPT_OBJECT_CACHE", str(OBJECT_CACHE))

# The watchdog's waits after `cudaopt_timeout` (5 s for the main thread to leave a hung test,
# then 10 s before faulthandler ends a hang that holds the GIL) are idle time in every hang test
# of the suite; the pytest children this suite starts wait 3 s and 4 s. What the tests check (who
# ends the hang, what is written) does not depend on their length.
os.environ.setdefault("CUDAOPT_WATCHDOG_GRACE_S", "3")
os.environ.setdefault("CUDAOPT_WATCHDOG_BACKSTOP_S", "4")

# Every pytest session of the suite starts a worker for the candidate, and each would import torch
# (about 3 s of CPU here): one zygote per test process forks them instead (run/zygote.py). Its
# address reaches the pytest children through the environment. CUDAOPT_TEST_ZYGOTE=0 runs every
# worker the plain way; tests/test_worker_start.py runs both ways whatever is set.
if os.environ.get("CUDAOPT_TEST_ZYGOTE", "1") != "0" and not os.environ.get(_zygote.ENV):
    os.environ[_zygote.ENV] = f"cudaopt-test-{os.getpid()}-{secrets.token_hex(4)}"
    _ZYGOTE = _zygote.start(os.environ[_zygote.ENV], subprocess_env())

# A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and would pass
# that on to the pytest children whose Ctrl-C handling the tests check. A handler of our own is
# not inherited: those children start with SIGINT's default and install Python's.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def prebuilt_workdir():
    """`prebuilt_workdir(name)`: path of the built copy of tests/workdirs/<name>. Shared by
    every test (do not modify it; use `make_workdir` for a copy of your own)."""
    done: dict[str, Path] = {}

    def get(name: str = "cpu_scale") -> Path:
        if name not in done:
            done[name] = prebuild(name)
        return done[name]

    return get


@pytest.fixture
def make_workdir(tmp_path: Path, prebuilt_workdir):
    """`make_workdir(name="cpu_scale", dest=None)`: a private copy of an example workdir
    whose extension is already built (the build folder is relocatable: a copy whose
    sources are unchanged builds in about a second; a changed kernel recompiles alone)."""

    def make(name: str = "cpu_scale", dest: Path | None = None) -> Path:
        src = prebuilt_workdir(name)
        dest = Path(dest) if dest is not None else tmp_path / name
        with FileLock(str(PREBUILT_ROOT / f"{name}.lock")):
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        return dest

    return make


@pytest.fixture
def cheat(pytester, prebuilt_workdir):
    """`cheat(variant)`: pytester.path/wd, the built cheat_kernels workdir with that model_new.py
    (support.copy_cheat), and a pytest.ini that judges it on the CPU."""

    def make(variant: str = "honest") -> Path:
        pytester.makeini(CPU_INI)
        return copy_cheat(prebuilt_workdir, pytester.path / "wd", variant)

    return make


# The helpers as fixtures too (`def test_x(pytester, run_pytest): run_pytest(pytester, ...)`).
@pytest.fixture(name="run_pytest")
def _run_pytest_fixture():
    return run_pytest


@pytest.fixture(name="copy_workdir")
def _copy_workdir_fixture():
    return copy_workdir


@pytest.fixture(name="subprocess_env")
def _subprocess_env_fixture() -> dict[str, str]:
    return subprocess_env()


# The longest modules (measured, `--durations`, benchmarks/results/2026-12-04-test-suite-time.md)
# run first: pytest-xdist's
# loadscope hands modules out in collection order under --no-loadscope-reorder (.ci/run), and a
# long one handed out last keeps one worker busy while the others have nothing left.
LONGEST_FIRST = ("test_hangs", "test_correctness_verdict", "test_perf_verdict", "test_contract", "test_build",
                 "test_interruptions", "test_sandbox", "test_judge", "test_gate", "test_exploits", "test_policy",
                 "test_memsafety", "test_judge_gallery", "test_scaffold")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if COMPILING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path))
        if path.parent not in (TESTS_DIR, TESTS_DIR / "exploits"):
            return -1  # the workdir's own items (model_new.py) first, as before
        return LONGEST_FIRST.index(path.stem) if path.stem in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's own order is kept


