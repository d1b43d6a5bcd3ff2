"""pytest hooks and fixtures of cudaopt: options, report header, GPU skips, the per-workdir items."""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import os
import re
from pathlib import Path

import pytest

from pytest_cudaopt import settings as _settings
from pytest_cudaopt.session import CudaoptSession, pin_worker_to_gpu, workdirs_in

SESSION_KEY = pytest.StashKey[CudaoptSession]()
# CUDAOPT_SELF_TEST as it was when the plugin loaded, before any conftest.py could set it.
_SELF_TEST_AT_LOAD = os.environ.get("CUDAOPT_SELF_TEST", "")
SUITE_MODULE = "pytest_cudaopt.suite.items"
# Importing these binds the timing functions that `perf.clocks.tampered()` checks.
TIMING_MODULES = ("pytest_cudaopt.perf.clocks", "pytest_cudaopt.perf.trace")
# The items that judge the workdir at run time: on the device, under the watchdog.
JUDGED_KINDS = ("correctness", "perf", "memsafety")
MARKERS = {
    "correctness": "the custom path computes the same function as model.py (generated per workdir)",
    "perf": "the custom path is faster than torch.compile (generated per workdir)",
    "policy": "the workdir rules hold (generated per workdir)",
    "memsafety": "one small case of the custom path runs clean under compute-sanitizer (generated per workdir)",
    "gpu": "needs a CUDA device; skipped with a reason where none is visible",
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_cudaopt.hookspecs import CudaoptHooks

    pluginmanager.add_hookspecs(CudaoptHooks)


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
            env={**os.environ, "CUDAOPT_SELF_TEST": _SELF_TEST_AT_LOAD},
        )
    except _settings.SettingError as exc:
        raise pytest.UsageError(f"cudaopt: {exc}") from None
    # A pytest-xdist worker uses the seed its controller drew (pytest_configure_node).
    seed = getattr(config, "workerinput", {}).get("cudaopt_seed")
    config.stash[SESSION_KEY] = CudaoptSession(resolved, rootpath=config.rootpath, seed=seed)
    config.stash[SESSION_KEY].workdir_paths = workdirs_in(config.args, config.invocation_params.dir, config.rootpath)
    if config.stash[SESSION_KEY].workdir_paths:
        bind_timing()
    config.stash[SESSION_KEY].emit = _terminal_lines(config)
    if hasattr(config, "workerinput"):
        pin_worker_to_gpu(config.workerinput["workerid"])
    from pytest_cudaopt import watchdog

    watchdog.keep_stderr()  # the terminal's stderr, for the watchdog (fd 2 is captured during tests)
    config.pluginmanager.register(_FailedItems(config.stash[SESSION_KEY]), "cudaopt-failed-items")
    if config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_BenchmarkHooks(), "cudaopt-benchmark")
    else:
        config.pluginmanager.register(_NoBenchmark(), "cudaopt-no-benchmark")


def bind_timing() -> None:
    """Import the timing engine, which binds time.perf_counter, torch.cuda.synchronize, ...
    as they are now. Called before any workdir code runs: in pytest_configure when the
    command line names a workdir, else when collection finds the first one (a workdir's
    model_new.py is imported only when its items run). Not at the plugin's import, so that
    loading the plugin imports no torch."""
    for name in TIMING_MODULES:
        importlib.import_module(name)


