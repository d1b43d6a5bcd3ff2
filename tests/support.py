"""Helpers of the plugin's self-tests: pytest in a subprocess with the plugin loaded, the example workdirs and their built copies."""

from __future__ import annotations

import contextlib
import json
import subprocess
import filecmp
import itertools
import os
import shutil
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from filelock import FileLock

import forkserver
from pytest_cudaopt.launch import plugin_args

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKDIRS = Path(__file__).resolve().parent / "workdirs"
TEMPLATES = REPO_ROOT / "pytest_cudaopt" / "templates"
FIXED_FILES = ("binding.cpp", "binding_registry.h")
# Files that several example workdirs share, kept once in tests/workdirs/_shared/ and added to
# the copies of the workdirs named here (a workdir's own file at that path wins).
SHARED = WORKDIRS / "_shared"
SHARED_FILES = {
    "model.py": ("cheat_kernels", "cpu_scale", "cuda_cheats", "cuda_memsafety", "cuda_scale", "registry_forms",
                 "upstream_scale"),
    "kernels/scale.cpp": ("cpu_scale", "registry_forms", "upstream_scale"),
    "kernels/scale_binding.cpp": ("cpu_scale", "upstream_scale"),
}
# Built copies of tests/workdirs/<name>, kept between runs so that a test that copies a
# workdir starts from objects that are up to date (every torch binding costs tens of
# seconds to compile). Ignored by git (/build/).
PREBUILT_ROOT = REPO_ROOT / "build" / "test-workdirs"
def subprocess_env() -> dict[str, str]:
    """os.environ with the repo root first on PYTHONPATH, so an uninstalled checkout imports."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def run_pytest(pytester: pytest.Pytester, *args: str, timeout: float | None = None,
               fork: bool = True, cache: bool = False) -> pytest.RunResult:
    """`pytester.runpytest_subprocess(*args)` with the plugin loaded whether or not the
    package is installed, and without pytest's cache unless `cache`. The subprocess runs in `pytester.path`: a fork of
    the fork server (forkserver.py), or a plain subprocess without `fork` (a test of what a fresh process has
    imported) or with CUDAOPT_TEST_FORK=0."""
    no_cache = () if cache else ("-p", "no:cacheprovider")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
        if not (fork and forkserver.enabled()):
            return pytester.runpytest_subprocess(*plugin_args(), *no_cache, *args, timeout=timeout)
        basetemp = pytester.mkdir(f"runpytest-{next(_RUNS)}")
        return run_forked(["--basetemp", str(basetemp), *plugin_args(), *no_cache, *args],
                          cwd=pytester.path, timeout=timeout)


_RUNS = itertools.count()
_SERVER: list[forkserver.Server] = []


def server() -> forkserver.Server:
    """This test process's fork server (started on first use)."""
    if not (_SERVER and _SERVER[0].alive()):
        _SERVER[:] = [forkserver.Server(subprocess_env())]
    return _SERVER[0]


