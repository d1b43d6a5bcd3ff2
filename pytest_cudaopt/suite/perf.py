"""Placeholder: the perf verdict's items (being written)."""


class TestPerf:
    pass
