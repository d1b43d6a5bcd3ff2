"""Judge many workdirs: each in fresh processes of its own, over every GPU of a host (a worker pool) or many hosts (Ray).

What it offers:
  `judge(paths, options, ray=None)`   one line per workdir (a dict, LINE_SCHEMA), each as it
                                      finishes; `Judge` is the same as an object that keeps the
                                      devices' busy fractions and the wall time afterwards
  `Options`                           gpus, cpu_slots, jobs, share, timeout, pytest_args, seed,
                                      cache_dir, all_stages, keep ...
  `run(paths, options, out=...)`      judge and write the lines to a JSON-lines file (`--resume`
                                      keeps the lines already there); `cudaopt judge` is this
  `Service(options)`                  a warm judge for a loop: `submit(folder | tar bytes)` returns
                                      a Future of the line; `close` drains, `stop` cancels
                                      (`cudaopt judge --serve` is it on stdin and stdout: stdio.py)
  `find_workdirs`, `Scheduler`, `LINE_SCHEMA`, `STATUSES`

Each workdir goes through four stages, each a child process with a time limit, on a private
copy of the workdir with a scrubbed environment: build (CPU; `child_build.py`, overlapping
other workdirs' GPU work, objects from the host's content-keyed cache), policy (CPU, `pytest -m
policy`: no candidate code runs before the static rules pass), check (`pytest -m "not perf and
not policy"`: correctness and the other non-perf items; several may share a GPU while their
memory fits), perf (`pytest -m perf`, alone on its GPU). A stage that does not pass ends the
workdir (unless `all_stages`). Each child is forked from the pool's zygote (run/zygote.py:
torch imported there once, the device given in the fork's environment). The modules:
scheduler.py (where each stage runs; no processes), runner.py (one child), stages.py (a stage's
command and what it left), lines.py (the line), pool.py (the local engine, also fed while it
runs), ray_backend.py (Ray: the local engine on each node), copies.py (copies, bytes,
environment), devices.py, discover.py, display.py (progress and table), engine.py (paths,
backends, files).
docs/judge.md describes the line and the guarantees.
"""

from pytest_cudaopt.judge.discover import find_workdirs
from pytest_cudaopt.judge.engine import FAILED, PASSED, UNJUDGED, Judge, judge, run
from pytest_cudaopt.judge.lines import LINE_SCHEMA, STATUSES
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.judge.scheduler import Scheduler
from pytest_cudaopt.judge.service import Service

__all__ = ["FAILED", "LINE_SCHEMA", "PASSED", "STATUSES", "UNJUDGED", "Judge", "Options", "Scheduler",
           "Service", "find_workdirs", "judge", "run"]
