"""The memory-safety verdict: compute-sanitizer over the candidate (verdict.py), the child it
runs (child.py) and its log reader (log.py)."""
