"""Placeholder: the policy verdict's items (being written)."""


class TestPolicy:
    pass
