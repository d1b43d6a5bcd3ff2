"""The policy verdict's items: one per rule id, failing with `path:line: RULE-ID: what was found` lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudaopt import policy

_REPORTS = pytest.StashKey[dict]()


def _report(config: pytest.Config, workdir: Path) -> tuple[policy.Config, list[policy.Violation]]:
    """The workdir's configuration and violations, computed once per session."""
    reports = config.stash.setdefault(_REPORTS, {})
    key = Path(workdir).resolve()
    if key not in reports:
        settings = policy.load_config(key)
        reports[key] = (settings, policy.check_workdir(key, settings))
    return reports[key]


@pytest.mark.policy
class TestPolicy:
    """Static checks of the workdir rules (`cudaopt check` gives the same lines); no GPU needed."""

    @pytest.mark.parametrize("rule", policy.RULE_IDS)
    def test_rule(self, rule: str, cudaopt_workdir_path: Path, request: pytest.FixtureRequest) -> None:
        settings, violations = _report(request.config, cudaopt_workdir_path)
        lines = list(policy.iter_rule_lines(violations, rule, cudaopt_workdir_path))
        if rule in settings.disable and not lines:
            pytest.skip(f"{rule} is disabled by [tool.cudaopt] in {cudaopt_workdir_path / 'pyproject.toml'}")
        if lines:
            pytest.fail(f"{rule}: {policy.RULES[rule]}\n" + "\n".join(lines), pytrace=False)

    def test_extension_functions(self, cudaopt_workdir_path: Path, cudaopt_session) -> None:
        """EX001: every cuda_extension function that model_new.py calls is defined by the built
        module. Uses the session's build or the last one on disk; compiles nothing."""
        from pytest_cudaopt.policy.extension_names import RULE, RULE_TEXT, check_extension_names

        module = cudaopt_session.inspect_extension(cudaopt_workdir_path)
        if module is None:
            pytest.skip(f"{RULE} needs the built extension: run `cudaopt build {cudaopt_workdir_path}` "
                        "or the correctness items first")
        found = check_extension_names(cudaopt_workdir_path, module)
        if found:
            pytest.fail(f"{RULE}: {RULE_TEXT}\n" + "\n".join(
                policy.format_violation(v, cudaopt_workdir_path) for v in found), pytrace=False)
