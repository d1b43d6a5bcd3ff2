"""The workdir rules: static checks and ModelNew's construction (MN010); `check_workdir` runs them all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_cudaopt.candidate.construct import construction as construction_facts
from pytest_cudaopt.policy.construction import construction_violations
from pytest_cudaopt.policy.cpp_checks import KernelScan, check_convolution, model_convolutions
from pytest_cudaopt.policy.cpp_lexer import lex_cpp
from pytest_cudaopt.policy.extension_names import extension_violations
from pytest_cudaopt.policy.files import PROTECTED_TEMPLATES, TEMPLATES, check_kernels_dir, check_protected, write_lock
from pytest_cudaopt.policy.model_new_checks import check_model_new
from pytest_cudaopt.policy.rules import (CONFIG_KEYS, IMPORTS_WORKDIR, RULE_IDS, RULES, Config, Violation,
                                         format_violation, iter_rule_lines, load_config, render, rule_count)

__all__ = ["CONFIG_KEYS", "IMPORTS_WORKDIR", "PROTECTED_TEMPLATES", "RULE_IDS", "RULES", "TEMPLATES", "Config",
           "Violation", "check_workdir", "format_violation", "worker_violations", "iter_rule_lines", "lex_cpp",
           "load_config", "model_convolutions", "render", "rule_count", "write_lock"]


def check_workdir(workdir: Path, config: Config | None = None, extension: Any = None,
                  construct: bool = True) -> list[Violation]:
    """Every violation of the workdir rules in `workdir`, sorted, less the rules the config disables.
    `extension`: the built `cuda_extension` for MN010 (None: a stand-in); `construct=False`: none of IMPORTS_WORKDIR."""
    workdir = Path(workdir).resolve()
    config = load_config(workdir) if config is None else config
    found: list[Violation] = list(config.problems)
    found += check_model_new(workdir, config)
    if construct and "MN010" not in config.disable:  # the one rule that imports torch and runs the workdir's code
        found += construction_violations(workdir, construction_facts(workdir, extension))
    scan = KernelScan(workdir, config)
    found += scan.violations
    found += check_convolution(workdir, scan)
    found += check_protected(workdir)
    found += check_kernels_dir(workdir, scan.reached)
    # A changed locked setting is reported even when PF003 is disabled: `disable` is one of them.
    return sorted({v for v in found if v.rule not in config.disable
                   or (v.rule == "PF003" and v.path in ("pyproject.toml", "pytest.ini"))})


def worker_violations(workdir: Path, reply: dict) -> list[Violation]:
    """MN010 and EX001 from the facts a worker's `policy` request answered (candidate/construct.py)."""
    return (construction_violations(workdir, reply.get("construction"))
            + extension_violations(list(reply.get("missing") or ())))
