"""Tests of pytest_cudaopt.extension: arch, toolkit discovery, incremental ninja builds, locking, error reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from support import run_python
from pytest_cudaopt import extension as build
from pytest_cudaopt.extension import buildfile, runner, toolchain

REPO_ROOT = Path(__file__).resolve().parents[1]
HAS_NVCC = build.find_cuda_home() is not None
needs_nvcc = pytest.mark.skipif(not HAS_NVCC, reason="no CUDA toolkit (nvcc) on this machine")

BROKEN_CU = """\
// broken.cu: a deliberate compile error on line 5.
#include <cuda_runtime.h>

__global__ void broken_kernel(float* y) {
  y[threadIdx.x] = undefined_name;
}
"""
BROKEN_CPP = """\
// broken.cpp: a deliberate compile error on line 3.
int broken() {
  return undefined_name;
}
"""


def touch(path: Path) -> None:
    """Set `path`'s mtime to now: newer than every object built before (a copied build
    keeps the older mtimes of the build it was copied from)."""
    os.utime(path)


# ------------------------------------------------------------------------ arch, toolkit

@pytest.mark.parametrize("text, gencode, shown", [
    # 9.0's cubin is sm_90a (every sm_90 GPU runs it; Hopper kernels need it), its PTX compute_90.
    ("9.0", ["-gencode=arch=compute_90a,code=sm_90a"], "sm_90a (from TORCH_CUDA_ARCH_LIST=9.0)"),
    ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a"], "sm_90a (from TORCH_CUDA_ARCH_LIST=9.0a)"),
    ("8.0;9.0+PTX", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
                     "-gencode=arch=compute_90,code=compute_90"],
     "sm_80, sm_90a+PTX (from TORCH_CUDA_ARCH_LIST=8.0;9.0+PTX)"),
    ("Hopper", ["-gencode=arch=compute_90a,code=sm_90a"], "sm_90a (from TORCH_CUDA_ARCH_LIST=Hopper)"),
    ("8.9", ["-gencode=arch=compute_89,code=sm_89"], "sm_89 (from TORCH_CUDA_ARCH_LIST=8.9)"),
])
def test_the_arch_comes_from_torch_cuda_arch_list(monkeypatch, text, gencode, shown):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    arches, _ = toolchain.arch_list()
    assert toolchain.gencode_flags(arches) == gencode
    assert build.resolve_arch() == shown


def test_a_bad_arch_list_entry_is_a_build_error_that_names_it(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0;sm90")
    with pytest.raises(build.BuildError, match=r"TORCH_CUDA_ARCH_LIST entry 'sm90' is not an arch"):
        build.resolve_arch()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a visible GPU decides the arch")
def test_without_arch_list_or_gpu_the_arch_is_9_0(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert build.resolve_arch() == "sm_90a (default: no TORCH_CUDA_ARCH_LIST and no visible GPU)"


def _fake_toolkit(root: Path) -> tuple[Path, Path]:
    """A toolkit at root/cuda-13.0 and, in root/bin, an nvcc wrapper script that execs it."""
    toolkit = root / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "bin" / "nvcc").write_bytes(b"\x7fELF (the real compiler is a binary)")
    (root / "bin").mkdir()
    wrapper = root / "bin" / "nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    for path in (toolkit / "bin" / "nvcc", wrapper):
        path.chmod(0o755)
    return toolkit, wrapper


def test_cuda_home_is_found_behind_an_nvcc_wrapper_script_on_path(tmp_path, monkeypatch):
    toolkit, wrapper = _fake_toolkit(tmp_path)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}/usr/bin:/bin")
    assert build.find_cuda_home(default=tmp_path / "no-such-cuda") == toolkit.resolve()


def test_cuda_home_from_the_environment_comes_first(tmp_path, monkeypatch):
    toolkit, _ = _fake_toolkit(tmp_path)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert build.find_cuda_home() == toolkit


@needs_nvcc
def test_cublas_and_cudnn_are_found_in_the_toolkit_or_the_torch_wheels():
    home = build.find_cuda_home()
    for name, header, stems in (("cuBLAS", "cublas_v2.h", ("cublas", "cublasLt")),
                                ("cuDNN", "cudnn.h", ("cudnn",))):
        found = build.find_library(name, header, stems, home)
        assert found is not None, f"{name} not found"
        assert (found.include / header).is_file()
        assert [lib.name.split(".so")[0] for lib in found.libs] == [f"lib{s}" for s in stems]
        assert all(lib.is_file() for lib in found.libs)


# ----------------------------------------------------------------------- error reports

def _config(workdir: Path) -> buildfile.Config:
    build_dir = workdir / "build" / "cudaopt" / "sm90-0123456789ab"
    sources = [Path("binding.cpp"), Path("kernels/broken.cu"), Path("kernels/x_binding.cpp")]
    return buildfile.Config(workdir, build_dir, sources, True, "sm_90", "c++", "nvcc", [], [], [], {})


def test_nvcc_and_gcc_errors_are_reported_as_workdir_file_line_and_one_summary(tmp_path):
    cfg = _config(tmp_path)
    output = textwrap.dedent("""\
        [1/4] nvcc kernels/broken.cu
        FAILED: [code=2] objs/kernels/broken.cu.o
        nvcc --generate-dependencies-with-compile -c ../../../kernels/broken.cu -o objs/kernels/broken.cu.o
        ../../../kernels/broken.cu(5): error: identifier "undefined_name" is undefined
            y[threadIdx.x] = undefined_name;
                             ^

        1 error detected in the compilation of "../../../kernels/broken.cu".
        [2/4] c++ kernels/x_binding.cpp
        FAILED: objs/kernels/x_binding.cpp.o
        c++ -c ../../../kernels/x_binding.cpp -o objs/kernels/x_binding.cpp.o
        In file included from /opt/torch/include/ATen/core/Tensor.h:4,
                         from ../../../kernels/x_binding.cpp:2:
        /opt/torch/include/c10/util/intrusive_ptr.h:775:27: error: 'strong_ordering' does not name a type
        ../../../kernels/x_binding.cpp:9:3: error: 'foo' was not declared in this scope
            9 |   foo();
              |   ^~~
        ninja: build stopped: subcommand failed.
        """)
    error = runner.failure_of(cfg, output, cfg.build_dir / "build.log")
    lines = error.report().splitlines()
    assert lines[0] == 'kernels/broken.cu:5: error: identifier "undefined_name" is undefined'
    assert lines[1].strip() == "y[threadIdx.x] = undefined_name;"
    assert ("/opt/torch/include/c10/util/intrusive_ptr.h:775:27: error: 'strong_ordering' does not name "
            "a type  [included from kernels/x_binding.cpp:2]") in lines
    assert "kernels/x_binding.cpp:9:3: error: 'foo' was not declared in this scope" in lines
    assert lines[-1] == (f"cudaopt build: 3 errors in kernels/broken.cu, kernels/x_binding.cpp; "
                         f"build log: {cfg.build_dir / 'build.log'}")
    assert "Traceback" not in error.report()


def test_a_link_error_is_reported_with_the_linkers_words(tmp_path):
    cfg = _config(tmp_path)
    output = ("[4/4] link cuda_extension.so\nFAILED: cuda_extension.so\nc++ objs/binding.cpp.o -o x\n"
              "/usr/bin/ld: objs/kernels/x_binding.cpp.o: in function `f()':\n"
              "x_binding.cpp:(.text+0x1f): undefined reference to `missing_launcher'\n"
              "collect2: error: ld returned 1 exit status\n")
    report = runner.failure_of(cfg, output, cfg.build_dir / "build.log").report()
    assert "undefined reference to `missing_launcher'" in report
    assert report.splitlines()[-1].startswith("cudaopt build: linking cuda_extension failed; build log: ")


def test_a_workdir_without_binding_cpp_is_a_build_error(tmp_path):
    (tmp_path / "kernels").mkdir()
    with pytest.raises(build.BuildError, match="has no binding.cpp"):
        build.compile_extension(tmp_path)


# ------------------------------------------------------------------- real builds (slow)

def test_the_cpu_workdir_builds_imports_and_computes_its_reference(prebuilt_workdir):
    workdir = prebuilt_workdir("cpu_scale")
    result = build.build(workdir)
    assert not result.cuda and result.arch == "cpu"
    ninja_file = (result.build_dir / "build.ninja").read_text()
    assert "nvcc" not in ninja_file and "cudart" not in ninja_file, "a CPU-only workdir must not need CUDA"
    x, w, b = torch.randn(5, 7), torch.randn(7), torch.randn(7)
    for config in (0, 1):
        torch.testing.assert_close(result.module.scale(x, w, b, config=config), x * w + b)
    assert build.build_extension(workdir) is result.module, "an unchanged tree is imported once"


def test_the_cpu_workdirs_binding_names_the_argument_and_what_was_expected(prebuilt_workdir):
    ext = build.build_extension(prebuilt_workdir("cpu_scale"))
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    cases = [
        ((x.double(), w, b), r"x must be a contiguous float32 CPU tensor; got dtype Double"),
        ((x, torch.randn(16)[::2], b), r"weight must be a contiguous float32 CPU tensor; got strides"),
        ((x, w, b.to("meta")), r"bias must be a contiguous float32 CPU tensor; got device meta"),
        ((x, torch.randn(9), b), r"weight must have shape \(8,\)"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            ext.scale(*args)
    with pytest.raises(RuntimeError, match=r"unknown config 7"):
        ext.scale(x, w, b, config=7)


def _signature(doc: str) -> list[tuple[str, str, bool]]:
    """(name, type, has_default) of each parameter in pybind11's first docstring line."""
    head = doc.splitlines()[0]
    inner = head[head.index("(") + 1:head.rindex(") ->")]
    params, depth, part = [], 0, ""
    for ch in inner + ",":
        if ch == "," and depth == 0:
            if part.strip():
                params.append(part.strip())
            part = ""
            continue
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        part += ch
    out = []
    for param in params:
        name, _, rest = param.partition(":")
        kind, _, default = rest.partition("=")
        out.append((name.strip(), kind.strip(), bool(default.strip())))
    return out


