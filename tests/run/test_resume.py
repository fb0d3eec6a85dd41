"""`dsa-bench run --resume`: an interrupted run completed to what an uninterrupted one records,
and refused, naming the difference, when the workload, settings or solutions changed."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import FIXTURES, ROOT, cli

HANGS = str(FIXTURES / "solutions" / "hangs_when_told")
WRITES_NOTHING = str(FIXTURES / "adversarial" / "writes_nothing")
#: two cases of indexer_smoke, of batch sizes 1 and 4: hangs_when_told can be told to stop on the second
RUN = ["run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-c", "smoke_edges", "-s", "reference", "-s", HANGS, "-s", WRITES_NOTHING]


def statuses(doc: dict) -> dict[tuple[str, str], str]:
    keys = [(r["case"], r["solution"]) for r in doc["records"]]
    assert len(keys) == len(set(keys)), "no (case, solution) twice"
    return {(r["case"], r["solution"]): r["status"] for r in doc["records"]}


def log_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    save = tmp_path_factory.mktemp("full") / "full.json"
    proc = cli(*RUN, "--save", str(save))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # writes_nothing fails every case
    doc = json.loads(save.read_text())
    assert len(doc["records"]) == 6 and doc["complete"] is True
    return doc


def test_resume_completes_a_partial_results_file(uninterrupted, tmp_path):
    # what an interruption after the fourth record leaves: case 1 finished, case 2 begun (reference only)
    partial = tmp_path / "partial.json"
    first_case = uninterrupted["records"][:3]
    partial.write_text(json.dumps({**uninterrupted, "records": uninterrupted["records"][:4], "complete": False}))
    proc = cli(*RUN, "--resume", str(partial))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "resuming" in proc.stdout and "3 records of 1 finished cases kept, 1 cases to run" in proc.stdout
    ran = log_lines(proc.stdout)
    assert [line.split(":")[0] for line in ran] == [
        "[1/3] smoke_edges reference", "[2/3] smoke_edges hangs_when_told", "[3/3] smoke_edges writes_nothing"
    ], "the begun case is run again from its start"
    doc = json.loads(partial.read_text())
    assert doc["complete"] is True
    assert statuses(doc) == statuses(uninterrupted)
    assert doc["records"][:3] == first_case, "finished records are kept as they were"
    assert doc["records"][3] != uninterrupted["records"][3], "the begun case's reference record is a new one"
    assert doc["resumed"][0]["records_kept"] == 3 and doc["wall_breakdown"]["sittings"] == 2
    assert doc["created"] == uninterrupted["created"] and doc["cases"] == uninterrupted["cases"]


@pytest.mark.slow  # three workers started twice, and a hanging one waited for: about 30 s on a loaded CPU
def test_resume_after_an_interrupt(uninterrupted, tmp_path):
    """A run stopped by Ctrl-C while a solution hangs, then resumed: the same statuses as a run
    that was never stopped. The piped log shows each record as it finishes."""
    save = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"DSA_BENCH_TEST_HANG_BATCH": "4"}
    proc = subprocess.Popen([sys.executable, "-m", "dsa_bench", *RUN, "--save", str(save)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline, seen = time.monotonic() + 300, []
    while not any(line.startswith("[4/6]") for line in seen):  # smoke_edges' reference: then hangs_when_told sleeps
        assert time.monotonic() < deadline and proc.poll() is None, seen
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            pass
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 130, proc.stderr.read()
    doc = json.loads(save.read_text())
    assert doc["complete"] is False and len(doc["records"]) == 4

    resumed = cli(*RUN, "--resume", str(save))
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert [line.split(":")[0] for line in log_lines(resumed.stdout)] == [
        "[1/3] smoke_edges reference", "[2/3] smoke_edges hangs_when_told", "[3/3] smoke_edges writes_nothing"
    ]
    doc = json.loads(save.read_text())
    assert doc["complete"] is True and statuses(doc) == statuses(uninterrupted)


def _refusal(args: list[str], results) -> str:
    before = results.read_bytes()
    proc = cli(*args, "--resume", str(results))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert results.read_bytes() == before, "a refused resume leaves the file alone"
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_resume_refuses_other_settings_cases_and_solutions(uninterrupted, tmp_path):
    results = tmp_path / "r.json"
    results.write_text(json.dumps({**uninterrupted, "records": uninterrupted["records"][:3], "complete": False}))
    assert "settings.iterations is 10 there and 4 in this run" in _refusal([*RUN, "--iterations", "4"], results)
    assert "settings.tolerance.atol" in _refusal(RUN, _edited(results, tmp_path, lambda d: d["settings"]["tolerance"].update(atol=0.5)))
    assert "the case selection differs: 2 cases there, 1 in this run" in _refusal([*RUN[:4], *RUN[6:]], results)
    assert "the solutions differ: hangs_when_told, reference, writes_nothing there, hangs_when_told, reference in this run" in _refusal(
        RUN[:-2], results
    )
    other_trace = _edited(results, tmp_path, lambda d: d["workload"].update(cases_sha256="x"))
    assert "workload.cases_sha256 is 'x' there" in _refusal(RUN, other_trace)
    old = _edited(results, tmp_path, lambda d: d["workload"].pop("cases_sha256"))
    assert "written before dsa-bench could resume runs" in _refusal(RUN, old)
    proc = cli(*RUN, "--resume", str(results), "--save", str(tmp_path / "other.json"))
    assert proc.returncode == 2 and "leave out --save and --no-save" in proc.stderr


def _edited(results, tmp_path, change) -> object:
    doc = json.loads(results.read_text())
    change(doc)
    edited = tmp_path / f"edited{len(list(tmp_path.iterdir()))}.json"
    edited.write_text(json.dumps(doc))
    return edited


def test_resume_refuses_a_changed_solution(tmp_path):
    solution = tmp_path / "writes_nothing"
    shutil.copytree(WRITES_NOTHING, solution)
    results = tmp_path / "r.json"
    proc = cli("run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-s", str(solution), "--save", str(results))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recorded = json.loads(results.read_text())["solutions"]["writes_nothing"]["content_hash"]
    with open(solution / "kernel.py", "a") as kernel:
        kernel.write("# changed after the run\n")
    from dsa_bench.solution import content_hash

    message = _refusal(["run", "-w", "indexer_smoke", "-c", "smoke_passthrough", "-s", str(solution)], results)
    assert f"solution 'writes_nothing' has changed since: content hash {recorded} there, {content_hash(solution)} now" in message


def test_resume_refuses_another_launch_mode():
    """An interrupted eager run (or one from before run --cuda-graph) is not continued with CUDA-graph replays."""
    from dsa_bench.results.records import ResultsHeader
    from dsa_bench.run.resume import resume_problem

    def header(**fields: object) -> ResultsHeader:
        workload = {"name": "indexer_smoke", "definition": "d", "cases_sha256": "abc"}
        return ResultsHeader.model_validate({"workload": workload, "timer": "cupti", "l2_flush": "clean", "cases": ["c"], **fields})

    eager, graph, older = header(launch="eager"), header(launch="cuda_graph"), header()
    assert resume_problem(eager, eager) is None and resume_problem(older, eager) is None
    problem = resume_problem(eager, graph)
    assert problem is not None and "launch is 'eager' there and 'cuda_graph' in this run" in problem
    assert "launch is 'eager' there" in (resume_problem(older, graph) or "")
