"""The object cache (build/objcache.py) with a fake compiler: hits across workdirs, misses on a changed header, depfiles that keep ninja right."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from pytest_cudaopt.extension import objcache

# A "compiler" that writes its output and a gcc-style depfile naming the source and kernels/h.h,
# and counts its runs in COUNT.
FAKE = """#!{python}
import sys, pathlib
args = sys.argv[1:]
out = args[args.index("-o") + 1]; dep = args[args.index("-MF") + 1]; src = args[args.index("-c") + 1]
pathlib.Path(out).write_bytes(b"object of " + pathlib.Path(src).read_bytes())
pathlib.Path(dep).write_text(out + ": " + src + " \\\\\\n  ../../kernels/h.h\\n")
count = pathlib.Path({count!r})
count.write_text(str(int(count.read_text() or 0) + 1) if count.exists() else "1")
"""


def _setup(tmp_path: Path):
    compiler = tmp_path / "fakecc"
    count = tmp_path / "count"
    compiler.write_text(FAKE.format(python=sys.executable, count=str(count)))
    compiler.chmod(compiler.stat().st_mode | stat.S_IEXEC)
    return compiler, count


def _workdir(root: Path, header: str = "int h;") -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "binding.cpp").write_text('#include "kernels/h.h"\n')
    (root / "kernels" / "h.h").write_text(header)
    (root / "build" / "k").mkdir(parents=True)
    return root / "build" / "k"


def _compile(build_dir: Path, compiler: Path, cache: Path) -> int:
    old = os.getcwd()
    os.chdir(build_dir)
    try:
        return objcache.run(["--cache", str(cache), "--workdir", "../..", "--source", "../../binding.cpp",
                             "--out", "objs/binding.cpp.o", "--depfile", "objs/binding.cpp.o.d", "--",
                             str(compiler), "-MMD", "-MF", "objs/binding.cpp.o.d", "-c", "../../binding.cpp",
                             "-o", "objs/binding.cpp.o"])
    finally:
        os.chdir(old)


def test_a_source_identical_across_workdirs_compiles_once(tmp_path):
    compiler, count = _setup(tmp_path)
    cache = tmp_path / "cache"
    for name in ("a", "b"):
        build_dir = _workdir(tmp_path / name)
        (build_dir / "objs").mkdir()
        assert _compile(build_dir, compiler, cache) == 0
    assert count.read_text() == "1"
    b = tmp_path / "b" / "build" / "k"
    assert (b / "objs" / "binding.cpp.o").read_bytes() == b'object of #include "kernels/h.h"\n'
    assert objcache.counts(b) == {"hit": 1, "store": 0, "miss": 0}
    # the depfile names this workdir's files, relative to its build folder, as ninja expects
    assert objcache.parse_depfile((b / "objs" / "binding.cpp.o.d").read_text()) == [
        "../../binding.cpp", "../../kernels/h.h"]


def test_a_changed_local_header_is_a_miss(tmp_path):
    compiler, count = _setup(tmp_path)
    cache = tmp_path / "cache"
    first = _workdir(tmp_path / "a")
    (first / "objs").mkdir()
    _compile(first, compiler, cache)
    second = _workdir(tmp_path / "b", header="int h2;")
    (second / "objs").mkdir()
    _compile(second, compiler, cache)
    assert count.read_text() == "2"


def test_a_failed_compile_is_not_stored(tmp_path):
    cache = tmp_path / "cache"
    build_dir = _workdir(tmp_path / "a")
    failing = tmp_path / "fail"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    assert _compile(build_dir, failing, cache) == 3
    assert not list(cache.rglob("manifest.json"))


def test_depfiles_are_read_with_continuations_and_escaped_spaces():
    text = "objs/a.o: ../../a.cpp /usr/include/x\\ y.h \\\n  ../../kernels/h.h\n"
    assert objcache.parse_depfile(text) == ["../../a.cpp", "/usr/include/x y.h", "../../kernels/h.h"]


def test_build_ninja_wraps_every_compile_only_when_the_cache_is_set(tmp_path):
    from pytest_cudaopt.extension.buildfile import configure, ninja_file
    from pytest_cudaopt.suite.settings import Settings
    from support import copy_workdir

    workdir = copy_workdir("cpu_scale", tmp_path / "w")
    plain = ninja_file(configure(workdir, Settings.resolve_all(env={"CUDAOPT_OBJECT_CACHE": "off"})))
    cached = ninja_file(configure(workdir, Settings.resolve_all(env={"CUDAOPT_OBJECT_CACHE": str(tmp_path / "c")})))
    assert "$objcache" not in plain
    assert "command = $objcache --source $in --out $out --depfile $out.d -- $cxx -MMD -MF $out.d" in cached
    assert f"--cache {tmp_path / 'c'} --workdir ../../.." in cached
    assert cached.count("depfile = $out.d") == plain.count("depfile = $out.d")


def test_by_default_workdirs_share_the_per_user_object_cache_so_a_new_one_does_not_compile_binding_cpp_again(
        tmp_path, monkeypatch):
    from pytest_cudaopt.extension.buildfile import configure, ninja_file
    from pytest_cudaopt.suite.settings import Settings
    from support import copy_workdir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    first, second = (copy_workdir("cpu_scale", tmp_path / name) for name in ("w1", "w2"))
    for workdir in (first, second):
        text = ninja_file(configure(workdir, Settings.resolve_all(env={})))
        assert f"--cache {tmp_path / 'xdg' / 'cudaopt' / 'objects'} --workdir ../../.." in text
