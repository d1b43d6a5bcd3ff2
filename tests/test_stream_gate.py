"""The gate's judging side (pytest_cudaopt/remote/window.py) on the CPU: the page's two words, the spin on DONE and its ends, the calibration on empty batches and what a stalled enqueue does, the request's stall hook, and CUDA rebuilds without the event wait. The worker's stream side needs a GPU: tests/test_gpu_verdicts.py."""

import io
import pickle
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

import pytest

from pytest_cudaopt.remote import window as gate_mod
from pytest_cudaopt import wire as protocol
from pytest_cudaopt.remote.worker import Worker
from pytest_cudaopt.remote.window import DONE, OPEN, WindowError, JudgeWindow


@pytest.fixture
def page():
    found = JudgeWindow.create()
    yield found
    found.unlink()


def _word(gate: JudgeWindow, at: int) -> int:
    return struct.unpack_from("<I", gate.view, at)[0]


def _stream(gate: JudgeWindow, seq: int, takes: float) -> threading.Thread:
    """What the worker's stream does: wait until OPEN reaches `seq`, work `takes` s, write DONE."""
    def run():
        while _word(gate, OPEN) < seq:
            time.sleep(1e-4)
        time.sleep(takes)
        struct.pack_into("<I", gate.view, DONE, seq)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_page_is_a_private_file_that_a_second_mapping_shares(page):
    import mmap
    import os
    import stat

    assert stat.S_IMODE(os.stat(page.path).st_mode) == 0o600
    fd = os.open(page.path, os.O_RDWR)
    other = mmap.mmap(fd, gate_mod.PAGE)
    os.close(fd)
    page.open(7)
    assert struct.unpack_from("<I", other, OPEN)[0] == 7
    page.open(3)   # never backwards: a later batch's gate stays open
    assert struct.unpack_from("<I", other, OPEN)[0] == 7


def test_wait_done_returns_when_the_stream_writes_its_batch_back(page):
    seq = page.next()
    _stream(page, seq, 0.02)
    opened = page.open(seq)
    seen = page.wait_done(seq, lambda: True, limit=5)
    assert 0.02 <= seen - opened < 2


def test_wait_done_ends_when_the_worker_dies_or_the_limit_passes(page):
    seq = page.next()
    page.open(seq)
    with pytest.raises(ChildProcessError):
        page.wait_done(seq, lambda: False, limit=5)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match="not done within 0.05 s"):
        page.wait_done(seq, lambda: True, limit=0.05)
    assert time.perf_counter() - started < 2


class _GatedWorker:
    """A worker whose stream is a thread: each `gated` request starts one that waits on the gate;
    `stalls`: the enqueue does not come back until the stall hook opened the gate."""

    def __init__(self, gate: JudgeWindow, takes: float, stalls: bool = False):
        self.gate, self.takes, self.stalls = gate, takes, stalls
        self.ops: list[str] = []
        self.probes: list = []

    def alive(self) -> bool:
        return True

    def request(self, message, stall=None, **kwargs):
        self.ops.append(message["op"])
        if message["op"] == "gated":
            assert message["inputs"] == []   # the calibration runs nothing of the workdir's
            self.probes.append(message.get("probe"))
            spin = (message.get("probe") or {}).get("cycles", 0) / SPIN_RATE
            _stream(self.gate, message["seq"], self.takes + spin)
            if self.stalls:
                stall[1]()
        return {}


SPIN_RATE = 1e9   # the fake GPU's cycles a second


class _SpinWork:
    """JudgeWork's calibration steps with no GPU: a fill of nothing, no copy excess."""

    torch = None

    def cycles_per_second(self):
        return SPIN_RATE

    def fill(self, pairs):
        assert pairs == []

    def excess(self, seen, pairs):
        return 0.0, 0.0


