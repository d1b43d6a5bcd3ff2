"""Shared helpers of the plugin's self-tests: pytest in a subprocess with the plugin loaded, example workdirs."""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from filelock import FileLock

from pytest_cudaopt.cli import entry_point_installed

pytest_plugins = ["pytester"]

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKDIRS = Path(__file__).resolve().parent / "workdirs"
TEMPLATES = REPO_ROOT / "pytest_cudaopt" / "templates"
FIXED_FILES = ("binding.cpp", "binding_registry.h")
# Files that several example workdirs share, kept once in tests/workdirs/_shared/ and added to
# the copies of the workdirs named here (a workdir's own file at that path wins).
SHARED = WORKDIRS / "_shared"
SHARED_FILES = {
    "model.py": ("cheat_kernels", "cpu_scale", "cuda_cheats", "cuda_scale", "registry_forms", "upstream_scale"),
    "kernels/scale.cpp": ("cpu_scale", "registry_forms", "upstream_scale"),
    "kernels/scale_binding.cpp": ("cpu_scale", "upstream_scale"),
}
# Built copies of tests/workdirs/<name>, kept between runs so that a test that copies a
# workdir starts from objects that are up to date (every torch binding costs tens of
# seconds to compile). Ignored by git (/build/).
PREBUILT_ROOT = REPO_ROOT / "build" / "test-workdirs"
# Fixtures that compile an extension: their tests get the `slow` marker.
COMPILING_FIXTURES = {"make_workdir", "prebuilt_workdir"}

# The example workdirs are inputs of these tests, not workdirs of this repo's own run.
collect_ignore = ["workdirs", "policy_gallery"]
# Test modules here use `from conftest import ...`. pytest imports every conftest.py under
# the name `conftest`, so a nested one would shadow this module; pytest_collectstart below
# puts this one back before each test module of this folder is imported.
_THIS = sys.modules[__name__]


def plugin_args() -> list[str]:
    """`-p pytest_cudaopt.plugin` unless the entry point registers the plugin already
    (naming it twice would register it twice)."""
    return [] if entry_point_installed() else ["-p", "pytest_cudaopt.plugin"]


def subprocess_env() -> dict[str, str]:
    """os.environ with the repo root first on PYTHONPATH, so an uninstalled checkout imports."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def run_pytest(pytester: pytest.Pytester, *args: str, timeout: float | None = None) -> pytest.RunResult:
    """`pytester.runpytest_subprocess(*args)` with the plugin loaded whether or not the
    package is installed. The subprocess runs in `pytester.path`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
        return pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", *args,
                                             timeout=timeout)


def _added_files(name: str) -> dict[Path, Path]:
    """What a copy of tests/workdirs/<name> gets besides its own files: the shared ones named
    for it, and the fixed binding files from pytest_cudaopt/templates/ (a workdir that carries
    its own, another registry, keeps them). Relative path -> source."""
    src = WORKDIRS / name
    added = {Path(rel): SHARED / rel for rel, users in SHARED_FILES.items() if name in users}
    added.update({Path(fixed): TEMPLATES / fixed for fixed in FIXED_FILES})
    return {rel: source for rel, source in added.items() if not (src / rel).is_file()}


def copy_workdir(name: str, dest: Path) -> Path:
    """Copy tests/workdirs/<name> to `dest` with its added files (_added_files). Files already
    at `dest` with the same content are left alone (so their mtimes, and the objects built
    from them, stay valid)."""
    src = WORKDIRS / name
    if not src.is_dir():
        raise FileNotFoundError(f"no example workdir {src}")
    dest = Path(dest)
    pairs = [(path, dest / path.relative_to(src)) for path in sorted(src.rglob("*"))
             if path.is_file() and not {"__pycache__", "build"} & set(path.relative_to(src).parts)]
    pairs += [(source, dest / rel) for rel, source in _added_files(name).items()]
    for source, target in pairs:
        if target.is_file() and filecmp.cmp(source, target, shallow=False):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return dest


def _prune(dest: Path, name: str) -> None:
    """Remove files of a prebuilt copy that its example workdir no longer has (build/ stays)."""
    keep = {p.relative_to(WORKDIRS / name) for p in (WORKDIRS / name).rglob("*") if p.is_file()}
    keep |= set(_added_files(name))
    for path in sorted(dest.rglob("*"), reverse=True):
        rel = path.relative_to(dest)
        if rel.parts[0] in ("build", "__pycache__") or "__pycache__" in rel.parts:
            continue
        if path.is_file() and rel not in keep:
            path.unlink()


def prebuild(name: str) -> Path:
    """The built copy of tests/workdirs/<name> under build/test-workdirs/, brought up to
    date (ninja recompiles only what changed since the last run). Returns its path."""
    from pytest_cudaopt import build

    dest = PREBUILT_ROOT / name
    dest.mkdir(parents=True, exist_ok=True)
    with FileLock(str(PREBUILT_ROOT / f"{name}.lock")):
        copy_workdir(name, dest)
        _prune(dest, name)
        build.compile_extension(dest)
    return dest


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


# The helpers above as fixtures too (`def test_x(pytester, run_pytest): run_pytest(pytester, ...)`),
# for test modules that should not depend on which conftest module `import conftest` finds.
@pytest.fixture(name="run_pytest")
def _run_pytest_fixture():
    return run_pytest


@pytest.fixture(name="copy_workdir")
def _copy_workdir_fixture():
    return copy_workdir


@pytest.fixture(name="subprocess_env")
def _subprocess_env_fixture() -> dict[str, str]:
    return subprocess_env()


def pytest_collectstart(collector: pytest.Collector) -> None:
    if isinstance(collector, pytest.Module) and collector.path.parent == Path(__file__).parent:
        sys.modules["conftest"] = _THIS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if COMPILING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def junit_cases(path: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(workdir, test name) -> (outcome, message and text) of a --junitxml file."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        workdir = case.get("classname", "").split(".")[0]
        outcome, text = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (found.get("message") or "") + "\n" + (found.text or "")
                break
        cases[(workdir, case.get("name"))] = (outcome, text)
    return cases
