"""The memory-safety verdict: compute-sanitizer over the candidate, the child it runs and its log reader."""
