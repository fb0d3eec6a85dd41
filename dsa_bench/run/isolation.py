"""Who a solution's worker runs as, what it may write, and how everything it started is ended.

When the harness runs as root, each worker of a run gets a user and group id of its own from an
unused range (no account needs to exist for a numeric id): it cannot signal the harness, read
its memory or files it was not given, write to the project, or touch another solution's worker.
Every process that id owns is killed when the worker is stopped, so a process a solution starts
in a new session still ends with the run. When the harness is not root, workers run as the
harness's user: they are still separate processes in sessions of their own, killed with their
process group, but a hostile solution could signal the harness or read what its user can read.

A worker running under its own id needs every path it reads to be open to "others" (the Python
installation, the package, the solution, the trace's blobs); when one is not (a checkout under a
private home folder, a temporary folder of mode 700) the run says so and runs workers as the
harness's user instead, and the results record which it was.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

#: the numeric ids workers get when the harness is root: below 65536, which user namespaces map
WORKER_ID_FIRST = 60000
WORKER_ID_COUNT = 4096
WORKER_USER_MODES = ("auto", "harness")


@dataclass(frozen=True)
class WorkerIdentity:
    """The user a worker runs as: ``uid`` None means the harness's own."""

    uid: int | None
    gid: int | None
    description: str

    @property
    def dedicated(self) -> bool:
        return self.uid is not None


def _closed_to_others(path: Path, need: int) -> str | None:
    """Why a user with no rights but "other" cannot use ``path`` (``need`` = the mode bits a final
    component must grant to others), or None."""
    try:
        resolved = path.resolve()
        parts = [*reversed(resolved.parents), resolved]
        for i, part in enumerate(parts):
            mode = os.stat(part).st_mode
            want = need if i == len(parts) - 1 else stat.S_IXOTH
            if stat.S_ISDIR(mode) and i == len(parts) - 1:
                want = need | stat.S_IXOTH
            if mode & want != want:
                return f"{part} (mode {stat.filemode(mode)})"
    except OSError as exc:
        return f"{path} ({exc.strerror})"
    return None


def python_paths() -> list[Path]:
    """What any worker reads: the interpreter and every folder on its module path."""
    paths = [Path(os.path.realpath(sys.executable))]
    paths += [Path(p) for p in sys.path if p and Path(p).exists()]
    return paths


def gpu_device_files(device_index: int) -> list[Path]:
    names = ["nvidiactl", "nvidia-uvm", f"nvidia{device_index}"]
    return [Path("/dev") / n for n in names if (Path("/dev") / n).exists()]


def choose_identity(mode: str, slot: int, reads: list[Path], read_writes: list[Path]) -> WorkerIdentity:
    """The identity for the ``slot``-th worker of this run (each gets its own id)."""
    if mode not in WORKER_USER_MODES:
        raise ValueError(f"worker user mode {mode!r}; expected one of {WORKER_USER_MODES}")
    if mode == "harness":
        return WorkerIdentity(None, None, "the harness's user (--worker-user harness)")
    if os.geteuid() != 0:
        return WorkerIdentity(None, None, "the harness's user (the harness is not root)")
    for path in reads:
        problem = _closed_to_others(path, stat.S_IROTH)
        if problem:
            return WorkerIdentity(None, None, f"the harness's user: an unprivileged worker could not read {problem}")
    for path in read_writes:
        problem = _closed_to_others(path, stat.S_IROTH | stat.S_IWOTH)
        if problem:
            return WorkerIdentity(None, None, f"the harness's user: an unprivileged worker could not use {problem}")
    uid = WORKER_ID_FIRST + (os.getpid() * 8 + slot) % WORKER_ID_COUNT
    return WorkerIdentity(uid, uid, f"unprivileged uid/gid {uid}")


def give_to(identity: WorkerIdentity, folders: list[Path]) -> None:
    """Create ``folders`` and, for a dedicated identity, hand them (and what is in them) over."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        if identity.uid is None or identity.gid is None:  # the harness's own user keeps them
            continue
        for current, dirs, files in os.walk(folder):
            for name in [current, *(os.path.join(current, d) for d in dirs), *(os.path.join(current, f) for f in files)]:
                os.lchown(name, identity.uid, identity.gid)


def processes_of(uid: int) -> list[int]:
    """Pids of every process whose real user id is ``uid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("Uid:"):
                    if int(line.split()[1]) == uid:
                        found.append(int(entry.name))
                    break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return found


def end_everything(pid: int, identity: WorkerIdentity) -> None:
    """Kill a worker's process group and, for a dedicated identity, every process of its id."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if identity.uid is not None:  # a dedicated identity
        for _ in range(3):  # a process may fork while we look; look again
            victims = processes_of(identity.uid)
            if not victims:
                break
            for victim in victims:
                try:
                    os.kill(victim, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
