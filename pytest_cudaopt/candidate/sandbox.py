"""The worker's OS sandbox, applied by the worker to itself before any candidate code runs: Landlock (it reads its workdir, its build and the Python and CUDA environment, writes only its scratch folder, executes nothing, cannot ptrace, signal or reach abstract sockets outside itself, opens no TCP connection), a seccomp filter (no ptrace, no other process's memory, no signal outside its own process group, no exec, no kernel modules, mounts or namespaces), no capabilities, no new privileges, not dumpable.

Standard library only (ctypes; docs/threat-model.md says why): this runs before torch is imported, while the
worker has a single thread (Landlock confines the calling thread and those it starts, not those already running)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import os
import platform
import site
import sys
import sysconfig
from pathlib import Path

MODES = ("require", "auto", "off")
# The restrictions, as the report names them.
RESTRICTIONS = {
    "files": "reads only its workdir, its build and the Python and CUDA environment; writes only its scratch folder",
    "exec": "starts no program",
    "ptrace": "cannot ptrace or read the memory of another process (the judging process, a sibling)",
    "signals": "cannot signal a process outside its own process group; its children cannot leave that group",
    "network": "opens no TCP connection and binds no TCP port",
    "sockets": "cannot connect to an abstract Unix socket outside its own sandbox",
    "privileges": "no capabilities, no new privileges (setuid), not dumpable",
    "kernel": "no kernel modules, mounts, namespaces, bpf, keyrings, reboot or clock changes"}

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 38, 47, 4

# -- Landlock (include/uapi/linux/landlock.h) ------------------------------------------------

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
(EXECUTE, WRITE_FILE, READ_FILE, READ_DIR, REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK,
 MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV) = (1 << i for i in range(16))
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a rule on a file may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2      # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2   # ABI 6

READ = READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE | IOCTL_DEV
# The scratch folder: everything but executing, device nodes and ioctls.
SCRATCH = READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_SYM \
    | REFER | TRUNCATE
# /dev/shm (the arena, torch's shared tensors, CUDA's IPC counts): files made and removed, the folder not listed.
SHARED_MEMORY = READ_FILE | WRITE_FILE | MAKE_REG | REMOVE_FILE | TRUNCATE


def _check(result: int, what: str) -> int:
    """`result` of a libc call, or the OSError its errno names (`what: strerror`)."""
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> tuple[int, str]:
    """The kernel's Landlock ABI version (0 when there is none) and, when 0, why."""
    found = _LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                          ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if found >= 0:
        return int(found), ""
    code = ctypes.get_errno()
    why = {errno.ENOSYS: "this kernel has no Landlock (older than 5.13, or built without it)",
           errno.EOPNOTSUPP: "Landlock is built in but turned off (lsm= boot parameter)"}.get(code)
    return 0, why or f"landlock_create_ruleset: {os.strerror(code)}"


def _landlock(abi: int, reads: list[tuple[str, int]]) -> None:
    """Restrict this thread (and the threads and processes it starts) to `reads`' (path, rights)."""
    fs = FS_BY_ABI.get(abi, FS_BY_ABI[5])
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = _check(_LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                                   ctypes.c_size_t(size), ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        for path, rights in reads:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this machine
            try:
                if not os.path.isdir(path):
                    rights &= FILE_RIGHTS
                rule = _PathBeneath(rights & fs, fd)
                _check(_LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                                     ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)),
                       f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(_LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def rules(workdir: str, build: str | None, scratch: str) -> list[tuple[str, int]]:
    """(path, Landlock rights) of everything the worker may open; nothing else of the host."""
    import pytest_cudaopt

    reads = [workdir, str(Path(pytest_cudaopt.__file__).resolve().parent)]
    if build:
        reads.append(str(build))
    paths = sysconfig.get_paths()
    reads += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    reads += [*getattr(site, "getsitepackages", lambda: [])(), *filter(None, [getattr(site, "USER_SITE", None)])]
    reads += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    reads += [sys.pycache_prefix] if sys.pycache_prefix and Path(sys.pycache_prefix).is_dir() else []
    reads += [os.environ[k] for k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if os.environ.get(k)]
    reads += glob.glob("/usr/local/cuda*") + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    reads += ["/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/local/lib", "/usr/share/zoneinfo",
              "/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
              "/proc/cpuinfo", "/proc/meminfo",
              "/proc/stat", "/proc/sys/vm/overcommit_memory", "/sys/devices/system/cpu", "/sys/devices/system/node",
              "/sys/devices/system/clocksource", "/proc/sys/kernel/perf_event_paranoid",  # the profiler (CUPTI)
              "/proc/driver/nvidia", "/proc/devices", "/sys/bus/pci/devices", "/sys/module/nvidia",
              *glob.glob("/sys/devices/pci*")]
    found = [(p, READ) for p in reads if p and p != "/"]
    devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random", *glob.glob("/dev/nvidia*")]
    found += [(p, DEVICE) for p in devices]
    found += [(scratch, SCRATCH), ("/dev/shm", SHARED_MEMORY)]
    # Its own /proc entries, written too: the CUDA driver opens one with O_TRUNC at initialisation
    # (benchmarks/sandbox_probe.py). Other processes' entries need ptrace access, which Landlock refuses.
    found.append((f"/proc/{os.getpid()}", READ | WRITE_FILE | TRUNCATE))
    return found


# -- seccomp (include/uapi/linux/seccomp.h, filter.h) -----------------------------------------

_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# name -> (x86_64, aarch64) syscall numbers; None where the architecture has no such call.
_SYSCALLS = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "pidfd_send_signal": (424, 424), "tkill": (200, 130),
    "execve": (59, 221), "execveat": (322, 281),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280), "userfaultfd": (323, 282),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "setns": (308, 268), "unshare": (272, 97), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "adjtimex": (159, 171), "clock_adjtime": (305, 266),
    "sethostname": (170, 161), "setdomainname": (171, 162), "quotactl": (179, 60),
    "iopl": (172, None), "ioperm": (173, None),
    "setsid": (112, 157), "setpgid": (109, 154),   # its children stay in its process group, and die with it
    # checked on their arguments
    "kill": (62, 129), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
    "clone": (56, 220), "clone3": (435, 435), "fork": (57, None), "vfork": (58, None)}
