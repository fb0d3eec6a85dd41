"""Adversarial solutions each get the right status, and the run goes on past every one of them.

CPU-capable fixtures run here in CI; the GPU-only ones (side stream, pointer memoization, CUDA
fault) run where CUDA is present.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from conftest import FIXTURES, run_cli

ADVERSARIAL = FIXTURES / "adversarial"


def statuses(doc: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for record in doc["records"]:
        found.setdefault(record["solution"], []).append(record["status"])
    return found


def messages(doc: dict, solution: str) -> list[str]:
    return [r["message"] for r in doc["records"] if r["solution"] == solution]


def run_with(tmp_path, workload: str, cases: list[str], names: list[str], *extra: str) -> tuple[int, dict, str]:
    save = tmp_path / "results.json"
    args = ["run", "-w", workload, "-s", "reference", "--save", str(save), *extra]
    for case in cases:
        args += ["-c", case]
    for name in names:
        args += ["-s", str(ADVERSARIAL / name)]
    proc = run_cli(*args)
    assert "Traceback" not in proc.stdout
    return proc.returncode, json.loads(save.read_text()), proc.stdout + proc.stderr


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_cpu_adversaries_on_the_indexer(tmp_path):
    names = ["writes_nothing", "caches_by_shape", "sleeps", "kills_itself", "wrong_dtype", "permuted_topk"]
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_boundary", "smoke_scored"], names, "--case-timeout", "8")
    assert code == 1, output
    found = statuses(doc)
    assert found["reference"] == ["PASSED", "PASSED"], "the run goes on past every failure"
    assert found["writes_nothing"] == ["INCORRECT_INDICES"] * 2
    assert "neither -1 nor a token id" in messages(doc, "writes_nothing")[0]
    assert found["caches_by_shape"] == ["INCORRECT_INDICES"] * 2, "a cached answer for a different input set fails"
    assert found["sleeps"] == ["TIMEOUT"] * 2
    assert "no answer within 8 s" in messages(doc, "sleeps")[0]
    assert found["kills_itself"] == ["RUNTIME_ERROR"] * 2
    assert "worker process died (exit code -9)" in messages(doc, "kills_itself")[0]
    assert found["wrong_dtype"] == ["INCORRECT_DTYPE"] * 2
    assert "dtype int64, expected int32" in messages(doc, "wrong_dtype")[0]
    assert found["permuted_topk"] == ["PASSED", "PASSED"]


def test_natural_log_lse_fails(tmp_path):
    code, doc, output = run_with(tmp_path, "sparse_attention_smoke", ["smoke_t3_empty_small"], ["natural_log_lse"])
    assert code == 1, output
    assert statuses(doc) == {"reference": ["PASSED"], "natural_log_lse": ["INCORRECT_NUMERICAL"]}
    assert messages(doc, "natural_log_lse")[0].startswith("lse:")


@pytest.mark.gpu
def test_side_stream_work_is_timed_by_cupti(tmp_path):
    """The fixture hides a ~4 ms spin kernel on a side stream and returns early."""
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], ["side_stream"], "--timer", "cupti")
    assert code == 0, output
    record = next(r for r in doc["records"] if r["solution"] == "side_stream")
    assert record["status"] == "PASSED" and record["timing"]["timer"] == "cupti"
    assert doc["l2_flush"] == "clean", "the default flush leaves the L2 clean"
    assert record["timing"]["min_ms"] > 3.0, "CUPTI sees the hidden kernel"
    # CUDA events on the current stream miss it: the reason CUPTI is the default timer.
    code, events_doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], ["side_stream"], "--timer", "events")
    events_record = next(r for r in events_doc["records"] if r["solution"] == "side_stream")
    assert events_record["timing"]["timer"] == "cuda_events"
    assert events_record["timing"]["median_ms"] < 0.5 * record["timing"]["median_ms"], (events_record["timing"], record["timing"])


@pytest.mark.gpu
def test_pointer_memoization_is_caught_by_timed_call_checks(tmp_path):
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored", "smoke_edges"], ["memoizes_by_pointer"])
    assert code == 1, output
    found = statuses(doc)
    assert found["reference"] == ["PASSED", "PASSED"]
    assert all(s.startswith("INCORRECT") for s in found["memoizes_by_pointer"]), found
    assert any("timed call" in m or "valid ids" in m or "top-" in m for m in messages(doc, "memoizes_by_pointer"))


@pytest.mark.gpu
def test_cuda_fault_is_a_runtime_error_and_the_worker_restarts(tmp_path):
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_passthrough", "smoke_scored"], ["cuda_fault"])
    assert code == 1, output
    found = statuses(doc)
    assert found == {"reference": ["PASSED", "PASSED"], "cuda_fault": ["RUNTIME_ERROR", "RUNTIME_ERROR"]}
    assert any("illegal" in m.lower() for m in messages(doc, "cuda_fault")), messages(doc, "cuda_fault")


# --------------------------------------------------------------------------- the judging side is unreachable


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _processes_named(token: str) -> list[int]:
    """Live processes whose command line holds ``token`` (a fixture's child names itself with it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes() and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _worker_pids(harness: int) -> set[int]:
    """The workers among ``harness``'s descendants: other dsa-bench runs on the machine (another
    test session, a user's run) are not this test's business."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"dsa_bench.run.worker" not in (entry / "cmdline").read_bytes():
                    continue
            except OSError:
                continue
            pid: int | None = int(entry.name)
            while pid is not None and pid > 1:
                pid = _parent(pid)
                if pid == harness:
                    found.add(int(entry.name))
                    break
    return found


def test_worker_lists_hold_only_the_harness_descendants():
    """The SIGTERM/SIGKILL test counts its own harness's workers only: a worker of another run on
    the machine (here: a stand-in that is not the harness's descendant) is not among them."""
    import os
    import subprocess
    import sys

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "dsa_bench.run.worker"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and stranger.pid not in _worker_pids(os.getpid()):
            time.sleep(0.05)  # until its command line is in /proc
        assert stranger.pid in _worker_pids(os.getpid()), "a descendant is found"
        unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert stranger.pid not in _worker_pids(unrelated.pid), "another harness's list leaves it out"
        finally:
            unrelated.kill()
            unrelated.wait()
    finally:
        stranger.kill()
        stranger.wait()


@pytest.fixture
def marker(monkeypatch):
    """A file any worker may write, named to the fixtures by DSA_BENCH_TEST_MARKER (pytest's own
    temporary folders are closed to the unprivileged users workers run as under root)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="dsa-bench-marker-"))
    folder.chmod(0o777)
    monkeypatch.setenv("DSA_BENCH_TEST_MARKER", str(folder / "marker"))
    yield folder / "marker"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow  # a run of every attack fixture (~11 s on two cores)
def test_attacks_on_the_judging_side(tmp_path, marker, monkeypatch):
    """A pickle payload returned or forged into the pipe is never loaded, patching the judge in the
    solution's process changes nothing, and a child process ends with the run."""
    payload = marker.with_name("payload")  # created by whoever loads a pickle payload
    monkeypatch.setenv("DSA_BENCH_TEST_PAYLOAD", str(payload))
    token = uuid.uuid4().hex  # names leaves_children's child, so only this test's processes are looked at
    monkeypatch.setenv("DSA_BENCH_TEST_TOKEN", token)
    names = ["pickle_payload", "forges_replies", "patches_judge", "leaves_children"]
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], names)
    assert code == 1, output
    found = statuses(doc)
    assert found["reference"] == ["PASSED"]
    assert found["pickle_payload"] == ["INCORRECT_SHAPE"] and "missing or not a tensor" in messages(doc, "pickle_payload")[0]
    assert found["forges_replies"] == ["RUNTIME_ERROR"] and "not valid JSON" in messages(doc, "forges_replies")[0]
    assert found["patches_judge"] == ["INCORRECT_INDICES"]
    assert found["leaves_children"] == ["PASSED"]
    assert not payload.exists(), "a pickle payload was loaded"
    assert doc["solution_notes"]["leaves_children"].startswith("started child"), doc["solution_notes"]
    assert not _processes_named(f"dsa-bench-child-{token}"), "a solution's child outlived the run"


