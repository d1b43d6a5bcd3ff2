"""The judging side of the wire: the candidate as the verdicts call it (`candidate.Candidate`,
implemented by `model.RemoteModel`), its worker's life (`worker.Worker`), the timed window
around a gated batch (window.py), and every timing allowance (timing.py)."""
