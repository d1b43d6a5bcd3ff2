"""The candidate's process: the only place where model_new.py and the built extension run.

The judging process (pytest, `cudaopt check`, every judge stage) never imports model_new.py or
loads the extension. It starts a worker per workdir (`client.Worker`), sends it inputs and
parameters (shared memory on the CPU, CUDA IPC on a GPU), and gets back outputs and raw
observations (the op audit, aliasing, a kernel trace). It draws the inputs, runs the reference
and the baselines, compares, times from its own stream and decides; the worker writes no
verdict file and is given no path to one (not on its command line, not in its environment, not
in its working directory, which is a scratch folder of its own).

The modules: protocol.py (messages over a socket, the worker's environment), server.py (the
worker's side: load, construct, call, time, trace), client.py (the judging side: `Worker`,
`RemoteModel`, what a dead or hung worker means). docs/isolation.md draws the boundary.
"""

from pytest_cudaopt.worker.client import RemoteExtension, RemoteModel, Worker, WorkerError, WorkerFailed

__all__ = ["RemoteExtension", "RemoteModel", "Worker", "WorkerError", "WorkerFailed"]