def _bad_tensor_calls(fn, device: str):
    """For the first tensor parameter of `fn`: (case, args, words its error must contain).
    Other tensors are float32 and contiguous on `device`, ints 1, floats 1.0."""
    params = _signature(fn.__doc__)
    tensors = [name for name, kind, _ in params if kind == "torch.Tensor"]
    assert tensors, f"{fn.__name__} takes no tensor: {fn.__doc__.splitlines()[0]}"
    first = tensors[0]

    def args(bad):
        values = []
        for name, kind, has_default in params:
            if kind == "torch.Tensor":
                values.append(bad if name == first else torch.randn(2, 4, 12, device=device))
            elif has_default:
                break
            elif "float" in kind:
                values.append(1.0)
            elif "bool" in kind:
                values.append(False)
            else:
                values.append(1)
        return values

    good = torch.randn(2, 4, 12, device=device)
    dtype_words = r"float|half|bfloat16|dtype|double|int"
    yield "a CPU tensor", args(good.cpu()), first, r"cuda|gpu|device"
    yield "a wrong dtype", args(good.double()), first, dtype_words
    yield "a non-contiguous tensor", args(torch.randn(2, 4, 24, device=device)[..., ::2]), first, r"contiguous"


def _check_bindings(ext) -> list[str]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    problems = []
    names = [n for n in dir(ext) if not n.startswith("_") and callable(getattr(ext, n))]
    assert names, "the extension registers no binding"
    for name in names:
        for case, args, arg, words in _bad_tensor_calls(getattr(ext, name), device):
            try:
                getattr(ext, name)(*args)
            except (RuntimeError, ValueError, TypeError) as exc:
                message = str(exc).splitlines()[0]
                if not re.search(rf"\b{arg}\b", message) or not re.search(words, message, re.IGNORECASE):
                    problems.append(f"{name}({arg}=<{case}>): the error must name {arg!r} and what was "
                                    f"expected ({words}); got: {message}")
            else:
                problems.append(f"{name}({arg}=<{case}>) raised nothing")
    return problems


