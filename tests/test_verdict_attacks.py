"""The judging side of the attacks on the verdict, unit by unit: a worker whose figures under-report or over-report its time (a scripted worker behind RemoteModel), a reply that names a function, and the environment a worker gets. The attacks themselves, planted in workdirs, are in tests/exploits/."""

from __future__ import annotations

import time

import pytest


class _FakeWorker:
    """What RemoteModel.time_batch asks of its worker: a reply to `time` (the figures it is told
    to report, after `takes` seconds; `reported` as shares of the time it really took, when
    `shares`), a ping (100 us unless told, calibrated at 100 us before the workdir loaded) and
    the handoff bound."""

    dropped: list = []
    stream_gate = None   # no timed window: the round trip's bound
    stream_gate_error = "no gate in this test"
    handoff_bound = __import__("pytest_cudaopt.remote.worker", fromlist=["Worker"]).Worker.handoff_bound

    def __init__(self, reported: list[float], takes: float, ping: float = 100e-6, outputs: list | None = None,
                 shares: bool = False, calibrated: float = 100e-6, spins: bool = False, cpu_factor: float = 0.0):
        self.reported, self.takes, self._ping, self.outputs, self.shares = reported, takes, ping, outputs, shares
        self.calibrated_ping = calibrated
        self.spins, self.cpu_factor, self.cpu = spins, cpu_factor, 0.0

    def ping(self) -> float:
        return self._ping

    def cpu_seconds(self) -> float | None:
        """Its CPU time as the kernel would count it: `cpu_factor` times what its `spins` took
        (None: not readable)."""
        return self.cpu if self.cpu_factor else None

    def request(self, message, on_send=None, **kwargs):
        if on_send is not None:
            on_send()
        started = time.perf_counter()
        if self.spins:   # CPU work, not a sleep
            while time.perf_counter() - started < self.takes:
                pass
        else:
            time.sleep(self.takes)
        took = time.perf_counter() - started   # a loaded host oversleeps: an honest worker reports what it took
        self.cpu += self.cpu_factor * took
        seconds = [x * took for x in self.reported] if self.shares else list(self.reported)
        return {"seconds": seconds, "outputs": list(self.outputs or [None] * len(self.reported))}


def _timed(device: str, reported: list[float], takes: float, sets: list | None = None, **kwargs):
    from pytest_cudaopt.remote.model import RemoteModel

    model = RemoteModel(_FakeWorker(reported, takes, **kwargs), 1, device, [])
    started = time.perf_counter()
    # The round trip's bound on a batch (time_batch sends a GPU's ungated batches one call at a
    # time: tests/test_stream_gate.py).
    seconds = [t for _, t in model._time_round_trip(sets or [[] for _ in reported])]
    return model, seconds, time.perf_counter() - started   # the last: an outer bound of the round trip


@pytest.fixture
def no_device(monkeypatch):
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_workers_under_reported_figures_count_the_batchs_round_trip_less_a_handoff(device, no_device):
    from pytest_cudaopt.remote.timing import CPU_WAKEUP_S

    wakeups = CPU_WAKEUP_S if device == "cpu" else 0.0  # a loaded CPU host's
    takes = 60e-3 + wakeups
    model, seconds, outer = _timed(device, reported=[1e-6, 1e-6], takes=takes)
    slack = 3 * 100e-6 + 500e-6 + wakeups
    assert takes - slack <= sum(seconds) <= outer - slack
    assert seconds[0] == pytest.approx(seconds[1])   # the deficit spread over the calls
    assert "2 of 2 timed calls took longer by the judging process's clock" in model.timing_note()
    [batch] = model.clock.batches   # what the benchmarks read: the batch's round trip less its figures
    assert batch.calls == 2 and takes - 2e-6 <= batch.shift <= outer and batch.allowance == pytest.approx(slack)
    assert model.timing_failure() == ""   # one batch is noise, not a pattern
    # Figures that add up are kept as reported (a handoff of a few ms: a loaded host's stall
    # between the worker's answer and this process's clock stays inside it).
    model, seconds, _ = _timed(device, reported=[0.5, 0.4999], takes=60e-3, shares=True, ping=2e-3, calibrated=2e-3)
    assert seconds[0] > seconds[1] >= 0.4999 * 60e-3 and "took longer" not in model.timing_note()
    # A worker without a gate on a GPU is timed by the round trip alone, and the report says so.
    assert ("not behind the gate: the worker has no gate" in model.timing_note()) == (device == "cuda")


