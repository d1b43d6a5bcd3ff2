"""pytest hooks and fixtures of cudaopt: options, report header, GPU skips, the per-workdir items."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from pytest_cudaopt.results import blame, ledger
from pytest_cudaopt.results.ledger import LedgerHooks, kind_of
from pytest_cudaopt.run import signals, turn, watchdog
from pytest_cudaopt.suite import settings as _settings
from pytest_cudaopt.suite.collection import SUITE_MODULE, WorkdirModule, bind_timing, is_workdir_file, matches_python_files, worker_ahead, workdir_node, workdirs_in
from pytest_cudaopt.primitives.environment import pin_worker_to_gpu
from pytest_cudaopt.suite.session import CudaoptSession

SESSION_KEY = pytest.StashKey[CudaoptSession]()
# CUDAOPT_SELF_TEST as it was when the plugin loaded, before any conftest.py could set it.
_SELF_TEST_AT_LOAD = os.environ.get("CUDAOPT_SELF_TEST", "")
# The items that judge the workdir at run time: on the device, under the watchdog.
JUDGED_KINDS = ("correctness", "perf", "memsafety")
MARKERS = {"build": "the workdir's extension compiles and imports (generated per workdir; runs without a GPU too)",
           "correctness": "the custom path computes the same function as model.py (generated per workdir)",
           "perf": "the custom path is faster than torch.compile (generated per workdir)",
           "policy": "the workdir rules hold (generated per workdir)",
           "memsafety": "one small case of the custom path runs clean under compute-sanitizer (generated per workdir)",
           "gpu": "needs a CUDA device; skipped with a reason where none is visible"}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_cudaopt.suite.hookspecs import CudaoptHooks

    pluginmanager.add_hookspecs(CudaoptHooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cudaopt", "cudaopt: judge a CUDA extension workdir")
    for option in _settings.OPTIONS:
        dest = "cudaopt_" + option.name
        if option.cli and option.is_flag:
            group.addoption(option.flag, dest=dest, default=None, action="store_const", const="true",
                            help=option.full_help)
            group.addoption(option.off_flag, dest=dest, action="store_const", const="false",
                            help=f"turn {option.flag} off")
        elif option.cli:
            group.addoption(option.flag, dest=dest, default=None, help=option.full_help)
        if option.ini:
            parser.addini(option.ini_key, help=option.full_help, default=None)


def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """A misspelled `--cudaopt-*` option: a usage error naming the closest one (argparse says only "unrecognized")."""
    unknown = _settings.unknown_flags(args)
    if unknown:
        raise pytest.UsageError(f"cudaopt: unknown option {'; '.join(unknown)}")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    unknown = _settings.unknown_ini_keys(_settings.ini_keys(config.inipath, config.option.override_ini or ()))
    if unknown:
        raise pytest.UsageError(f"cudaopt: unknown ini option {'; '.join(unknown)} in {config.inipath}")
    try:
        resolved = _settings.Settings.resolve_all(cli=lambda name: config.getoption("cudaopt_" + name, default=None),
                                                  ini=lambda name: config.getini("cudaopt_" + name),
                                                  env={**os.environ, "CUDAOPT_SELF_TEST": _SELF_TEST_AT_LOAD})
    except _settings.SettingError as exc:
        raise pytest.UsageError(f"cudaopt: {exc}") from None
    # A pytest-xdist worker uses the seed its controller drew (pytest_configure_node).
    seed = getattr(config, "workerinput", {}).get("cudaopt_seed")
    session = config.stash[SESSION_KEY] = CudaoptSession(resolved, rootpath=config.rootpath, seed=seed,
                                                         asked=config.getoption("markexpr", default="") or "")
    session.workdir_paths = workdirs_in(config.args, config.invocation_params.dir, config.rootpath)
    _check_report_path(config)
    # The files a verdict is written to, as absolute paths: no worker's environment may name them.
    paths = [getattr(config.option, dest, None) for dest in ("xmlpath", "benchmark_json", "report_log", "htmlpath")]
    session.workers.secrets = [str(Path(config.invocation_params.dir, str(getattr(path, "name", path))).resolve())
                               for path in filter(None, [*paths, session.settings.report])]
    if session.workdir_paths or _cudaopt_options_given(config):
        signals.install()  # before torch is imported: an interrupt never lands inside an import
    if session.workdir_paths:
        named = workdirs_in(config.args, config.invocation_params.dir)
        if named and worker_ahead(config, session.settings.device):
            session.workers.launch(named[0])  # its torch import beside this process's, below
        bind_timing()
    session.emit = _terminal_lines(config)
    if hasattr(config, "workerinput"):
        pin_worker_to_gpu(config.workerinput["workerid"])
    watchdog.keep_stderr()  # the terminal's stderr, for the watchdog (fd 2 is captured during tests)
    config.pluginmanager.register(LedgerHooks(session.ledger, lambda nodeid: _item_workdir(session, nodeid)),
                                  "cudaopt-ledger")
    from pytest_cudaopt.run.supervision import BlameHooks, InterruptHooks

    config.pluginmanager.register(InterruptHooks(session), "cudaopt-interrupt")
    config.pluginmanager.register(BlameHooks(), "cudaopt-blame")
    if not config.pluginmanager.hasplugin("benchmark"):
        config.pluginmanager.register(_NoBenchmark(), "cudaopt-no-benchmark")


def _check_report_path(config: pytest.Config) -> None:
    """Refuse at once a `--cudaopt-report` on another output's file, a folder or a file that is no report."""
    session = config.stash[SESSION_KEY]
    if not session.settings.report or hasattr(config, "workerinput"):
        return
    others = {f"--{flag}": getattr(config.option, dest, None)
              for flag, dest in (("junitxml", "xmlpath"), ("benchmark-json", "benchmark_json"),
                                 ("report-log", "report_log"), ("html", "htmlpath"))}
    refused = session.resolve_report(config.invocation_params.dir, others)
    if refused:
        raise pytest.UsageError(f"cudaopt: --cudaopt-report={session.settings.report}: {refused}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say at once that the JSON report cannot be written (the verdicts still run)."""
    error = _session(session.config).report_error
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if error and reporter is not None:
        reporter.write_line(f"cudaopt: ERROR: --cudaopt-report: {error}; the verdicts run, no JSON report is "
                            "written, and the run exits with status 4", red=True, bold=True)


def _terminal_lines(config: pytest.Config):
    """Build progress on pytest's terminal, past output capturing (a build runs inside an item's setup)."""

    def emit(text: str) -> None:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None or config.get_verbosity() < -1 or hasattr(config, "workerinput"):
            return
        capman = config.pluginmanager.get_plugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            reporter.ensure_newline()
            reporter.write_line(f"cudaopt build: {text}")

    return emit


def _item_workdir(session: CudaoptSession, nodeid: str) -> str:
    return str((session.rootpath / nodeid.split("::")[0]).parent)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info) -> None:
    """pytest-benchmark's hook (called only where pytest-benchmark is loaded)."""
    from pytest_cudaopt.results import report

    report.machine_info(machine_info)


