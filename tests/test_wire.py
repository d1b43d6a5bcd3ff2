"""wire.py's sender refuses, before a byte goes out, what the other process's reader would refuse."""

from __future__ import annotations

import collections
from multiprocessing import Pipe

import pytest
import torch

from pytest_cudaopt import wire


class Opaque:
    pass


def test_plain_values_dtypes_devices_sizes_and_tensors_go_through():
    sent = {"n": [1, 2.5, "s", b"b", None, True, (3,), {4}, frozenset({5})], "dtype": torch.float16,
            "device": torch.device("cpu"), "size": torch.Size([2, 3]), "ordered": collections.OrderedDict(a=1),
            "complex": 1 + 2j,
            "x": torch.arange(6.0).reshape(2, 3)}
    left, right = Pipe()
    arena = wire.Arena.create()   # the CPU tensors' way, as between a worker and its judging process
    try:
        wire.send(left, sent, arena, "judge")
        got = wire.receive(right, arena, "judge")
    finally:
        arena.unlink()
    assert {k: v for k, v in got.items() if k != "x"} == {k: v for k, v in sent.items() if k != "x"}
    assert torch.equal(got["x"], sent["x"])


@pytest.mark.parametrize("value, named", [
    (slice(1, 2), "a builtins.slice (slice(1, 2, None))"),
    (range(3), "a builtins.range (range(0, 3))"),
    (Opaque(), "a test_wire.Opaque ("),
    (torch.nn.Parameter(torch.ones(2)), "a torch.nn.parameter.Parameter, not a plain torch.Tensor"),
    (pytest.importorskip("numpy").int64(64), "a numpy.int64 (np.int64(64))"),
])
def test_what_the_reader_refuses_is_refused_at_the_sender_naming_its_type(value, named):
    left, right = Pipe()
    with pytest.raises(wire.Unsendable) as refused:
        wire.send(left, {"op": "make", "init": [8, value]}, None, "judge")
    assert named in str(refused.value)
    assert not right.poll(0.05)   # nothing went out


def test_the_reader_still_refuses_what_another_sender_let_through():
    """The allow-list is the reader's: a sender without the check cannot get past it."""
    import pickle

    left, right = Pipe()
    left.send_bytes(pickle.dumps({"init": [slice(1)]}))
    with pytest.raises(pickle.UnpicklingError, match="may not name builtins.slice"):
        wire.receive(right, None, "judge")