def test_on_the_cpu_hidden_work_counts_by_the_workers_cpu_clock_less_a_handoff_not_the_wakeups(no_device):
    """15 ms of CPU work reported as 1 us is inside the 60 ms a loaded host's wakeups may add to a
    round trip (CPU_WAKEUP_S), so the wall clock alone lets it stand; the worker's CPU time, less a
    handoff and the serving of a call, counts instead."""
    from pytest_cudaopt.remote.timing import CPU_CALL_S

    handoff = 3 * 100e-6 + 500e-6 + CPU_CALL_S
    model, seconds, outer = _timed("cpu", reported=[1e-6], takes=15e-3, spins=True, cpu_factor=1.0)
    assert 15e-3 - handoff <= seconds[0] <= outer and "took longer" in model.timing_note()
    # Honest figures stand.
    model, seconds, _ = _timed("cpu", reported=[1.0], takes=15e-3, spins=True, shares=True, cpu_factor=1.0)
    assert seconds[0] >= 15e-3 and not model.clock.raised()
    # CPU time above the wall (a kernel's threads, against the rules) counts no more than the round trip.
    _, seconds, outer = _timed("cpu", reported=[1e-6], takes=15e-3, spins=True, cpu_factor=4.0)
    assert 15e-3 - handoff <= seconds[0] <= outer


def test_slow_pings_on_a_loaded_host_widen_the_wall_clocks_handoff_not_the_cpu_times(no_device):
    """Pings of 20 ms, calibrated so before the workdir loaded (a busy host), make a 60.5 ms handoff:
    wide enough for the wall clock, but the worker's CPU time holds no wakeups, so its handoff stays
    CPU_HANDOFF_S and a worker hiding 15 ms of CPU work a call is still counted for it."""
    from pytest_cudaopt.remote.timing import CPU_CALL_S, CPU_HANDOFF_S

    model, seconds, outer = _timed("cpu", reported=[1e-6], takes=15e-3, spins=True, cpu_factor=1.0,
                                   ping=20e-3, calibrated=20e-3)
    assert 15e-3 - CPU_HANDOFF_S - CPU_CALL_S <= seconds[0] <= outer and "took longer" in model.timing_note()
    [batch] = model.clock.batches
    assert batch.short > 15e-3 - CPU_HANDOFF_S - CPU_CALL_S - 1e-3


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_worker_that_slows_its_own_pings_widens_its_allowance_only_to_the_calibrated_cap(device, no_device):
    from pytest_cudaopt.remote.timing import PING_CAP_FACTOR
    from pytest_cudaopt.remote.timing import CPU_WAKEUP_S

    wakeups = CPU_WAKEUP_S if device == "cpu" else 0.0
    takes = 60e-3 + wakeups
    slack = 3 * PING_CAP_FACTOR * 100e-6 + 500e-6 + wakeups
    _, seconds, outer = _timed(device, reported=[1e-6], takes=takes, ping=40e-3)
    assert takes - slack <= seconds[0] <= outer - slack
    # A ping slower than the calibrated one, within the cap, still counts as measured.
    slack = 3 * 250e-6 + 500e-6 + wakeups
    _, seconds, outer = _timed(device, reported=[1e-6], takes=takes, ping=250e-6)
    assert takes - slack <= seconds[0] <= outer - slack


def test_cuda_tensors_widen_the_allowance_by_their_handles_not_their_bytes(no_device):
    """A CUDA tensor crosses as an IPC handle: 64 MB of them widen the allowance by a handle
    each, not by the 1 GB/s of the CPU arena's copies (which would allow 200 ms here)."""
    import torch

    from pytest_cudaopt.remote.timing import CUDA_HANDLE_S, CUDA_MESSAGE_S

    big = lambda: torch.empty(16 << 20, device="meta")  # noqa: E731 - 64 MB that take no memory
    sets = [[big(), big()]]
    model, seconds, outer = _timed("cuda", reported=[1e-6], takes=60e-3, sets=sets, outputs=[big()])
    slack = 3 * 100e-6 + 500e-6 + CUDA_MESSAGE_S + 3 * CUDA_HANDLE_S
    assert 60e-3 - slack <= seconds[0] <= outer - slack
    assert model.clock.batches[0].allowance == pytest.approx(slack)