class _NoBenchmark:
    """Without pytest-benchmark the perf items' `benchmark` argument is None and only the gate runs."""

    @pytest.fixture
    def benchmark(self):
        return None


def _session(config: pytest.Config) -> CudaoptSession:
    return config.stash[SESSION_KEY]


HEADER_SHOWN = pytest.StashKey[bool]()


def _header_lines(config: pytest.Config) -> list[str]:
    from pytest_cudaopt.primitives.environment import device_summary

    session = _session(config)
    return [device_summary(session.settings.device), *session.header_lines()]


def _cudaopt_options_given(config: pytest.Config) -> bool:
    return any(config.getoption("cudaopt_" + option.name, default=None) is not None
               for option in _settings.OPTIONS if option.cli)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """torch, CUDA, GPU, arch, the seed and the relaxations, where the command line names a workdir or a
    --cudaopt option; elsewhere they wait for collection to find a workdir (other projects import no torch)."""
    if _session(config).workdir_paths or _cudaopt_options_given(config):
        config.stash[HEADER_SHOWN] = True
        return _header_lines(config)
    return []


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
    if not config.stash.get(HEADER_SHOWN, False) and any(workdir_node(item) for item in items):
        return _header_lines(config)
    return []


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """A `model_new.py` next to a `model.py` is a workdir: collect the verdict suite for it (where pytest's
    python plugin collects the file itself, it asks pytest_pycollect_makemodule below)."""
    if is_workdir_file(file_path) and not (
            parent.session.isinitpath(file_path)
            or matches_python_files(file_path, parent.config.getini("python_files"))):
        return WorkdirModule.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    if is_workdir_file(module_path):
        return WorkdirModule.from_parent(parent, path=module_path)
    return None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The suite's canonical correctness item runs once per secret seed (`cudaopt_seeds`)."""
    if "seed_index" in metafunc.fixturenames and getattr(metafunc.module, "__name__", "") == SUITE_MODULE:
        count = _session(metafunc.config).settings.seeds
        metafunc.parametrize("seed_index", range(count), ids=[f"seed{i}" for i in range(count)])