def _terminal_lines(config: pytest.Config):
    """Build progress on pytest's terminal, past output capturing (a build runs inside an
    item's setup): one `cudaopt build: ...` line per step. Silent with -qq and on xdist workers."""

    def emit(text: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or config.get_verbosity() < -1 or hasattr(config, "workerinput"):
            return
        capman = config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(f"cudaopt build: {text}")

    return emit


class _FailedItems:
    """Remembers the correctness, perf and memory-safety items pytest reports as failed (also those run by a
    pytest-xdist worker that crashed): the JSON report counts the ones without a result."""

    def __init__(self, session: CudaoptSession):
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed and any(kind in report.keywords for kind in JUDGED_KINDS):
            lines = [line for line in report.longreprtext.strip().splitlines()
                     if line.strip() and not re.match(r"\[gw\d+\] ", line)]  # xdist's worker header
            self.session.failed_items.setdefault(report.nodeid, lines[0] if lines else "failed")


class _BenchmarkHooks:
    """pytest-benchmark's hooks, registered only when pytest-benchmark is loaded."""

    @staticmethod
    def pytest_benchmark_update_machine_info(config, machine_info) -> None:
        from pytest_cudaopt import report

        report.machine_info(machine_info)


class _NoBenchmark:
    """Without pytest-benchmark (absent, or `-p no:benchmark`) the perf items' `benchmark`
    argument is None and only the gate runs."""

    @pytest.fixture
    def benchmark(self):
        return None


def _session(config: pytest.Config) -> CudaoptSession:
    return config.stash[SESSION_KEY]


HEADER_SHOWN = pytest.StashKey[bool]()


def _header_lines(config: pytest.Config) -> list[str]:
    from pytest_cudaopt.environment import device_summary

    session = _session(config)
    return [device_summary(session.settings.device), *session.header_lines()]


def _cudaopt_options_given(config: pytest.Config) -> bool:
    return any(config.getoption("cudaopt_" + option.name, default=None) is not None
               for option in _settings.OPTIONS if option.cli)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """torch, CUDA, GPU, arch, the seed and the relaxations, where cudaopt has work: the command
    line names a workdir (or the rootdir is one), or sets a --cudaopt option. Elsewhere the
    lines wait for collection to find a workdir, so that other projects' pytest runs in the
    same environment print nothing of cudaopt and import no torch."""
    if _session(config).workdir_paths or _cudaopt_options_given(config):
        config.stash[HEADER_SHOWN] = True
        return _header_lines(config)
    return []


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
    if not config.stash.get(HEADER_SHOWN, False) and any(_workdir_node(item) for item in items):
        return _header_lines(config)
    return []


def _is_workdir_file(file_path: Path) -> bool:
    return file_path.name == "model_new.py" and (file_path.parent / "model.py").is_file()


def _matches_python_files(path: Path, patterns: list[str]) -> bool:
    """Whether pytest's python plugin collects `path` (the `python_files` ini patterns): a
    pattern without a slash matches the file name, one with a slash the end of the path."""
    for pattern in patterns:
        if "/" not in pattern and os.sep not in pattern:
            matched = fnmatch.fnmatch(path.name, pattern)
        else:
            full = pattern if os.path.isabs(pattern) else f"*{os.sep}{pattern}"
            matched = fnmatch.fnmatch(str(path), full)
        if matched:
            return True
    return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """A `model_new.py` next to a `model.py` is a workdir: collect the verdict suite for it.
    Where pytest's python plugin collects the file itself (a path named on the command
    line, or one matching python_files), it asks pytest_pycollect_makemodule below."""
    if _is_workdir_file(file_path) and not (
            parent.session.isinitpath(file_path)
            or _matches_python_files(file_path, parent.config.getini("python_files"))):
        return WorkdirModule.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    if _is_workdir_file(module_path):
        return WorkdirModule.from_parent(parent, path=module_path)
    return None


class WorkdirModule(pytest.Module):
    """The suite in `pytest_cudaopt.suite.items`, collected once for each workdir under
    the workdir's `model_new.py` (node ids like `model_new.py::TestCorrectness::...`)."""

    @classmethod
    def from_parent(cls, parent: pytest.Collector, **kwargs) -> "WorkdirModule":
        bind_timing()  # before the suite, and the workdir's code, is imported
        module = super().from_parent(parent, **kwargs)
        module.obj = importlib.import_module(SUITE_MODULE)  # instead of importing model_new.py
        return module

    @property
    def workdir_path(self) -> Path:
        return self.path.parent


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The suite's canonical correctness item runs once per secret seed (`cudaopt_seeds`)."""
    if "seed_index" in metafunc.fixturenames and getattr(metafunc.module, "__name__", "") == SUITE_MODULE:
        count = _session(metafunc.config).settings.seeds
        metafunc.parametrize("seed_index", range(count), ids=[f"seed{i}" for i in range(count)])


def _workdir_node(item: pytest.Item) -> WorkdirModule | None:
    return item.getparent(WorkdirModule)


@pytest.hookimpl(trylast=True)  # after reordering plugins (pytest-randomly), for the gate's order
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _session(config)
    for item in items:
        node = _workdir_node(item)
        if node is None:
            continue
        needs_device = any(item.get_closest_marker(m) for m in JUDGED_KINDS)
        if needs_device and session.settings.device == "cuda":
            item.add_marker(pytest.mark.gpu)
    if session.settings.ci_gate:  # policy, then correctness, then perf (a stable sort)
        order = ("policy", "correctness", "memsafety", "perf")
        items.sort(key=lambda i: next((n for n, m in enumerate(order) if i.get_closest_marker(m)), len(order)))
    # A skip mark (not pytest.skip in a hook) so that `-rs` shows the item's own location. The
    # CI gate never skips them: pytest_runtest_setup fails them instead.
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = session.gpu_unavailable_reason() if gpu_items else None
    if reason and not session.settings.ci_gate:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_finish(session: pytest.Session) -> None:
    from pytest_cudaopt.supervision import start_sentinel

    # Collection has loaded every conftest.py and no workdir code yet (model_new.py and the
    # extension are imported when their items run): what torch is now is trusted.
    if any(_workdir_node(item) for item in session.items):
        unwatched = _session(session.config).isolation.trust().unwatched
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if unwatched and reporter is not None:  # a torch without some of the API: said, not hidden
            reporter.write_line(f"cudaopt: isolation does not verify {'; '.join(unwatched)}")
    start_sentinel(session)


def _judged(item: pytest.Item) -> bool:
    from pytest_cudaopt.supervision import judged

    return judged(item)


def pytest_runtest_setup(item: pytest.Item) -> None:
    session = _session(item.config)
    if item.get_closest_marker("gpu") and session.settings.ci_gate:
        reason = session.gpu_unavailable_reason()
        if reason:
            from pytest_cudaopt.ci_gate import SETUP_PROPERTY

            item.user_properties.append((SETUP_PROPERTY, reason))
            pytest.fail(f"{reason}: the CI gate never passes without the device", pytrace=False)
    node = _workdir_node(item)
    if node is not None and _judged(item):
        reason = session.not_run_reason(node.workdir_path)
        if reason:
            pytest.fail(reason, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Correctness and perf items run under supervision (supervision.py)."""
    if not _judged(item):
        return (yield)
    from pytest_cudaopt.supervision import run_judged

    session = _session(item.config)
    node = _workdir_node(item)
    return (yield from run_judged(item, session, node.workdir_path if node is not None else session.rootpath))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    _session(config).terminal_summary(terminalreporter)


def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    config = session.config
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller reports
        config.workeroutput["cudaopt_records"] = _session(config).records()
    else:
        _session(config).write_report()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist controller: every worker gets the controller's seed, so the seed in the
    header replays a failure of any worker."""
    node.workerinput["cudaopt_seed"] = _session(node.config).seed


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist controller: collect the results of a finished worker."""
    records = getattr(node, "workeroutput", {}).get("cudaopt_records", [])
    _session(node.config).add_records(records)


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


def _built_extension(session: CudaoptSession, workdir: Path, test: str):
    """A build that fails fails the item with the compiler's report, not a traceback (the
    first item of the workdir; later ones refer to it)."""
    from pytest_cudaopt.build import BuildError

    try:
        return session.extension(workdir)
    except BuildError as exc:
        failure = session.failure_report(workdir, test, exc)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def cudaopt_root_extension(request: pytest.FixtureRequest, cudaopt_session: CudaoptSession):
    """The rootdir workdir's built `cuda_extension` module, built once per session."""
    return _built_extension(cudaopt_session, cudaopt_session.rootpath, request.node.nodeid)


@pytest.fixture
def cuda_extension(request: pytest.FixtureRequest, cudaopt_session: CudaoptSession,
                   cudaopt_workdir_path: Path):
    """The item's workdir's built `cuda_extension` module (the rootdir's outside workdir
    items); built once per workdir per session."""
    if cudaopt_workdir_path.resolve() == cudaopt_session.rootpath.resolve():
        return request.getfixturevalue("cudaopt_root_extension")
    return _built_extension(cudaopt_session, cudaopt_workdir_path, request.node.nodeid)
