"""The policy verdict's items: one per rule id, failing with `path:line: RULE-ID: what was found` lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudaopt import policy
from pytest_cudaopt.ledger import RULE_PROPERTY, SKIP_PROPERTY
from pytest_cudaopt.results import DISABLED
from pytest_cudaopt.watchdog import set_stage

_REPORTS = pytest.StashKey[dict]()


def _built_extension(session, workdir: Path):
    """The extension MN010 constructs ModelNew with: this session's build, else the last one on
    disk, else None (the stand-in). Compiles nothing."""
    from pytest_cudaopt import build

    module = session.loaded_extension(workdir)
    if module is None:
        try:
            module = build.existing_extension(workdir, settings=session.settings)
        except build.BuildError:  # a build that does not load: the correctness items say why
            module = None
    return module


def _report(config: pytest.Config, workdir: Path) -> tuple[policy.Config, list[policy.Violation]]:
    """The workdir's configuration and the violations of the rules that only read its files,
    computed once per session: nothing of the workdir is imported."""
    reports = config.stash.setdefault(_REPORTS, {})
    key = Path(workdir).resolve()
    if key not in reports:
        settings = policy.load_config(key)
        reports[key] = (settings, policy.check_workdir(key, settings, construct=False))
    return reports[key]


def _construction(session, workdir: Path, settings: policy.Config) -> list[policy.Violation]:
    """MN010's violations: model_new.py imported and ModelNew constructed, under the item's
    watchdog (a hang there is one of the workdir's set-up)."""
    if "MN010" in settings.disable:
        return []
    set_stage("importing model.py and model_new.py and constructing Model and ModelNew (MN010)")
    return policy.check_construction(workdir, _built_extension(session, Path(workdir).resolve()))


@pytest.mark.policy
class TestPolicy:
    """The workdir rules (`cudaopt check` gives the same lines); no GPU needed."""

    @pytest.mark.parametrize("rule", policy.RULE_IDS)
    def test_rule(self, rule: str, cudaopt_workdir_path: Path, cudaopt_session,
                  request: pytest.FixtureRequest) -> None:
        settings, violations = _report(request.config, cudaopt_workdir_path)
        if rule in policy.IMPORTS_WORKDIR:
            violations = _construction(cudaopt_session, cudaopt_workdir_path, settings)
        lines = list(policy.iter_rule_lines(violations, rule, cudaopt_workdir_path))
        if rule in settings.disable and not lines:  # the owner's choice, shown as a relaxation
            request.node.user_properties.append((SKIP_PROPERTY, DISABLED))
            pytest.skip(f"{rule} is disabled by [tool.cudaopt] in {cudaopt_workdir_path / 'pyproject.toml'}")
        if lines:
            pytest.fail(f"{rule}: {policy.RULES[rule]}\n" + "\n".join(lines), pytrace=False)

    def test_extension_functions(self, cudaopt_workdir_path: Path, cudaopt_session, request) -> None:
        """EX001: every cuda_extension function that model_new.py calls is defined by the built
        module. Uses the session's build, builds now when this session's correctness or perf
        items will build anyway, else the last build on disk."""
        from pytest_cudaopt import build
        from pytest_cudaopt.policy.extension_names import RULE, RULE_TEXT, check_extension_names

        request.node.user_properties.append((RULE_PROPERTY, RULE))
        set_stage("building or loading the extension (EX001)")
        module = cudaopt_session.loaded_extension(cudaopt_workdir_path)
        failure = ""
        try:
            if module is None and cudaopt_session.builds_later(cudaopt_workdir_path):
                module = cudaopt_session.extension(cudaopt_workdir_path)
            if module is None:  # the last build on disk, its import verified like a build's
                module = cudaopt_session.inspect_extension(cudaopt_workdir_path)
        except build.BuildError as exc:
            failure = (cudaopt_session.failure_report(cudaopt_workdir_path, request.node.nodeid, exc)
                       if cudaopt_session.builds_later(cudaopt_workdir_path) else
                       f"{RULE} not checked: {exc.summary}; the build log: {exc.log_path}")
        if failure:
            pytest.fail(failure, pytrace=False)
        if module is None:
            pytest.skip(f"{RULE} needs the built extension: run `cudaopt build {cudaopt_workdir_path}` "
                        "or the correctness items first")
        found = check_extension_names(cudaopt_workdir_path, module)
        if found:
            pytest.fail(f"{RULE}: {RULE_TEXT}\n" + "\n".join(
                policy.format_violation(v, cudaopt_workdir_path) for v in found), pytrace=False)
