"""Where one judge stage's time goes: a gallery workdir's check and perf sessions, each run as the judge runs it (`pytest -m ...`), under cProfile, with every worker request and every start-up step timed from the judging side.

    python3 benchmarks/stage_profile.py [--problem leaky_relu --variant honest] [--out DIR]     # GPU
    python3 benchmarks/stage_profile.py --cpu --out DIR                                         # CPU (cpu_scale)
    python3 benchmarks/stage_profile.py --turns ...      # each stage as a judge's: asks for its place (and the perf
                                                         # stage for its turn), granted at once
    python3 benchmarks/stage_profile.py --turns --plain  # ... with no cProfile in the judging process (honest exit time)
    python3 benchmarks/stage_profile.py --turns --warm   # ... each stage run once unmeasured first (bytecode, caches)

The workdir is built once first (`cudaopt build`, not profiled). Each stage is a fresh
`python -m cProfile -m pytest` with this file as a plugin (`-p stage_profile`), which wraps
Worker.start's steps and Worker.request (time by op, on the judging side), and starts the
workers through a zygote of this file's (`--zygote NAME`: worker.zygote's, as the judge starts
one; each fork's server times and profiles every op and lists what it imported; the stats are
written when the worker is told to stop). Results:
OUT/<stage>.txt (the request tables of both sides, pytest's phases, the cProfile functions of
pytest_cudaopt by cumulative time in each process), OUT/<stage>.prof, OUT/<stage>-worker.prof.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
STAGES = {"check": "not perf and not policy and not memsafety", "memsafety": "memsafety", "perf": "perf"}


# ------------------------------------------------------------- the plugin (in each pytest child)

_requests: dict[str, list[float]] = {}
_steps: dict[str, list[float]] = {}
_t0 = time.perf_counter()
_marks: dict[str, float] = {}   # time.monotonic() of the session's last steps: the driver splits a turn with them


def _timed(table: dict, key_of):
    def wrap(fn):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                table.setdefault(key_of(args, kwargs), []).append(time.perf_counter() - started)
        return timed
    return wrap


def _stop_and_collect(stop):
    """Worker.stop, after asking the worker to stop (it writes its stats) and copying them out."""
    def collecting(self):
        from pytest_cudaopt import wire as protocol

        out = os.environ.get("STAGE_PROFILE_JSON")
        if self.conn is not None and self.alive() and out:
            try:
                protocol.send(self.conn, {"op": "stop"}, self.arena, "judge")
                self.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001 - a dead worker: no stats
                pass
            for name in ("worker-ops.json", "worker.prof"):
                found = self.scratch / name if self.scratch else None
                if found is not None and found.is_file():
                    Path(out).with_name(Path(out).stem + "-" + name).write_bytes(found.read_bytes())
        try:
            return stop(self)
        finally:
            _marks["worker stopped"] = time.monotonic()
    return collecting


def pytest_configure(config):
    from pytest_cudaopt.remote import worker as client
    from pytest_cudaopt.run import zygote

    # A judge's children are forks of its zygote, which imported these: here too, or their first uses (the first
    # meta-device operation imports sympy, about 1 s) land in the place, where a judge's child never pays them.
    for name in zygote.PRELOAD:
        importlib.import_module(name)
    W = client.Worker
    W.stop = _stop_and_collect(W.stop)
    W.request = _timed(_requests, lambda a, k: str(a[1].get("op")))(W.request)
    for name in ("start", "confine", "calibrate", "stop"):
        setattr(W, name, _timed(_steps, lambda a, k, n=name: f"Worker.{n}")(getattr(W, name)))
    zygote.spawn = _timed(_steps, lambda a, k: "zygote.spawn")(zygote.spawn)
    _steps["configure (since interpreter start of this module)"] = [time.perf_counter() - _t0]
    out = os.environ.get("STAGE_PROFILE_JSON")
    if out:
        def write() -> None:
            _marks["exiting"] = time.monotonic()
            Path(out).write_text(json.dumps({"requests": _requests, "steps": _steps, "marks": _marks}))
        atexit.register(write)


def pytest_collection_finish(session):
    _steps["collection done (since plugin import)"] = [time.perf_counter() - _t0]


def pytest_runtest_logfinish(nodeid, location):
    _marks["item ended"] = time.monotonic()


def pytest_sessionfinish(session):
    _marks.setdefault("session finishing", time.monotonic())   # this plugin's hook runs among the first


def pytest_unconfigure(config):
    _marks["unconfigured"] = time.monotonic()


# ------------------------------------------------------------- the worker (`--worker FD`)


def serve_zygote(name: str) -> int:
    """The plugin's zygote (worker.zygote.serve), its forks' server timing and profiling each op
    and listing the modules the worker imported after the fork. A fork imports the package afresh
    (zygote._forget_package), so the patch goes on the fresh candidate.serve."""
    from pytest_cudaopt.run import zygote

    forget = zygote._forget_package

    def forget_then_patch() -> None:
        forget()
        _patch_server()

    zygote._forget_package = forget_then_patch
    return zygote.serve(name)


def _patch_server() -> None:
    import cProfile

    from pytest_cudaopt.candidate import serve as server

    serve_plain = server.main

    def profiled_main(argv):
        profile, ops, before = cProfile.Profile(), {}, set(sys.modules)
        depth = [0]   # an op may call another (sandbox -> context): the profile is enabled once, by the outer one
        for name in [n for n in dir(server.Server) if n.startswith("op_")]:
            def timed(self, request, _fn=getattr(server.Server, name), _name=name[3:]):
                # A checked call is left unprofiled: the op audit owns sys.setprofile there.
                checked = bool(request.get("check"))
                profiled = not checked and depth[0] == 0
                started = time.perf_counter()
                if profiled:
                    profile.enable()   # twice is a ValueError on Python 3.12 ("Another profiling tool")
                depth[0] += 1
                try:
                    return _fn(self, request)
                finally:
                    depth[0] -= 1
                    if profiled:
                        profile.disable()
                    ops.setdefault(_name + (" (checked)" if checked else ""), []).append(
                        time.perf_counter() - started)
            setattr(server.Server, name, timed)
        try:
            return serve_plain(argv)
        finally:  # the cwd is the worker's scratch folder, the one place it may write
            new = sorted(set(sys.modules) - before)
            Path("worker-ops.json").write_text(json.dumps({"ops": ops, "imported": new}))
            profile.dump_stats("worker.prof")

    server.main = profiled_main


# ------------------------------------------------------------- the driver


def _table(title: str, table: dict) -> list[str]:
    lines = [title, f"  {'name':34} {'n':>5} {'total ms':>10} {'median ms':>10} {'max ms':>9}"]
    for key, values in sorted(table.items(), key=lambda kv: -sum(kv[1])):
        s = sorted(values)
        lines.append(f"  {key:34} {len(s):5d} {1e3 * sum(s):10.1f} {1e3 * s[len(s) // 2]:10.2f} {1e3 * s[-1]:9.1f}")
    return lines


def _granting(folder: Path, started: float, times: dict) -> threading.Thread:
    """The judge's side of a turn (run/turn.py), granted as soon as asked: when it was asked, from the start."""
    from pytest_cudaopt.run.turn import Turn

    turn = Turn(folder)

    def grant():
        while not turn.wanted():
            if times.get("ended"):
                return
            time.sleep(0.002)
        turn.grant()
        times["asked"], times["granted"], times["channel"] = turn.asked_at - started, turn.granted_at, turn
    thread = threading.Thread(target=grant, daemon=True)
    thread.start()
    return thread


