"""The gate's judging side (pytest_cudaopt/worker/stream_gate.py) on the CPU: the page's two words, the spin on DONE and its ends, the calibration on empty batches and what a stalled enqueue does, the request's stall hook, and CUDA rebuilds without the event wait. The worker's stream side needs a GPU: tests/test_gpu_verdicts.py."""

import io
import pickle
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

import pytest

from pytest_cudaopt.worker import stream_gate as gate_mod
from pytest_cudaopt.worker import protocol
from pytest_cudaopt.worker.client import Worker
from pytest_cudaopt.worker.stream_gate import DONE, OPEN, GateError, JudgeGate


@pytest.fixture
def page():
    found = JudgeGate.create()
    yield found
    found.unlink()


def _word(gate: JudgeGate, at: int) -> int:
    return struct.unpack_from("<I", gate.view, at)[0]


def _stream(gate: JudgeGate, seq: int, takes: float) -> threading.Thread:
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

    def __init__(self, gate: JudgeGate, takes: float, stalls: bool = False):
        self.gate, self.takes, self.stalls = gate, takes, stalls
        self.ops: list[str] = []

    def alive(self) -> bool:
        return True

    def request(self, message, stall=None, **kwargs):
        self.ops.append(message["op"])
        if message["op"] == "gated":
            assert message["inputs"] == []   # the calibration runs nothing of the workdir's
            _stream(self.gate, message["seq"], self.takes)
            if self.stalls:
                stall[1]()
        return {}


def test_calibration_measures_empty_batches_from_opening_to_done(page):
    worker = _GatedWorker(page, 0.003)
    page.calibrate(worker, batches=5)
    assert len(page.windows) == 5 and all(0.003 <= w < 1 for w in page.windows)
    assert page.fixed == max(page.windows)
    assert worker.ops == ["gated", "collect"] * 5


def test_a_stalled_calibration_leaves_the_gate_open_and_no_gate(page):
    worker = _GatedWorker(page, 0.0, stalls=True)
    with pytest.raises(GateError, match="did not come back"):
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
