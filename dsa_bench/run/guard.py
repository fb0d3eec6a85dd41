"""The worker's audit hook: what a solution may not do from Python, refused with a clear name.

Installed in the worker (``sys.addaudithook``) after the harness's own setup and before the
solution is imported. It refuses, by raising :class:`Refused` where the call is made and
remembering it so the case fails as RUNTIME_ERROR even if the solution catches the error:

- starting programs (``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``),
  except the compilers a build needs (``nvcc``, ``ptxas``, the C/C++ compiler, ``ninja``,
  ``ldconfig``, and ``file -b PATH`` as ``platform.architecture()`` runs it), found outside every
  folder the worker may write and outside the solution;
- sockets other than UNIX ones, and every ``connect`` or ``bind``;
- ``ctypes`` loads of shared libraries other than the Python environment's (its installation and the
  ``sys.path`` folders that neither hold the solution nor are writable by the worker), CUDA's, the
  solution's own builds (its build and Triton cache folders) and those already loaded;
- opening a file for writing, or creating, removing, renaming or changing one, outside the
  worker's build, cache, home and scratch folders and ``/dev``.

An audit hook is not a wall: code in the process can still reach the C library through ``ctypes``
(``CDLL(None)``) and do what Python refused. The walls are the kernel's (:mod:`dsa_bench.run.sandbox`:
namespaces, Landlock); the hook makes an ordinary attempt fail early and say what it was.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: programs a declared build may start (by file name; the file must lie outside what the worker can write)
BUILD_TOOLS = frozenset({
    "nvcc", "ptxas", "cuobjdump", "nvdisasm", "fatbinary", "nvlink", "cc", "c++", "gcc", "g++", "clang", "clang++",
    "ninja", "ldconfig", "ldconfig.real", "file",
})  # fmt: skip
#: file names of the CUDA libraries a kernel may load wherever the driver installed them
CUDA_LIBRARY_PREFIXES = ("libcuda", "libcudart", "libnvrtc", "libcupti", "libnvidia-ml", "libcublas", "libnvJitLink", "libnvToolsExt")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: event -> {position of a path argument it changes: position of the dir_fd a relative one is resolved against,
#: or None} (``shutil.rmtree`` unlinks names relative to a folder descriptor)
_PATH_EVENTS: dict[str, dict[int, int | None]] = {
    "os.remove": {0: 1}, "os.rmdir": {0: 1}, "os.mkdir": {0: 2}, "os.rename": {0: 2, 1: 3}, "os.link": {0: 2, 1: 3},
    "os.symlink": {1: 2}, "os.truncate": {0: None}, "os.chmod": {0: 2}, "os.chown": {0: 3}, "os.utime": {0: 3},
    "shutil.rmtree": {0: 1},
}  # fmt: skip


class Refused(PermissionError):
    """What the worker's audit hook refused."""