@pytest.hookimpl(trylast=True)  # after reordering plugins (pytest-randomly), for the gate's order
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    session = _session(config)
    for item in items:
        if session.settings.device == "cuda" and workdir_node(item) is not None \
                and any(item.get_closest_marker(m) for m in JUDGED_KINDS):
            item.add_marker(pytest.mark.gpu)
    if session.settings.ci_gate:  # policy, then correctness, then perf (a stable sort)
        order = ("build", "policy", "correctness", "memsafety", "perf")
        items.sort(key=lambda i: next((n for n, m in enumerate(order) if i.get_closest_marker(m)), len(order)))
    # A skip mark (not pytest.skip in a hook): `-rs` shows the item's own location. The CI gate fails them instead.
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    reason = session.gpu_unavailable_reason() if gpu_items else None
    if reason and not session.settings.ci_gate:
        for item in gpu_items:
            node = workdir_node(item)
            own = (session.gpu_unavailable_reason(workdir_item=True, workdir=node.workdir_path)
                   if node is not None else reason)
            item.add_marker(pytest.mark.skip(reason=own))


@pytest.hookimpl(tryfirst=True)   # before a pytest-xdist worker sends its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    from pytest_cudaopt.run.supervision import start_sentinel

    # In whatever order the plugins and options left (pytest-randomly; --ff and --nf reorder after every other
    # pytest_collection_modifyitems), a workdir's perf item runs after its correctness items: their precision bounds
    # its timed outputs (perf/timed_precision.py).
    from pytest_cudaopt.suite.scheduling import perf_after_correctness

    session.items[:] = perf_after_correctness(session.items)
    cudaopt = _session(session.config)
    for item in session.items:
        node = workdir_node(item)
        cudaopt.ledger.collect(item.nodeid, kind_of(item.nodeid, (m.name for m in item.iter_markers())),
                               str(node.workdir_path) if node is not None else _item_workdir(cudaopt, item.nodeid))
    start_sentinel(session, _supervised, str(cudaopt.report_path) if cudaopt.report_path else None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """pytest-xdist controller: the items a worker collected, so that one never run is counted."""
    session = _session(node.config)
    for nodeid in ids:
        session.ledger.collect(nodeid, kind_of(nodeid), _item_workdir(session, nodeid))


def _supervised(item: pytest.Item) -> bool:
    """Under the watchdog from the first line: the workdir's items and any correctness or perf item."""
    from pytest_cudaopt.run.supervision import judged

    return workdir_node(item) is not None or judged(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """GPU items without a device fail in the CI gate; a workdir's items after its hang fail at once."""
    session = _session(item.config)
    if item.get_closest_marker("gpu") and session.settings.ci_gate:
        reason = session.gpu_unavailable_reason()
        if reason:
            from pytest_cudaopt.commands.gate import SETUP_PROPERTY

            item.user_properties.append((SETUP_PROPERTY, reason))
            where = workdir_node(item)
            cpu = (f" (a CPU workdir: `cudaopt gate {where.workdir_path} -- --cudaopt-device=cpu`, or cudaopt_device = "
                   f"\"cpu\" in its pyproject.toml)" if where is not None else "")
            pytest.fail(f"{reason}: the CI gate never passes without the device{cpu}", pytrace=False)
    node = workdir_node(item)
    if node is not None and (session.hung or session.hogs):
        from pytest_cudaopt.run.supervision import judged, static

        reason = None if static(item) else session.not_run_reason(node.workdir_path, judged=judged(item))
        if reason:
            pytest.fail(reason, pytrace=False)
    if not (item.get_closest_marker("build") or item.get_closest_marker("policy")):
        turn.enter_place()   # a judge's child: started, imported and collected without its place on the device
    if os.environ.get(turn.PAUSE):
        turn.set_hold(session.workers.hold)      # and before each correctness case (turn.pause_within)
        turn.pause_point(session.workers.hold)   # a judge's check child: another workdir's turn on its device
    return (yield from _run_supervised(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Supervised items run under the watchdog (supervision.py)."""
    return (yield from _run_supervised(item, "call"))


def _run_supervised(item: pytest.Item, when: str):
    if not _supervised(item):
        return (yield)
    from pytest_cudaopt.run.supervision import run_supervised

    session, node = _session(item.config), workdir_node(item)
    return (yield from run_supervised(item, session, node.workdir_path if node is not None else session.rootpath, when))


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    _session(config).terminal_summary(terminalreporter)


@pytest.hookimpl(tryfirst=True)  # before junitxml's: no worker is alive when a verdict file is written
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    config = session.config
    cudaopt = _session(config)
    cudaopt.workers.stop()
    turn.leave()   # a judge's child: its place and turn end here, not at its exit
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller reports
        config.workeroutput["cudaopt_records"] = cudaopt.records()
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED:  # before any verdict item was collected, say
        cudaopt.ledger.end(ledger.INTERRUPTED, f"interrupted by {signals.reason() or 'KeyboardInterrupt'}")
    elif exitstatus == pytest.ExitCode.INTERNAL_ERROR:
        cudaopt.ledger.end(ledger.INTERNAL_ERROR, "pytest stopped with an internal error")
    elif (session.shouldfail or session.shouldstop) and cudaopt.ledger.pending():
        cudaopt.ledger.end(ledger.STOPPED, f"stopped early: {session.shouldfail or session.shouldstop}")
    cudaopt.write_report()
    if cudaopt.report_error and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.USAGE_ERROR  # the report asked for was not written
    blamed = blame.exit_status(cudaopt.account().blame)
    if blamed and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        session.exitstatus = blamed  # no verdict: 75 the environment's, 70 the harness's (blame.py)


def pytest_unconfigure(config: pytest.Config) -> None:
    signals.uninstall()


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist controller: each workdir's perf item goes with its canonical correctness items (scheduling.py)."""
    from pytest_cudaopt.suite.scheduling import scheduler

    return scheduler(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist controller: every worker gets the controller's seed (the header's seed replays any failure)."""
    node.workerinput["cudaopt_seed"] = _session(node.config).seed


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist controller: collect the results of a finished worker."""
    _session(node.config).add_records(getattr(node, "workeroutput", {}).get("cudaopt_records", []))


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
    """A build that fails fails the item with the compiler's report, not a traceback."""
    from pytest_cudaopt.extension import BuildError

    try:
        return session.workers.extension_module(workdir, session.extension(workdir).so_path)
    except BuildError as exc:
        failure = session.failure_report(workdir, test, exc)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def cudaopt_root_extension(request: pytest.FixtureRequest, cudaopt_session: CudaoptSession):
    """The rootdir workdir's built `cuda_extension` module, built once per session."""
    return _built_extension(cudaopt_session, cudaopt_session.rootpath, request.node.nodeid)


@pytest.fixture
def cuda_extension(request: pytest.FixtureRequest, cudaopt_session: CudaoptSession, cudaopt_workdir_path: Path):
    """The item's workdir's built `cuda_extension` module (the rootdir's outside workdir items)."""
    if cudaopt_workdir_path.resolve() == cudaopt_session.rootpath.resolve():
        return request.getfixturevalue("cudaopt_root_extension")
    return _built_extension(cudaopt_session, cudaopt_workdir_path, request.node.nodeid)
