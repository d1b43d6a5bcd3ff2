"""What a user meets when something is wrong: bad settings, a missing file, Ctrl-C, a killed build, a CPU workdir's header and skips."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from pytest_cudaopt import extension as build, cli, policy
from pytest_cudaopt.results import jsonreport
from pytest_cudaopt.suite import settings
from pytest_cudaopt.extension import runner
from pytest_cudaopt.primitives.environment import device_summary


@pytest.mark.parametrize("flag, raw", [("--cudaopt-timeout", "nan"), ("--cudaopt-timeout", "inf"),
                                       ("--cudaopt-atol", "inf"), ("--cudaopt-rtol", "nan"),
                                       ("--cudaopt-min-speedup", "inf"), ("--cudaopt-atol", "-1")])
def test_a_meaningless_number_is_a_usage_error_naming_its_source(pytester, run_pytest, flag, raw):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run_pytest(pytester, f"{flag}={raw}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*cudaopt: {flag}='{raw}': expected *got '{raw}'*"])


def test_zero_tolerances_are_valid():
    resolved = settings.Settings.resolve_all(cli=lambda name: {"atol": "0", "rtol": "0"}.get(name), env={})
    assert (resolved.atol, resolved.rtol) == (0.0, 0.0)
    with pytest.raises(settings.SettingError, match="environment variable CUDAOPT_TIMEOUT='nan'"):
        settings.Settings.resolve_all(env={"CUDAOPT_TIMEOUT": "nan"})


def test_the_command_has_a_version_and_a_description(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("cudaopt ")
    help_text = cli.parser().format_help()
    assert "Judge a workdir that accelerates a PyTorch model" in help_text and "front door" not in help_text


def test_verify_takes_pytest_options_with_the_workdir_omitted(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text("")
    monkeypatch.chdir(tmp_path)
    seen = {}
    monkeypatch.setattr(cli, "_run_pytest", lambda workdir, marker, extra: seen.update(
        workdir=workdir, marker=marker, extra=list(extra)) or 0)
    assert cli.main(["verify", "--cudaopt-device=cpu"]) == 0
    assert seen == {"workdir": tmp_path.resolve(), "marker": "correctness", "extra": ["--cudaopt-device=cpu"]}
    with pytest.raises(SystemExit):
        cli.main(["check", "--cudaopt-device=cpu"])  # check takes no pytest options


def test_report_of_a_missing_file_says_no_such_file(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err.strip() == f"cudaopt report: {tmp_path / 'r.json'}: no such file"
    with pytest.raises(ValueError, match="not a cudaopt JSON report"):
        (tmp_path / "bad.json").write_text("{}")
        jsonreport.render_file(tmp_path / "bad.json")


def test_ctrl_c_during_build_says_interrupted_and_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text("")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "build", interrupted)
    assert cli.main(["build", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "cudaopt build: interrupted"


def _fake_ninja(tmp_path: Path, script: str, monkeypatch) -> types.SimpleNamespace:
    ninja = tmp_path / "ninja"
    ninja.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    ninja.chmod(0o755)
    monkeypatch.setattr(runner, "_ninja", lambda: str(ninja))
    (tmp_path / "out").mkdir()
    return types.SimpleNamespace(build_dir=tmp_path / "out")


def test_a_no_op_build_keeps_the_last_real_build_log(tmp_path, monkeypatch):
    cfg = _fake_ninja(tmp_path, """\
        if [ -f "$2/built" ]; then echo "ninja: no work to do."; exit 0; fi
        touch "$2/built"; echo "[1/1] c++ a.cpp"; echo "a.cpp:1: warning: unused variable"
    """, monkeypatch)
    steps, code = runner.run_ninja(cfg, lambda text: None, time.monotonic())
    assert (steps, code) == (["c++ a.cpp"], 0)
    steps, code = runner.run_ninja(cfg, lambda text: None, time.monotonic())
    assert (steps, code) == ([], 0)
    assert "warning: unused variable" in (cfg.build_dir / "build.log").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DEATHSIG is Linux's")
def test_ninja_dies_with_the_process_that_started_it(tmp_path, subprocess_env):
    pid_file = tmp_path / "ninja.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time, types
        from pathlib import Path
        from pytest_cudaopt.extension import runner
        ninja = Path({str(tmp_path)!r}) / "ninja"
        ninja.write_text("#!/bin/sh\\necho $$ > {pid_file}\\nexec sleep 60\\n")
        ninja.chmod(0o755)
        runner._ninja = lambda: str(ninja)
        runner.run_ninja(types.SimpleNamespace(build_dir=Path({str(tmp_path)!r})), print, time.monotonic())
    """)], env=subprocess_env)
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        # A dead child is a zombie until its new parent reaps it; /proc tells them apart.
        state = Path(f"/proc/{child}/stat").read_text().split()[2] if Path(f"/proc/{child}/stat").exists() else "Z"
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("ninja outlived the killed process that started it")


def test_the_header_names_the_arch_only_for_cuda_workdirs():
    assert " arch " not in device_summary("cpu") and ", arch " in device_summary("cuda")


def test_a_cpu_workdir_whose_kernels_are_cpp_passes_kc005(tmp_path, copy_workdir):
    workdir = copy_workdir("cpu_scale", tmp_path / "wd")
    assert "KC005" not in {v.rule for v in policy.check_workdir(workdir)}
    (workdir / "kernels" / "extra.cu").write_text("__global__ void k() {}\n")
    assert "KC005" in {v.rule for v in policy.check_workdir(workdir)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: GPU tests run")
def test_the_gpu_skip_reason_points_at_the_item(pytester, run_pytest):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_needs_a_gpu():
            pass
    """)
    result = run_pytest(pytester, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_the_gpu_skip_reason_points_at_the_item.py:3: "
                                 "no CUDA device visible*"])
    assert "pytest_cudaopt" not in "".join(line for line in result.outlines if line.startswith("SKIPPED"))


def test_the_watchdog_runs_without_pytests_faulthandler_plugin(pytester, run_pytest):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.correctness
        def test_judged():
            pass
    """)
    result = run_pytest(pytester, "-p", "no:faulthandler", "--cudaopt-device=cpu")
    result.assert_outcomes(passed=1)
