"""The content-keyed object cache: a compile whose command, toolchain, source bytes and headers match an earlier one
is copied from the cache instead of run (build.ninja wraps each compile in this script when `object_cache` is set).

The workdir is named by its path relative to the build folder, so two workdirs with the same layout share keys; a
manifest per key names the headers each object was built from. Any error of the cache's own falls back to the plain
compile. Standard library only: ninja runs it as a script, outside any package (`python -I`)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

VERSION = 1
MAX_ENTRIES = 8   # manifests keep the newest objects of a key (one per state of its headers)
COMPILER_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
                "SOURCE_DATE_EPOCH")
LOG_NAME = "objcache.log"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _binary(name: str) -> list:
    """A compiler as the key sees it: its real path, size and mtime (an upgrade is a new key)."""
    found = shutil.which(name)
    if found is None:
        return [name, None]
    real = os.path.realpath(found)
    stat = os.stat(real)
    return [real, stat.st_size, stat.st_mtime_ns]


def compile_key(command: list[str], source: Path, out: str, depfile: str) -> str:
    """The key of one compile: command (output paths as placeholders), compilers, environment, source bytes."""
    args = ["<out>" if a == out else "<depfile>" if a == depfile else a for a in command]
    host = next((command[i + 1] for i, a in enumerate(command[:-1]) if a == "-ccbin"), os.environ.get("CXX") or "c++")
    parts = {"version": VERSION, "args": args, "compiler": _binary(command[0]), "host": _binary(host),
             "env": {k: os.environ.get(k) for k in COMPILER_ENV if os.environ.get(k)}, "source": _sha256(source)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style depfile (gcc -MMD, nvcc --dependency-output), unescaped."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for rule in text.splitlines():
        match = re.match(r"^((?:[^:\\]|\\.)*?)\s*:(?:\s|$)", rule)
        if not match:
            continue
        for token in re.findall(r"(?:\\.|[^\s\\])+", rule[match.end():]):
            dep = re.sub(r"\\(.)", r"\1", token).replace("$$", "$")
            if dep not in deps:
                deps.append(dep)
    return deps


def _escape(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "\\ ").replace("#", "\\#")


def describe_deps(deps: list[str], cwd: Path, workdir: Path) -> list[list]:
    """Each dependency as the manifest keeps it: ["local", path, sha256] or ["system", path, size, mtime_ns]."""
    out = []
    for dep in deps:
        path = Path(os.path.normpath(cwd / dep))
        if path == workdir or workdir in path.parents:
            out.append(["local", path.relative_to(workdir).as_posix(), _sha256(path)])
        else:
            stat = path.stat()
            out.append(["system", str(path), stat.st_size, stat.st_mtime_ns])
    return out


def _still_true(dep: list, workdir: Path) -> bool:
    try:
        if dep[0] == "local":
            return _sha256(workdir / dep[1]) == dep[2]
        stat = os.stat(dep[1])
        return [stat.st_size, stat.st_mtime_ns] == dep[2:]
    except OSError:
        return False


def depfile_text(out: str, deps: list[list], cwd: Path, workdir: Path) -> str:
    """The depfile this workdir's compile would have written (local headers relative to the build folder)."""
    paths = [os.path.relpath(workdir / d[1], cwd) if d[0] == "local" else d[1] for d in deps]
    return f"{_escape(out)}: " + " \\\n  ".join(_escape(p) for p in paths) + "\n"


class Cache:
    """One key's folder: manifest.json and the objects it names, under a lock file."""

    def __init__(self, root: Path, key: str):
        self.folder = root / key[:2] / key
        self.lock_path = root / key[:2] / f"{key}.lock"

    def entries(self) -> list[dict]:
        try:
            return json.loads((self.folder / "manifest.json").read_text())["entries"]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def find(self, workdir: Path) -> dict | None:
        for entry in self.entries():
            if all(_still_true(dep, workdir) for dep in entry["deps"]) and (self.folder / entry["object"]).is_file():
                return entry
        return None

    def store(self, obj: Path, deps: list[list]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{hashlib.sha256(json.dumps(deps).encode()).hexdigest()[:16]}.o"
        partial = self.folder / f"{name}.{os.getpid()}.tmp"
        shutil.copyfile(obj, partial)
        os.replace(partial, self.folder / name)
        kept = [e for e in self.entries() if e["object"] != name][-(MAX_ENTRIES - 1):]
        manifest = self.folder / f"manifest.json.{os.getpid()}.tmp"
        manifest.write_text(json.dumps({"entries": [*kept, {"object": name, "deps": deps}]}))
        os.replace(manifest, self.folder / "manifest.json")


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _hit(cache: Cache, args, cwd: Path, workdir: Path) -> bool:
    entry = cache.find(workdir)
    if entry is None:
        return False
    partial = Path(f"{args.out}.{os.getpid()}.tmp")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cache.folder / entry["object"], partial)
    os.replace(partial, args.out)
    Path(args.depfile).write_text(depfile_text(args.out, entry["deps"], cwd, workdir))
    return True


def run(argv: list[str]) -> int:
    """The wrapper: a hit, or the compile (stored when it succeeds). Returns the exit status."""
    parser = argparse.ArgumentParser(prog="objcache.py")
    for name in ("--cache", "--workdir", "--source", "--out", "--depfile"):
        parser.add_argument(name, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    start = time.monotonic()
    cwd = Path.cwd()
    workdir = Path(os.path.normpath(cwd / args.workdir))
    try:
        cache = Cache(Path(args.cache).expanduser(), compile_key(command, cwd / args.source, args.out, args.depfile))
        with _locked(cache.lock_path):
            if _hit(cache, args, cwd, workdir):
                _log(cwd, "hit", args.source, start)
                return 0
            code = subprocess.call(command)
            if code == 0:
                cache.store(Path(args.out), describe_deps(parse_depfile(Path(args.depfile).read_text()), cwd, workdir))
                _log(cwd, "store", args.source, start)
            return code
    except (OSError, ValueError) as exc:  # the cache's own trouble: compile as if it were not there
        print(f"objcache: {exc}; compiling without the cache", file=sys.stderr)
        _log(cwd, "miss", args.source, start)
        return subprocess.call(command)


def _log(cwd: Path, what: str, source: str, start: float) -> None:
    with contextlib.suppress(OSError), open(cwd / LOG_NAME, "a") as handle:
        handle.write(f"{what} {source} {time.monotonic() - start:.3f}\n")


def counts(build_dir: Path) -> dict[str, int]:
    """hit / store / miss counts of a build folder's objcache.log."""
    found = {"hit": 0, "store": 0, "miss": 0}
    with contextlib.suppress(OSError):
        for line in (Path(build_dir) / LOG_NAME).read_text().splitlines():
            what = line.split(" ", 1)[0]
            if what in found:
                found[what] += 1
    return found


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
