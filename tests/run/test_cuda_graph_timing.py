"""`dsa-bench run --cuda-graph`: timed calls are replays of a CUDA graph the worker captured of the call.

On a GPU (``-m gpu``): a solution that sleeps on the host between two launches is timed with the
sleep eagerly and without it as a replay, and its replayed outputs pass the checks; a call that
synchronizes with the host cannot be captured, which fails that case with a plain message while the
next case runs; a solution whose captured work replays host-side state is caught by the checked
call. The worker's graph logic itself is tested on the CPU in tests/timing/test_timing_protocol.py.
"""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES, run_cli

GRAPH_FIXTURES = FIXTURES / "cuda_graph"


def run_with(tmp_path, cases: list[str], names: list[str], *extra: str) -> tuple[int, dict, str]:
    save = tmp_path / f"results{len(list(tmp_path.iterdir()))}.json"
    args = ["run", "-w", "indexer_smoke", "-s", "reference", "--timer", "cupti", "--save", str(save), *extra]
    for case in cases:
        args += ["-c", case]
    for name in names:
        args += ["-s", str(GRAPH_FIXTURES / name)]
    proc = run_cli(*args)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout, output
    return proc.returncode, json.loads(save.read_text()), output


def records_of(doc: dict, solution: str) -> list[dict]:
    return [r for r in doc["records"] if r["solution"] == solution]


@pytest.mark.gpu
def test_a_replay_leaves_out_the_host_time_between_launches_and_its_outputs_pass(tmp_path):
    code, eager, output = run_with(tmp_path, ["smoke_scored"], ["sleeps_between_kernels"])
    assert code == 0, output
    assert eager["launch"] == "eager"
    (record,) = records_of(eager, "sleeps_between_kernels")
    assert record["status"] == "PASSED" and record["timing"]["min_ms"] > 2.0, record["timing"]  # the sleep is in the span

    code, graph, output = run_with(tmp_path, ["smoke_scored"], ["sleeps_between_kernels"], "--cuda-graph")
    assert code == 0, output
    assert graph["launch"] == "cuda_graph" and "CUDA-graph replay" in output
    statuses = {r["solution"]: r["status"] for r in graph["records"]}
    assert statuses == {"reference": "PASSED", "sleeps_between_kernels": "PASSED"}, graph["records"]  # the checked replays
    (record,) = records_of(graph, "sleeps_between_kernels")
    assert max(max(trial) for trial in record["timing"]["samples_ms"]) < 1.0, record["timing"]  # the kernels alone
    # the host samples time the replay's launch and its synchronisation: no sleep in them either
    assert max(max(trial) for trial in record["timing"]["host_samples_ms"]) < 2.0, record["timing"]["host_samples_ms"]


@pytest.mark.gpu
def test_a_call_that_cannot_be_captured_fails_its_case_plainly_and_the_next_case_runs(tmp_path):
    code, doc, output = run_with(tmp_path, ["smoke_scored", "smoke_edges"], ["syncs_in_call"], "--cuda-graph")
    assert code == 1, output
    records = records_of(doc, "syncs_in_call")
    assert [(r["case"], r["status"]) for r in records] == [("smoke_scored", "RUNTIME_ERROR"), ("smoke_edges", "PASSED")], records
    message = records[0]["message"]
    assert message.startswith("--cuda-graph: the call could not be captured in a CUDA graph ("), message
    assert message.endswith("the solution must not synchronize with the host inside a call, or run without --cuda-graph"), message
    assert "Traceback" not in message
    assert [r["status"] for r in records_of(doc, "reference")] == ["PASSED", "PASSED"]


@pytest.mark.gpu
def test_captured_work_that_replays_host_side_state_is_caught_by_the_checked_call(tmp_path):
    code, eager, output = run_with(tmp_path, ["smoke_scored"], ["replays_host_state"])
    assert code == 0, output  # eagerly right: the redraw bumps the version counters it remembers answers by
    code, graph, output = run_with(tmp_path, ["smoke_scored"], ["replays_host_state"], "--cuda-graph")
    assert code == 1, output
    (record,) = records_of(graph, "replays_host_state")
    assert record["status"].startswith("INCORRECT") and "timed call" in record["message"], record


@pytest.mark.gpu
def test_a_reference_that_cannot_be_captured_is_checked_but_not_timed(tmp_path):
    # kv_insert's reference writer drops -1 slots by a boolean mask (a host sync): its outputs are still
    # the expectation, its record says why it has no time, and the Triton writer is timed as replays.
    save = tmp_path / "insert.json"
    proc = run_cli("run", "-w", "kv_insert_v32_smoke", "-s", "reference", "-s", "triton", "--timer", "cupti", "--cuda-graph",
                   "--save", str(save))  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    doc = json.loads(save.read_text())
    for record in records_of(doc, "reference"):
        assert record["status"] == "PASSED" and record["timing"] is None, record
        assert record["message"].startswith("not timed: --cuda-graph cannot capture this definition's reference"), record
    triton = records_of(doc, "triton")
    assert triton and all(r["status"] == "PASSED" and r["timing"] and r.get("speedup") is None for r in triton), triton
