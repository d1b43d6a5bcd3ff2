"""RUNS IN THE CANDIDATE'S PROCESS: the worker that loads model_new.py and the extension.

It imports the standard library, torch, `pytest_cudaopt.wire` and its own modules only: the judging side decides."""