def run_python(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run([sys.executable, *args], capture_output=True, text=True)` for a program
    that imports torch (the plugin's CLI, `utils/`, a benchmark script): a fork of the fork
    server, which imported it already. A plain subprocess with CUDAOPT_TEST_FORK=0. Raises
    subprocess.TimeoutExpired past `timeout`, as subprocess.run does."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    env = dict(subprocess_env() if env is None else env)
    command = [sys.executable, *map(str, args)]
    if not forkserver.enabled():
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="run-python-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        ret = server().run(list(map(str, args)), cwd=cwd, env=env, stdout=out, stderr=err, timeout=timeout,
                            python=True)
        stdout = out.read_text(encoding="utf8", errors="replace")
        stderr = err.read_text(encoding="utf8", errors="replace")
    if ret is None:
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, ret, stdout, stderr)


def run_forked(args: list[str], *, cwd: Path, timeout: float | None = None,
               env: dict[str, str] | None = None) -> pytest.RunResult:
    """`python -m pytest *args` in `cwd`, as pytester runs it (the folder first on PYTHONPATH,
    stdout and stderr kept in files there), through the fork server."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(cwd), env.get("PYTHONPATH", "")]))
    out, err = Path(cwd) / "stdout", Path(cwd) / "stderr"
    started = time.monotonic()
    ret = server().run(args, cwd=Path(cwd), env=env, stdout=out, stderr=err, timeout=timeout)
    if ret is None:
        raise pytest.Pytester.TimeoutExpired(f"{timeout} second timeout expired running pytest {args}")
    outlines = out.read_text(encoding="utf8", errors="replace").splitlines()
    errlines = err.read_text(encoding="utf8", errors="replace").splitlines()
    print("\n".join(outlines))
    print("\n".join(errlines), file=sys.stderr)
    with contextlib.suppress(ValueError):
        ret = pytest.ExitCode(ret)
    return pytest.RunResult(ret, outlines, errlines, time.monotonic() - started)


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
    from pytest_cudaopt import extension as build

    dest = PREBUILT_ROOT / name
    dest.mkdir(parents=True, exist_ok=True)
    with FileLock(str(PREBUILT_ROOT / f"{name}.lock")):
        copy_workdir(name, dest)
        _prune(dest, name)
        build.compile_extension(dest)
    return dest


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


# tests/workdirs/cheat_kernels: an honest CPU workdir and its planted cheats and hangs (variants/).
CHEAT_VARIANTS = WORKDIRS / "cheat_kernels" / "variants"
CPU_INI = "[pytest]\ncudaopt_device = cpu\n"


def copy_cheat(prebuilt_workdir, dest: Path, variant: str = "honest") -> Path:
    """A copy of the built cheat_kernels workdir at `dest`, with model_new.py replaced by
    variants/<variant>.py (the extension stays built: the copy builds in about a second)."""
    src = prebuilt_workdir("cheat_kernels")
    with FileLock(str(PREBUILT_ROOT / "cheat_kernels.lock")):
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    if variant != "honest":
        shutil.copyfile(CHEAT_VARIANTS / f"{variant}.py", dest / "model_new.py")
    return dest


# The judge's CPU cases: cpu_scale as it is (honest) and with one file replaced from
# tests/workdirs/judge_variants/<name>/ (wrong, segfault, hang, build_error).
JUDGE_VARIANTS = WORKDIRS / "judge_variants"
JUDGE_CASES = ("honest", "wrong", "segfault", "hang", "build_error")
# The object and torch.compile caches of the judge's tests, kept between runs like the prebuilt copies.
JUDGE_CACHE = PREBUILT_ROOT / "judge-cache"
OBJECT_CACHE = JUDGE_CACHE / "objects"   # the suite's object cache (conftest.py), the judge's too
JUDGE_CPU_ARGS = ("--cudaopt-device=cpu", "--cudaopt-compile-backend=eager", "--cudaopt-max-time=1",
                  "--cudaopt-warmup=0.1", "--cudaopt-min-runs=5", "--cudaopt-max-examples=5")


def judge_workdirs(dest: Path, names=JUDGE_CASES) -> dict[str, Path]:
    """The judge's CPU cases under `dest`, by name (sources only: the judge builds them)."""
    made = {}
    for name in names:
        target = copy_workdir("cpu_scale", Path(dest) / name)
        variant = JUDGE_VARIANTS / name
        if variant.is_dir():
            for path in variant.rglob("*"):
                if path.is_file():
                    shutil.copyfile(path, target / path.relative_to(variant))
        made[name] = target
    return made


# Attacks on tests/workdirs/cpu_attacks (tests/test_sandbox.py; the gallery's own are in tests/exploits/):
# the built workdir with these files (path in it -> file in variants/).
ATTACK_VARIANTS = WORKDIRS / "cpu_attacks" / "variants"
ATTACKS = {
    "forge": {"kernels/forge_binding.cpp": "forge_binding.cpp"},
    "gate_patch": {"model_new.py": "gate_patch.py"},
    "heap_scan": {"model_new.py": "heap_scan.py"},
    "gc_walk": {"model_new.py": "gc_walk.py"},
    "fd_forge": {"model_new.py": "fd_forge.py"},
    "timer_patch": {"model_new.py": "timer_patch.py"},
    "timer_shave": {"model_new.py": "timer_shave.py"},
    "honest_spin": {"model_new.py": "honest_spin.py"},
    "clock_hook": {"model_new.py": "clock_hook.py"},
    "ping_stall": {"model_new.py": ("timer_patch.py", "ping_stall.py")},  # the second appended to the first
    "parent_mem": {"model_new.py": "parent_mem.py"},
    "daemon_forge": {"model_new.py": "daemon_forge.py"},
    "write_outside": {"model_new.py": "write_outside.py"},
}
DIFFERS = "ModelNew's output differs from Model's"


def attack_workdir(prebuilt_workdir, name: str, dest: Path) -> Path:
    """A copy of the built cpu_attacks workdir at `dest` with the files of attack `name`."""
    src = prebuilt_workdir("cpu_attacks")
    with FileLock(str(PREBUILT_ROOT / "cpu_attacks.lock")):
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
    for target, variant in ATTACKS[name].items():
        parts = (variant,) if isinstance(variant, str) else variant
        (dest / target).write_text("".join((ATTACK_VARIANTS / part).read_text() for part in parts))
    return dest


def attack_session(root: Path, names: list[str], *args: str, timeout: float = 1200) -> dict:
    """One `python -m pytest` over the attack workdirs `names` under `root` (its command line
    names the verdict files, as a user's would): its exit status, output, JUnit cases and report."""
    report, junit = root / "report.json", root / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--junitxml={junit}", f"--cudaopt-report={report}", *JUDGE_CPU_ARGS, *args,
           *[f"{name}/model_new.py" for name in names]]
    done = subprocess.run(cmd, cwd=root, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert report.is_file() and junit.is_file(), f"pytest (status {done.returncode}) left no verdict files:\n" + \
        output[-4000:]
    return {"status": done.returncode, "output": output, "cases": junit_cases(junit),
            "report": json.loads(report.read_text())}


@contextlib.contextmanager
def busy_cores(count: int, limit_s: float = 1800):
    """`count` processes that spin on a core each for the block (and never past `limit_s`)."""
    spin = f"import time\nend = time.monotonic() + {limit_s}\nwhile time.monotonic() < end: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def attack_case(verdicts: dict, workdir: str, prefix: str) -> tuple[str, str]:
    """(outcome, text) of the one JUnit case of `workdir` whose name starts with `prefix`."""
    found = [v for (w, name), v in verdicts["cases"].items() if w == workdir and name.startswith(prefix)]
    assert len(found) == 1, f"{workdir}: no single case {prefix!r} in {sorted(verdicts['cases'])}\n" + \
        verdicts["output"][-3000:]
    return found[0]


def copy_non_persistent_buffers(model, model_new) -> None:
    """Model's non-persistent buffers into ModelNew's (`copy_buffers`), both in this process."""
    from pytest_cudaopt.candidate.load import copy_buffers
    from pytest_cudaopt.workdir import non_persistent_buffers

    copy_buffers(non_persistent_buffers(model), model_new)
