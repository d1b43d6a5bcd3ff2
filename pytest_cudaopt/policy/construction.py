"""MN010: `ModelNew(*get_init_inputs())` constructs without a GPU and its state dict matches Model's.
The facts come from candidate/construct.py (in the worker, or in process for `cudaopt check`)."""

from __future__ import annotations

import re
from pathlib import Path

from pytest_cudaopt.policy.rules import Violation

RULE = "MN010"
MAX_LISTED = 6
_FRAME = re.compile(r"^  (?P<file>.+?):(?P<line>\d+) in (?P<func>[^:]+?)(?:: (?P<code>.*))?$")
_LOCATED = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+): (?P<rest>.*)$")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _violation(traceback: str, lead: str, file: str, line: int) -> Violation:
    """One line for an exception: its innermost workdir frame, the exception, that line's code and its callers."""
    text = traceback.splitlines()
    frames = [m for m in map(_FRAME.match, text) if m]
    error = " ".join(ln.strip() for ln in text if not _FRAME.match(ln))
    message = f"{lead}: {_shorten(error, 300)}"
    if frames:
        inner = frames[-1]
        file, line = inner["file"], int(inner["line"])
        details = [f"in {inner['func']}" + (f": `{_shorten(inner['code'], 100)}`" if inner["code"] else "")]
        if len(frames) > 1:
            details.append("called from " + ", ".join(f"{f['file']}:{f['line']} in {f['func']}"
                                                      for f in reversed(frames[:-1])))
        message += f" ({'; '.join(details)})"
    return Violation(Path(file).as_posix(), line, RULE, message)


def _load_failure(workdir: Path, failed: dict, lead: str, line: int) -> Violation:
    """A failure of loading or of get_init_inputs(): its cause's frames when it has one, else its own first line."""
    text = str(failed["text"])
    named = [name for name in ("model.py", "model_new.py") if str(workdir / name) in text]
    file = failed.get("file") or (named[0] if named else "model_new.py")
    if failed.get("cause"):
        return _violation(failed["traceback"], lead, file, line if file == "model_new.py" else 1)
    first = text.strip().splitlines()[0] if text.strip() else "error"
    located = _LOCATED.match(first)
    if located and (workdir / located["file"]).is_file():
        return Violation(located["file"], int(located["line"]), RULE, f"{lead}: {located['rest']}")
    return Violation(file, line if file == "model_new.py" else 1, RULE, f"{lead}: {first}")


def _listed(keys: list[str]) -> str:
    return ", ".join(keys[:MAX_LISTED]) + (f" and {len(keys) - MAX_LISTED} more" if len(keys) > MAX_LISTED else "")


def _state_dict_difference(ours: dict, theirs: dict, line: int) -> list[Violation]:
    """MN010 when ModelNew's state_dict has other keys or shapes than Model's."""
    parts = []
    missing, unexpected = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if missing:
        parts.append(f"missing (in Model, not in ModelNew): {_listed(missing)}")
    if unexpected:
        parts.append(f"unexpected (in ModelNew, not in Model): {_listed(unexpected)}")
    shapes = [f"{k} {ours[k]} in Model, {theirs[k]} in ModelNew" for k in ours if k in theirs and ours[k] != theirs[k]]
    if shapes:
        parts.append(f"other shapes: {_listed(shapes)}")
    if not parts:
        return []
    return [Violation("model_new.py", line, RULE, "ModelNew's state_dict differs from Model's (model.py), so "
                                                  "Model's weights cannot be loaded into it: " + "; ".join(parts))]


def construction_violations(workdir: Path, facts: dict | None) -> list[Violation]:
    """MN010 from the facts of worker.construct.construction."""
    if facts is None:
        return []
    workdir, line, failed = Path(workdir).resolve(), int(facts["line"]), facts.get("failed")
    if failed is None:
        return _state_dict_difference(dict(facts["model"]), dict(facts["model_new"]), line)
    stage, traceback = failed["stage"], str(failed.get("traceback", ""))
    if stage == "import":
        return [_load_failure(workdir, failed, f"importing {failed.get('file') or 'the workdir'} failed", line)]
    if stage == "exit":
        return [_violation(traceback, "importing the workdir failed", "model_new.py", line)]
    if stage == "init":
        return [_load_failure(workdir, {**failed, "cause": failed.get("cause") or bool(traceback),
                                        "file": failed.get("file") or "model.py"},
                              "get_init_inputs() failed, so ModelNew cannot be constructed", line)]
    if stage == "model_new":
        return [_violation(traceback, "ModelNew(*get_init_inputs()) fails on the CPU", "model_new.py", line)]
    return [_violation(traceback, "Model(*get_init_inputs()) fails on the CPU, so ModelNew's state_dict "
                                  "cannot be compared with it", "model.py", 1)]

