"""Judge many workdirs: each in fresh processes of its own, over every GPU of a host (a worker pool) or many hosts (Ray).

Each workdir goes through four stages, each a child process with a time limit, on a private
copy of the workdir with a scrubbed environment: build (CPU), policy (CPU: no candidate code runs
before the static rules pass), check (correctness and the other non-perf items; several may share
a GPU while their memory fits), perf (alone on its GPU). A stage that does not pass ends the
workdir (unless `all_stages`). docs/judge.md describes the line and the guarantees.
"""

from pytest_cudaopt.judge.discover import find_workdirs
from pytest_cudaopt.judge.engine import FAILED, PASSED, UNJUDGED, Judge, judge, run
from pytest_cudaopt.judge.lines import LINE_SCHEMA, STATUSES
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.judge.scheduler import Scheduler
from pytest_cudaopt.judge.service import Service

__all__ = ["FAILED", "LINE_SCHEMA", "PASSED", "STATUSES", "UNJUDGED", "Judge", "Options", "Scheduler",
           "Service", "find_workdirs", "judge", "run"]
