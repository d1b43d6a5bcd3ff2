"""Judge many workdirs: each in fresh processes of its own, over every GPU of a host (a worker pool) or many hosts (Ray)."""

from pytest_cudaopt.judge.discover import find_workdirs
from pytest_cudaopt.judge.engine import FAILED, PASSED, UNJUDGED, Judge, judge, run
from pytest_cudaopt.judge.lines import LINE_SCHEMA, STATUSES
from pytest_cudaopt.judge.options import Options
from pytest_cudaopt.judge.scheduler import Scheduler
from pytest_cudaopt.judge.service import Service

__all__ = ["FAILED", "LINE_SCHEMA", "PASSED", "STATUSES", "UNJUDGED", "Judge", "Options", "Scheduler",
           "Service", "find_workdirs", "judge", "run"]
