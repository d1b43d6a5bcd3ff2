"""The correctness verdict: is ModelNew the same function as Model, on many shapes, through every guard."""
