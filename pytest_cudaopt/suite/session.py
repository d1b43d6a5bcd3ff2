"""One object per pytest session: settings, built extensions, loaded workdirs, faults and results."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable

from pytest_cudaopt.remote.workers import Workers
from pytest_cudaopt.results.ledger import Ledger
from pytest_cudaopt.suite.settings import Settings


class CudaoptSession:
    def __init__(self, settings: Settings, rootpath: Path, seed: int | None = None, asked: str = ""):
        self.settings = settings
        self.rootpath = Path(rootpath)
        # Every trial's secret seed derives from it; pytest-xdist workers receive the controller's.
        if seed is None:
            seed = settings.seed if settings.seed is not None else secrets.randbits(32)
        self.seed: int = seed
        self.results: list[Any] = []
        self.workdir_paths: list[Path] = []
        self._extensions: dict[Path, Any] = {}
        self._workdirs: dict[Path, Any] = {}
        self._references: dict[Path, Any] = {}   # model.py imported, no worker yet (`reference`)
        self.workers = Workers(settings)
        self._failures_reported: dict[tuple, str] = {}  # (workdir, error) → the item that reported it
        self.emit: Callable[[str], None] | None = None
        # Set by the first CUDA fault: (item id, message). Later GPU items report it.
        self.fault: tuple[str, str] | None = None
        # Workdir → (item id, message, in setup) of its first item that timed out (not_run_reason).
        self.hung: dict[Path, tuple[str, str, bool]] = {}
        self.hogs: dict[Path, tuple[str, str]] = {}   # workdir -> (the item, what its worker held): note_hog
        self.ledger = Ledger(asked)
        # Where `--cudaopt-report` goes, and why it cannot be written, once known.
        self.report_path: Path | None = Path(settings.report) if settings.report else None
        self.report_error: str = ""

    def relaxations(self) -> list[str]:
        from pytest_cudaopt.results import relaxations as trust

        return trust.relaxations(self.settings, self.workdir_paths)

    def header_lines(self) -> list[str]:
        """The reproduce line, then every relaxation in force, loudly."""
        relaxed = self.relaxations()
        return [f"cudaopt: seed {self.seed} (replay with --cudaopt-seed={self.seed}), "
                f"device {self.settings.device}, hypothesis profile {self.settings.profile}",
                *([f"cudaopt: RELAXED ({len(relaxed)}): " + "; ".join(relaxed)] if relaxed else [])]

    def gpu_unavailable_reason(self, workdir_item: bool = False, workdir: Path | None = None) -> str | None:
        """Why a `gpu` item cannot run here, or None (a workdir item's reason names the CPU setting)."""
        from pytest_cudaopt.primitives.environment import cuda_device_name

        if cuda_device_name() is None:
            hint = (f"; kernels written as C++ for the CPU are judged here with --cudaopt-device=cpu (`pytest "
                    f"{workdir} --cudaopt-device=cpu`, or cudaopt_device = \"cpu\" in the workdir's pyproject.toml, "
                    f"as `cudaopt init --device cpu` writes)" if workdir_item else "")
            return f"no CUDA device visible (torch.cuda.is_available() is False){hint}"
        return None

    def verdict_hook(self, item, name: str, **kwargs: Any) -> Any:
        """The result of hook `name` for `item`; one implemented outside pytest_cudaopt fails the item."""
        import pytest

        hook = getattr(item.ihook, name)
        foreign = [impl for impl in hook.get_hookimpls()
                   if not getattr(impl.function, "__module__", "").startswith("pytest_cudaopt.")]
        if foreign and not self.settings.self_test:
            code = getattr(foreign[0].function, "__code__", None)
            place = f"{code.co_filename}:{code.co_firstlineno}" if code else foreign[0].plugin_name
            pytest.fail(f"the hook {name} decides the verdict and is implemented in {place}; a workdir "
                        "cannot replace it (the plugin's own tests allow it with --cudaopt-self-test or "
                        "CUDAOPT_SELF_TEST=1)", pytrace=False)
        return hook(config=item.config, **kwargs)

    def extension(self, workdir: Path):
        """The workdir's build (build.BuildResult), brought up to date at most once per session."""
        from pytest_cudaopt import extension as build

        workdir = Path(workdir).resolve()
        if workdir not in self._extensions:
            try:
                result = build.compile_extension(workdir, settings=self.settings, emit=self.emit)
                if self.emit is not None and (result.compiled or result.linked or result.waited_s):
                    self.emit(build.describe(result))
                self._extensions[workdir] = result
            except build.BuildError as exc:
                # Every later item of this workdir reports the same failure without rebuilding.
                self._extensions[workdir] = exc
        return _raise_or_return(self._extensions[workdir])

    def builds_later(self, workdir: Path) -> bool:
        """Whether a correctness or perf item of `workdir` is still to run (and will build)."""
        from pytest_cudaopt.results.records import NOT_RUN

        if self.settings.device == "cuda" and self.gpu_unavailable_reason():
            return False  # its items skip, or fail in the CI gate, before any build
        workdir = Path(workdir).resolve()
        return any(entry.kind in ("correctness", "perf") and entry.status == NOT_RUN and not entry.reason
                   and Path(entry.workdir).resolve() == workdir for entry in self.ledger.entries.values())

    def built(self, workdir: Path):
        """The workdir's build if this session has made it already, else None."""
        found = self._extensions.get(Path(workdir).resolve())
        return None if found is None or isinstance(found, BaseException) else found

    def workdir(self, path: Path):
        """The loaded workdir (`workdir.Workdir`), loaded at most once per session."""
        from pytest_cudaopt.workdir import WorkdirError

        path = Path(path).resolve()
        if path not in self._workdirs:
            try:
                self._workdirs[path] = self._load(path)
            except WorkdirError as exc:
                self._workdirs[path] = exc
        found = _raise_or_return(self._workdirs[path])
        if not found.worker.alive():  # a case crashed it (its item said so): a fresh one for the next
            found.worker = self.workers.start(path, found.worker.extension)
        return found

    def _load(self, path: Path):
        """Build the extension, import model.py here, start the workdir's worker."""
        from pytest_cudaopt.run.turn import enter_place
        from pytest_cudaopt.workdir import load_reference

        build = self.extension(path)
        self._sanitize_ahead(path, build.so_path)
        enter_place()   # the build item's: built without a place on the device, loaded with one
        loaded = self._references.get(path) or load_reference(path)
        loaded.worker = self.workers.start(path, build.so_path)
        self._begin_memory_safety(loaded)
        return loaded

    def _begin_memory_safety(self, loaded) -> None:
        """Its sanitized children started ahead: the memory-safety case goes to them now, to run beside the
        correctness items (the item decides it, `workers.begun_for`); if it cannot, the item starts afresh."""
        from pytest_cudaopt.correctness.guards import derive_seed
        from pytest_cudaopt.memsafety.verdict import begin

        path = Path(loaded.path).resolve()
        ahead = self.workers.take_sanitized(path)
        if ahead is None:
            return
        try:
            self.workers.keep_begun(path, begin(loaded, self.settings, derive_seed(self.seed, "memsafety"),
                                                ahead.sanitizer, ahead))
        except Exception:   # the item draws the case again, and says what fails
            ahead.close()

    def _sanitize_ahead(self, path: Path, so_path: Path | None) -> None:
        """A memory-safety item of this workdir to run: its sanitized children start now (workers.sanitize_ahead)."""
        from pytest_cudaopt.memsafety.verdict import find_sanitizer, sanitizes
        from pytest_cudaopt.results.records import NOT_RUN

        if so_path is None or not sanitizes(self.settings):
            return
        if not any(entry.kind == "memsafety" and entry.status == NOT_RUN and Path(entry.workdir).resolve() == path
                   for entry in self.ledger.entries.values()):
            return
        sanitizer, _ = find_sanitizer(self.settings.compute_sanitizer)
        if sanitizer is not None:
            self.workers.sanitize_ahead(path, so_path, sanitizer)

    def reference(self, path: Path):
        """The workdir built and its model.py imported here, no worker started (what a perf child prepares
        before its turn); None when either fails (the item reports it once it loads the workdir)."""
        from pytest_cudaopt.extension import BuildError
        from pytest_cudaopt.workdir import WorkdirError, load_reference

        path = Path(path).resolve()
        try:
            self.extension(path)
            if path not in self._references:
                self._references[path] = load_reference(path)
        except (BuildError, WorkdirError):
            return None
        return self._references[path]

    def policy_facts(self, path: Path, mn010: bool, ex001: bool) -> list:
        """MN010's and EX001's violations, found by a worker: data, not code run here."""
        from pytest_cudaopt import extension as build_
        from pytest_cudaopt.policy import worker_violations
        from pytest_cudaopt.workdir import WorkdirError

        path = Path(path).resolve()
        if ex001 and path not in self._workdirs and self.builds_later(path):
            try:  # the worker the correctness items will use
                self.workdir(path)
            except (build_.BuildError, WorkdirError):
                pass
        loaded = self._workdirs.get(path)
        worker = loaded.worker if loaded is not None and not isinstance(loaded, BaseException) else None
        if worker is None:  # one for the workdir's policy items, kept for the session (MN010 and EX001)
            found = self.built(path)
            so = found.so_path if found is not None else build_.existing_build(path, settings=self.settings)
            worker = self.workers.policy_worker(path, so)
            ex001 = ex001 and so is not None
        reply = worker.request({"op": "policy", "mn010": mn010, "ex001": ex001}, what="checking MN010 and EX001")
        return worker_violations(path, reply)

    def loaded_or_fail(self, path: Path, test: str, verb: str = "run"):
        """The loaded workdir for item `test`; the item fails after an earlier CUDA fault or a build or load error."""
        import pytest

        from pytest_cudaopt.extension import BuildError
        from pytest_cudaopt.workdir import WorkdirError

        if self.fault is not None:
            where, message = self.fault
            pytest.fail(f"not {verb}: the candidate's earlier CUDA fault in {where} left the CUDA context "
                        f"unusable: {message}", pytrace=False)
        try:
            return self.workdir(path)
        except (BuildError, WorkdirError) as exc:
            failure = self.failure_report(path, test, exc)
        pytest.fail(failure, pytrace=False)  # outside the except block: one report, no exception chain

    def failure_report(self, path: Path, test: str, exc: BaseException) -> str:
        """A build or load error's whole report for the first item that meets it, a reference for later ones."""
        from pytest_cudaopt.extension import BuildError

        key = (Path(path).resolve(), type(exc).__name__, str(exc))
        first = self._failures_reported.setdefault(key, test)
        if first == test:
            return exc.report() if isinstance(exc, BuildError) else str(exc)
        what = "the build" if isinstance(exc, BuildError) else "loading the workdir"
        return f"not run: {what} failed; the report is under {first}"

    def target_workdir(self):
        """The loaded `baseline_workdir`, the error that loading it raised, or None."""
        if not self.settings.baseline_workdir:
            return None
        from pytest_cudaopt.extension import BuildError
        from pytest_cudaopt.workdir import WorkdirError

        try:
            return self.workdir(Path(self.settings.baseline_workdir))
        except (BuildError, WorkdirError, OSError) as exc:
            return exc

    def note_fault(self, test: str, error: BaseException | None, message: str | None = None) -> None:
        """Keep the first error after which this process's CUDA context is unusable."""
        if error is None or self.fault is not None:
            return
        from pytest_cudaopt.correctness.faults import context_lost

        if context_lost(error):
            text = str(error).strip()
            self.fault = (test, message or (text.splitlines()[0] if text else repr(error)))

    def record_hang(self, workdir: Path, test: str, case: str, message: str, correctness: bool,
                    setup: bool = False) -> None:
        """An item of `workdir` timed out (`setup`: while it set the workdir up)."""
        self.hung.setdefault(Path(workdir).resolve(), (test, message, setup))
        if correctness:
            from pytest_cudaopt.results.records import CorrectnessResult

            self.results.append(CorrectnessResult(workdir=str(workdir), test=test, case=case or "?",
                                                  passed=False, check="timeout", message=message))

    def note_hog(self, workdir: Path, test: str, why: str) -> None:
        """`test` found ModelNew's process holding more device memory than the workdir's largest case allows (`why`):
        its workers are stopped at once, so the device's other users get the memory back (a judge's checks share
        it), and the workdir's later items fail unrun."""
        path = Path(workdir).resolve()
        if path not in self.hogs:
            self.hogs[path] = (test, why)
            self.workers.stop_workdir(path)

    def not_run_reason(self, workdir: Path, judged: bool = True) -> str | None:
        """Why an item of `workdir` fails at once after a hang or a hog (None: it runs)."""
        hog = self.hogs.get(Path(workdir).resolve())
        if hog is not None and judged:
            return f"not run: {hog[0]} found {hog[1]}; its worker was stopped, freeing the device"
        hung = self.hung.get(Path(workdir).resolve())
        if hung is None or not (judged or hung[2]):
            return None
        test, message, _ = hung
        where = message[message.index("where it was:"):] if "where it was:" in message else ""
        return f"not run: {test} timed out ({message.splitlines()[0]})" + (f"\n{where}" if where else "")

    def account(self, running: str | None = None):
        """The run's account now (ledger.Account); `running`: taken before that item ran."""
        return self.ledger.account(self.results, running=running)

    def terminal_summary(self, terminalreporter) -> None:
        """The result tables and the account's lines, when this run had verdict items."""
        if not self.results and not self.ledger.entries:
            return
        from pytest_cudaopt.results import ledger, report

        account = self.account()
        records = [report.record(r) for r in [*self.results, *ledger.policy_results(account.items)]]
        lines = report.account_lines(account)
        lines += report.gate_figure_lines(self.results, terminalreporter.config)
        sandbox = self.workers.sandbox
        if sandbox is not None:
            from pytest_cudaopt.remote.candidate import describe

            lines.append(f"cudaopt: sandbox of the candidate's worker ({sandbox['workers']} started): {describe(sandbox)}")
        if self.report_error:
            lines.append(f"cudaopt: ERROR: no JSON report: --cudaopt-report={self.settings.report}: {self.report_error}")
        elif self.settings.report:
            lines.append(f"cudaopt: report written to {self.settings.report}")
        report.terminal_summary(terminalreporter, records, lines)

    def records(self) -> list[dict]:
        """The results as plain data (sent from pytest-xdist workers to the controller)."""
        from pytest_cudaopt.results import report

        return [report.record(r) for r in self.results]

    def add_records(self, records: list[dict]) -> None:
        from pytest_cudaopt.results.records import RecordedResult

        self.results.extend(RecordedResult(r) for r in records)

    def resolve_report(self, base: Path, others: dict[str, Any]) -> str:
        """Where `--cudaopt-report` goes (relative to `base`); why it is refused ("" when not)."""
        from pytest_cudaopt.results import jsonreport

        path = Path(base, self.settings.report)
        why, refused = jsonreport.unusable(path, {k: Path(base, str(v)) for k, v in others.items() if v})
        if refused:
            return why
        self.report_path, self.report_error = path, why
        return ""

    def write_report(self, running: str | None = None) -> None:
        """Write the JSON report (if asked); `running`: before that item, as an incomplete report."""
        if self.report_path is None or self.report_error:
            return
        from pytest_cudaopt.results import jsonreport, ledger

        account = self.account(running)
        doc = jsonreport.document(account, [*self.results, *ledger.policy_results(account.items)],
                                  seed=self.seed, settings=self.settings.as_dict(),
                                  relaxations=self.relaxations(), sandbox=self.workers.sandbox)
        try:
            jsonreport.write_json(self.report_path, doc)
        except OSError as exc:
            self.report_error = f"writing it failed: {type(exc).__name__}: {exc}"


def _raise_or_return(found):
    """A session's cached outcome: the error again (every later item reports it), or the value."""
    if isinstance(found, BaseException):
        raise found.with_traceback(None)
    return found