def test_calibration_measures_empty_batches_from_opening_to_done(page):
    worker = _GatedWorker(page, 0.003)
    page.calibrate(worker, batches=5)
    assert len(page.windows) == 5 and all(0.003 <= w < 1 for w in page.windows)
    assert page.fixed == max(page.windows)
    assert worker.ops == ["gated", "collect"] * 5


def test_calibration_also_spins_the_worker_to_learn_what_a_longer_batch_adds_to_the_copy(page, monkeypatch):
    monkeypatch.setattr(gate_mod, "SPUN_S", (0.02, 0.05))
    monkeypatch.setattr(gate_mod, "SPUN_BATCHES", 2)
    worker = _GatedWorker(page, 0.0)
    page.calibrate(worker, batches=3, work=_SpinWork())
    assert [p["cycles"] for p in worker.probes] == [0] * 3 + [int(0.02 * SPIN_RATE)] * 2 + [int(0.05 * SPIN_RATE)] * 2
    assert {p["bytes"] for p in worker.probes} == {gate_mod.PROBE_BYTES}
    # each spin's median window, in the spins' order, at least as long as its worker's stream waited (how much
    # longer is the host's scheduling: on a loaded 2-core CI machine the 20 ms spin's window once took 64 ms)
    (short, _), (long, _) = page.spun
    assert len(page.parts) == 3 and short >= 0.02 and long >= 0.05


def test_extra_reads_the_spun_batches_excess_through_its_points_never_decreasing_flat_past_the_last(page):
    page.parts = [(100e-6, 170e-6)] * 3
    page.spun = [(1.1e-3, 190e-6), (2.6e-3, 230e-6), (5.1e-3, 220e-6)]   # the last one lower: noise
    assert page.extra(50e-6) == 0.0 and page.extra(100e-6) == 0.0
    assert page.extra(0.6e-3) == pytest.approx(10e-6)          # half way to the first point
    assert page.extra(1.1e-3) == pytest.approx(20e-6)
    assert page.extra(1.85e-3) == pytest.approx(40e-6)
    assert page.extra(2.6e-3) == pytest.approx(60e-6)
    assert page.extra(4e-3) == pytest.approx(60e-6) == page.extra(1.0)   # never down, never past the last
    page.spun = []
    assert page.extra(1e-3) == 0.0   # no spun calibration (no GPU spin): nothing added


def test_a_stalled_calibration_leaves_the_gate_open_and_no_gate(page):
    worker = _GatedWorker(page, 0.0, stalls=True)
    with pytest.raises(WindowError, match="did not come back"):
        page.calibrate(worker, batches=3)
    assert _word(page, OPEN) >= page.seq   # the worker's stream is never left waiting


def test_a_request_that_stalls_runs_its_hook_once_and_still_gets_its_reply(tmp_path):
    ours, theirs = socket.socketpair()
    judge, peer = Connection(ours.detach()), Connection(theirs.detach())

    def answer():
        request = protocol.receive(peer, None, "judge")
        time.sleep(0.3)
        protocol.send(peer, {"echo": request["op"]}, None, "worker")

    threading.Thread(target=answer, daemon=True).start()
    worker = Worker(tmp_path, None, "cpu")
    worker.conn = judge
    worker.proc = type("Running", (), {"poll": lambda self: None})()
    fired: list[float] = []
    try:
        reply = worker.request({"op": "gated"}, relay=False, stall=(0.05, lambda: fired.append(time.perf_counter())))
    finally:
        worker.proc = None
        judge.close()
        peer.close()
    assert reply == {"echo": "gated"} and len(fired) == 1


class _CudaRebuild:
    """Pickles as a call of torch's CUDA rebuild with arguments of the wrong form."""

    def __reduce__(self):
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        return rebuild_cuda_tensor, (1, 2, 3)


def _message_with_cuda_tensor() -> bytes:
    inner = pickle.dumps(_CudaRebuild())

    class Packer(pickle.Pickler):
        def persistent_id(self, obj):
            return ("torch", inner) if isinstance(obj, _CudaRebuild) else None

    buffer = io.BytesIO()
    Packer(buffer).dump({"outputs": [_CudaRebuild()]})
    return buffer.getvalue()


