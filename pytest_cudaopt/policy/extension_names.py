"""The `cuda_extension` functions that model_new.py calls exist in the built module (needs a build)."""

from __future__ import annotations

from pytest_cudaopt.policy.rules import BUILD_RULES, Violation

RULE = "EX001"
RULE_TEXT = BUILD_RULES[RULE]


def extension_violations(missing: list) -> list[Violation]:
    """EX001 from the facts of worker.construct.missing_functions: (line, name, why)."""
    return [Violation("model_new.py", int(line), RULE, str(why)) for line, _, why in missing]