class Guard:
    """The hook's policy: the folders the worker may write and load its builds from."""

    def __init__(self, writable: Iterable[str], solution: str, builds: Iterable[str] = ()) -> None:
        """``writable``: the folders the worker may write below; ``builds``: those it may also load
        shared libraries from (its build and Triton cache folders)."""
        self.writable = [os.path.realpath(p) for p in writable] + ["/dev"]
        self.solution = os.path.realpath(solution)
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        installed = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
        # the installation and its site-packages, not every sys.path entry (the project's checkout is one)
        self.library_roots = [os.path.realpath(p) for p in (prefixes | installed) if p]
        cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        self.library_roots += [os.path.realpath(cuda_home), *(os.path.realpath(p) for p in builds)]
        # packages installed beside the environment (a PYTHONPATH folder such as pip's --target) are part of it;
        # a sys.path entry holding the solution (the project's checkout) or writable by the worker is not
        for entry in filter(os.path.isdir, filter(None, sys.path)):
            real = os.path.realpath(entry)
            if not self._under(self.solution, [real]) and not self._under(real, self.writable):
                self.library_roots.append(real)
        self.refused: list[str] = []

    # ------------------------------------------------------------------ the policy

    def _under(self, path: str, roots: list[str]) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def _may_write(self, path: Any) -> bool:
        if isinstance(path, int):  # an open descriptor: what it names was opened under this policy
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return self._under(real, self.writable)

    def _holds_writable(self, path: Any) -> bool:
        """Whether ``path`` is a folder above one the worker may write (so never empty)."""
        if isinstance(path, int):
            return False
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(w != real and self._under(w, [real]) for w in self.writable if os.path.isdir(w))

    def _tool(self, executable: Any, args: Any, env: Any) -> str | None:
        """The build tool this program is, or None."""
        first = executable if executable is not None else (args[0] if isinstance(args, (list, tuple)) and args else args)
        if first is None:
            return None
        name = os.fsdecode(first)
        search = (env or {}).get("PATH") if isinstance(env, dict) else None
        found = name if "/" in name else shutil.which(name, path=search or os.environ.get("PATH"))
        if found is None:
            return None
        real = os.path.realpath(found)
        allowed = BUILD_TOOLS | {os.path.basename(os.environ.get(k, "")) for k in ("CC", "CXX")} - {""}
        if os.path.basename(found) not in allowed and os.path.basename(real) not in allowed:
            return None
        if self._under(real, [*self.writable, self.solution]):
            return None  # a "compiler" the solution could have written
        if os.path.basename(real) == "file" and not _is_file_query(args):
            return None
        return real

    def _library_allowed(self, name: Any) -> bool:
        if name is None:  # the program itself: nothing new is loaded
            return True
        text = os.fsdecode(name)
        base = os.path.basename(text)
        if base.startswith(CUDA_LIBRARY_PREFIXES):
            return True
        if "/" in text:
            real = os.path.realpath(text)
            return self._under(real, self.library_roots) or real in _loaded_libraries()
        return base in {os.path.basename(p) for p in _loaded_libraries()}

    # ------------------------------------------------------------------ the hook

    def refuse(self, what: str) -> None:
        self.refused.append(what)
        raise Refused(f"dsa-bench refused {what} (the worker may not do this; docs/trust.md)")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = (args + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writes and path is not None and not self._may_write(path):
                self.refuse(f"opening {os.fsdecode(path)!s} for writing")
        elif event in _PATH_EVENTS:
            if event == "os.mkdir" and args and not isinstance(args[0], int) and os.path.isdir(args[0]):
                return  # makedirs(..., exist_ok=True) of a folder that exists changes nothing
            if event == "os.rmdir" and args and self._holds_writable(args[0]):
                return  # it holds a writable folder, so the OS refuses it (not empty): Triton's os.removedirs climbs so
            for i, dir_fd_at in _PATH_EVENTS[event].items():
                if i < len(args) and args[i] is not None:
                    path = _resolved(args[i], args, dir_fd_at)
                    if not self._may_write(path):
                        self.refuse(f"{event} on {os.fsdecode(path) if not isinstance(path, int) else path}")
        elif event == "subprocess.Popen":
            executable, popen_args, _cwd, env = args
            if self._tool(executable, popen_args, env) is None:
                self.refuse(f"starting a program: {_shown(popen_args)}")
        elif event in ("os.posix_spawn", "os.posix_spawnp", "os.spawn"):
            path, argv, env = args[-3:] if event != "os.spawn" else args[1:4]
            if self._tool(path, argv, env) is None:
                self.refuse(f"starting a program ({event}): {_shown(argv)}")
        elif event in ("os.system", "os.exec", "os.fork", "os.forkpty", "pty.spawn"):
            self.refuse(f"{event}" + (f": {_shown(args[0])}" if args and event != "os.fork" else ""))
        elif event == "socket.__new__":
            family = args[1] if len(args) > 1 else None
            if family not in (socket.AF_UNIX, -1, None):
                self.refuse(f"opening a network socket (family {family})")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            self.refuse(f"{event} to {_shown(args[1] if len(args) > 1 else '?')}")
        elif event == "ctypes.dlopen":
            if not self._library_allowed(args[0]):
                self.refuse(f"loading the shared library {os.fsdecode(args[0])}")


def _resolved(path: Any, args: tuple[Any, ...], dir_fd_at: int | None) -> Any:
    """``path`` made absolute against the call's ``dir_fd`` when it has one and the path is relative (the
    folder an open descriptor names, read from /proc); otherwise ``path`` as given (relative: the cwd's)."""
    dir_fd = args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None
    if isinstance(path, int) or not isinstance(dir_fd, int) or dir_fd < 0 or os.path.isabs(os.fsdecode(path)):
        return path
    try:
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fsdecode(path))
    except OSError:
        return path  # no /proc: judged against the cwd, as before


def _is_file_query(args: Any) -> bool:
    """``file -b PATH``, as ``platform.architecture()`` runs it: the only ``file`` call allowed (it reads one
    file and prints; other options, such as ``-C``, write)."""
    return isinstance(args, (list, tuple)) and len(args) == 3 and args[1] == "-b" and not os.fsdecode(args[2]).startswith("-")


def _shown(value: Any, limit: int = 200) -> str:
    text = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _loaded_libraries() -> set[str]:
    """Files mapped into this process (a library loaded again adds no code)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6 and "/" in line}
    except OSError:
        return set()


_installed: Guard | None = None


def install(writable: Iterable[str], solution: str | Path, builds: Iterable[str] = ()) -> Guard:
    """Install the hook for the rest of this process's life (an audit hook cannot be removed)."""
    global _installed
    if _installed is None:
        _installed = Guard(writable, str(solution), builds)
        sys.addaudithook(_installed)
    return _installed
