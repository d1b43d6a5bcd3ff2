"""Workdirs written to the agent-workdir contract: both REGISTER_BINDING forms, an agent-workdir style registry, `cudaopt adopt`, the classic utils lines, a registration mistake named."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support import REPO_ROOT, run_python, subprocess_env, TEMPLATES
from pytest_cudaopt import extension as build, classic, policy
from pytest_cudaopt.commands import scaffold
from pytest_cudaopt.candidate.construct import called_functions, missing_functions
from pytest_cudaopt.policy.extension_names import extension_violations
from pytest_cudaopt.policy.files import UPSTREAM_SHA256, fixed_file_origin

INI = "[pytest]\ncudaopt_device = cpu\ncudaopt_compile_backend = eager\n"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_python(["-m", "pytest_cudaopt.cli", *args], cwd=cwd, timeout=600)


# -- static: the shipped files, PF001/PF002 messages, adopt's view of the bindings ---------------

def test_the_shipped_registry_is_the_root_copy_and_documents_the_contract_form():
    shipped = (TEMPLATES / "binding_registry.h").read_text()
    assert shipped == (REPO_ROOT / "binding_registry.h").read_text()
    assert "REGISTER_BINDING(attention, register_attention);" in shipped


def test_every_project_kernel_uses_the_contract_form():
    regs = scaffold.find_registrations(REPO_ROOT)
    assert {name for _, _, name, _ in regs} == {"causal_attention", "linear", "linear_fp32"}
    assert {form for *_, form in regs} == {"contract"}


def test_adopt_tells_the_two_forms_apart():
    regs = {name: form for _, _, name, form in scaffold.find_registrations(REPO_ROOT / "tests/workdirs/registry_forms")}
    assert regs == {"scale": "contract", "scale_short": "short", "scale_setup": "short"}


def test_pf001_accepts_a_fixed_file_with_the_published_agent_workdir_hash(tmp_path, monkeypatch):
    (tmp_path / "binding.cpp").write_text("// an agent-workdir binding.cpp\n")
    shutil.copyfile(TEMPLATES / "binding_registry.h", tmp_path / "binding_registry.h")
    (tmp_path / "model.py").write_text("x = 1\n")
    assert fixed_file_origin(tmp_path, "binding.cpp") == "modified"
    rules = [v for v in policy.check_workdir(tmp_path) if v.rule == "PF001"]
    assert len(rules) == 1 and "cp " not in rules[0].message and "version control" in rules[0].message
    import hashlib
    digest = hashlib.sha256((tmp_path / "binding.cpp").read_bytes()).hexdigest()
    monkeypatch.setitem(UPSTREAM_SHA256, "binding.cpp", digest)
    assert fixed_file_origin(tmp_path, "binding.cpp") == "upstream"
    assert fixed_file_origin(tmp_path, "binding_registry.h") == "shipped"
    assert not [v for v in policy.check_workdir(tmp_path) if v.rule == "PF001"]


def test_pf003_accepts_the_published_empty_utils_init_whatever_the_lock_says(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text("# ours\n")
    policy.write_lock(tmp_path)
    (tmp_path / "utils" / "__init__.py").write_text("")  # the published version: an empty file
    assert not [v for v in policy.check_workdir(tmp_path) if v.rule == "PF003"]
    (tmp_path / "utils" / "__init__.py").write_text("# edited\n")
    assert [v.rule for v in policy.check_workdir(tmp_path) if v.rule == "PF003"] == ["PF003"]


def test_pf002_names_cudaopt_adopt(tmp_path):
    (tmp_path / "model.py").write_text("x = 1\n")
    (message,) = [v.message for v in policy.check_workdir(tmp_path) if v.rule == "PF002"]
    assert f"cudaopt adopt {tmp_path}" in message


def test_ex001_finds_every_cuda_extension_call_including_aliases(tmp_path):
    (tmp_path / "model_new.py").write_text(
        "import cuda_extension\nimport cuda_extension as ce\nfrom cuda_extension import gelu\n"
        "def f(x):\n    return cuda_extension.scale(ce.bias(x))\n")
    assert called_functions(tmp_path / "model_new.py") == [(3, "gelu"), (5, "bias"), (5, "scale")]


# -- the classic lines, from a report -------------------------------------------------------------

def test_verification_lines_count_the_checks_and_end_with_the_verdict():
    doc = {"results": [{"kind": "correctness", "data": {"passed": True, "case": "canonical seed0", "inputs": "x"}},
                       {"kind": "correctness", "data": {"passed": False, "case": "drawn shapes", "inputs": "",
                                                        "check": "mismatch"}}]}
    assert classic.verification_lines(doc) == ["[PASS] check 1/2: canonical seed0 x",
                                               "[FAIL] check 2/2: drawn shapes (mismatch)",
                                               "[FAIL] verify failed: 1 of 2 checks failed"]
    doc["results"].pop()
    assert classic.verification_lines(doc)[-1] == "[PASS] verify success"


def test_profiling_line_reports_the_table_medians_in_microseconds():
    doc = {"results": [{"kind": "perf", "data": {"timing": {"contenders": [
        {"key": "eager", "median_s": 30e-6}, {"key": "compile", "median_s": 20e-6},
        {"key": "custom", "median_s": 12.5e-6}]}}}]}
    assert classic.profiling_lines(doc) == ["Torch Baseline: 30.00us, Torch Compile: 20.00us, CUDA Extension: 12.50us"]


def test_single_run_refuses_an_unknown_contender():
    assert classic.parse_contenders("cuda_extension,torch_compile") == ["cuda_extension", "torch_compile"]
    with pytest.raises(ValueError, match="unknown contender cuda"):
        classic.parse_contenders("cuda")


# -- built workdirs (slow: each compiles once per checkout, shared by every test here) ----------

def test_both_registration_forms_work_in_one_module(prebuilt_workdir):
    import torch

    ext = build.build_extension(prebuilt_workdir("registry_forms"))
    assert build.defined_functions(ext) == ["scale", "scale_setup", "scale_short"]
    x, w, b = torch.randn(3, 5), torch.randn(5), torch.randn(5)
    torch.testing.assert_close(ext.scale(x, w, b), x * w + b)
    torch.testing.assert_close(ext.scale_short(x, w, b), x * w + b)
    assert build.takes_module(ext.scale_setup) and not build.takes_module(ext.scale)


def test_a_missing_function_is_named_with_what_the_module_defines_and_the_wrong_form(prebuilt_workdir):
    workdir = prebuilt_workdir("registry_forms")
    ext = build.build_extension(workdir)
    (found,) = extension_violations(missing_functions(workdir, ext))
    assert (found.path, found.rule) == ("model_new.py", "EX001")
    assert "cuda_extension has no function 'scale_forward'; it defines scale, scale_setup, scale_short" in found.message
    assert "scale_setup takes a pybind11 module: that looks like a registration function passed in the wrong form" \
        in found.message
    with pytest.raises(AttributeError, match="cuda_extension has no function 'scale_forward'; it defines scale,"):
        ext.scale_forward


def test_cudaopt_check_after_a_build_reports_the_missing_function(prebuilt_workdir, tmp_path):
    done = _cli("check", str(prebuilt_workdir("registry_forms")), cwd=tmp_path)
    assert "model_new.py:16: EX001: cuda_extension has no function 'scale_forward'" in done.stdout, done.stdout


def test_a_name_registered_twice_is_an_import_error_naming_both_files(make_workdir):
    workdir = make_workdir("registry_forms")
    (workdir / "kernels" / "twice.cpp").write_text('extern "C" int twice_launcher() { return 0; }\n')
    (workdir / "kernels" / "twice_binding.cpp").write_text(
        '#include "binding_registry.h"\n'
        'void register_twice(pybind11::module& m) { m.def("scale", [](int v) { return v; }); }\n'
        "REGISTER_BINDING(twice, register_twice);\n")
    with pytest.raises(build.BuildError, match=r"function 'scale' is defined twice \(in kernels/scale_binding.cpp "
                                               r"and in kernels/twice_binding.cpp\)"):
        build.build_extension(workdir)


def test_a_workdir_with_an_agent_workdir_style_registry_builds_and_loads_beside_a_shipped_one(prebuilt_workdir):
    import torch

    theirs = build.build_extension(prebuilt_workdir("upstream_scale"))
    ours = build.build_extension(prebuilt_workdir("cpu_scale"))
    forms = build.build_extension(prebuilt_workdir("registry_forms"))
    assert build.defined_functions(theirs) == ["scale"] == build.defined_functions(ours)
    assert build.defined_functions(forms) == ["scale", "scale_setup", "scale_short"]
    x, w, b = torch.randn(4, 3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(theirs.scale(x, w, b), ours.scale(x, w, b))


def test_adopt_records_the_lock_and_reports_fixed_files_and_bindings(make_workdir, tmp_path):
    workdir = make_workdir("upstream_scale")
    (workdir / "cudaopt.lock").unlink(missing_ok=True)
    before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file() and "build" not in p.parts}
    done = _cli("adopt", str(workdir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "binding.cpp: modified" in out and "binding_registry.h: modified" in out
    assert "bindings: 1" in out and "kernels/scale_binding.cpp:" in out and "scale: contract form" in out
    assert json.loads((workdir / "cudaopt.lock").read_text())["files"]["model.py"]
    after = {p: p.read_bytes() for p in before}
    assert after == before  # nothing but the lock was written
    assert not [v for v in policy.check_workdir(workdir) if v.rule in ("PF002", "PF003")]


def test_a_contract_workdir_passes_correctness_and_policy(pytester, make_workdir, run_pytest):
    workdir = make_workdir("cpu_scale", pytester.path / "wd")
    # KC005 (a plain .cpp kernel) is what a CPU workdir cannot avoid.
    (workdir / "pyproject.toml").write_text('[tool.cudaopt]\ndisable = ["KC005"]\n')
    policy.write_lock(workdir)  # the copy leaves *.lock files behind
    pytester.makefile(".ini", pytest=INI)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness or policy", "-p", "no:randomly", "-v")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("error", 0) == 0, result.stdout.str()
    assert outcomes["passed"] >= len(policy.RULE_IDS) - 1 + 1 + 3  # rules, EX001, canonical seeds
    result.stdout.fnmatch_lines(["*TestPolicy::test_extension_functions PASSED*"])


def test_utils_flags_print_the_classic_lines(make_workdir, tmp_path):
    workdir = make_workdir("cpu_scale")
    shutil.copytree(TEMPLATES / "utils", workdir / "utils", dirs_exist_ok=True)
    (workdir / "pytest.ini").write_text(INI)
    env = subprocess_env()
    run = lambda *a: run_python(["-m", *a], cwd=workdir, env=env, timeout=600)  # noqa: E731
    done = run("utils.verification", "--iters", "3")
    assert "[PASS] check 1/" in done.stdout and done.stdout.rstrip().endswith("[PASS] verify success"), done.stdout
    done = run("utils.profiling", "--iters", "5", "--cudaopt-max-time=1", "--cudaopt-warmup=0.05")
    assert "Torch Baseline: " in done.stdout and ", Torch Compile: " in done.stdout, done.stdout + done.stderr
    line = [l for l in done.stdout.splitlines() if l.startswith("Torch Baseline: ")][0]
    assert line.count("us") == 3 and "n/a" not in line, line
    done = run("utils.profiling", "--single-run", "torch_baseline,cuda_extension")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["single run: torch_baseline done on cpu",
                                             "single run: cuda_extension done on cpu"]


def test_a_module_that_defines_nothing_points_at_register_binding():
    import types

    empty = types.ModuleType("cuda_extension")
    message = build.missing_function_message(empty, "scale")
    assert message.startswith("cuda_extension has no function 'scale'; it defines none")
    assert "REGISTER_BINDING(op, register_op)" in message


def test_the_correctness_failure_of_a_missing_function_speaks_of_cuda_extension(pytester, make_workdir, run_pytest):
    make_workdir("registry_forms", pytester.path / "wd")
    pytester.makefile(".ini", pytest=INI)
    result = run_pytest(pytester, "wd/model_new.py", "-m", "correctness", "-p", "no:randomly")
    assert result.parseoutcomes().get("failed", 0) >= 1
    result.stdout.fnmatch_lines(["*cuda_extension has no function 'scale_forward'; it defines scale, scale_setup, "
                                 "scale_short. scale_setup takes a pybind11 module*"])
    result.stdout.no_fnmatch_line("*cudaopt_ext_*")


@pytest.mark.slow
def test_cudaopt_check_rebuilds_a_stale_build_before_ex001_reads_it_and_says_when_it_cannot(make_workdir, tmp_path):
    from pytest_cudaopt.commands import scaffold

    workdir = make_workdir("cpu_scale")
    scaffold.lock_workdir(workdir)   # the copy leaves the lock behind
    binding = workdir / "kernels" / "scale_binding.cpp"
    # The binding and model_new.py renamed together: the earlier build still defines `scale` only.
    binding.write_text(binding.read_text().replace('m.def("scale",', 'm.def("scale_affine",'))
    (workdir / "model_new.py").write_text((workdir / "model_new.py").read_text().replace(
        "cuda_extension.scale(", "cuda_extension.scale_affine("))
    done = _cli("check", str(workdir), cwd=tmp_path)
    assert done.returncode == 0 and "EX001" not in done.stdout, done.stdout + done.stderr
    assert "follows all 28 rules" in done.stdout
    binding.write_text("this does not compile\n" + binding.read_text())
    done = _cli("check", str(workdir), cwd=tmp_path)
    assert "EX001 not checked: the build predates the latest edits and rebuilding it failed" in done.stdout
    assert f"(`cudaopt build {workdir}` shows the compiler's errors)" in done.stdout