def run_stage(stage: str, workdir: Path, args: list[str], out: Path, env: dict, turns: bool = False,
              plain: bool = False) -> str:
    prof, data = out / f"{stage}.prof", out / f"{stage}.json"
    from pytest_cudaopt.launch import plugin_args  # -p pytest_cudaopt.plugin where the package is not installed

    profiler = [] if plain else ["-m", "cProfile", "-o", str(prof)]
    command = [sys.executable, *profiler, "-m", "pytest", *plugin_args(),
               str(workdir / "model_new.py"),
               "--rootdir", str(workdir), "-p", "no:cacheprovider", "-p", "no:benchmark", "-p", "stage_profile",
               "-m", STAGES[stage], "--durations=0", "--durations-min=0.05", "-q", *args]
    started, times, extra = time.monotonic(), {}, {}
    granters = []
    if turns:   # a place for every stage, a turn for the perf stage: each granted as soon as asked
        channels = [("CUDAOPT_PLACE", "place")] + ([("CUDAOPT_TURN", "turn")] if stage == "perf" else [])
        for env_name, name in channels:
            folder = out / f"{stage}-{name}"
            shutil.rmtree(folder, ignore_errors=True)
            extra[env_name] = str(folder)
            granters.append((name, _granting(folder, started, times.setdefault(name, {}))))
    proc = subprocess.run(command, cwd=workdir, env={**env, **extra, "STAGE_PROFILE_JSON": str(data),
                                                     "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])},
                          capture_output=True, text=True)
    ended = time.monotonic()
    wall = ended - started
    lines = [f"== {stage}: pytest -m '{STAGES[stage]}' exit {proc.returncode}, wall {wall:.2f} s"]
    try:   # the plugin's tables and marks, written at the child's exit
        doc, unread = json.loads(data.read_text()), None
    except (OSError, ValueError) as exc:
        doc, unread = {}, exc
    for name, granter in granters:
        times[name]["ended"] = True
        granter.join()
        asked = times[name].get("asked")
        if name == "place":   # held until the child left it (its work on the device done), as a judge counts
            place = times[name].get("channel")
            if asked is None:
                lines.append("place: never asked")
            elif place is not None and place.left():
                lines.append(f"place: asked {asked:.2f} s after the start, held {place.held():.2f} s")
            else:
                lines.append(f"place: asked {asked:.2f} s after the start, never left")
            continue
        lines.append("turn: never asked" if asked is None else
                     f"turn: asked {asked:.2f} s after the start, held {wall - asked:.2f} s to the end")
        marks = doc.get("marks", {})
        if asked is not None and marks.get("item ended") and marks.get("worker stopped"):
            item, stopped = marks["item ended"], marks["worker stopped"]
            lines.append(f"  of it: {item - times[name]['granted']:.2f} s to the perf item's end, then "
                         f"{stopped - item:.2f} s to the worker's stop, {ended - stopped:.2f} s to the process's end")
            after = [(k, v) for k, v in sorted(marks.items(), key=lambda kv: kv[1]) if v >= item]
            lines.append("  after the item: " + ", ".join(f"{k} +{v - item:.2f} s" for k, v in after)
                         + f", process ended +{ended - item:.2f} s")
    try:
        if unread is not None:
            raise unread
        lines += _table("worker requests (judging side, wall)", doc["requests"])
        lines += _table("start-up steps", doc["steps"])
        inside = json.loads(data.with_name(f"{stage}-worker-ops.json").read_text())
        lines += _table("worker ops (inside the worker)", inside["ops"])
        tops = sorted({m.split(".")[0] for m in inside["imported"]})
        lines.append(f"modules the worker imported after its fork: {len(inside['imported'])} ({', '.join(tops)})")
    except (OSError, ValueError) as exc:
        lines.append(f"(no request table: {exc})")
    tail = proc.stdout.splitlines()
    start = next((i for i, line in enumerate(tail) if "slowest durations" in line), max(0, len(tail) - 40))
    lines += ["pytest:", *("  " + line for line in tail[start:][:60])]
    if proc.returncode not in (0, 1) or not tail:
        lines += ["stderr:", *proc.stderr.splitlines()[-30:]]
    if prof.is_file():

        buffer = io.StringIO()
        stats = pstats.Stats(str(prof), stream=buffer)
        stats.sort_stats("cumulative").print_stats(r"pytest_cudaopt|torch/(cuda|_dynamo|_inductor)/__init__|importlib", 45)
        lines += ["cProfile (judging process, cumulative):", buffer.getvalue()[-9000:]]
    worker_prof = data.with_name(f"{stage}-worker.prof")
    if worker_prof.is_file():

        buffer = io.StringIO()
        pstats.Stats(str(worker_prof), stream=buffer).sort_stats("cumulative").print_stats(45)
        lines += ["cProfile (worker, inside its ops, cumulative):", buffer.getvalue()[-9000:]]
    return "\n".join(lines)


def main() -> int:
    if sys.argv[1:2] == ["--zygote"]:
        return serve_zygote(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="leaky_relu")
    parser.add_argument("--variant", default="honest")
    parser.add_argument("--cpu", action="store_true", help="the repo's cpu_scale on the CPU")
    parser.add_argument("--stages", default="check,perf")
    parser.add_argument("--out", type=Path, default=Path("out"))
    parser.add_argument("--turns", action="store_true",
                        help="each stage asks for its place, the perf stage for its turn (granted at once)")
    parser.add_argument("--warm", action="store_true",
                        help="run each stage once unmeasured first (its modules' bytecode written, the Inductor cache "
                             "filled), as in a judge that has judged before")
    parser.add_argument("--plain", action="store_true",
                        help="the judging process without cProfile (its exit then holds no profile dump)")
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    import judge_gallery

    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "workdirs"
    if opts.cpu:
        workdir = judge_gallery.cpu_gallery(scratch)[0] if not (scratch / "cpu_scale-honest").is_dir() \
            else scratch / "cpu_scale-honest"
        args = judge_gallery.CPU_ARGS
    else:
        workdir = scratch / f"{opts.problem}-{opts.variant}"
        if not workdir.is_dir():
            judge_gallery.gpu_gallery(scratch)
        args = judge_gallery.GPU_ARGS
    from pytest_cudaopt.judge.options import Options
    from pytest_cudaopt.judge.stages import common_environment

    # What a judge gives every child (Inductor compiling in the child's own process: no pool to shut down at its
    # exit), and bytecode in a folder of its own, as a judge's children read the one its zygote writes: a machine
    # whose Python packages ship none would otherwise compile every module from source inside the measured stages.
    env = dict(os.environ, PYTHONUNBUFFERED="1", **common_environment(Options(bytecode=out / "bytecode")))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t = time.monotonic()
    built = subprocess.run([sys.executable, "-m", "pytest_cudaopt.cli", "build", str(workdir)], cwd=workdir, env=env,
                           capture_output=True, text=True)
    print(f"build: exit {built.returncode}, {time.monotonic() - t:.1f} s", flush=True)
    if built.returncode:
        print(built.stdout[-3000:], built.stderr[-3000:])
        return 1
    name = f"stage-profile-{os.getpid()}"
    zygote = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--zygote", name], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=dict(env, PYTHONPATH=str(ROOT)), start_new_session=True)
    zygote.stdout.readline()
    env["CUDAOPT_WORKER_ZYGOTE"] = name
    if opts.warm:   # unmeasured: the modules each stage imports compiled, the caches filled
        (out / "warm").mkdir(exist_ok=True)
        for stage in opts.stages.split(","):
            run_stage(stage, workdir, args, out / "warm", env, opts.turns, plain=True)
    for stage in opts.stages.split(","):
        text = run_stage(stage, workdir, args, out, env, opts.turns, opts.plain)
        (out / f"{stage}.txt").write_text(text)
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
