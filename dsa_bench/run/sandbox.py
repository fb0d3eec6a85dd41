"""The kernel-enforced walls around a solution's worker: ``python -m dsa_bench.run.sandbox``.

The harness starts every worker through this launcher. Where the kernel allows it (Linux, util
namespaces permitted, as root or not), the launcher puts the worker in a user, PID and mount
namespace of its own, with a fresh ``/proc``:

- the worker sees only its own processes: it cannot name the harness to signal, trace or read it
  (``kill``, ``/proc/<pid>/mem``, ``pidfd_open`` all look pids up in the worker's namespace);
- the launcher's child is the namespace's init and the worker its child; when the worker ends
  (or the harness kills the launcher, or dies), init ends and the kernel kills every process of
  the namespace, including one a solution started in a new session with ``setsid``;
- every capability is dropped before the worker runs (a worker mapped to root holds none).

Then, where the kernel offers Landlock (Linux 5.13+), the worker may write only below the folders
the harness hands it (its build, Triton, home and scratch folders, and ``/dev`` for the GPU), may
not bind or connect TCP sockets (ABI 4+), and may not signal processes or reach abstract UNIX
sockets outside its own domain (ABI 6+). Reads are not restricted.

Whatever is not available is skipped and said: the launcher hands the worker the list of what is
in force (``DSA_BENCH_PROTECTIONS``), which the worker reports and the results record. The harness
itself is made non-dumpable (:func:`protect_harness`), so a process of its own user id that
reaches it anyway cannot read its memory through ``/proc`` or ``ptrace`` it.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import platform
import select
import signal
import sys

from dsa_bench.run import seccomp

#: the environment variable through which the launcher tells the worker what is in force
PROTECTIONS_ENV = "DSA_BENCH_PROTECTIONS"
#: set (to anything) to start workers without namespaces, as on a kernel that refuses them
NO_NAMESPACES_ENV = "DSA_BENCH_NO_NAMESPACES"
#: the pid the worker's parent has (the namespace's init, or the launcher): the worker ends when it changes
PARENT_ENV = "DSA_BENCH_WORKER_PARENT"

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 4, 24, 36, 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE, _FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
_FS_MAKE_ANY = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def protect_harness() -> str | None:
    """Make this process (the harness) non-dumpable: processes of its own user id can then
    neither ``ptrace`` it nor read ``/proc/<pid>/mem``, ``environ`` or ``maps``. The protection
    in force as text, or None where the kernel call failed."""
    if sys.platform != "linux":
        return None
    try:
        if _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return "harness not dumpable"


# --------------------------------------------------------------------------- namespaces


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces() -> str | None:
    """Unshare user, PID and mount namespaces (this process's later children enter the PID one);
    None on success, else why not."""
    if sys.platform != "linux":
        return f"no namespaces on {sys.platform}"
    if os.environ.get(NO_NAMESPACES_ENV):
        return f"namespaces turned off ({NO_NAMESPACES_ENV})"
    uid, gid = os.geteuid(), os.getegid()
    libc = _libc()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS) != 0:
        return f"the kernel refused new user/PID/mount namespaces ({_errno_text()})"
    try:  # the worker keeps its own ids inside (a one-line map of the creator's ids needs no privilege)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:
        return f"cannot map ids into the user namespace ({exc.strerror})"
    return None


def _mount_private_proc() -> str | None:
    libc = _libc()
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"cannot make the mounts private ({_errno_text()})"
    if libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        return f"cannot mount a /proc of the worker's own ({_errno_text()})"
    return None


def _drop_capabilities() -> None:
    """No capability survives into the worker, even for a worker mapped to root."""
    libc = _libc()
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break  # past the kernel's last capability
    data = (_CapData * 2)()
    libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data)


# --------------------------------------------------------------------------- landlock


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64", "arm64"):
        return 0
    version = _libc().syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(0, int(version))


def _landlock(writable: list[str]) -> list[str]:
    """Restrict this process (and what it executes) with Landlock; the protections in force."""
    abi = landlock_abi()
    if abi < 1:
        return []
    libc = _libc()
    write = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_ANY
    write |= (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = _RulesetAttr(write, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        return []
    try:
        for folder in writable:
            try:
                fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue  # a folder that does not exist cannot be written below anyway
            try:
                rule = _PathBeneathAttr(write, fd)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    return []
            finally:
                os.close(fd)
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            return []
    finally:
        os.close(ruleset)
    found = [f"landlock v{abi}: writes only below its build, cache, home and scratch folders and /dev"]
    if net:
        found.append("landlock: no TCP bind or connect")
    if scoped:
        found.append("landlock: no signals or abstract UNIX sockets outside the worker")
    return found


#: Why a worker on a CUDA device runs without Landlock: under this launcher's ruleset the NVIDIA driver does
#: not initialize (torch: "Unexpected error from cudaGetDeviceCount() ... Error 304", on an H100 machine,
#: 2026-12-06), while the same worker with user, PID and mount namespaces, no new privileges and no
#: capabilities (each tried alone too) initializes. Which rule the driver trips is not yet known.
LANDLOCK_OFF_ON_CUDA = "no Landlock on a CUDA device (the NVIDIA driver fails to initialize under its rules; docs/trust.md)"


def restrict_self(writable: list[str], landlock: bool = True) -> list[str]:
    """No new privileges, then Landlock unless ``landlock`` is off, then the seccomp filter; what is in force."""
    if sys.platform != "linux":
        return []
    _libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # needed by Landlock and seccomp without privileges; setuid files gain nothing
    found = _landlock(writable) if landlock else [LANDLOCK_OFF_ON_CUDA]
    return [*found, seccomp.install()]


# --------------------------------------------------------------------------- the launcher


def _exit_like(status: int) -> None:
    """End this process the way a child with wait ``status`` ended (a signal as that signal)."""
    code = os.waitstatus_to_exitcode(status)
    if code > 128 and code - 128 in signal.valid_signals():  # init passes on a signal that ended the worker as 128 + it
        code = 128 - code
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be caught, so have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


def _init(command: list[str], fds: list[int], writable: list[str], guard_r: int, protections: list[str], landlock: bool) -> None:
    """PID 1 of the worker's namespace: mounts its /proc, starts the worker, reaps everything, and
    ends with the worker (the kernel then kills whatever is left in the namespace)."""
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([guard_r], [], [], 0)[0]:  # the launcher is already gone (its end of the pipe closed)
        os._exit(1)
    problem = _mount_private_proc()
    protections.append("own /proc" if problem is None else f"the host's /proc: {problem}")
    worker = os.fork()
    if worker == 0:
        os.close(guard_r)
        _drop_capabilities()
        protections += restrict_self(writable, landlock)
        os.environ[PROTECTIONS_ENV] = "; ".join(protections)
        os.execvp(command[0], command)
    for fd in (*fds, guard_r):
        os.close(fd)  # only the worker holds the harness's pipes
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            if os.WIFSIGNALED(status):
                os._exit(128 + os.WTERMSIG(status))
            os._exit(os.waitstatus_to_exitcode(status))


def _children() -> list[int]:
    """This process's children (orphans of its descendants among them, as a subreaper)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    return found


def _sweep() -> None:
    """Kill every descendant: children first; their orphans then come to this subreaper, and so on."""
    for _ in range(100):
        children = _children()
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in children:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _reap_without_namespace(command: list[str], fds: list[int], writable: list[str], problem: str, landlock: bool) -> None:
    """Where no namespace can be had: the launcher stays as the worker's parent and a child
    subreaper, so the orphans of whatever the worker started (in a new session too) come to it,
    and it kills them all when the worker ends or when the harness stops it (SIGTERM) or dies."""
    libc = _libc()
    subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    _drop_capabilities()
    protections = ["no capabilities", *restrict_self(writable, landlock), f"no PID namespace: {problem}"]
    protections.append("every process it starts ends with it (subreaper)" if subreaper else "no subreaper: a process started in a new "
                       "session may outlive it")  # fmt: skip
    os.environ[PROTECTIONS_ENV] = "; ".join(protections)
    os.environ[PARENT_ENV] = str(os.getpid())
    worker = os.fork()
    if worker == 0:
        os.execvp(command[0], command)
    for fd in fds:
        os.close(fd)

    def stop(signum: int, frame: object) -> None:
        _sweep()
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, stop)  # the harness's stop; and its death (the parent-death signal below)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    while True:
        try:
            _, status = os.waitpid(worker, 0)
            break
        except InterruptedError:
            continue
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _sweep()
    _exit_like(status)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m dsa_bench.run.sandbox")
    parser.add_argument("--harness-pid", type=int, required=True)
    parser.add_argument("--fds", default="", help="the harness's pipe ends the worker uses, comma-separated")
    parser.add_argument("--write", action="append", default=[], help="a folder the worker may write below")
    parser.add_argument("--no-landlock", action="store_true", help="no Landlock rules (a worker on a CUDA device)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    fds = [int(fd) for fd in args.fds.split(",") if fd]
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != args.harness_pid:  # the harness died before the notice was set
        os._exit(1)
    writable = [*args.write, "/dev"]
    problem = _enter_namespaces()
    if problem is not None:
        _reap_without_namespace(command, fds, writable, problem, not args.no_landlock)
    os.environ[PARENT_ENV] = "1"  # the worker's parent is the namespace's init
    guard_r, guard_w = os.pipe()
    protections = ["own user, PID and mount namespaces", "no capabilities"]
    child = os.fork()
    if child == 0:
        os.close(guard_w)
        _init(command, fds, writable, guard_r, protections, not args.no_landlock)
    os.close(guard_r)
    for fd in fds:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harness's; it ends the worker itself
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
