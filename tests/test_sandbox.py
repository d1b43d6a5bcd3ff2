"""The candidate's worker in its OS sandbox (pytest_cudaopt/candidate/sandbox.py), attacked from the candidate's own code: each escape_* variant of tests/workdirs/cpu_attacks/ succeeds in a pytest session with cudaopt_sandbox=off and is refused, its items failing with what was refused, in one with the default (auto); cudaopt_sandbox=require refuses to run a candidate where the kernel has no Landlock (a seccomp filter that answers Landlock's syscalls with ENOSYS stands in for such a kernel); an attack fails through cudaopt judge too."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from support import OBJECT_CACHE, PREBUILT_ROOT, WORKDIRS, run_python, subprocess_env
from pytest_cudaopt.launch import plugin_args
from pytest_cudaopt.candidate import sandbox

VARIANTS = WORKDIRS / "cpu_attacks" / "variants"
# attack -> the file that carries it (a model_new.py, or an extension planted in kernels/ beside an
# honest model_new.py). The cache attack comes last: unconfined, it poisons the objects the workdirs
# after it would link.
ATTACKS = {"write": "escape_write_binding.cpp", "read": "escape_read.py", "signal": "escape_signal.py",
           "ptrace": "escape_ptrace.py", "exec": "escape_exec.py", "cache": "escape_cache.py"}
LANDLOCK = sandbox.landlock_abi()
needs_landlock = pytest.mark.skipif(not LANDLOCK[0], reason=f"no Landlock here: {LANDLOCK[1]}")
needs_seccomp = pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"),
                                   reason=f"no seccomp syscall table for {platform.machine()}")
FAST = ("--cudaopt-device=cpu", "-m", "correctness", "--cudaopt-seeds=1", "--cudaopt-max-examples=1", "-q", "-s",
        "-p", "no:cacheprovider", "-p", "no:randomly")


def _attack_workdirs(prebuilt: Path, root: Path) -> dict[str, Path]:
    """A copy of the built cpu_attacks workdir per attack under `root`, a victim workdir beside
    them, a private copy of the object cache (the cache attack overwrites an entry of it)."""
    made = {}
    for name, variant in ATTACKS.items():
        dest = root / name
        with FileLock(str(PREBUILT_ROOT / "cpu_attacks.lock")):
            shutil.copytree(prebuilt, dest, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.lock"))
        if variant.endswith(".cpp"):
            shutil.copyfile(VARIANTS / variant, dest / "kernels" / variant)
            variant = "honest.py"
        shutil.copyfile(VARIANTS / variant, dest / "model_new.py")
        made[name] = dest
    (root / "victim" / "kernels").mkdir(parents=True)
    (root / "victim" / "kernels" / "secret.cu").write_text("// another candidate's kernel\n")
    objcache = Path(os.environ.get("CUDAOPT_OBJECT_CACHE", OBJECT_CACHE))
    shutil.copytree(objcache, root / "objcache", ignore=shutil.ignore_patterns("*.lock"))
    return made


def _run(root: Path, made: dict[str, Path], mode: str | None, *, wrapper: list[str] = (),
         args: tuple[str, ...] = ()) -> dict:
    """One pytest session over `made`'s workdirs (cudaopt_sandbox `mode`, None: the default)."""
    env = subprocess_env()
    env["CUDAOPT_OBJECT_CACHE"] = str(root / "objcache")
    env.pop("CUDAOPT_SANDBOX", None)
    if wrapper:  # what the wrapper does to its process tree must reach the worker: no zygote's fork
        env.pop("CUDAOPT_WORKER_ZYGOTE", None)
    if mode is not None:
        env["CUDAOPT_SANDBOX"] = mode
    victim = subprocess.Popen(["sleep", "600"])
    if "signal" in made:
        (made["signal"] / "victim.pid").write_text(str(victim.pid))
    report, junit = root / f"report-{mode}.json", root / f"junit-{mode}.xml"
    cmd = [*wrapper, sys.executable, "-m", "pytest", *plugin_args(), *[str(p / "model_new.py") for p in made.values()],
           *FAST, f"--junitxml={junit}", f"--cudaopt-report={report}", *args]
    try:
        done = (subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900) if wrapper
                else run_python(cmd[1:], cwd=root, env=env, timeout=900))
        time.sleep(0.2)
        victim_status = victim.poll()
    finally:
        victim.kill()
        victim.wait()
    output = done.stdout + done.stderr
    assert report.is_file() and junit.is_file(), output[-4000:]
    return {"output": output, "report": json.loads(report.read_text()), "junit": junit, "victim": victim_status,
            "root": root, "made": made}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, prebuilt_workdir):
    """The six attacks in one session with the sandbox off and in one with it on (the default)."""
    prebuilt = prebuilt_workdir("cpu_attacks")
    runs = {}
    for mode in ("off", None):
        root = tmp_path_factory.mktemp(f"sandbox-{mode or 'auto'}")
        made = _attack_workdirs(prebuilt, root)
        runs[mode or "auto"] = _run(root, made, mode)
    return runs


