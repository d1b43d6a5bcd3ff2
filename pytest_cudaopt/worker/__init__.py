"""The candidate's process: the only place where model_new.py and the built extension run.

The judging process (pytest, `cudaopt check`, every judge stage) never imports model_new.py or
loads the extension. It starts a worker per workdir (`client.Worker`), sends it inputs and
parameters (shared memory on the CPU, CUDA IPC on a GPU), and gets back outputs and raw
observations (the op audit, aliasing, a kernel trace). It draws the inputs, runs the reference
and the baselines, compares, times from its own stream and decides; the worker writes no
verdict file and is given no path to one (not on its command line, not in its environment, not
in its working directory, which is a scratch folder of its own).

The modules: protocol.py (messages over a socket, the worker's environment), server.py (the
worker's side: load, construct, call, time, trace), sandbox.py (the OS sandbox the worker puts
itself in before any candidate code runs), client.py (the judging side: `Worker`, what a dead or
hung worker means), candidate.py (the `Candidate` Protocol: ModelNew as the verdicts call it, the
only face of the worker they see besides timing.py), remote.py (`RemoteModel`, its implementation,
and `RemoteExtension`: ModelNew and the extension as the judging process calls them), stream_gate.py (the window around a timed batch on a GPU), zygote.py
(a process with torch imported that forks workers). docs/how-it-works.md draws the boundary.

The names below are imported on first use: `python -m pytest_cudaopt.worker` must reach its
sandbox before torch is imported (torch's import starts threads that Landlock would not cover).
"""

__all__ = ["RemoteExtension", "RemoteModel", "Worker", "WorkerError", "WorkerFailed"]


def __getattr__(name: str):
    if name in __all__:
        from pytest_cudaopt.worker import client, remote

        return getattr(remote if name.startswith("Remote") else client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
