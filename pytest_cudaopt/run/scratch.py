"""Temporary folders owned by a process, named `cudaopt-KIND-HOST-PID-XXXXXXXX` in the temp folder, and what one
holds (`weigh`: a worker's, which the judging process bounds).

A process killed outright (SIGKILL at a hang, a lost Ray actor, a judge's child ended with its group) runs no
clean-up: the next process of this host and user that makes a folder of the same kind removes those whose owner is
gone. The host in the name keeps a temp folder shared between machines (or containers, each with its own process
numbers) from losing a live owner's folder.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path


def own_folder(kind: str) -> Path:
    """A new folder of `kind` for this process, after removing those of `kind` that dead processes of this host and
    user left."""
    temp = Path(tempfile.gettempdir())
    mine = f"cudaopt-{kind}-{socket.gethostname()}-"   # then PID-, then mkdtemp's 8 characters
    for stale in temp.glob(f"{glob.escape(mine)}*"):
        found = re.fullmatch(r"(\d+)-[A-Za-z0-9_]{8}", stale.name[len(mine):])
        try:
            if found is None or stale.stat().st_uid != os.getuid():
                continue
            os.kill(int(found.group(1)), 0)   # alive (or another's process of that number): kept
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue
    return Path(tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}-"))


def weigh(folder: Path, most: int) -> tuple[int, int]:
    """(bytes on disk, entries) of the tree at `folder`, the walk ended once past `most` entries. Allocated blocks,
    not sizes: a sparse file weighs what it holds."""
    size = entries = 0
    todo = [str(folder)]
    while todo and entries <= most:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as found:
            for entry in found:
                entries += 1
                if entries > most:
                    break
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    else:
                        size += entry.stat(follow_symlinks=False).st_blocks * 512
    return size, entries
