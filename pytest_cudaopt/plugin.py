"""pytest hooks and fixtures of cudaopt: options, report header, GPU skips, the per-workdir items."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pytest_cudaopt import settings as _settings
from pytest_cudaopt.session import CudaoptSession, device_summary

SESSION_KEY = pytest.StashKey[CudaoptSession]()
SUITE_MODULE = "pytest_cudaopt.suite.items"
MARKERS = {
    "correctness": "the custom path computes the same function as model.py (generated per workdir)",
    "perf": "the custom path is faster than torch.compile (generated per workdir)",
    "policy": "the workdir rules hold (generated per workdir)",
    "gpu": "needs a CUDA device; skipped with a reason where none is visible",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudaopt", "cudaopt: judge a CUDA extension workdir")
    for option in _settings.OPTIONS:
        if option.cli:
            group.addoption(option.flag, dest="cudaopt_" + option.name, default=None,
                            help=option.full_help)
        if option.ini:
            parser.addini(option.ini_key, help=option.full_help, default=None)


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        resolved = _settings.Settings.resolve_all(
            cli=lambda name: config.getoption("cudaopt_" + name, default=None),
            ini=lambda name: config.getini("cudaopt_" + name),
        )
    except _settings.SettingError as exc:
        raise pytest.UsageError(f"cudaopt: {exc}") from None
    config.stash[SESSION_KEY] = CudaoptSession(resolved, rootpath=config.rootpath)


def _session(config: pytest.Config) -> CudaoptSession:
    return config.stash[SESSION_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [device_summary(), _session(config).reproduce_line()]


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """A `model_new.py` next to a `model.py` is a workdir: collect the verdict suite for it."""
    if file_path.name == "model_new.py" and (file_path.parent / "model.py").is_file():
        return WorkdirModule.from_parent(parent, path=file_path)
    return None


class WorkdirModule(pytest.Module):
    """The suite in `pytest_cudaopt.suite.items`, collected once for each workdir under
    the workdir's `model_new.py` (node ids like `model_new.py::TestCorrectness::...`)."""

    @property
    def workdir_path(self) -> Path:
        return self.path.parent

    def _getobj(self):
        return importlib.import_module(SUITE_MODULE)


def _workdir_node(item: pytest.Item) -> WorkdirModule | None:
    return item.getparent(WorkdirModule)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _session(config)
    for item in items:
        node = _workdir_node(item)
        if node is None:
            continue
        needs_device = any(item.get_closest_marker(m) for m in ("correctness", "perf"))
        if needs_device and session.settings.device == "cuda":
            item.add_marker(pytest.mark.gpu)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu"):
        reason = _session(item.config).gpu_unavailable_reason()
        if reason:
            pytest.skip(reason)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    _session(config).terminal_summary(terminalreporter)


@pytest.fixture(scope="session")
def cudaopt_session(pytestconfig: pytest.Config) -> CudaoptSession:
    """The session object: resolved settings, built extensions, loaded workdirs, results."""
    return _session(pytestconfig)


@pytest.fixture(scope="session")
def cudaopt_settings(cudaopt_session: CudaoptSession):
    """The resolved cudaopt settings (`cudaopt_settings.atol`, ...)."""
    return cudaopt_session.settings


@pytest.fixture
def cudaopt_workdir_path(request: pytest.FixtureRequest, cudaopt_session: CudaoptSession) -> Path:
    """The workdir of the item being run: its WorkdirModule's folder, else the rootdir."""
    node = request.node.getparent(WorkdirModule)
    return node.workdir_path if node is not None else cudaopt_session.rootpath


@pytest.fixture
def cuda_extension(cudaopt_session: CudaoptSession, cudaopt_workdir_path: Path):
    """The workdir's built `cuda_extension` module; built once per workdir per session."""
    return cudaopt_session.extension(cudaopt_workdir_path)