def test_a_gated_reply_rebuilds_cuda_tensors_without_the_event_wait():
    data = _message_with_cuda_tensor()
    with pytest.raises(pickle.UnpicklingError, match="a CUDA tensor reference of an unknown form"):
        protocol.receive_bytes(data, sync_events=False)   # through the unsynced rebuild
    with pytest.raises(TypeError):
        protocol.receive_bytes(data)   # torch's own, which waits on the sender's event


# -- the judging side of a gated batch (RemoteModel._time_gated), its GPU work on the CPU --------

FIXED_S = 50e-3


class _CopyWork:
    """JudgeWork's steps as plain copies (no GPU): the fill before the gate opens, the copy out."""

    def fill(self, pairs):
        for dst, src in pairs:
            dst.copy_(src)

    def excess(self, seen, pairs):
        for dst, src in pairs:
            dst.copy_(src)
        return 0.0, 0.0


class _StreamWorker:
    """A worker whose stream is a thread: the `gated` enqueue answers at once with outputs not yet
    written; once the gate opens the thread computes 2 * input into them for `takes` seconds and
    writes DONE; `collect` reports `share` of what it took, after `lingers` more seconds of work
    (another stream's, past DONE). `stalls`: the enqueue comes back only through the stall hook,
    the call `waits_at` the one whose enqueue waited; `raises`: the forward raised. `time` (the
    round trip) answers 2 * input with figures of 0."""

    dropped: list = []
    calibrated_ping = 100e-6
    stream_gate_error = ""
    handoff_bound = Worker.handoff_bound

    def __init__(self, gate, takes=0.0, share=1.0, lingers=0.0, stalls=False, raises=False, waits_at=0):
        self.stream_gate = gate
        gate.work = _CopyWork()
        self.takes, self.share, self.lingers, self.stalls, self.raises = takes, share, lingers, stalls, raises
        self.waits_at = waits_at
        self.ops: list[str] = []
        self.shared: dict = {}
        self.saw_fresh: list[bool] = []
        self.sent: list = []

    def alive(self):
        return True

    def ping(self):
        return 100e-6

    def last_words(self):
        return ""

    def sharing(self):
        import contextlib

        return contextlib.nullcontext()

    def request(self, message, stall=None, **kwargs):
        import torch

        from pytest_cudaopt.remote.worker import WorkerError

        op = message["op"]
        self.ops.append(op)
        if op == "slots":
            self.shared[message["slots"]] = [s[0] for s in message["sets"]]
            return {}
        if op == "time":
            kwargs["on_send"]()
            return {"outputs": [2 * inputs[0] for inputs in message["inputs"]],
                    "seconds": [0.0] * len(message["inputs"])}
        if op == "collect":
            self.thread.join()
            time.sleep(self.lingers)
            calls = len(self.sent)
            return {"seconds": [self.took * self.share / calls] * calls}
        seq, gate = message["seq"], self.stream_gate
        self.slots = self.shared[message["slots"]]
        self.saw_fresh.append(any(torch.equal(slot, fresh) for slot, fresh in zip(self.slots, self.fresh)))
        if self.raises:
            struct.pack_into("<I", gate.view, DONE, seq)
            raise WorkerError("ModelNew.forward raised:\nValueError: no", kind="candidate")
        outputs = [torch.empty_like(slot) for slot in self.slots[:len(message["inputs"])]]
        self.sent = outputs

        def stream():
            while _word(gate, OPEN) < seq:
                time.sleep(1e-5)
            started = time.perf_counter()
            time.sleep(self.takes)
            for out, slot in zip(outputs, self.slots):
                out.copy_(2 * slot)
            self.took = time.perf_counter() - started
            struct.pack_into("<I", gate.view, DONE, seq)

        self.thread = threading.Thread(target=stream, daemon=True)
        self.thread.start()
        enqueued = [1e-5] * len(outputs)
        if self.stalls:
            stall[1]()
            enqueued[self.waits_at] = 2.0
        return {"outputs": outputs, "enqueued": enqueued}


