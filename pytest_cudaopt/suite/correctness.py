"""Placeholder: the correctness verdict's items (being written)."""


class TestCorrectness:
    pass
