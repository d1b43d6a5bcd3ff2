"""Which part of the worker's sandbox a host's CUDA driver needs: each mechanism of candidate/sandbox.py alone, Landlock with every right on "/" but one, and Landlock with writes allowed beneath one more path, each in a fresh process that then initialises CUDA.

    python3 benchmarks/sandbox_probe.py [--extra /some/path ...]

(On the H200 this found the driver's write with O_TRUNC beneath the process's own /proc entry.)

Prints one line per variant: whether `torch.ones(1, device="cuda")` worked after it, and the
error when not. A variant that works where the full sandbox fails names what the driver needs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, platform
sys.path.insert(0, {root!r})
from pytest_cudaopt.candidate import sandbox as s
variant, extra, scratch = sys.argv[1], sys.argv[2:], {scratch!r}
abi, _ = s.landlock_abi()
reads = s.rules(os.getcwd(), None, scratch)
if variant == "landlock":
    s._landlock(abi, reads)
elif variant == "landlock+":
    s._landlock(abi, reads + [(p, s.READ | s.DEVICE | s.MAKE_CHAR | s.MAKE_REG | s.MAKE_DIR | s.MAKE_SOCK
                                | s.WRITE_FILE | s.REMOVE_FILE) for p in extra])
elif variant == "seccomp":
    s._prctl(s.PR_SET_NO_NEW_PRIVS, 1, "nnp"); s._seccomp(platform.machine())
elif variant == "capabilities":
    s._drop_capabilities(s._last_capability())
elif variant == "dumpable":
    s._prctl(s.PR_SET_DUMPABLE, 0, "dumpable")
elif variant.startswith("without:"):  # every right on "/" but the one named
    fs = s.FS_BY_ABI.get(abi, s.FS_BY_ABI[5])
    s._landlock(abi, reads + [("/", fs & ~getattr(s, variant.split(":")[1], 0))])
elif variant.startswith("write:"):  # write and truncate allowed beneath one more path
    s._landlock(abi, reads + [(variant.split(":", 1)[1], s.READ | s.WRITE_FILE | s.TRUNCATE | s.MAKE_REG | s.MAKE_DIR)])
elif variant.startswith("ruleset:"):  # ruleset:NET:SCOPES, the file rules as the sandbox's
    net, scopes = (int(x) for x in variant.split(":")[1:])
    import ctypes
    fs = s.FS_BY_ABI.get(abi, s.FS_BY_ABI[5])
    attr = s._RulesetAttr(fs, net, scopes)
    fd = s._LIBC.syscall(ctypes.c_long(444), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    for path, rights in reads:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        if not os.path.isdir(path):
            rights &= s.FILE_RIGHTS
        rule = s._PathBeneath(rights & fs, pfd)
        assert s._LIBC.syscall(ctypes.c_long(445), ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)) == 0, path
        os.close(pfd)
    assert s._LIBC.syscall(ctypes.c_long(446), ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
    print("ruleset", variant, "abi", abi)
elif variant == "all":
    print(s.describe(s.confine("require", os.getcwd(), None, scratch)))
import torch
torch.ones(1, device="cuda").add_(1)
torch.cuda.synchronize()
print("cuda ok", torch.cuda.device_count())
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extra", nargs="*", default=[])
    args = p.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            print("/dev/" + name, end="  ")
    print()
    variants = [("none", []), ("dumpable", []), ("capabilities", []), ("seccomp", []), ("landlock", []), ("all", [])]
    variants += [(f"without:{right}", []) for right in ("EXECUTE", "WRITE_FILE", "TRUNCATE", "IOCTL_DEV")]
    home = os.path.expanduser("~")
    variants += [(f"write:{path}", []) for path in ("/dev", "/proc", "/proc/self", "/sys", "/tmp", "/run", home)]
    variants += [("landlock+", [extra]) for extra in args.extra]
    for variant, extra in variants:
        with tempfile.TemporaryDirectory() as scratch:
            env = dict(os.environ, TMPDIR=scratch, CUDA_CACHE_PATH=os.path.join(scratch, "cc"))
            done = subprocess.run([sys.executable, "-c", CHILD.format(root=root, scratch=scratch), variant, *extra],
                                  capture_output=True, text=True, env=env, timeout=120)
        said = (done.stdout + done.stderr).strip().splitlines()
        ok = done.returncode == 0 and any("cuda ok" in line for line in said)
        tail = "" if ok else " | ".join(line for line in said[-3:])[:300]
        print(f"{variant:<14} {' '.join(extra):<12} {'ok' if ok else 'FAILS'}  {tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
