"""The policy verdict's items: one per rule id, failing with `path:line: RULE-ID: what was found` lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_cudaopt.results import blame
from pytest_cudaopt import policy
from pytest_cudaopt.results.ledger import RULE_PROPERTY, SKIP_PROPERTY
from pytest_cudaopt.results.records import DISABLED
from pytest_cudaopt.run.watchdog import set_stage

_REPORTS = pytest.StashKey[dict]()


def _report(config: pytest.Config, workdir: Path) -> tuple[policy.Config, list[policy.Violation]]:
    """The workdir's configuration and the violations of the rules that only read its files."""
    reports = config.stash.setdefault(_REPORTS, {})
    key = Path(workdir).resolve()
    if key not in reports:
        settings = policy.load_config(key)
        reports[key] = (settings, policy.check_workdir(key, settings, construct=False))
    return reports[key]


def _construction(session, workdir: Path, settings: policy.Config, test: str) -> list[policy.Violation]:
    """MN010's violations: model_new.py imported and ModelNew constructed, in a worker."""
    if "MN010" in settings.disable:
        return []
    set_stage("importing model.py and model_new.py and constructing Model and ModelNew (MN010, in a worker)")
    return _facts(session, workdir, test, mn010=True)


def _facts(session, workdir: Path, test: str, mn010: bool = False, ex001: bool = False) -> list[policy.Violation]:
    """MN010's or EX001's violations from a worker; one that cannot load the extension, or dies, fails the item."""
    from pytest_cudaopt.extension import BuildError
    from pytest_cudaopt.workdir import WorkdirError
    from pytest_cudaopt.remote.worker import WorkerError, WorkerFailed

    if session.fault is not None:  # the worker's CUDA context is gone: no rule of ours fails in its wake
        where, message = session.fault
        pytest.fail(f"{blame.NOT_RUN_AFTER_FAULT} in {where} left the CUDA context unusable: {message}",
                    pytrace=False)
    try:
        return session.policy_facts(Path(workdir).resolve(), mn010=mn010, ex001=ex001)
    except BuildError as exc:  # the .so on disk does not import (a build of this session's: its report)
        failure = (session.failure_report(workdir, test, exc) if session.builds_later(workdir) else
                   f"{'EX001' if ex001 else 'MN010'} not checked: {exc.summary}; the build log: {exc.log_path}")
    except (WorkdirError, WorkerError, WorkerFailed) as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


@pytest.mark.policy
class TestPolicy:
    """The workdir rules (`cudaopt check` gives the same lines); no GPU needed."""

    @pytest.mark.parametrize("rule", policy.RULE_IDS)
    def test_rule(self, rule: str, cudaopt_workdir_path: Path, cudaopt_session,
                  request: pytest.FixtureRequest) -> None:
        settings, violations = _report(request.config, cudaopt_workdir_path)
        if rule in policy.IMPORTS_WORKDIR:
            violations = _construction(cudaopt_session, cudaopt_workdir_path, settings, request.node.nodeid)
        lines = list(policy.iter_rule_lines(violations, rule, cudaopt_workdir_path))
        if rule in settings.disable and not lines:  # the owner's choice, shown as a relaxation
            request.node.user_properties.append((SKIP_PROPERTY, DISABLED))
            pytest.skip(f"{rule} is disabled by [tool.cudaopt] in {cudaopt_workdir_path / 'pyproject.toml'}")
        if lines:
            pytest.fail(f"{rule}: {policy.RULES[rule]}\n" + "\n".join(lines), pytrace=False)

    def test_extension_functions(self, cudaopt_workdir_path: Path, cudaopt_session, request) -> None:
        """EX001: every cuda_extension function that model_new.py calls is defined by the built module."""
        from pytest_cudaopt import extension as build
        from pytest_cudaopt.policy.extension_names import RULE, RULE_TEXT

        request.node.user_properties.append((RULE_PROPERTY, RULE))
        set_stage("building or loading the extension (EX001)")
        failure = ""
        built = cudaopt_session.built(cudaopt_workdir_path)
        try:
            if built is None and cudaopt_session.builds_later(cudaopt_workdir_path):
                built = cudaopt_session.extension(cudaopt_workdir_path)
        except build.BuildError as exc:
            failure = cudaopt_session.failure_report(cudaopt_workdir_path, request.node.nodeid, exc)
        if failure:
            pytest.fail(failure, pytrace=False)
        if built is None and build.existing_build(cudaopt_workdir_path, settings=cudaopt_session.settings) is None:
            pytest.skip(f"{RULE} needs the built extension: run `cudaopt build {cudaopt_workdir_path}` "
                        "or the correctness items first")
        found = _facts(cudaopt_session, cudaopt_workdir_path, request.node.nodeid, ex001=True)
        if found:
            pytest.fail(f"{RULE}: {RULE_TEXT}\n" + "\n".join(
                policy.format_violation(v, cudaopt_workdir_path) for v in found), pytrace=False)