# New namespaces from clone(): unshare and setns are refused outright. On the CPU, new processes too
# (threads only): a process's CPU time is not the worker's, which bounds the worker's timer there.
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
CLONE_THREAD = 0x00010000

_RET, _LD_ABS, _JEQ, _JGE, _JSET = 0x06, 0x20, 0x15, 0x35, 0x45
ALLOW, ERRNO, KILL = 0x7FFF0000, 0x00050000, 0x80000000
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple:
    return (code, jt, jf, k & 0xFFFFFFFF)


def seccomp_program(machine: str, refused: dict[int, int], own: list[int] = (), clone: int | None = None,
                    signalling: tuple[int, ...] = (), group_kill: int | None = None,
                    threads_only: bool = False) -> list[tuple]:
    """A BPF program: `refused` syscall -> errno; `signalling` calls (kill, tgkill, ...) allowed only when their
    first argument is one of `own` (kill also 0 and `group_kill`, its group's negative id); `clone` refused with
    EPERM for a new namespace; a call of another architecture ends the process; everything else allowed."""
    prog = [_op(_LD_ABS, 4), _op(_JEQ, _ARCH[machine], 1, 0), _op(_RET, KILL), _op(_LD_ABS, 0)]
    if machine == "x86_64":  # x32 calls: the same numbers with bit 30 set
        prog += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, ERRNO | errno.EPERM)]
    for nr, code in refused.items():
        prog += [_op(_JEQ, nr, 0, 1), _op(_RET, ERRNO | code)]
    for nr in signalling:
        allowed = list(own) + ([0, group_kill] if group_kill is not None and nr == signalling[0] else [])
        block = [_op(_LD_ABS, 16)]
        for value in allowed:
            block += [_op(_JEQ, value, 0, 1), _op(_RET, ALLOW)]
        block += [_op(_RET, ERRNO | errno.EPERM)]
        prog += [_op(_JEQ, nr, 0, len(block)), *block]
    if clone is not None:  # a new namespace refused; with `threads_only`, a new process too
        check = [_op(_JSET, CLONE_NEW, 2), _op(_JSET, CLONE_THREAD, 0, 1)] if threads_only else [_op(_JSET, CLONE_NEW, 1)]
        prog += [_op(_JEQ, clone, 0, len(check) + 3), _op(_LD_ABS, 16), *check, _op(_RET, ALLOW),
                 _op(_RET, ERRNO | errno.EPERM)]
    return prog + [_op(_RET, ALLOW)]


def install_seccomp(prog: list[tuple], machine: str) -> None:
    """Install `prog` on every thread of this process (TSYNC), for good."""
    filters = (_SockFilter * len(prog))(*[_SockFilter(*op) for op in prog])
    fprog = _SockFprog(len(prog), filters)
    if _LIBC.syscall(ctypes.c_long(_SYS_SECCOMP[machine]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                     ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog)) != 0:  # TSYNC: >0 names a thread
        _check(-1, "seccomp")