@pytest.fixture
def gated(page, monkeypatch):
    """`gated(**worker)`: (RemoteModel, worker, fresh input sets) on a page calibrated at FIXED_S
    (a loaded CI host wakes the stream's thread late: that delay is the worker's, in the window)."""
    import torch

    from pytest_cudaopt.remote.model import RemoteModel

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    page.parts = [(FIXED_S, 0.0)]

    def make(**kwargs):
        worker = _StreamWorker(page, **kwargs)
        worker.fresh = [torch.randn(64, 32)]
        return RemoteModel(worker, 1, "cuda", []), worker, [list(worker.fresh)]

    return make


def test_a_gated_batch_gets_the_fresh_inputs_only_after_its_enqueue_and_the_outputs_as_copies(gated):
    model, worker, sets = gated(takes=5e-3)
    ((output, seconds),) = model._time_gated(sets)
    assert worker.saw_fresh == [False]   # the buffers held other values when the worker enqueued
    assert torch_equal(output, 2 * sets[0][0]) and output is not worker.sent[0]
    assert seconds == pytest.approx(worker.took) and model.gated == 1 and not model.clock.raised()
    model._time_gated([[x.clone() for x in sets[0]]])   # the same shape: the buffers are shared once
    assert worker.ops == ["slots", "gated", "collect", "gated", "collect"]
    assert model.timing_note() == ""


def test_a_passs_batch_and_the_latency_runs_call_alternate_on_buffers_shared_once_each(gated):
    import torch

    model, worker, _ = gated(takes=1e-3)
    for calls in (2, 1, 2, 1, 2):
        batch = [[torch.randn(64, 32)] for _ in range(calls)]
        worker.fresh = [inputs[0] for inputs in batch]
        found = model._time_gated(batch)
        assert len(found) == calls and all(torch.equal(out, 2 * inputs[0]) for (out, _), inputs in zip(found, batch))
    assert worker.ops.count("slots") == 2 and worker.saw_fresh == [False] * 5


def test_a_gated_batch_that_under_reports_counts_the_window_less_the_fixed_part(gated):
    model, worker, sets = gated(takes=240e-3, share=0.5)   # hides 120 ms
    started = time.perf_counter()
    ((_, seconds),) = model._time_gated(sets)
    took = time.perf_counter() - started
    # The window less the fixed part (+ 20 us, + 1.5 us a call).
    assert worker.took - FIXED_S - 21.5e-6 <= seconds <= took - FIXED_S
    assert "took longer by the judging process's clock" in model.timing_note()


def test_a_longer_batchs_allowance_holds_what_the_calibration_found_such_a_batch_adds(gated, page):
    model, worker, sets = gated(takes=240e-3, share=0.5)   # hides 120 ms
    # Empty batches: 1 ms to DONE, the rest of FIXED_S the copy's excess; 20 ms more to DONE, 5 ms more excess.
    page.parts = [(1e-3, FIXED_S - 1e-3)]
    page.spun = [(21e-3, FIXED_S - 1e-3 + 5e-3)]
    started = time.perf_counter()
    ((_, seconds),) = model._time_gated(sets)
    took = time.perf_counter() - started
    (batch,) = model.clock.batches
    assert batch.allowance == pytest.approx(FIXED_S + 5e-3 + 21.5e-6)
    assert worker.took - FIXED_S - 5e-3 - 21.5e-6 <= seconds <= took - FIXED_S - 5e-3


def test_work_past_done_is_counted_by_the_collects_round_trip_less_a_handoff(gated):
    model, worker, sets = gated(takes=1e-3, lingers=200e-3)
    ((_, seconds),) = model._time_gated(sets)
    assert seconds > 200e-3 - FIXED_S - Worker.handoff_bound(worker, 100e-6)


