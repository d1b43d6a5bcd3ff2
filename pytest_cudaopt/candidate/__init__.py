"""RUNS IN THE CANDIDATE'S PROCESS: the worker that loads model_new.py and the extension.

It imports the standard library, torch, `pytest_cudaopt.wire` and its own modules only
(tests/test_layout.py holds it): what the judging side believes of the candidate is decided
there, from the plain facts these modules return. `python -m pytest_cudaopt.candidate` confines
itself (sandbox.py) before torch is imported, then serves (serve.py)."""