@needs_nvcc
def test_a_cuda_workdirs_bindings_reject_bad_tensors_naming_the_argument(prebuilt_workdir):
    ext = build.build_extension(prebuilt_workdir("cuda_scale"))
    assert _check_bindings(ext) == []


@pytest.mark.slow
@needs_nvcc
def test_the_real_extension_builds_imports_and_its_bindings_reject_bad_tensors():
    bindings = sorted((REPO_ROOT / "kernels").glob("*_binding.cpp"))
    if not bindings:
        pytest.skip(f"{REPO_ROOT / 'kernels'} has no *_binding.cpp yet")
    result = build.build(REPO_ROOT)
    assert result.cuda
    registered = {n for n in dir(result.module) if not n.startswith("_")}
    assert registered, f"{result.so_path} registers no binding"
    problems = _check_bindings(result.module)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@needs_nvcc
def test_compile_sh_builds_the_real_workdir_and_prints_the_build_time(subprocess_env):
    if not sorted((REPO_ROOT / "kernels").glob("*_binding.cpp")):
        pytest.skip(f"{REPO_ROOT / 'kernels'} has no *_binding.cpp yet")
    env = dict(subprocess_env, TORCH_CUDA_ARCH_LIST="9.0", PYTHON=sys.executable)  # the Python running the tests
    done = subprocess.run(["bash", str(REPO_ROOT / "utils" / "compile.sh")], env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^(built cuda_extension in \d+\.\d s \(\d+ of \d+ objects compiled"
                     r"(, \d+ taken from the object cache)?\)|"
                     r"cuda_extension up to date \(\d+\.\d s\)): ", done.stdout.splitlines()[-1]), done.stdout


@needs_nvcc
def test_a_broken_cu_file_is_reported_with_its_file_and_line(make_workdir):
    workdir = make_workdir("cuda_scale")
    (workdir / "kernels" / "broken.cu").write_text(BROKEN_CU)
    with pytest.raises(build.BuildError) as info:
        build.compile_extension(workdir)
    report = info.value.report()
    assert report.splitlines()[0] == 'kernels/broken.cu:5: error: identifier "undefined_name" is undefined'
    assert re.fullmatch(r"cudaopt build: 1 error in kernels/broken\.cu; build log: .*build\.log",
                        report.splitlines()[-1]), report
    assert "Traceback" not in report
    assert "undefined_name" in info.value.log_path.read_text()


def test_a_broken_cpp_file_is_reported_with_its_file_line_and_column(make_workdir):
    workdir = make_workdir("cpu_scale")
    (workdir / "kernels" / "broken.cpp").write_text(BROKEN_CPP)
    with pytest.raises(build.BuildError) as info:
        build.compile_extension(workdir)
    lines = info.value.report().splitlines()
    assert re.fullmatch(r"kernels/broken\.cpp:3:10: error: .undefined_name. was not declared in this scope",
                        lines[0]), lines
    assert lines[-1].startswith("cudaopt build: 1 error in kernels/broken.cpp; build log: ")


def test_a_copied_workdir_keeps_its_build_and_a_second_build_compiles_nothing(make_workdir):
    workdir = make_workdir("cpu_scale")
    first = build.compile_extension(workdir)
    second = build.compile_extension(workdir)
    for result in (first, second):
        assert result.compiled == [] and not result.linked, f"ninja rebuilt {result.compiled}"
        assert result.up_to_date
    assert "(0 of 3" not in build.describe(second) and "up to date" in build.describe(second)


def test_touching_one_kernel_recompiles_that_kernel_only(make_workdir):
    workdir = make_workdir("cpu_scale")
    touch(workdir / "kernels" / "scale.cpp")
    result = build.compile_extension(workdir)
    assert result.compiled == ["kernels/scale.cpp"] and result.linked
    assert build.describe(result).startswith("built cuda_extension in ")
    # Its content unchanged, the suite's object cache (tests/conftest.py) gives the object back.
    assert result.cached == 1
    assert "(0 of 3 objects compiled, 1 taken from the object cache)" in build.describe(result)


@needs_nvcc
def test_touching_one_cu_kernel_recompiles_that_kernel_only(make_workdir):
    workdir = make_workdir("cuda_scale")
    touch(workdir / "kernels" / "scale.cu")
    assert build.compile_extension(workdir).compiled == ["kernels/scale.cu"]


def test_touching_a_header_recompiles_the_sources_that_include_it(make_workdir):
    workdir = make_workdir("cpu_scale")
    kernel = workdir / "kernels" / "scale.cpp"
    (workdir / "kernels" / "scale_config.h").write_text("#pragma once\nconstexpr int kUnused = 1;\n")
    kernel.write_text('#include "scale_config.h"\n' + kernel.read_text())
    assert build.compile_extension(workdir).compiled == ["kernels/scale.cpp"]
    touch(workdir / "kernels" / "scale_config.h")
    assert build.compile_extension(workdir).compiled == ["kernels/scale.cpp"]


def test_a_rebuilt_extension_is_imported_again_in_the_same_process(make_workdir):
    workdir = make_workdir("cpu_scale")
    before = build.build_extension(workdir)
    assert build.build_extension(workdir) is before
    kernel = workdir / "kernels" / "scale.cpp"
    kernel.write_text(kernel.read_text().replace("xr[f] * weight[f] + bias[f]", "xr[f] * weight[f] - bias[f]"))
    after = build.build_extension(workdir)
    assert after is not before
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(after.scale(x, w, b), x * w - b)
    torch.testing.assert_close(before.scale(x, w, b), x * w + b)


@needs_nvcc
def test_two_workdirs_in_one_process_keep_their_own_bindings(prebuilt_workdir):
    cpu = build.build_extension(prebuilt_workdir("cpu_scale"))
    gpu = build.build_extension(prebuilt_workdir("cuda_scale"))
    assert cpu is not gpu
    assert cpu.scale.__doc__.rstrip().endswith("CPU.") and gpu.scale.__doc__.rstrip().endswith("CUDA.")
    x, w, b = torch.randn(2, 3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(cpu.scale(x, w, b), x * w + b)
    with pytest.raises(RuntimeError, match="x must be a contiguous float32 CUDA tensor"):
        gpu.scale(x, w, b)


BUILD_SCRIPT = """\
import json, sys
from pytest_cudaopt import extension as build
result = build.compile_extension(sys.argv[1], verbose=True)
print("RESULT " + json.dumps({"compiled": result.compiled, "waited_s": result.waited_s}), flush=True)
"""


def test_two_processes_building_at_once_build_once(make_workdir, subprocess_env, tmp_path):
    """Both start while the build folder is locked (as by a third build); once it is free,
    one of them compiles the changed kernel and the other waits for it and reuses the result."""
    from filelock import FileLock

    workdir = make_workdir("cpu_scale")
    build_dir = build.compile_extension(workdir).build_dir
    touch(workdir / "kernels" / "scale.cpp")
    script = tmp_path / "build_it.py"
    script.write_text(BUILD_SCRIPT)
    lock = FileLock(str(build_dir / "lock"))
    procs, outputs = [], []
    with lock:
        for _ in range(2):
            proc = subprocess.Popen([sys.executable, str(script), str(workdir)], env=subprocess_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("waiting for another build of"):
                    break
            assert seen and seen[-1].startswith("waiting for another build of"), "".join(seen)
            procs.append(proc)
            outputs.append(seen)
    for proc, seen in zip(procs, outputs):
        seen.append(proc.communicate(timeout=1800)[0])
        assert proc.returncode == 0, "".join(seen)
    texts = ["".join(seen) for seen in outputs]
    results = [json.loads(next(l for l in text.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
               for text in texts]
    assert sorted(r["compiled"] for r in results) == [[], ["kernels/scale.cpp"]], texts
    reused = texts[[r["compiled"] for r in results].index([])]
    assert "c++ kernels/scale.cpp" not in reused and "compiling" not in reused, reused


def test_the_cli_prints_progress_and_the_build_time_or_the_compiler_errors(make_workdir, subprocess_env):
    workdir = make_workdir("cpu_scale")
    touch(workdir / "kernels" / "scale.cpp")
    cmd = ["-m", "pytest_cudaopt.cli", "build", str(workdir)]
    done = run_python(cmd, env=subprocess_env, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "compiling 1 of 3 sources for cpu: kernels/scale.cpp"
    assert re.fullmatch(r"\[1/2\] c\+\+ kernels/scale\.cpp  \(\d+\.\d s\)", lines[1]), lines
    assert re.fullmatch(r"\[2/2\] link cuda_extension\.so  \(\d+\.\d s\)", lines[2]), lines
    assert re.fullmatch(r"built cuda_extension in \d+\.\d s \((1 of 3 objects compiled|0 of 3 objects compiled, "
                        r"1 taken from the object cache)\): .*cuda_extension\.so", lines[-1]), lines

    (workdir / "kernels" / "broken.cpp").write_text(BROKEN_CPP)
    done = run_python(cmd, env=subprocess_env, timeout=1800)
    assert done.returncode == 1
    assert "kernels/broken.cpp:3:10: error:" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("cudaopt build: 1 error in kernels/broken.cpp; build log: ")
    assert "Traceback" not in done.stdout + done.stderr


def test_a_failed_build_fails_the_item_with_the_compiler_report(pytester, make_workdir, run_pytest):
    make_workdir("cpu_scale", dest=pytester.path)
    (pytester.path / "kernels" / "broken.cpp").write_text(BROKEN_CPP)
    pytester.makepyfile(test_uses_extension="""
        def test_one(cuda_extension):
            assert cuda_extension.scale

        def test_two(cuda_extension):
            assert cuda_extension.scale
    """)
    result = run_pytest(pytester, "test_uses_extension.py", "--cudaopt-device=cpu")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([
        "*kernels/broken.cpp:3:10: error: *undefined_name* was not declared in this scope",
        "*cudaopt build: 1 error in kernels/broken.cpp; build log: *build.log",
    ])
    assert "Traceback" not in result.stdout.str()
    assert "build.py" not in result.stdout.str()


def test_the_rootdir_extension_is_a_session_fixture_built_once_and_run_in_a_worker(pytester, make_workdir,
                                                                                  run_pytest):
    make_workdir("cpu_scale", dest=pytester.path)
    for name in ("test_one", "test_two"):
        pytester.makepyfile(**{name: """
            import pytest
            import torch

            def test_scale(cuda_extension):
                x = torch.ones(2, 3)
                assert torch.equal(cuda_extension.scale(x, x[0], x[0]), x + 1)
                assert "scale" in dir(cuda_extension)
                with pytest.raises(AttributeError, match="has no function 'nope' .it defines: .*scale"):
                    cuda_extension.nope
                # The candidate's native code (its static initialisers too) never loads here.
                assert "cuda_extension" not in open("/proc/self/maps").read()
        """})
    result = run_pytest(pytester, "test_one.py", "test_two.py", "--setup-show")
    result.assert_outcomes(passed=2)
    setups = [line for line in result.outlines if re.search(r"SETUP\s+S cudaopt_root_extension", line)]
    assert len(setups) == 1, result.stdout.str()


def test_a_failed_unit_is_shown_at_once_and_not_as_a_success(tmp_path, monkeypatch):
    cfg = _config(tmp_path)
    cfg.build_dir.mkdir(parents=True)
    ninja = tmp_path / "ninja"
    ninja.write_text(textwrap.dedent("""\
        #!/bin/sh
        echo "[1/3] nvcc kernels/broken.cu"
        echo "FAILED: [code=2] objs/kernels/broken.cu.o"
        echo "nvcc -c ../../../kernels/broken.cu -o objs/kernels/broken.cu.o"
        echo '../../../kernels/broken.cu(5): error: identifier "undefined_name" is undefined'
        sleep 1
        echo "[2/3] c++ kernels/x_binding.cpp"
        echo "ninja: build stopped: subcommand failed."
        exit 1
        """))
    ninja.chmod(0o755)
    monkeypatch.setattr(runner, "_ninja", lambda: str(ninja))
    seen: list[tuple[float, str]] = []
    steps, code = runner.run_ninja(cfg, lambda text: seen.append((time.monotonic(), text)), time.monotonic())
    assert code == 1 and steps == ["nvcc kernels/broken.cu", "c++ kernels/x_binding.cpp"]
    texts = [text for _, text in seen]
    assert re.fullmatch(r"\[1/3\] nvcc kernels/broken\.cu  \(\d+\.\d s\)  FAILED", texts[0]), texts
    assert texts[1] == 'kernels/broken.cu failed: kernels/broken.cu:5: error: identifier "undefined_name" is undefined'
    assert texts[2].startswith("[2/3] c++ kernels/x_binding.cpp  (") and not texts[2].endswith("FAILED")
    # The error was shown when the unit failed, a second before the next unit finished.
    assert seen[2][0] - seen[1][0] > 0.5


@needs_nvcc
def test_a_compile_error_fails_the_build_item_on_a_machine_without_a_gpu(pytester, make_workdir, run_pytest):
    root = make_workdir("cuda_scale", pytester.path / "wd")
    (root / "kernels" / "scale.cu").write_text((root / "kernels" / "scale.cu").read_text() + "\nnot_cuda_at_all;\n")
    result = run_pytest(pytester, "wd", "-m", "build or correctness", timeout=1200)
    assert result.ret == 1
    result.assert_outcomes(failed=1, skipped=4)  # the build item; the correctness items need a GPU
    result.stdout.fnmatch_lines(["*kernels/scale.cu failed: kernels/scale.cu:*: error*"])  # at once, on the terminal
    result.stdout.fnmatch_lines(["*kernels/scale.cu:*: error*", "*cudaopt build: 1 error in kernels/scale.cu*",
                                 "*FAILED wd/model_new.py::TestBuild::test_extension*"])


def test_cudaopt_build_reads_the_workdirs_ini_as_pytest_does(make_workdir, tmp_path, capsys, monkeypatch):
    """utils/compile.sh (`cudaopt build`) builds what `pytest` in the workdir builds: the
    build folder, flags and object cache of its ini file count."""
    from pytest_cudaopt import cli
    from pytest_cudaopt.extension import buildfile

    monkeypatch.delenv("CUDAOPT_BUILD_DIR", raising=False)
    workdir = make_workdir("cpu_scale")
    (workdir / "pytest.ini").write_text(f"[pytest]\ncudaopt_build_dir = {tmp_path / 'elsewhere'}\n")
    cfg = buildfile.configure(workdir.resolve(), buildfile.settings_or_default(None, workdir))
    assert cfg.build_dir.parent == tmp_path / "elsewhere"
    (workdir / "pytest.ini").write_text("[pytest]\ncudaopt_build_dri = /tmp/x\n")
    assert cli.main(["build", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cudaopt build: unknown ini option cudaopt_build_dri (did you mean cudaopt_build_dir?) in ")
    assert str(workdir / "pytest.ini") in err
