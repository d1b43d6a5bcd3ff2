"""`cudaopt judge --serve`: one workdir a line on stdin (a path, or {"path": ..., "id": ...}), one JSON line each on stdout as it finishes; end of input drains, SIGTERM or SIGINT cancels what is left."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any, TextIO

from pytest_cudaopt.judge import lines
from pytest_cudaopt.judge.engine import UNJUDGED, exit_code
from pytest_cudaopt.judge.options import Options, result_key
from pytest_cudaopt.judge.service import Service

# Exit codes: those of `cudaopt judge` after end of input (0 every line passed, 1 some failed,
# 3 some not judged or no device); after a signal, 128 + its number (143 SIGTERM, 130 SIGINT).
STOPPING = (signal.SIGTERM, signal.SIGINT)
READY = "cudaopt judge --serve: ready"   # on stderr, once its signal handlers are in place


def request(raw: str) -> tuple[str, Any]:
    """(path, id) of one input line: a path, or a JSON object with "path" and an optional "id"."""
    text = raw.strip()
    if not text.startswith("{"):
        return text, None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("path"), str):
        raise ValueError('a JSON request needs "path", a string')
    if not isinstance(data.get("id"), (str, int, type(None))):
        raise ValueError('"id" must be a string or an integer')
    return data["path"], data.get("id")


class _Front:
    """The service between stdin and stdout: lines written whole and flushed, one by one."""

    def __init__(self, service: Service, stdout: TextIO):
        self.service, self.stdout = service, stdout
        self.written: list[dict] = []
        self.lock = threading.Lock()      # one line at a time on stdout
        self.feeding = threading.Lock()   # a submission and the signal's stop, one after the other
        self.stopped = False
        self.ended = threading.Event()    # end of input, or a signal

    def write(self, line: dict) -> None:
        with self.lock:
            self.stdout.write(lines.dumps(line) + "\n")
            self.stdout.flush()
            self.written.append(line)

    def read(self, stdin: TextIO) -> None:
        try:
            for raw in stdin:
                if not raw.strip():
                    continue
                with self.feeding:
                    if self.stopped:
                        return
                    self.submit(raw.strip())
        finally:
            self.ended.set()

    def submit(self, raw: str) -> None:
        try:
            path, id = request(raw)
            future = self.service.submit(path, id=id)
        except ValueError as exc:
            key = result_key(raw, "", self.service.options)
            self.write(lines.unjudged(raw, key, "error", f"not judged: {exc}; send a workdir's path, or "
                                                         f'{{"path": PATH, "id": ID}}, one a line'))
            return
        future.add_done_callback(lambda done: self.write(done.result()))


def serve(options: Options, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Judge the workdirs named on `stdin` until its end or SIGTERM/SIGINT; the exit code."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    try:
        service = Service(options)
    except ValueError as exc:
        print(f"cudaopt judge --serve: {exc}", file=sys.stderr)
        return UNJUDGED
    front = _Front(service, stdout)
    caught: list[int] = []

    def on_signal(signum, frame) -> None:
        caught.append(signum)
        front.ended.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOPPING}
    try:
        threading.Thread(target=front.read, args=(stdin,), name="cudaopt-serve-stdin", daemon=True).start()
        # From here a signal cancels what is queued (before, it ends the process as the default would).
        print(READY, file=sys.stderr, flush=True)
        while not front.ended.wait(0.2):
            pass
        if not caught:   # end of input: drain, unless a signal comes first
            service.close(wait=False)
            while not caught and not service.wait(0.2):
                pass
        if caught:
            with front.feeding:
                front.stopped = True
            service.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + caught[0] if caught else exit_code(front.written)
