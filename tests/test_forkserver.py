"""The self-tests' fork server (forkserver.py): a pytest child is a fork of the process that imported torch and Hypothesis, not a fresh Python that imports them again."""

from __future__ import annotations

import pytest

from support import run_pytest

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