def test_an_enqueue_that_stalls_opens_the_gate_and_leaves_the_batch_to_the_round_trip(gated, page):
    model, worker, sets = gated(stalls=True)
    assert model._time_gated(sets) is None
    assert "did not return within 2 s behind the gate" in model.gate_off
    assert worker.ops[-1] == "collect" and _word(page, OPEN) >= page.seq
    assert not model._gate_ready(sets)   # and every later batch of this model too
    assert "timed by the round trip, not behind the gate" in model.timing_note()


def _five_sets(worker):
    import torch

    batch = [[torch.randn(64, 32)] for _ in range(5)]
    worker.fresh = [inputs[0] for inputs in batch]
    return batch


def test_a_batch_longer_than_the_models_gated_calls_goes_behind_the_gate_in_parts(gated, monkeypatch):
    import torch

    model, worker, _ = gated(takes=1e-3)
    parts: list[int] = []
    monkeypatch.setattr(model, "_gate_ready", lambda sets: parts.append(len(sets)) or True)
    model.gate_calls = 2
    batch = _five_sets(worker)
    found = model.time_batch(batch)
    assert all(torch.equal(out, 2 * inputs[0]) for (out, _), inputs in zip(found, batch)) and len(found) == 5
    assert parts == [2, 2, 1] and worker.ops.count("gated") == 3 and "time" not in worker.ops
    # Each part's allowance: the calibrated fixed part + 20 us + 1.5 us a call.
    assert [b.allowance - FIXED_S for b in model.clock.batches] == pytest.approx([23e-6, 23e-6, 21.5e-6])


def test_a_batch_whose_later_call_waited_behind_the_gate_holds_fewer_calls_from_then_on(gated, monkeypatch):
    import torch

    model, worker, _ = gated(stalls=True, waits_at=3)   # three calls fit in what CUDA queued
    monkeypatch.setattr(model, "_gate_ready", lambda sets: not model.gate_off)
    batch = _five_sets(worker)
    assert model._time_gated(batch) is None
    assert model.gate_calls == 3 and not model.gate_off
    assert model.timing_note() == ("behind the gate at most 3 calls a batch: a batch of 5 did not return within 2 s, "
                                   "its call 4 waiting (more launches than CUDA queues on a stream that waits)")
    # A stall no call's enqueue accounts for (the answer after them waited) is the first call's.
    model.gate_calls = 0
    model._stalled(5, [1e-5] * 5)
    assert model.gate_off and model.gate_calls == 0
    model.gate_off = ""
    # Where the first call waited, the model goes by the round trip, one call at a time.
    worker.waits_at, model.gate_calls = 0, 0
    found = model.time_batch(batch)
    assert "did not return within 2 s behind the gate" in model.gate_off
    assert all(torch.equal(out, 2 * inputs[0]) for (out, _), inputs in zip(found, batch))
    assert worker.ops[-5:] == ["time"] * 5


def test_a_model_without_the_gate_is_timed_by_the_round_trip_one_call_at_a_time(gated):
    model, worker, _ = gated()
    model.worker.stream_gate = None
    assert len(model.time_batch(_five_sets(worker))) == 5 and worker.ops == ["time"] * 5


def test_a_forward_that_raises_behind_the_gate_leaves_it_open(gated, page):
    from pytest_cudaopt.remote.worker import WorkerError

    model, _, sets = gated(raises=True)
    with pytest.raises(WorkerError, match="ValueError: no"):
        model._time_gated(sets)
    assert _word(page, OPEN) >= page.seq


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_the_worker_keeps_the_input_buffers_of_the_shapes_the_judging_process_keeps():
    from types import SimpleNamespace

    from pytest_cudaopt.candidate.serve import Server

    server = Server(None)
    server.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    for sid in (1, 2, 3):
        server.op_slots({"slots": sid, "sets": [[f"x{sid}"]], "keep": 2})
    assert list(server.slots) == [2, 3] and server.slots[3] == [["x3"]]