def _outcomes(run: dict, attack: str) -> list[tuple[str, str]]:
    """(outcome, message) of each JUnit case of the attack's workdir."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(run["junit"]).getroot()
    found = []
    for case in tree.iter("testcase"):
        if case.get("classname", "").split(".")[0] != attack:
            continue
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        found.append(("passed", "") if failed is None else
                     ("failed", (failed.get("message") or "") + "\n" + (failed.text or "")))
    assert found, f"no JUnit case of {attack}: {run['output'][-3000:]}"
    return found


def _succeeded(run: dict, attack: str, said: str) -> None:
    assert said in run["output"], run["output"][-4000:]
    assert all(outcome == "passed" for outcome, _ in _outcomes(run, attack)), _outcomes(run, attack)


def _refused(run: dict, attack: str, *words: str) -> str:
    outcomes = _outcomes(run, attack)
    assert all(outcome == "failed" for outcome, _ in outcomes), outcomes
    message = outcomes[0][1]
    for word in words:
        assert word in message, message
    return message


@needs_landlock
def test_an_extension_that_writes_its_workdirs_reference_is_refused(attacked):
    off, on = attacked["off"], attacked["auto"]
    assert "# written by the candidate's extension" in (off["made"]["write"] / "model.py").read_text()
    _succeeded(off, "write", "ATTACK SUCCEEDED: appended to")
    assert "written by the candidate" not in (on["made"]["write"] / "model.py").read_text()
    _refused(on, "write", "escape_write_binding.cpp: opening", "model.py to write was refused: Permission denied")


@needs_landlock
def test_reading_another_workdirs_kernel_is_refused(attacked):
    _succeeded(attacked["off"], "read", "ATTACK SUCCEEDED: read 30 characters of another workdir's kernel")
    _refused(attacked["auto"], "read", "PermissionError", "victim/kernels/secret.cu",
             "refused by the worker's OS sandbox")


@needs_landlock
def test_overwriting_an_object_cache_entry_is_refused(attacked):
    def poisoned(run):
        return [p for p in (run["root"] / "objcache").rglob("*.o") if b"poisoned by the candidate" in p.read_bytes()]

    _succeeded(attacked["off"], "cache", "ATTACK SUCCEEDED: overwrote the cached object")
    assert poisoned(attacked["off"])
    _refused(attacked["auto"], "cache", "PermissionError", str(attacked["auto"]["root"] / "objcache"),
             "refused by the worker's OS sandbox")
    assert not poisoned(attacked["auto"])


@needs_seccomp
def test_signalling_a_sibling_or_the_judging_process_is_refused(attacked):
    _succeeded(attacked["off"], "signal", "ATTACK SUCCEEDED: killed process")
    assert attacked["off"]["victim"] is not None  # the sibling died
    _refused(attacked["auto"], "signal", "PermissionError: [Errno 1] Operation not permitted",
             "refused by the worker's OS sandbox")
    assert attacked["auto"]["victim"] is None


def _yama_scope() -> int:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return 0


@needs_seccomp
def test_ptrace_of_the_judging_process_is_refused(attacked):
    if _yama_scope() >= 1 and os.geteuid() != 0:  # Yama keeps a child from tracing its parent by itself
        _refused(attacked["off"], "ptrace", "ptrace(PTRACE_ATTACH,", "Operation not permitted")
    else:
        _succeeded(attacked["off"], "ptrace", "ATTACK SUCCEEDED: attached to the judging process")
    _refused(attacked["auto"], "ptrace", "ptrace(PTRACE_ATTACH,", "Operation not permitted",
             "refused by the worker's OS sandbox")


@needs_seccomp
def test_starting_a_program_is_refused(attacked):
    _succeeded(attacked["off"], "exec", "ATTACK SUCCEEDED: started /bin/sh, which said shell-ran")
    # A CPU worker may not even fork (its CPU time bounds its timer): subprocess fails before its exec.
    _refused(attacked["auto"], "exec", "PermissionError", "refused by the worker's OS sandbox")


@needs_seccomp
@pytest.mark.parametrize("threads_only", [True, False])
def test_a_cpu_workers_seccomp_lets_it_start_threads_but_no_process(threads_only):
    """The worker's own filter (`_seccomp`): threads start; a process only where not `threads_only` (a GPU
    worker's); no program either way (the CPU worker's exec attack fails at its fork, so exec is held here)."""
    code = ("import os, platform, threading; from pytest_cudaopt.candidate import sandbox as s; "
            f"s._prctl(s.PR_SET_NO_NEW_PRIVS, 1, 'nnp'); s._seccomp(platform.machine(), {threads_only}); "
            "t = threading.Thread(target=print, args=('thread-ran',)); t.start(); t.join()\n"
            "try:\n    pid = os.fork()\nexcept PermissionError as e:\n    print('fork-refused', e)\nelse:\n"
            "    os._exit(0) if pid == 0 else (os.waitpid(pid, 0), print('fork-ran'))\n"
            "try:\n    os.execv('/bin/true', ['/bin/true'])\nexcept PermissionError as e:\n    print('exec-refused', e)")
    done = run_python(["-c", code], timeout=120)
    assert "thread-ran" in done.stdout, done.stdout + done.stderr
    assert ("fork-refused [Errno 1] Operation not permitted" if threads_only else "fork-ran") in done.stdout, \
        done.stdout + done.stderr
    assert "exec-refused [Errno 1] Operation not permitted" in done.stdout, done.stdout + done.stderr


@needs_landlock
def test_the_report_says_what_the_sandbox_enforced(attacked):
    on, off = attacked["auto"]["report"]["sandbox"], attacked["off"]["report"]["sandbox"]
    assert on["mode"] == "auto" and on["workers"] >= 6 and on["landlock"] == LANDLOCK[0]
    assert {"files", "exec", "ptrace", "signals", "privileges", "kernel"} <= set(on["held"]), on
    assert "Landlock" in " ".join(on["held"]["files"]) and not on["missing"], on
    assert "cudaopt: sandbox of the candidate's worker" in attacked["auto"]["output"]
    assert off["mode"] == "off" and not off["held"]
    assert any("sandbox off" in line for line in attacked["off"]["report"]["relaxations"])
    assert "RELAXED" in attacked["off"]["output"] and "sandbox off" in attacked["off"]["output"]


def _without_landlock() -> list[str]:
    """A command prefix that runs its program in a process tree whose Landlock syscalls fail
    with ENOSYS, as on a kernel without Landlock."""
    code = ("import errno, os, platform, sys; from pytest_cudaopt.candidate import sandbox as s; "
            "s._prctl(s.PR_SET_NO_NEW_PRIVS, 1, 'nnp'); m = platform.machine(); "
            "s.install_seccomp(s.seccomp_program(m, {n: errno.ENOSYS for n in (444, 445, 446)}), m); "
            "os.execv(sys.executable, sys.argv[1:])")
    return [sys.executable, "-c", code]


@needs_seccomp
def test_require_refuses_a_candidate_where_the_kernel_has_no_landlock(tmp_path, prebuilt_workdir):
    made = _attack_workdirs(prebuilt_workdir("cpu_attacks"), tmp_path)
    read = {"read": made["read"]}
    refused = _run(tmp_path, read, "require", wrapper=_without_landlock())
    _refused(refused, "read", "cudaopt_sandbox=require: the candidate's worker could not be confined",
             "files (Landlock: this kernel has no Landlock")
    assert "ATTACK SUCCEEDED" not in refused["output"]
    assert refused["report"]["passed"] is False and refused["report"]["sandbox"]["missing"]["files"]
    # auto on the same kernel runs it, with what seccomp offers, and says what did not hold
    ran = _run(tmp_path, read, "auto", wrapper=_without_landlock())
    assert "ATTACK SUCCEEDED: read" in ran["output"]
    assert "NOT held: files (Landlock: this kernel has no Landlock" in ran["output"]
    assert {"exec", "ptrace", "signals", "kernel"} <= set(ran["report"]["sandbox"]["held"])


@needs_seccomp
def test_an_attack_fails_through_cudaopt_judge(tmp_path, prebuilt_workdir):
    from support import JUDGE_CPU_ARGS
    from pytest_cudaopt.judge import lines as judge_lines

    made = _attack_workdirs(prebuilt_workdir("cpu_attacks"), tmp_path / "made")
    gallery = tmp_path / "gallery"
    gallery.mkdir()
    shutil.copytree(made["exec"], gallery / "exec", ignore=shutil.ignore_patterns("build"))
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(tmp_path / "made" / "objcache", cache / "objects")
    out = tmp_path / "lines.jsonl"
    done = run_python(["-m", "pytest_cudaopt.cli", "judge", str(gallery), "--cpu-slots", "1", "--jobs", "1",
                       "--timeout", "300", "--cache-dir", str(cache), "--out", str(out),
                       "--scratch", str(tmp_path / "scratch"), "--", *JUDGE_CPU_ARGS], cwd=tmp_path, timeout=1500)
    lines = list(judge_lines.read_lines(out))
    assert len(lines) == 1, done.stdout[-3000:] + done.stderr[-3000:]
    line = json.dumps(lines[0])
    assert lines[0]["passed"] is False, line[-3000:]
    assert "Operation not permitted" in line and "/bin/sh" in line, line[-3000:]
    assert "ATTACK SUCCEEDED" not in line
    assert "files" in json.dumps(lines[0].get("report", {}).get("sandbox", {})), line[-3000:]


def test_the_worker_serves_nothing_before_it_is_confined_and_confines_itself_single_threaded(tmp_path):
    """Whatever starts a worker, its first request must be `sandbox`; and the worker has not
    imported torch (whose import starts threads Landlock would not cover) before it."""
    import socket
    from multiprocessing.connection import Connection

    from pytest_cudaopt.remote import worker as client
    from pytest_cudaopt import wire as protocol

    ours, theirs = socket.socketpair()
    env = client.worker_env(os.environ, client.package_root())
    proc = subprocess.Popen([sys.executable, "-m", "pytest_cudaopt.candidate", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], cwd=tmp_path, env=env, start_new_session=True)
    theirs.close()
    conn = Connection(ours.detach())
    try:
        protocol.send(conn, {"op": "load", "workdir": str(tmp_path)})
        assert protocol.receive(conn) == {"error": "'load' before the sandbox request"}
        protocol.send(conn, {"op": "sandbox", "mode": "auto", "workdir": str(tmp_path), "scratch": str(tmp_path)})
        facts = protocol.receive(conn)["sandbox"]
        assert {"exec", "ptrace", "signals", "kernel", "privileges"} <= set(facts["held"]), facts
        if LANDLOCK[0]:
            assert facts["held"]["files"] == [f"Landlock ABI {LANDLOCK[0]}"] and not facts["missing"], facts
        protocol.send(conn, {"op": "sandbox", "mode": "off", "workdir": str(tmp_path), "scratch": str(tmp_path)})
        assert protocol.receive(conn) == {"error": "the worker is confined already"}
    finally:
        proc.kill()
        proc.wait()
        conn.close()


def test_judge_and_gate_require_the_sandbox_for_gpu_workdirs_unless_told_otherwise(tmp_path):
    from pytest_cudaopt.judge import stages
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.launch import strict_sandbox

    assert strict_sandbox([], env={}) == ["--cudaopt-sandbox=require"]
    assert strict_sandbox(["--cudaopt-device=cpu"], env={}) == []
    assert strict_sandbox(["--cudaopt-sandbox=auto"], env={}) == []
    assert strict_sandbox([], env={"CUDAOPT_SANDBOX": "off"}) == []
    assert strict_sandbox([], env={}, ini={"cudaopt_device": "cpu"}) == []
    assert "--cudaopt-sandbox=require" in stages.command("check", tmp_path, tmp_path, Options())
    cpu = stages.command("check", tmp_path, tmp_path, Options(pytest_args=["--cudaopt-device=cpu"]))
    assert not any(arg.startswith("--cudaopt-sandbox") for arg in cpu)


def test_a_gate_whose_runner_cannot_confine_the_candidate_is_broken_not_failed():
    from types import SimpleNamespace

    from pytest_cudaopt.commands import gate as ci_gate
    from pytest_cudaopt.remote.worker import REQUIRE_REFUSED

    seen = ci_gate.Observer(kinds={"policy": 1, "correctness": 1, "perf": 1})
    seen.pytest_runtest_logreport(SimpleNamespace(
        when="setup", keywords={}, user_properties=[], failed=True, passed=False, outcome="failed",
        nodeid="model_new.py::TestCorrectness::test_canonical[seed0]",
        longreprtext=f"{REQUIRE_REFUSED}, so it is not run: require: held: ...; NOT held: files (Landlock: ...)"))
    code, reasons = ci_gate.exit_code(1, seen)
    assert code == ci_gate.BROKEN and "cannot confine the candidate" in reasons[0], reasons


_THREADED_CHILD = r"""
import json, sys, threading
from pytest_cudaopt.candidate.sandbox import confine
stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()  # a thread running before the confinement
scratch, outside, started_by = sys.argv[1], sys.argv[2], sys.argv[3] or None
facts = confine("require", scratch, None, scratch, started_by=started_by)
try:
    open(outside, "w").write("escaped")
    wrote = True
except OSError:
    wrote = False
print(json.dumps({"facts": facts, "wrote": wrote}))
"""


@needs_landlock
@pytest.mark.parametrize("started_by", ["", "compute-sanitizer"])
def test_a_process_with_a_thread_it_did_not_start_is_confined_only_when_told_who_started_it(tmp_path, started_by):
    """The sanitized child: compute-sanitizer's injection runs a thread before the child's first
    line. Unnamed, another thread leaves Landlock unapplied (and require refuses); named, the
    thread that runs the candidate is confined and the report says which thread is not."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside.txt"
    scratch.mkdir()
    done = subprocess.run([sys.executable, "-c", _THREADED_CHILD, str(scratch), str(outside), started_by],
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    facts = seen["facts"]
    if started_by:
        assert "files" not in facts["missing"], facts
        assert facts["held"]["files"] == [f"Landlock ABI {LANDLOCK[0]} (not the 1 thread compute-sanitizer started "
                                          "before it)"], facts
        assert seen["wrote"] is False and not outside.exists()
    else:
        assert "the worker had 2 threads" in facts["missing"]["files"], facts
        assert seen["wrote"] is True
