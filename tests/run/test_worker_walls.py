"""A solution's worker cannot reach out: its audit hook refuses programs, sockets, foreign
libraries and writes outside its folders (each a RUNTIME_ERROR naming what was refused), and the
kernel's walls (namespaces, Landlock) keep a worker of the harness's own user id away from the
harness and end every process it started (docs/trust.md)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT

ADVERSARIAL = FIXTURES / "adversarial"


_KERNEL_WALLS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
landlock = max(0, libc.syscall(444, None, 0, 1))  # Landlock's ABI version; 6 scopes signals
sys.exit(0 if libc.unshare(0x10000000 | 0x20000000 | 0x00020000) == 0 or landlock >= 6 else 1)
"""


def _kernel_walls_here() -> bool:
    """Whether this kernel lets a process unshare user, PID and mount namespaces, or scope its
    signals with Landlock (asked of a child process, which the unshare changes)."""
    return sys.platform == "linux" and subprocess.run([sys.executable, "-c", _KERNEL_WALLS], timeout=60).returncode == 0


def _run(tmp_path: Path, names: list[str], *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """``dsa-bench run`` on one indexer case, as ``exec`` of a shell whose pid it keeps, so the
    fixtures can be told the harness's pid (DSA_BENCH_TEST_HARNESS_PID)."""
    save = tmp_path / "results.json"
    args = ["-m", "dsa_bench", "run", "-w", "indexer_smoke", "-c", "smoke_scored", "-s", "reference", "--save", str(save), *extra]
    for name in names:
        args += ["-s", str(ADVERSARIAL / name)]
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | (env or {})
    script = 'export DSA_BENCH_TEST_HARNESS_PID=$$; exec "$@"'
    proc = subprocess.run(["sh", "-c", script, "sh", sys.executable, *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc, json.loads(save.read_text()) if save.exists() else {}


def _by_solution(doc: dict) -> dict[str, dict]:
    return {r["solution"]: r for r in doc["records"]}


def _processes_named(token: str) -> list[int]:
    """Pids of live processes whose command line holds ``token`` (only this test's own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    state = (entry / "stat").read_text().split(")")[-1].split()[0]
                    if state != "Z":
                        found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.slow
def test_the_audit_hook_refuses_programs_sockets_libraries_and_writes(tmp_path):
    folder = tmp_path / "open"  # any user may write here, so only the guard can stop the write
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    tmp_path.chmod(0o777)
    marker = folder / "marker"
    names = ["starts_program", "opens_socket", "loads_library", "writes_outside"]
    proc, doc = _run(tmp_path, names, env={"DSA_BENCH_TEST_MARKER": str(marker)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    records = _by_solution(doc)
    assert records["reference"]["status"] == "PASSED"
    expected = {
        "starts_program": "starting a program: true",
        "opens_socket": "opening a network socket",
        "loads_library": "loading the shared library",
        "writes_outside": f"opening {marker} for writing",
    }
    for name, refusal in expected.items():
        assert records[name]["status"] == "RUNTIME_ERROR", (name, records[name]["message"])
        assert "refused by dsa-bench's worker guard" in records[name]["message"] and refusal in records[name]["message"], records[name]
    assert not marker.exists(), "a worker wrote outside its folders"
    assert any(p.startswith("audit hook") for p in doc["worker_protections"]["starts_program"])


def _landlock_abi() -> int:
    if sys.platform != "linux":
        return 0
    code = "import ctypes; print(max(0, ctypes.CDLL(None).syscall(444, None, 0, 1)))"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout or 0)


@pytest.mark.slow
@pytest.mark.parametrize("namespaces", [True, False], ids=["namespaces", "no_namespaces"])
def test_a_worker_of_the_harness_user_cannot_reach_the_harness_nor_leave_a_process(tmp_path, namespaces):
    """--worker-user harness forces the fallback a private checkout under /root gets: the worker
    shares the harness's user id. It still cannot read the harness's memory or kill it, and a
    process it started in a session of its own at import ends with the run: in namespaces of its
    own, and without them (DSA_BENCH_NO_NAMESPACES, as on a kernel that refuses them) by the
    harness being non-dumpable, Landlock's signal scope and the launcher as subreaper."""
    if namespaces and not _kernel_walls_here():
        pytest.skip("this kernel offers neither user/PID namespaces nor Landlock's signal scope")
    if not namespaces and _landlock_abi() < 6:
        pytest.skip("without namespaces, only Landlock's signal scope (ABI 6) keeps a worker from signalling the harness")
    token = uuid.uuid4().hex
    env = {"DSA_BENCH_TEST_NEW_SESSION": "1", "DSA_BENCH_TEST_TOKEN": token} | ({} if namespaces else {"DSA_BENCH_NO_NAMESPACES": "1"})
    try:
        proc, doc = _run(tmp_path, ["reaches_harness", "leaves_children"], "--worker-user", "harness", env=env)
        assert proc.returncode == 0, (proc.returncode, proc.stdout + proc.stderr)
        records = _by_solution(doc)
        assert {n: r["status"] for n, r in records.items()} == {n: "PASSED" for n in ("reference", "reaches_harness", "leaves_children")}
        assert all(d.startswith("the harness's user") for d in doc["workers"].values()), doc["workers"]
        report = doc["solution_notes"]["reaches_harness"]
        assert "read memory: " in report and "read memory: done" not in report, report
        assert "kill: " in report and "kill: done" not in report, report
        assert doc["solution_notes"]["leaves_children"].startswith("started child"), doc["solution_notes"]
        assert "harness not dumpable" in doc["worker_protections"]["reaches_harness"]
        assert not _processes_named(f"dsa-bench-child-{token}"), "a process started in a new session outlived the run"
    finally:
        for pid in _processes_named(f"dsa-bench-child-{token}"):
            os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- the hook's policy, without a worker


@pytest.fixture
def guard(tmp_path):
    from dsa_bench.run.guard import Guard

    (tmp_path / "build").mkdir()
    (tmp_path / "solution").mkdir()
    (tmp_path / "scratch").mkdir()
    return Guard([str(tmp_path / "build"), str(tmp_path / "scratch")], str(tmp_path / "solution"), builds=[str(tmp_path / "build")])


def test_the_guard_allows_the_build_and_refuses_the_rest(guard, tmp_path):
    from dsa_bench.run.guard import Refused

    guard("open", (str(tmp_path / "build" / "lib.so"), "wb", 0))  # the build folder
    guard("open", ("/dev/null", "w", 0))
    guard("open", (str(ROOT / "README.md"), "r", 0))  # reading is not refused
    guard("ctypes.dlopen", (None,))
    guard("ctypes.dlopen", (str(tmp_path / "build" / "lib.so"),))
    guard("ctypes.dlopen", ("libcuda.so.1",))
    guard("subprocess.Popen", ("/usr/bin/gcc", ["/usr/bin/gcc", "-c", "x.c"], None, None))
    guard("os.mkdir", (str(ROOT), 0o777, -1))  # an existing folder: makedirs(exist_ok=True) changes nothing
    refusals = [
        ("open", (str(ROOT / "README.md"), "a", 0), "opening"),
        ("open", (str(tmp_path / "build" / ".." / "elsewhere"), None, os.O_WRONLY | os.O_CREAT), "opening"),
        ("os.rename", (str(tmp_path / "build" / "x"), str(ROOT / "x"), -1, -1), "os.rename"),
        ("os.mkdir", (str(ROOT / "new-folder"), 0o777, -1), "os.mkdir"),
        ("ctypes.dlopen", (str(tmp_path / "solution" / "payload.so"),), "loading the shared library"),
        ("ctypes.dlopen", (str(tmp_path / "scratch" / "payload.so"),), "loading the shared library"),  # writable, but no build folder
        ("ctypes.dlopen", ("libnotloaded-anywhere.so",), "loading the shared library"),
        ("subprocess.Popen", ("/bin/sh", ["/bin/sh", "-c", "id"], None, None), "starting a program"),
        ("subprocess.Popen", (None, [str(tmp_path / "build" / "gcc")], None, None), "starting a program"),  # a "compiler" it wrote
        ("os.system", ("id",), "os.system"),
        ("os.exec", ("/bin/sh", ["sh"], None), "os.exec"),
        ("os.fork", (), "os.fork"),
        ("socket.__new__", (None, 2, 1, 0), "network socket"),
        ("socket.connect", (None, "/run/docker.sock"), "socket.connect"),
    ]
    for event, args, named in refusals:
        with pytest.raises(Refused, match=named):
            guard(event, args)
    assert len(guard.refused) == len(refusals)


def test_a_temporary_folder_removed_below_a_writable_one_is_allowed(tmp_path):
    """shutil.rmtree (a TemporaryDirectory's cleanup, Triton's launcher build on a GPU) unlinks names relative to a
    folder descriptor: the guard resolves them against that folder, not the cwd."""
    code = (
        "import os, sys, tempfile; from dsa_bench.run.guard import install, Refused\n"
        f"guard = install([{str(tmp_path / 'scratch')!r}], {str(tmp_path / 'solution')!r})\n"
        f"with tempfile.TemporaryDirectory(dir={str(tmp_path / 'scratch')!r}) as d:\n"
        "    open(os.path.join(d, 'main.c'), 'w').close(); os.mkdir(os.path.join(d, 'sub'))\n"
        f"fd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
        "try:\n    os.remove('outside.txt', dir_fd=fd)\nexcept Refused as e:\n    print('REFUSED', e)\n"
        "print('refused:', guard.refused)\n"
    )
    (tmp_path / "scratch").mkdir()
    (tmp_path / "outside.txt").write_text("keep")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path / "scratch", timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"refused: ['os.remove on {tmp_path / 'outside.txt'}']" in proc.stdout, proc.stdout
    assert (tmp_path / "outside.txt").read_text() == "keep"


def test_the_guard_allows_what_a_gpu_build_does_and_nothing_beside_it(guard, tmp_path, monkeypatch):
    """What Triton's GPU compile and the peers' imports do (seen on a GPU machine): ``file -b`` on the
    interpreter, ``os.removedirs`` climbing from a cache temp folder into its parents, and a library of a package
    installed with ``pip --target`` on PYTHONPATH."""
    from dsa_bench.run.guard import Guard, Refused

    file_tool = shutil.which("file")
    if file_tool is not None:
        guard("subprocess.Popen", (None, [file_tool, "-b", sys.executable], None, None))
        for argv in ([file_tool, "-C", "-m", "x"], [file_tool, "-b", "-C"], [file_tool, sys.executable]):
            with pytest.raises(Refused, match="starting a program"):
                guard("subprocess.Popen", (None, argv, None, None))
    guard("os.rmdir", (str(tmp_path),))  # above the build folder: the OS refuses it (not empty)
    for folder in (tmp_path / "solution", tmp_path / "elsewhere"):  # holds no writable folder: refused as before
        folder.mkdir(exist_ok=True)
        with pytest.raises(Refused, match="os.rmdir"):
            guard("os.rmdir", (str(folder),))
    site = tmp_path / "site"  # pip install --target: a sys.path folder outside the project
    (site / "pkg").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tmp_path / "scratch"))  # writable: never a library root
    monkeypatch.syspath_prepend(str(tmp_path))  # holds the solution: never a library root
    fresh = Guard([str(tmp_path / "build"), str(tmp_path / "scratch")], str(tmp_path / "solution"), builds=[str(tmp_path / "build")])
    fresh("ctypes.dlopen", (str(site / "pkg" / "ext.so"),))
    for payload in (tmp_path / "scratch" / "p.so", tmp_path / "solution" / "p.so", tmp_path / "p.so"):
        with pytest.raises(Refused, match="loading the shared library"):
            fresh("ctypes.dlopen", (str(payload),))


# --------------------------------------------------------------------------- the seccomp filter


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_program_refuses_each_listed_call_and_every_socket_but_unix(machine):
    """Run the classic BPF program by hand (the kernel's semantics: load, jump if equal / greater or equal, return)."""
    from dsa_bench.run import seccomp

    instructions = seccomp.program(machine)
    arch, socket_nr, refused = seccomp._TABLES[machine]

    def verdict(nr: int, arg0: int = 0, audit_arch: int = arch) -> int:
        data = {0: nr, 4: audit_arch, 16: arg0}
        pc, acc = 0, 0
        while True:
            code, jt, jf, k = instructions[pc]
            if code == 0x20:
                acc = data[k]
            elif code == 0x06:
                return k
            elif code in (0x15, 0x35):
                taken = acc == k if code == 0x15 else acc >= k
                pc += jt if taken else jf
            pc += 1

    allow, eperm, eacces = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 13
    assert {name: verdict(nr) for name, nr in refused.items()} == dict.fromkeys(refused, eperm)
    assert verdict(socket_nr, 1) == allow  # AF_UNIX
    assert [verdict(socket_nr, family) for family in (2, 10, 16, 17)] == [eacces] * 4  # inet, inet6, netlink, packet
    assert verdict(0) == allow and verdict(socket_nr + 1) == allow  # calls not listed (read / write, connect on a unix socket)
    assert verdict(0, audit_arch=0x40000003) == eperm  # another ABI's entry point (i386)
    if machine == "x86_64":
        assert verdict(0x40000000 | 39) == eperm  # x32


@pytest.mark.slow  # a harness run
def test_a_worker_cannot_reach_past_the_hook_with_ctypes(tmp_path):
    """The seccomp filter holds where the audit hook cannot: system calls made through ctypes."""
    from dsa_bench.run import seccomp

    if not seccomp.refused_calls() or sys.platform != "linux":
        pytest.skip("no seccomp table for this machine")
    proc, doc = _run(tmp_path, ["raw_syscalls"], "--device", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _by_solution(doc)["raw_syscalls"]["status"] == "PASSED"
    assert seccomp.PROTECTION in doc["worker_protections"]["raw_syscalls"], doc["worker_protections"]
    notes = doc["solution_notes"]["raw_syscalls"]
    assert notes == "inet socket: EACCES; unix socket: done; ptrace: EPERM; unshare: EPERM", notes