def test_a_worker_whose_gate_cannot_be_set_up_is_left_without_one_and_the_page_removed(tmp_path, monkeypatch):
    import os

    worker = Worker(tmp_path, None, "cuda")
    asked: list[dict] = []

    def request(message, **kwargs):
        asked.append(message)
        return {"gate_error": "WindowError: cudaHostRegister of the gate's page: 3"}

    monkeypatch.setattr(worker, "request", request)
    worker.attach_stream_gate()
    assert worker.stream_gate is None and "cudaHostRegister" in worker.stream_gate_error
    assert [m["op"] for m in asked] == ["gate"] and not os.path.exists(asked[0]["path"])


class _Event:
    """torch.cuda.Event as op_gated uses it, on the host clock."""

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3


class _Gate:
    def __init__(self):
        self.ops: list[tuple[str, int]] = []

    def wait(self, seq):
        self.ops.append(("wait", seq))

    def done(self, seq):
        self.ops.append(("done", seq))


def _server():
    import contextlib
    from types import SimpleNamespace

    from pytest_cudaopt.candidate.serve import Server

    server = Server(None)
    server.torch = SimpleNamespace(no_grad=contextlib.nullcontext, cuda=SimpleNamespace(
        synchronize=lambda: None, current_stream=lambda: "stream", set_stream=lambda s: None, Event=_Event))
    server.stream_gate = _Gate()
    return server


def test_the_workers_gated_batch_runs_on_its_slots_between_the_wait_and_done_and_collects_figures():
    server = _server()

    def forward(x, k):
        if k == 0:
            raise ValueError("no")
        return x * k

    server.models = {1: forward}
    server.op_slots({"slots": 7, "sets": [[10, None], [20, None]], "keep": 2})   # a slot where a tensor goes
    reply = server.op_gated({"seq": 3, "id": 1, "slots": 7, "inputs": [[None, 2], [None, 3]]})
    assert reply["outputs"] == [20, 60] and server.stream_gate.ops == [("wait", 3), ("done", 3)]
    assert len(reply["enqueued"]) == 2 and all(s >= 0 for s in reply["enqueued"])
    seconds = server.op_collect({})["seconds"]
    assert len(seconds) == 2 and all(s >= 0 for s in seconds)
    # The gate's calibration: nothing of the workdir's, no figures.
    assert server.op_gated({"seq": 4, "inputs": []}) == {"outputs": [], "enqueued": []}
    assert server.op_collect({}) == {"seconds": []}
    # A calibration probe: outputs of its own, allocated before the wait, written behind it after the spin.
    import torch

    server.torch.empty, server.torch.uint8 = (lambda n, dtype, device: torch.zeros(n, dtype=dtype)), torch.uint8
    server.torch.cuda._sleep = lambda cycles: server.stream_gate.ops.append(("spin", cycles))
    probe = server.op_gated({"seq": 9, "inputs": [], "probe": {"bytes": 64, "count": 3, "cycles": 1000}})
    assert [tuple(t.shape) for t in probe["outputs"]] == [(64,)] * 3 and all((t == 9).all() for t in probe["outputs"])
    assert server.stream_gate.ops[-4:] == [("spin", 1), ("wait", 9), ("spin", 1000), ("done", 9)]
    # Buffers it was not given: refused before any wait is enqueued.
    with pytest.raises(RuntimeError, match="input buffers this worker was not given"):
        server.op_gated({"seq": 5, "id": 1, "slots": 8, "inputs": [[None, 2]]})
    # A forward that raises behind the gate still writes DONE.
    with pytest.raises(ValueError):
        server.op_gated({"seq": 6, "id": 1, "slots": 7, "inputs": [[None, 0]]})
    assert server.stream_gate.ops[-2:] == [("wait", 6), ("done", 6)] and ("wait", 5) not in server.stream_gate.ops
