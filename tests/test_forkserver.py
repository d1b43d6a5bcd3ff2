"""The self-tests' fork server (forkserver.py): a pytest child is a fork of the process that imported torch and Hypothesis, not a fresh Python that imports them again."""

from __future__ import annotations

import pytest

from support import run_pytest, run_python, subprocess_env

import forkserver

CHILD_TEST = '''
import sys


def test_this_process_is_a_fork_of_the_server():
    import torch

    assert sys.modules["__main__"].__file__.endswith("forkserver.py"), sys.modules["__main__"]
    assert not torch.cuda._is_in_bad_fork()
    assert {"torch._dynamo", "torch._inductor", "hypothesis"} <= set(sys.modules)
'''


@pytest.mark.skipif(not forkserver.enabled(), reason="CUDAOPT_TEST_FORK=0: every pytest child is a plain subprocess")
def test_a_pytest_child_is_forked_with_the_preloaded_modules(pytester):
    pytester.makepyfile(test_child=CHILD_TEST)
    run_pytest(pytester, "test_child.py").assert_outcomes(passed=1)


PROGRAM = '''
import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0])
print("preloaded", "torch._dynamo" in sys.modules, file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
'''


@pytest.mark.skipif(not forkserver.enabled(), reason="CUDAOPT_TEST_FORK=0: every child is a plain subprocess")
def test_run_python_runs_a_module_a_script_or_code_as_python_would_with_the_preloaded_modules(tmp_path):
    import subprocess

    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**subprocess_env(), "EXIT": "3"}
    for args, path0 in ((["-m", "prog", "a b"], str(tmp_path)), ([str(tmp_path / "prog.py"), "a b"], str(tmp_path)),
                        (["-c", PROGRAM, "a b"], "")):
        done = run_python(args, cwd=tmp_path, env=env, timeout=60)
        assert done.returncode == 3, done.stderr
        assert done.stdout == f"argv ['a b'] cwd {tmp_path} path0 {path0}\n", (args, done.stdout)
        assert done.stderr == "preloaded True\n", done.stderr   # a fork of the server, not a fresh Python
    (tmp_path / "boom.py").write_text("raise ValueError('boom')\n")
    done = run_python([str(tmp_path / "boom.py")], cwd=tmp_path, timeout=60)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([str(tmp_path / "slow.py")], cwd=tmp_path, timeout=1)