def _syscalls(machine: str, names) -> list[int]:
    column = 0 if machine == "x86_64" else 1
    return [n for n in (_SYSCALLS[name][column] for name in names) if n is not None]


def _seccomp(machine: str, threads_only: bool) -> None:
    refused = {nr: errno.EPERM for nr in _syscalls(machine, [n for n in _SYSCALLS if n not in (
        "kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "clone", "clone3")
        + (() if threads_only else ("fork", "vfork"))])}
    refused.update({nr: errno.ENOSYS for nr in _syscalls(machine, ["clone3"])})  # C libraries fall back to clone
    pid = os.getpid()
    group = -pid if os.getpgrp() == pid else None
    signalling = tuple(_syscalls(machine, ["kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"]))
    install_seccomp(seccomp_program(machine, refused, [pid], _syscalls(machine, ["clone"])[0], signalling, group,
                                    threads_only), machine)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _last_capability() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 63


def _drop_capabilities(last: int) -> None:
    """No capability left, in any set (a root worker can otherwise load a module, make a device node)."""
    for cap in range(last + 1):
        _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)   # refused without CAP_SETPCAP: then there is nothing to drop
    _LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _check(_LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")


def _prctl(option: int, value: int, what: str) -> None:
    _check(_LIBC.prctl(option, value, 0, 0, 0), what)


def confine(mode: str, workdir: str, build: str | None, scratch: str, *,
            started_by: str | None = None, threads_only: bool = False) -> dict:
    """Confine this process as far as `mode` and the kernel allow: {"mode", "landlock" (the ABI, 0: none),
    "held": {restriction: [mechanism, ...]}, "missing": {restriction: why}}; a failed mechanism raises nothing.
    With other threads Landlock is not applied, unless `started_by` (compute-sanitizer) started them."""
    if mode not in MODES:
        raise ValueError(f"sandbox mode {mode!r}: expected one of {', '.join(MODES)}")
    held: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    if os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # its own process group, the one it may signal
    if mode == "off":
        return {"mode": mode, "landlock": 0, "held": {}, "missing": {name: "cudaopt_sandbox=off" for name in RESTRICTIONS}}

    def attempt(mechanism: str, names: tuple[str, ...], action) -> None:
        try:
            action()
        except (OSError, AttributeError, ValueError) as exc:
            for name in names:
                failed.setdefault(name, f"{mechanism}: {exc}")
            return
        for name in names:
            held.setdefault(name, []).append(mechanism)

    abi, why = landlock_abi()
    machine = platform.machine()
    threads = len(os.listdir(f"/proc/{os.getpid()}/task"))
    reads = rules(workdir, build, scratch)
    last_capability = _last_capability()  # read while /proc/sys is open to it
    attempt("not dumpable", ("privileges",), lambda: _prctl(PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE"))
    attempt("no new privileges", ("privileges",), lambda: _prctl(PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS"))
    if not abi or threads > 1 and not started_by:  # Landlock would leave the other threads free
        why = why if not abi else f"not applied, the worker had {threads} threads"
        for name in ("files", "exec", "ptrace", "signals", "network", "sockets"):
            failed.setdefault(name, f"Landlock: {why}")
    else:
        covered = ["files", "exec", "ptrace"] + (["network"] if abi >= 4 else []) + \
            (["signals", "sockets"] if abi >= 6 else [])
        others = threads - 1
        how = f"Landlock ABI {abi}" + (f" (not the {others} thread{'s' * (others > 1)} {started_by} started before it)"
                                       if others else "")
        attempt(how, tuple(covered), lambda: _landlock(abi, reads))
        if abi < 4:
            failed.setdefault("network", f"Landlock ABI {abi} has no network rules (4 has)")
        if abi < 6:
            failed.setdefault("sockets", f"Landlock ABI {abi} has no scopes (6 has)")
    attempt("no capabilities", ("privileges",), lambda: _drop_capabilities(last_capability))
    if machine in _ARCH:
        attempt("seccomp", ("ptrace", "signals", "exec", "kernel"), lambda: _seccomp(machine, threads_only))
    else:
        for name in ("ptrace", "signals", "exec", "kernel"):
            failed.setdefault(name, f"seccomp: no syscall table for {machine}")
    # A restriction some mechanism holds is held; "privileges" needs all three of its own.
    missing = {name: failed[name] for name in RESTRICTIONS if name in failed and
               (name not in held or name == "privileges")}
    if "privileges" in missing:
        held.pop("privileges", None)
    return {"mode": mode, "landlock": abi, "held": held, "missing": missing}

