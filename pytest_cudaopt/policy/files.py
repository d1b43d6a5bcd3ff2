"""Files the optimiser must leave alone (PF001-PF003: fixed bindings, the lock) and a clean kernels/ (KD001-KD003)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path

from pytest_cudaopt.policy.rules import LOCK_NAME, Violation

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
PROTECTED_TEMPLATES = ("binding.cpp", "binding_registry.h")
LOCK_COMMAND = "cudaopt init --lock-only {workdir}"
ADOPT_COMMAND = "cudaopt adopt {workdir}"
# The published agent-workdir versions of the fixed files (sha256). A workdir that carries
# them is judged as it is: they are valid fixed files, never to be overwritten.
UPSTREAM_SHA256 = {"binding.cpp": "43da662b9aedb537a4cb2f04c57d92aeddbe018a9b5f7374ae28ec9bba0b3b62",
                   "binding_registry.h": "a829ca7d5de03049c439f30aa01f7f631c06418c31855cf19a67f23d69349e0f",
                   "utils/__init__.py": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                   "utils/compile.py": "4bc806d8021fb430caebcffab3e32d5edc2b13abc8655544faa696fc7d699734",
                   "utils/compile.sh": "0707712752799cacc79930d3e5256994c13f511ea355e5346490d67e164af3d0",
                   "utils/profiling.py": "5e6fdd564262a296bb51a6e5fe86e16c216717a43d453c4cc6104e55000a577b",
                   "utils/verification.py": "c47e6b0810766c49e2c68e10374aed2a54224f31fc8a399158c079f4b9e8312f"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _locked_files(workdir: Path) -> list[str]:
    """Files outside kernels/ and model_new.py that can move a verdict, locked when present."""
    names = ["model.py"] + [name for name in ("conftest.py", "peers.py") if (workdir / name).is_file()]
    utils = workdir / "utils"
    if utils.is_dir():
        names += sorted(p.relative_to(workdir).as_posix() for p in utils.rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return names


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def locked_settings(workdir: Path) -> dict[str, str]:
    """The verdict-moving settings of pyproject.toml and pytest.ini, each rendered canonically (reformatting and
    unrelated edits do not count)."""
    from pytest_cudaopt.policy.rules import load_toml

    found: dict[str, str] = {}
    pyproject = workdir / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = load_toml(pyproject)
        except Exception:  # unparseable: CF001 says why; any change of the file counts
            data = None
        if data is None:
            found["pyproject.toml (unparsed)"] = _sha256(pyproject)
        else:
            tool = data.get("tool", {}) if isinstance(data.get("tool"), dict) else {}
            table = tool.get("cudaopt", {})
            for key, value in (table.items() if isinstance(table, dict) else [("", table)]):
                found[f"pyproject.toml [tool.cudaopt] {key}".rstrip()] = _canonical(value)
            ini = tool.get("pytest", {}).get("ini_options", {}) if isinstance(tool.get("pytest"), dict) else {}
            for key, value in (ini.items() if isinstance(ini, dict) else []):
                if key.startswith("cudaopt_"):
                    found[f"pyproject.toml [tool.pytest.ini_options] {key}"] = _canonical(value)
    pytest_ini = workdir / "pytest.ini"
    if pytest_ini.is_file():
        import configparser

        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(pytest_ini, encoding="utf-8")
            items = parser.items("pytest") if parser.has_section("pytest") else []
        except configparser.Error:
            items = [("(unparsed)", _sha256(pytest_ini))]
        for key, value in items:
            if key.startswith("cudaopt_") or key == "(unparsed)":
                found[f"pytest.ini [pytest] {key}"] = _canonical(value.strip())
    return found


def _settings_sha256(workdir: Path) -> dict[str, str]:
    return {key: hashlib.sha256(text.encode()).hexdigest() for key, text in sorted(locked_settings(workdir).items())}


def write_lock(workdir: Path) -> Path:
    """Record the sha256 of what the optimiser must not change in `<workdir>/cudaopt.lock` (`cudaopt init`)."""
    workdir = Path(workdir).resolve()
    if not (workdir / "model.py").is_file():
        raise FileNotFoundError(f"{workdir} has no model.py to lock")
    lock = workdir / LOCK_NAME
    lock.write_text(json.dumps({
        "about": "sha256 of the files and settings the optimiser must not change; checked by `cudaopt check` (PF003)",
        "files": {name: _sha256(workdir / name) for name in _locked_files(workdir)},
        "settings": _settings_sha256(workdir)}, indent=2) + "\n", encoding="utf-8")
    return lock


def fixed_file_origin(workdir: Path, name: str) -> str:
    """"shipped" (pytest_cudaopt/templates), "upstream" (the published version), "modified" or "missing"."""
    path = Path(workdir) / name
    if not path.is_file():
        return "missing"
    master = TEMPLATES / name
    if master.is_file() and path.read_bytes() == master.read_bytes():
        return "shipped"
    if UPSTREAM_SHA256.get(name) == _sha256(path):
        return "upstream"
    return "modified"


def check_protected(workdir: Path) -> list[Violation]:
    """PF001-PF003: the fixed binding files are the shipped or published versions; the locked files match the lock."""
    found = []
    for name in PROTECTED_TEMPLATES:
        path, master = workdir / name, TEMPLATES / name
        origin = fixed_file_origin(workdir, name)
        if origin == "missing":
            found.append(Violation(name, 1, "PF001", f"{name} is missing; copy it from {master}"))
            continue
        if origin == "modified":
            mine, theirs = path.read_bytes(), master.read_bytes()
            line = next((i for i, (a, b) in enumerate(zip(mine.splitlines(), theirs.splitlines()), 1) if a != b),
                min(len(mine.splitlines()), len(theirs.splitlines())) + 1)
            found.append(Violation(name, line, "PF001",
                                   f"{name} is neither the copy shipped in pytest_cudaopt (first difference "
                                   f"at line {line}) nor the published agent-workdir version; restore it "
                                   f"from version control, or from {master} if the workdir uses the shipped files"))
    lock_path, relock = workdir / LOCK_NAME, LOCK_COMMAND.format(workdir=workdir)
    hint = f"record the current files with `{relock}`"
    if not lock_path.is_file():
        return found + [Violation(LOCK_NAME, 1, "PF002",
                                  f"no lock file: model.py and utils/ cannot be proven unchanged; record them "
                                  f"with `{ADOPT_COMMAND.format(workdir=workdir)}` (a workdir not made by "
                                  f"`cudaopt init`) or `{relock}`")]
    try:
        document = json.loads(lock_path.read_text(encoding="utf-8"))
        recorded = document["files"]
        recorded_settings = document.get("settings", {})
        if not isinstance(recorded, dict) or not isinstance(recorded_settings, dict):
            raise TypeError("files or settings is not a table")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return found + [Violation(LOCK_NAME, 1, "PF002", f"lock file is not valid ({exc}); {hint}")]
    if "model.py" not in recorded:
        found.append(Violation(LOCK_NAME, 1, "PF002", f"lock file records no model.py; {hint}"))
    owner = f"; only the owner changes it (then `{relock}`)"
    for name in sorted(set(recorded) | set(_locked_files(workdir))):
        path = workdir / name
        if name not in recorded:
            found.append(Violation(name, 1, "PF003", f"{name} was added after the workdir was locked{owner}"))
        elif not path.is_file():
            found.append(Violation(LOCK_NAME, 1, "PF003", f"{name} was recorded in {LOCK_NAME} but is missing{owner}"))
        elif _sha256(path) != recorded[name] and UPSTREAM_SHA256.get(name) != _sha256(path):
            found.append(Violation(name, 1, "PF003", f"{name} changed since it was recorded in {LOCK_NAME} (sha256 "
                                                     f"differs); restore it from version control, or, for an intended "
                                                     f"change, the owner records it with `{relock}`"))
    settings = _settings_sha256(workdir)
    for key in sorted(set(recorded_settings) | set(settings)):
        source = key.split(" ", 1)[0]
        if key not in recorded_settings:
            message = f"setting {key} was added after the workdir was locked"
        elif key not in settings:
            message = f"setting {key} was recorded in {LOCK_NAME} but is gone"
        elif settings[key] != recorded_settings[key]:
            message = f"setting {key} changed since it was recorded in {LOCK_NAME}"
        else:
            continue
        found.append(Violation(source, 1, "PF003", message + owner))
    return found


INTERMEDIATE_PATTERNS = ("*_v[0-9]*", "*_old*", "*_test*", "*_backup*", "*.bak", "*.orig", "*.rej", "*.tmp", "*~")
SOURCE_SUFFIXES = (".cu", ".cpp")
HEADER_SUFFIXES = (".h", ".cuh", ".hpp")


def kernel_files(workdir: Path) -> list[Path]:
    """Every file under `<workdir>/kernels`, sorted."""
    kernels = workdir / "kernels"
    if not kernels.is_dir():
        return []
    return sorted(p for p in kernels.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def check_kernels_dir(workdir: Path, reached: set[Path]) -> list[Violation]:
    """KD001-KD003; `reached` holds the (resolved) files that a kernels/ source includes."""
    found, final = [], []
    for path in kernel_files(workdir):
        rel = path.relative_to(workdir).as_posix()
        if any(fnmatch.fnmatchcase(path.name, pattern) for pattern in INTERMEDIATE_PATTERNS):
            found.append(Violation(rel, 1, "KD001", f"{path.name} looks like an intermediate version; "
                                                    "kernels/ holds only the final one (delete it, git keeps history)"))
        else:
            final.append(path)
    stems = {(p.parent, p.stem) for p in final if p.suffix in SOURCE_SUFFIXES and not p.stem.endswith("_binding")}
    for path in final:
        rel = path.relative_to(workdir).as_posix()
        if path.suffix == ".cpp" and path.stem.endswith("_binding"):
            op = path.stem[: -len("_binding")]
            if (path.parent, op) not in stems:
                found.append(Violation(rel, 1, "KD002", f"binding without a launcher: no {op}.cu or {op}.cpp "
                                                        f"next to {path.name}"))
        elif path.suffix in SOURCE_SUFFIXES:
            if not (path.parent / f"{path.stem}_binding.cpp").is_file():
                found.append(Violation(rel, 1, "KD002", f"launcher without a binding: no {path.stem}_binding.cpp "
                                                        f"registers {path.name}'s functions"))
        elif path.suffix in HEADER_SUFFIXES:
            if path.resolve() not in reached:
                found.append(Violation(rel, 1, "KD003", f"header {path.name} is included by no source in kernels/, "
                                                        "so it is never compiled"))
        elif path.name != ".gitkeep":
            found.append(Violation(rel, 1, "KD003", f"{path.name} is not compiled (kernels/ holds .cu/.cpp sources "
                                                    "and their headers only)"))
    return found

