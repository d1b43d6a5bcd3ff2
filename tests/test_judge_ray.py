"""The Ray backend on a local Ray cluster (CPU workdirs): the same lines as the local pool, a crash in its own line, and a task whose worker died retried and counted once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_cudaopt.judge import Judge, Options
from pytest_cudaopt.judge.pool import LocalPool
from pytest_cudaopt.judge.ray_backend import RayPool, remote_judge
from support import JUDGE_CACHE, JUDGE_CPU_ARGS, judge_workdirs

ray = pytest.importorskip("ray", reason="the Ray backend needs the ray extra: pip install -e '.[ray]'")

FIELDS = ("status", "passed", "verdicts")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return judge_workdirs(tmp_path_factory.mktemp("ray"), names=("honest", "wrong", "segfault"))


def _options(**kwargs) -> Options:
    return Options(cpu_slots=2, jobs=2, timeout=120, cache_dir=JUDGE_CACHE, pytest_args=list(JUDGE_CPU_ARGS), **kwargs)


def test_ray_and_the_local_pool_give_the_same_verdicts(cluster, cases):
    by_ray = {Path(line["workdir"]).name: line for line in Judge(list(cases.values()), _options(), ray="local")}
    local = {Path(line["workdir"]).name: line for line in LocalPool(list(cases.values()), _options()).lines()}
    assert sorted(by_ray) == sorted(local) == sorted(cases)
    for name in cases:
        assert {f: by_ray[name][f] for f in FIELDS} == {f: local[name][f] for f in FIELDS}, name
        assert by_ray[name]["key"] == local[name]["key"]   # the same idempotent key: same path, content, options
        assert by_ray[name]["workdir"] == str(cases[name])  # as the driver named it, not the task's copy
    assert by_ray["honest"]["passed"] and (by_ray["segfault"]["status"], by_ray["segfault"]["passed"]) == ("judged", False)


def test_a_task_whose_worker_died_is_retried_and_its_line_counted_once(cluster, cases, tmp_path):
    marker = tmp_path / "died-once"

    def dies_once(packed, name, key, options_json):
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)   # the worker process dies, as on a lost node
        return remote_judge(packed, name, key, options_json)

    pool = RayPool([cases["honest"]], _options(), "local", task=dies_once, retries=2)
    found = list(pool.lines())
    assert marker.exists()
    assert len(found) == 1 and found[0]["passed"] and pool.duplicates == 0
    assert found[0]["pid"] != int(marker.read_text())


def test_a_task_that_dies_every_time_still_gets_a_line(cluster, cases):
    def always_dies(packed, name, key, options_json):
        os._exit(1)

    found = list(RayPool([cases["wrong"]], _options(), "local", task=always_dies, retries=1).lines())
    assert len(found) == 1 and found[0]["status"] == "error" and not found[0]["passed"]
    assert "Ray task ended without a result" in found[0]["reason"]