def test_cpu_inputs_are_copied_before_the_clock_starts_so_only_the_outputs_bytes_widen_the_allowance(no_device):
    import torch

    from pytest_cudaopt.remote.timing import CPU_WAKEUP_S

    sets = [[torch.empty(16 << 20, device="meta")]]   # 64 MB in: copied into the arena before the clock
    model, seconds, outer = _timed("cpu", reported=[1e-6], takes=2 * CPU_WAKEUP_S, sets=sets,
                                   outputs=[torch.empty(1 << 20, device="meta")])   # 4 MB out: inside it
    slack = 3 * 100e-6 + 500e-6 + (4 << 20) / 1e9 + CPU_WAKEUP_S
    assert model.clock.batches[0].allowance == pytest.approx(slack)
    assert 2 * CPU_WAKEUP_S - slack <= seconds[0] <= outer - slack


def test_a_worker_whose_gpu_work_outlasts_its_answer_is_timed_to_the_end_of_it(monkeypatch):
    """The worker answers at once and its GPU goes on for 60 ms: this process's stream waits
    for the worker's outputs, and the clock stops after that wait, not at the answer."""
    calls = []

    def synchronize():  # the first: before the batch; the second: the wait for the worker's work
        calls.append(1)
        if len(calls) == 2:
            time.sleep(60e-3)

    monkeypatch.setattr("torch.cuda.synchronize", synchronize)
    model, seconds, outer = _timed("cuda", reported=[1e-6], takes=0.0)
    assert len(calls) == 2
    assert 60e-3 - (3 * 100e-6 + 500e-6) <= seconds[0] <= outer
    assert "1 of 1 timed calls took longer by the judging process's clock" in model.timing_note()


def test_a_workers_figures_above_the_time_around_them_fail_the_batch(no_device):
    from pytest_cudaopt.remote.timing import TimingError

    for device in ("cpu", "cuda"):
        with pytest.raises(TimingError, match="add up to more than the .* this process measured around them"):
            _timed(device, reported=[1.5, 1.5], takes=20e-3, shares=True)   # 3x what it took


def test_a_reply_that_names_a_function_is_refused():
    import io
    import os
    import pickle

    from pytest_cudaopt import wire as protocol

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    data = pickle.dumps({"output": Evil()})
    try:
        protocol.receive_bytes(data)
    except pickle.UnpicklingError as exc:
        assert "may not name posix.system" in str(exc) or "may not name os.system" in str(exc)
    else:
        raise AssertionError("a reply naming os.system was unpickled")
    assert protocol.receive_bytes(pickle.dumps({"n": 3, "s": "x", "l": [1.5, None]})) == {"n": 3, "s": "x", "l": [1.5, None]}
    del io


def test_the_workers_environment_names_no_verdict_file():
    from pytest_cudaopt.remote.worker import worker_env

    base = {"PATH": "/usr/bin", "HOME": "/root", "CUDAOPT_REPORT": "/x/report.json", "PYTEST_ADDOPTS": "-q",
            "TMPDIR": "/x/report.json.d", "AWS_SECRET_ACCESS_KEY": "k", "OMP_NUM_THREADS": "2"}
    env = worker_env(base, "/pkg", secrets=["/x/report.json"])
    assert env["PATH"] == "/usr/bin" and env["OMP_NUM_THREADS"] == "2" and env["PYTHONPATH"].startswith("/pkg")
    assert not any(k.startswith(("CUDAOPT_", "PYTEST_")) for k in env)
    assert "TMPDIR" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def test_a_reply_without_a_key_the_judging_process_reads_is_the_candidates_fault_not_a_keyerror_of_ours():
    """A stray or forged reply (a forked child of the worker answering on its socket did this) fails the item
    as the candidate's process's, never as the harness's KeyError."""
    from pytest_cudaopt.remote.worker import Reply, WorkerFailed
    from pytest_cudaopt.results import blame

    reply = Reply({"workdir_error": "a reply to another request"})
    reply.what = "constructing ModelNew"
    with pytest.raises(WorkerFailed) as failed:
        reply["id"]
    assert str(failed.value) == "the candidate's worker process answered without 'id' while constructing ModelNew"
    assert blame.classify(failed.value) == blame.CANDIDATE
    assert reply.get("id") is None and reply["workdir_error"] == "a reply to another request"