def _isolation_here() -> bool:
    from conftest import ROOT

    from dsa_bench.run.isolation import choose_identity, python_paths

    return choose_identity("auto", 0, [*python_paths(), ROOT], []).dedicated


@pytest.mark.skipif(
    not _isolation_here(), reason="workers cannot run as an unprivileged user here (not root, or Python is not readable by others)"
)
def test_unprivileged_workers_cannot_kill_the_harness_or_leave_processes(tmp_path, marker, monkeypatch):
    monkeypatch.setenv("DSA_BENCH_TEST_NEW_SESSION", "1")  # the child escapes the worker's process group
    token = uuid.uuid4().hex
    monkeypatch.setenv("DSA_BENCH_TEST_TOKEN", token)
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], ["kills_harness", "leaves_children"])
    assert code == 0, output
    assert statuses(doc) == {"reference": ["PASSED"], "kills_harness": ["PASSED"], "leaves_children": ["PASSED"]}
    assert all(d.startswith("unprivileged uid/gid") for d in doc["workers"].values()), doc["workers"]
    assert doc["solution_notes"]["leaves_children"].startswith("started child"), doc["solution_notes"]
    assert not _processes_named(f"dsa-bench-child-{token}"), "a child in a session of its own outlived the run"


@pytest.mark.slow  # over 10 s on 2 CPU cores: make test-all (make test stays under 5 min)
def test_sigterm_and_sigkill_of_the_harness_end_its_workers(tmp_path):
    """SIGTERM stops a run as Ctrl-C does (finished records kept, exit 143, workers ended); after
    SIGKILL of the harness its workers end on their own."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for sig, expected_code in ((signal.SIGTERM, 143), (signal.SIGKILL, -9)):
        save = tmp_path / f"run-{sig.name}.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsa_bench", "run", "-w", "indexer_smoke", "-s", "reference", "-s", str(ADVERSARIAL / "sleeps"),
             "--case-timeout", "120", "--save", str(save)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.time() + 120
        while time.time() < deadline and not (save.exists() and json.loads(save.read_text())["records"]):
            time.sleep(0.2)  # the reference's first record is in: the sleeping solution runs next
        time.sleep(3)
        workers = _worker_pids(proc.pid)
        assert workers, "the run started workers"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == expected_code, out + err
        if sig is signal.SIGTERM:
            assert "interrupted by SIGTERM" in err and json.loads(save.read_text())["complete"] is False
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers), f"workers outlived the harness ({sig.name})"


# --------------------------------------------------------------------------- the timer is out of reach (GPU)


def _log_of(name: str) -> Path:
    from conftest import ROOT

    return ROOT / ".cache" / "dsa-bench" / "logs" / f"{name}.log"


@pytest.mark.gpu
@pytest.mark.parametrize("timer", ["cupti", "events"])
def test_timer_patches_do_not_reach_the_timer_and_tampering_is_refused(tmp_path, timer):
    names = ["patches_timer_class", "patches_cupti", "patches_flush", "patches_perf_counter", "patches_cuda_event", "tampers_timer"]
    if timer == "events":
        names.remove("patches_cupti")
    for name in names:
        _log_of(name).unlink(missing_ok=True)
    code, doc, output = run_with(tmp_path, "indexer_smoke", ["smoke_scored"], names, "--timer", timer, "--iterations", "5", "--trials", "2")
    assert code == 1, output
    found = statuses(doc)
    assert found.pop("tampers_timer") == ["TIMING_SUSPECT"], output
    assert "impossible timing" in messages(doc, "tampers_timer")[0]
    assert all(s == ["PASSED"] for s in found.values()), found
    by_name = {r["solution"]: r for r in doc["records"]}
    reference_ms = by_name["reference"]["timing"]["mean_ms"]
    for name in names[:-1]:
        timing = by_name[name]["timing"]
        assert timing["min_ms"] > 0.2 * reference_ms, (name, timing["min_ms"], reference_ms)  # the reference's own work, honestly timed
        assert "PATCH CALLED" not in _log_of(name).read_text(), name
